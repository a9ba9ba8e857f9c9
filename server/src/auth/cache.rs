//! Every server's copy of the API keys: loaded from etcd once the store is
//! connected, then kept current by a watch on `/snowkeep/v1/apikeys/`
//! (re-listed and re-watched after any watch failure or compaction), so a
//! key created, expired or revoked through one server takes effect on every
//! server as soon as the watch delivers it (within a request timeout or two
//! while etcd answers).
//!
//! **While etcd is unreachable** the last keys known stay in force: calls
//! keep being authenticated against them (expiry is checked against the
//! server's clock at each call, so an expiry already recorded still takes
//! effect), and a revocation or expiry made elsewhere in the meantime takes
//! effect once this server's watch reaches etcd again. Before the first load
//! (etcd never answered since start) every authenticated call is
//! UNAVAILABLE.
//!
//! A record that does not parse is logged and left out (so its key is
//! refused as unknown) until it is repaired.
//!
//! **Order.** Every record is kept with its etcd mod revision, and the cache
//! knows the revision through which it has applied every change (the
//! list's, then each watch event's). Nothing replaces a record with an older
//! one, and no older write brings back a deleted key: a server's own write,
//! noted at once (`KeyCache::note`), may reach the cache after the watch
//! delivered a later change (a revocation through another server), and the
//! watch then delivers the noted write again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockWriteGuard};
use std::time::Duration;

use snowkeep_client::SharedClock;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use snowkeep_core::api_key::{BootstrapKey, KeyRecord, KeyRefusal, KeyScope, PresentedKey};
use snowkeep_etcd::apikeys::{ApiKeyStore, FollowEnd, KeyChange, KeyWrite, StoredKey};

/// Pause between attempts while etcd does not answer.
const RETRY: Duration = Duration::from_millis(500);

/// The API keys a server knows, shared by the authentication layer and the
/// administration service. Cheap to clone.
#[derive(Clone, Default)]
pub struct KeyCache {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// `None` until the first load.
    keys: RwLock<Option<Known>>,
    /// The etcd side, once connected.
    store: OnceLock<ApiKeyStore>,
    /// Bumped after every change of `keys`, for the open streams that end
    /// when their key is revoked (see `super::revoke`).
    changes: Changes,
}

/// A counter of changes that streams watch, and the same count for the
/// calls that only read it ([`KeyCache::generation`]).
struct Changes(tokio::sync::watch::Sender<u64>, AtomicU64);

impl Default for Changes {
    fn default() -> Self {
        Self(tokio::sync::watch::channel(0).0, AtomicU64::new(0))
    }
}

impl Changes {
    /// Marks a change of the keys just made under `keys`, their write lock.
    /// The count moves while the lock is still held: a call that finds the
    /// old count checks nothing after the change (a full check waits for
    /// the lock), and one that reads the new count sees the new keys. The
    /// streams that watch the keys are woken once the lock is released.
    fn changed(&self, keys: RwLockWriteGuard<'_, Option<Known>>) {
        self.1.fetch_add(1, Ordering::Release);
        drop(keys);
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The keys known, as of etcd revision `revision` at least.
struct Known {
    /// The readable records by id, each with its etcd mod revision.
    records: HashMap<String, (KeyRecord, i64)>,
    /// Every change up to this revision is applied (the list's revision,
    /// then each watch event's); a record noted after a write of ours may be
    /// newer still.
    revision: i64,
}

impl Known {
    /// Whether a change of `id` at `revision` is newer than the record held
    /// for `id` (true when none is held).
    fn is_newer(&self, id: &str, revision: i64) -> bool {
        self.records
            .get(id)
            .is_none_or(|&(_, held)| held < revision)
    }
}

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCache").finish_non_exhaustive()
    }
}

/// Why a presented key could not be checked or was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted: what the key may do, and when it expires (unix ms, 0 for
    /// never).
    Accepted {
        /// What the key may do.
        scope: KeyScope,
        /// When the key expires, unix ms; 0 for never.
        expires_unix_ms: u64,
    },
    /// Refused (UNAUTHENTICATED).
    Refused(KeyRefusal),
    /// No keys loaded yet (UNAVAILABLE).
    NotLoaded,
}

/// Whether `r` passes as an admin key at `now_unix_ms`: the admin
/// permission, every namespace, neither revoked nor expired.
pub(super) fn usable_admin(r: &KeyRecord, now_unix_ms: u64) -> bool {
    r.permissions.contains(&super::Permission::Admin)
        && r.namespaces.is_empty()
        && !r.revoked
        && (r.expires_unix_ms == 0 || r.expires_unix_ms > now_unix_ms)
}

pub(super) fn parse(stored: &StoredKey) -> Option<KeyRecord> {
    match KeyRecord::from_json(&stored.value) {
        Ok(record) if record.id == stored.id => Some(record),
        Ok(record) => {
            error!(key = %snowkeep_etcd::keys::apikey(&stored.id), id_inside = %record.id, "API key record names another id than its key; the key is refused until it is repaired");
            None
        }
        Err(problem) => {
            error!(key = %snowkeep_etcd::keys::apikey(&stored.id), problem, "unreadable API key record; the key is refused until it is repaired");
            None
        }
    }
}

impl KeyCache {
    /// An empty cache, not connected.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks `presented` at `now_unix_ms` against the known keys.
    pub fn verify(&self, presented: &PresentedKey, now_unix_ms: u64) -> Verdict {
        let keys = self.inner.keys.read().unwrap_or_else(|p| p.into_inner());
        let Some(keys) = keys.as_ref() else {
            return Verdict::NotLoaded;
        };
        match keys.records.get(presented.id()) {
            None => Verdict::Refused(KeyRefusal::Unknown(presented.id().to_owned())),
            Some((record, _)) => match record.verify(presented, now_unix_ms) {
                Ok(scope) => Verdict::Accepted {
                    scope,
                    expires_unix_ms: record.expires_unix_ms,
                },
                Err(refusal) => Verdict::Refused(refusal),
            },
        }
    }

    /// How many times the keys changed: a key that verified when this was
    /// `n` verifies the same way while it still is (see `super::memo`).
    /// Read it before verifying, never after.
    pub(crate) fn generation(&self) -> u64 {
        self.inner.changes.1.load(Ordering::Acquire)
    }

    /// A receiver that sees every change of the keys from now on.
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.0.subscribe()
    }

    /// When key `id` expires (unix ms, 0 for never), as known now; `None`
    /// for a key not known.
    pub(crate) fn expires_unix_ms(&self, id: &str) -> Option<u64> {
        let keys = self.inner.keys.read().unwrap_or_else(|p| p.into_inner());
        let (record, _) = keys.as_ref()?.records.get(id)?;
        Some(record.expires_unix_ms)
    }

    /// One known key that passes as an admin key at `now_unix_ms` (the
    /// admin permission, every namespace, neither revoked nor expired): its
    /// id and the mod revision of its
    /// record, the guard of a write that must not commit once it changed.
    /// `None` before the first load, `Some(None)` when there is none.
    pub(crate) fn usable_admin_key(&self, now_unix_ms: u64) -> Option<Option<(String, i64)>> {
        let keys = self.inner.keys.read().unwrap_or_else(|p| p.into_inner());
        let known = keys.as_ref()?;
        let mut usable = known
            .records
            .values()
            .filter(|(r, _)| usable_admin(r, now_unix_ms));
        Some(usable.next().map(|(r, at)| (r.id.clone(), *at)))
    }

    /// The etcd side; `None` before the store connected.
    pub(crate) fn store(&self) -> Option<ApiKeyStore> {
        self.inner.store.get().cloned()
    }

    /// Applies one record as written by a write of ours at `mod_revision`,
    /// so this server answers with it at once (the watch delivers it again).
    /// Left out when the cache already knows `record.id` as of that revision
    /// or later: a change the watch delivered first (a revocation through
    /// another server, a delete) is never undone.
    pub(crate) fn note(&self, record: KeyRecord, mod_revision: i64) {
        let mut keys = self.inner.keys.write().unwrap_or_else(|p| p.into_inner());
        let Some(known) = keys.as_mut() else { return };
        if mod_revision > known.revision && known.is_newer(&record.id, mod_revision) {
            known
                .records
                .insert(record.id.clone(), (record, mod_revision));
            self.inner.changes.changed(keys);
        }
    }

    /// Replaces the keys with `stored`, as listed at etcd revision
    /// `revision`; a record noted since at a later revision than the list's
    /// is kept (the list is older than it).
    pub(crate) fn replace_all(&self, stored: &[StoredKey], revision: i64) {
        let mut records: HashMap<String, (KeyRecord, i64)> = stored
            .iter()
            .filter_map(|s| parse(s).map(|r| (r.id.clone(), (r, s.mod_revision))))
            .collect();
        let mut keys = self.inner.keys.write().unwrap_or_else(|p| p.into_inner());
        let first = keys.is_none();
        if let Some(old) = keys.take() {
            for (id, (record, at)) in old.records {
                if at > revision {
                    records.insert(id, (record, at));
                }
            }
        }
        let count = records.len();
        *keys = Some(Known { records, revision });
        self.inner.changes.changed(keys);
        if first {
            info!(keys = count, "API keys loaded from etcd");
        }
    }

    /// Applies one change the watch delivered (in revision order), unless
    /// a record noted since is newer.
    fn apply(&self, change: KeyChange) {
        let mut keys = self.inner.keys.write().unwrap_or_else(|p| p.into_inner());
        let Some(known) = keys.as_mut() else { return };
        let (id, revision) = match &change {
            KeyChange::Put(stored) => (stored.id.as_str(), stored.mod_revision),
            KeyChange::Delete(id, revision) => (id.as_str(), *revision),
        };
        if !known.is_newer(id, revision) {
            known.revision = known.revision.max(revision);
            return;
        }
        match change {
            KeyChange::Put(stored) => match parse(&stored) {
                Some(record) => {
                    known
                        .records
                        .insert(record.id.clone(), (record, stored.mod_revision));
                }
                None => {
                    known.records.remove(&stored.id);
                }
            },
            KeyChange::Delete(id, _) => {
                known.records.remove(&id);
            }
        }
        known.revision = known.revision.max(revision);
        self.inner.changes.changed(keys);
    }

    /// Connects the cache to etcd: writes the bootstrap admin key when no
    /// key has its id, loads every key and follows them until `shutdown`.
    /// Retries every step while etcd does not answer. Call once; the task
    /// runs on the current runtime.
    pub(crate) fn connect(
        &self,
        store: ApiKeyStore,
        bootstrap: Option<BootstrapKey>,
        clock: SharedClock,
        shutdown: CancellationToken,
    ) {
        if self.inner.store.set(store.clone()).is_err() {
            return;
        }
        let cache = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = cache.run(store, bootstrap, clock) => {}
            }
        });
    }

    async fn run(&self, store: ApiKeyStore, bootstrap: Option<BootstrapKey>, clock: SharedClock) {
        if let Some(boot) = bootstrap {
            loop {
                let record = boot.record(clock.unix_ms());
                match store
                    .create(&boot.id, record.to_json().as_bytes(), None)
                    .await
                {
                    Ok(KeyWrite::Written(_)) => {
                        info!(key_id = %boot.id, "wrote the bootstrap admin key (--bootstrap-admin-key-file) to etcd");
                        break;
                    }
                    Ok(KeyWrite::Conflict | KeyWrite::ModeChanged) => {
                        info!(key_id = %boot.id, "the bootstrap admin key is already in etcd; left as it is");
                        break;
                    }
                    Err(e) => {
                        warn!(error = %snowkeep_core::DisplayChain(&e), "cannot write the bootstrap admin key yet; retrying");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        }
        loop {
            let revision = match store.list().await {
                Ok((stored, revision)) => {
                    self.replace_all(&stored, revision);
                    revision
                }
                Err(e) => {
                    warn!(error = %snowkeep_core::DisplayChain(&e), "cannot read the API keys from etcd; the last keys known stay in force; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            match store
                .follow(revision + 1, |change| self.apply(change))
                .await
            {
                FollowEnd::Compacted => {
                    info!("the API key watch fell behind a compaction; reading the keys again");
                }
                FollowEnd::Failed => tokio::time::sleep(RETRY).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::test_keys::stored;

    #[test]
    fn a_cache_refuses_until_loaded_then_follows_changes() {
        let key = PresentedKey::generate();
        let boot = BootstrapKey::parse(&key.reveal()).unwrap();
        let cache = KeyCache::new();
        assert_eq!(cache.verify(&key, 1), Verdict::NotLoaded);
        cache.replace_all(&[], 1);
        assert_eq!(
            cache.verify(&key, 1),
            Verdict::Refused(KeyRefusal::Unknown(key.id().to_owned()))
        );
        let mut record = boot.record(1);
        cache.apply(KeyChange::Put(stored(&record, 2)));
        assert!(
            matches!(cache.verify(&key, 2), Verdict::Accepted { scope, .. } if scope.key_id == key.id())
        );
        record.revoked = true;
        cache.apply(KeyChange::Put(stored(&record, 3)));
        assert_eq!(
            cache.verify(&key, 2),
            Verdict::Refused(KeyRefusal::Revoked(key.id().to_owned()))
        );
        // An unreadable record drops the key rather than keeping an old copy.
        cache.apply(KeyChange::Put(StoredKey {
            id: key.id().to_owned(),
            value: b"{".to_vec(),
            mod_revision: 4,
        }));
        assert_eq!(
            cache.verify(&key, 2),
            Verdict::Refused(KeyRefusal::Unknown(key.id().to_owned()))
        );
        cache.apply(KeyChange::Put(stored(&boot.record(1), 5)));
        cache.apply(KeyChange::Delete(key.id().to_owned(), 6));
        assert_eq!(
            cache.verify(&key, 2),
            Verdict::Refused(KeyRefusal::Unknown(key.id().to_owned()))
        );
    }

    /// Regression test (outside testing): `note` (called by the admin
    /// service right after its own write of a key) replaced whatever the
    /// cache held, with no revision to compare. When another server revoked
    /// the key between this server's write and its `note`, and the watch
    /// delivered both changes first, the note put the older, unrevoked
    /// record back, and this server accepted the revoked key until the next
    /// change of that key or a re-list. `note` now carries the write's mod
    /// revision and never replaces a newer record.
    #[test]
    fn a_late_note_of_an_older_record_does_not_undo_a_newer_revocation() {
        let key = PresentedKey::generate();
        let boot = BootstrapKey::parse(&key.reveal()).unwrap();
        let cache = KeyCache::new();
        let mut expired_later = boot.record(1);
        expired_later.expires_unix_ms = 1_000_000;
        cache.replace_all(&[stored(&boot.record(1), 10)], 10);
        // Revision 11: this server's ExpireKey wrote `expired_later`.
        // Revision 12: another server's RevokeKey. The watch delivers both
        // before this server's ExpireKey handler calls `note`.
        cache.apply(KeyChange::Put(stored(&expired_later, 11)));
        let mut revoked = expired_later.clone();
        revoked.revoked = true;
        cache.apply(KeyChange::Put(stored(&revoked, 12)));
        cache.note(expired_later, 11);
        assert_eq!(
            cache.verify(&key, 2),
            Verdict::Refused(KeyRefusal::Revoked(key.id().to_owned())),
            "the revoked key is accepted again after a late note of the record revoked since"
        );
    }

    /// The same kind for a delete and for a re-list: a late note of a write
    /// older than a delete the watch delivered does not bring the key back,
    /// an older watch event does not replace a newer noted record, and a
    /// re-list older than a noted record keeps the noted one.
    #[test]
    fn no_writer_replaces_a_record_or_a_delete_with_an_older_one() {
        let key = PresentedKey::generate();
        let boot = BootstrapKey::parse(&key.reveal()).unwrap();
        let unknown = Verdict::Refused(KeyRefusal::Unknown(key.id().to_owned()));
        let revoked = Verdict::Refused(KeyRefusal::Revoked(key.id().to_owned()));
        let cache = KeyCache::new();
        cache.replace_all(&[stored(&boot.record(1), 10)], 10);
        cache.apply(KeyChange::Delete(key.id().to_owned(), 12));
        cache.note(boot.record(1), 11);
        assert_eq!(cache.verify(&key, 2), unknown, "a late note undid a delete");

        // A revocation of ours noted at 20 before the watch delivers an
        // older change (13) and then the revocation itself (20).
        let cache = KeyCache::new();
        cache.replace_all(&[stored(&boot.record(1), 10)], 10);
        let mut record = boot.record(1);
        record.revoked = true;
        cache.note(record.clone(), 20);
        assert_eq!(cache.verify(&key, 2), revoked);
        cache.apply(KeyChange::Put(stored(&boot.record(1), 13)));
        assert_eq!(
            cache.verify(&key, 2),
            revoked,
            "an older watch event undid a noted revocation"
        );
        cache.apply(KeyChange::Delete(key.id().to_owned(), 14));
        assert_eq!(
            cache.verify(&key, 2),
            revoked,
            "an older delete removed a newer record"
        );
        // A re-list at 15 (older than the note) keeps the noted record.
        cache.replace_all(&[stored(&boot.record(1), 13)], 15);
        assert_eq!(
            cache.verify(&key, 2),
            revoked,
            "an older re-list undid a noted revocation"
        );
        cache.apply(KeyChange::Put(stored(&record, 20)));
        assert_eq!(cache.verify(&key, 2), revoked);
        // A re-list at or after the note's revision is the truth.
        cache.replace_all(&[], 21);
        assert_eq!(cache.verify(&key, 2), unknown);
    }

    #[test]
    fn expiry_is_judged_by_the_clock_at_each_call() {
        let key = PresentedKey::generate();
        let mut record = BootstrapKey::parse(&key.reveal()).unwrap().record(1);
        record.expires_unix_ms = 10_000;
        let cache = KeyCache::new();
        cache.replace_all(&[stored(&record, 1)], 1);
        assert!(matches!(
            cache.verify(&key, 9_999),
            Verdict::Accepted { .. }
        ));
        assert!(matches!(
            cache.verify(&key, 10_000),
            Verdict::Refused(KeyRefusal::Expired { .. })
        ));
    }

    #[test]
    fn the_usable_admin_key_comes_with_the_revision_it_was_judged_at() {
        let cache = KeyCache::new();
        assert_eq!(cache.usable_admin_key(0), None);
        let key = PresentedKey::generate();
        let mut record = BootstrapKey::parse(&key.reveal()).unwrap().record(1);
        record.expires_unix_ms = 5_000;
        cache.replace_all(&[stored(&record, 7)], 7);
        assert_eq!(
            cache.usable_admin_key(4_999),
            Some(Some((record.id.clone(), 7)))
        );
        assert_eq!(cache.usable_admin_key(5_000), Some(None));
        record.expires_unix_ms = 0;
        record.revoked = true;
        cache.note(record, 9);
        assert_eq!(cache.usable_admin_key(0), Some(None));
    }
}
