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

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use snowkeep_client::SharedClock;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::key::{BootstrapKey, KeyRecord, KeyRefusal, KeyScope, PresentedKey};
use crate::etcd::apikeys::{ApiKeyStore, FollowEnd, KeyChange, StoredKey};

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
    keys: RwLock<Option<HashMap<String, KeyRecord>>>,
    /// The etcd side, once connected.
    store: OnceLock<ApiKeyStore>,
}

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCache").finish_non_exhaustive()
    }
}

/// Why a presented key could not be checked or was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted: what the key may do.
    Accepted(KeyScope),
    /// Refused (UNAUTHENTICATED).
    Refused(KeyRefusal),
    /// No keys loaded yet (UNAVAILABLE).
    NotLoaded,
}

fn parse(stored: &StoredKey) -> Option<KeyRecord> {
    match KeyRecord::from_json(&stored.value) {
        Ok(record) if record.id == stored.id => Some(record),
        Ok(record) => {
            error!(key = %crate::etcd::keys::apikey(&stored.id), id_inside = %record.id, "API key record names another id than its key; the key is refused until it is repaired");
            None
        }
        Err(problem) => {
            error!(key = %crate::etcd::keys::apikey(&stored.id), problem, "unreadable API key record; the key is refused until it is repaired");
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
        match keys.get(presented.id()) {
            None => Verdict::Refused(KeyRefusal::Unknown(presented.id().to_owned())),
            Some(record) => match record.verify(presented, now_unix_ms) {
                Ok(scope) => Verdict::Accepted(scope),
                Err(refusal) => Verdict::Refused(refusal),
            },
        }
    }

    /// The etcd side; `None` before the store connected.
    pub(crate) fn store(&self) -> Option<ApiKeyStore> {
        self.inner.store.get().cloned()
    }

    /// Applies one record as read back after a write of ours, so this
    /// server answers with it at once (the watch delivers it again).
    pub(crate) fn note(&self, record: KeyRecord) {
        let mut keys = self.inner.keys.write().unwrap_or_else(|p| p.into_inner());
        if let Some(keys) = keys.as_mut() {
            keys.insert(record.id.clone(), record);
        }
    }

    pub(crate) fn replace_all(&self, stored: &[StoredKey]) {
        let fresh: HashMap<String, KeyRecord> = stored
            .iter()
            .filter_map(parse)
            .map(|r| (r.id.clone(), r))
            .collect();
        let count = fresh.len();
        let first = self
            .inner
            .keys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .replace(fresh)
            .is_none();
        if first {
            info!(keys = count, "API keys loaded from etcd");
        }
    }

    fn apply(&self, change: KeyChange) {
        let mut keys = self.inner.keys.write().unwrap_or_else(|p| p.into_inner());
        let Some(keys) = keys.as_mut() else { return };
        match change {
            KeyChange::Put(stored) => match parse(&stored) {
                Some(record) => {
                    keys.insert(record.id.clone(), record);
                }
                None => {
                    keys.remove(&stored.id);
                }
            },
            KeyChange::Delete(id) => {
                keys.remove(&id);
            }
        }
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
                match store.create(&boot.id, record.to_json().as_bytes()).await {
                    Ok(true) => {
                        info!(key_id = %boot.id, "wrote the bootstrap admin key (--bootstrap-admin-key-file) to etcd");
                        break;
                    }
                    Ok(false) => {
                        info!(key_id = %boot.id, "the bootstrap admin key is already in etcd; left as it is");
                        break;
                    }
                    Err(e) => {
                        warn!(error = %crate::DisplayChain(&e), "cannot write the bootstrap admin key yet; retrying");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        }
        loop {
            let revision = match store.list().await {
                Ok((stored, revision)) => {
                    self.replace_all(&stored);
                    revision
                }
                Err(e) => {
                    warn!(error = %crate::DisplayChain(&e), "cannot read the API keys from etcd; the last keys known stay in force; retrying");
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

    fn stored(record: &KeyRecord) -> StoredKey {
        StoredKey {
            id: record.id.clone(),
            value: record.to_json().into_bytes(),
            mod_revision: 1,
        }
    }

    #[test]
    fn a_cache_refuses_until_loaded_then_follows_changes() {
        let key = PresentedKey::generate();
        let boot = BootstrapKey::parse(&key.reveal()).unwrap();
        let cache = KeyCache::new();
        assert_eq!(cache.verify(&key, 1), Verdict::NotLoaded);
        cache.replace_all(&[]);
        assert_eq!(
            cache.verify(&key, 1),
            Verdict::Refused(KeyRefusal::Unknown(key.id().to_owned()))
        );
        let mut record = boot.record(1);
        cache.apply(KeyChange::Put(stored(&record)));
        assert!(matches!(cache.verify(&key, 2), Verdict::Accepted(s) if s.key_id == key.id()));
        record.revoked = true;
        cache.apply(KeyChange::Put(stored(&record)));
        assert_eq!(
            cache.verify(&key, 2),
            Verdict::Refused(KeyRefusal::Revoked(key.id().to_owned()))
        );
        // An unreadable record drops the key rather than keeping an old copy.
        cache.apply(KeyChange::Put(StoredKey {
            id: key.id().to_owned(),
            value: b"{".to_vec(),
            mod_revision: 3,
        }));
        assert_eq!(
            cache.verify(&key, 2),
            Verdict::Refused(KeyRefusal::Unknown(key.id().to_owned()))
        );
        cache.apply(KeyChange::Put(stored(&boot.record(1))));
        cache.apply(KeyChange::Delete(key.id().to_owned()));
        assert_eq!(
            cache.verify(&key, 2),
            Verdict::Refused(KeyRefusal::Unknown(key.id().to_owned()))
        );
    }

    /// Break-session finding (FAILS): `note` (called by the admin service
    /// right after its own write of a key) replaces whatever the cache
    /// holds, with no revision to compare. When another server revokes the
    /// key between this server's write and its `note`, and the watch
    /// delivers both changes first, the note puts the older, unrevoked
    /// record back, and this server accepts the revoked key until the next
    /// change of that key or a re-list. `note` should carry the record's
    /// mod revision and never replace a newer one.
    #[test]
    fn a_late_note_of_an_older_record_does_not_undo_a_newer_revocation() {
        let key = PresentedKey::generate();
        let boot = BootstrapKey::parse(&key.reveal()).unwrap();
        let cache = KeyCache::new();
        let mut expired_later = boot.record(1);
        expired_later.expires_unix_ms = 1_000_000;
        cache.replace_all(&[StoredKey {
            id: key.id().to_owned(),
            value: boot.record(1).to_json().into_bytes(),
            mod_revision: 10,
        }]);
        // Revision 11: this server's ExpireKey wrote `expired_later`.
        // Revision 12: another server's RevokeKey. The watch delivers both
        // before this server's ExpireKey handler calls `note`.
        cache.apply(KeyChange::Put(StoredKey {
            id: key.id().to_owned(),
            value: expired_later.to_json().into_bytes(),
            mod_revision: 11,
        }));
        let mut revoked = expired_later.clone();
        revoked.revoked = true;
        cache.apply(KeyChange::Put(StoredKey {
            id: key.id().to_owned(),
            value: revoked.to_json().into_bytes(),
            mod_revision: 12,
        }));
        cache.note(expired_later);
        assert_eq!(
            cache.verify(&key, 2),
            Verdict::Refused(KeyRefusal::Revoked(key.id().to_owned())),
            "the revoked key is accepted again after a late note of the record revoked since"
        );
    }

    #[test]
    fn expiry_is_judged_by_the_clock_at_each_call() {
        let key = PresentedKey::generate();
        let mut record = BootstrapKey::parse(&key.reveal()).unwrap().record(1);
        record.expires_unix_ms = 10_000;
        let cache = KeyCache::new();
        cache.replace_all(&[stored(&record)]);
        assert!(matches!(cache.verify(&key, 9_999), Verdict::Accepted(_)));
        assert!(matches!(
            cache.verify(&key, 10_000),
            Verdict::Refused(KeyRefusal::Expired { .. })
        ));
    }
}
