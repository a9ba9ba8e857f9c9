//! API key records in etcd (`/snowkeep/v1/apikeys/<id>`, JSON that
//! `snowkeep_core::api_key` parses) and the watch that follows them. This module moves
//! bytes only: what a record means is `snowkeep_core::api_key`'s.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tracing::{debug, warn};

use super::{keys, Endpoints, EtcdStore};
use snowkeep_core::claim::StoreError;

/// One stored key record: its id (from the etcd key), value and mod revision.
#[derive(Debug, Clone)]
pub struct StoredKey {
    /// The key id.
    pub id: String,
    /// The stored JSON.
    pub value: Vec<u8>,
    /// Its mod revision (the guard of a compare-and-swap).
    pub mod_revision: i64,
}

/// A change seen by [`ApiKeyStore::follow`].
#[derive(Debug, Clone)]
pub enum KeyChange {
    /// A record was written.
    Put(StoredKey),
    /// A record was deleted: its id and the revision of the delete.
    Delete(String, i64),
}

/// Why [`ApiKeyStore::follow`] returned: the caller re-lists, then follows
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowEnd {
    /// The watch could not be opened or failed.
    Failed,
    /// etcd compacted past the revision asked for.
    Compacted,
}

/// Reads, writes and watches API key records.
#[derive(Clone)]
pub struct ApiKeyStore {
    endpoints: Endpoints,
    timeout: Duration,
}

impl std::fmt::Debug for ApiKeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyStore").finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// The store's API key records, on its endpoints.
    pub fn api_keys(&self) -> ApiKeyStore {
        ApiKeyStore {
            endpoints: self.endpoints.clone(),
            timeout: self.settings.request_timeout,
        }
    }
}

fn stored(kv: &etcd_client::KeyValue) -> Option<StoredKey> {
    let id = kv.key().strip_prefix(keys::apikeys_prefix().as_bytes())?;
    Some(StoredKey {
        id: String::from_utf8_lossy(id).into_owned(),
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
    })
}

impl ApiKeyStore {
    /// Every record, and the revision they were read at.
    pub async fn list(&self) -> Result<(Vec<StoredKey>, i64), StoreError> {
        let resp = self
            .endpoints
            .call("list api keys", self.timeout, |mut c| async move {
                c.get(
                    keys::apikeys_prefix(),
                    Some(GetOptions::new().with_prefix()),
                )
                .await
            })
            .await?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        Ok((resp.kvs().iter().filter_map(stored).collect(), revision))
    }

    /// One record; `None` when absent.
    pub async fn get(&self, id: &str) -> Result<Option<StoredKey>, StoreError> {
        let key = keys::apikey(id);
        let (kv, _) = self
            .endpoints
            .get_key("read api key", self.timeout, &key)
            .await?;
        Ok(kv.as_ref().and_then(stored))
    }

    /// Writes `value` at `id` when no record has that id and, with a
    /// `guard`, while the cluster's security mode key is still at that mod
    /// revision (0: absent): [`KeyWrite::Written`] with the record's mod
    /// revision (a retry that finds its own earlier write counts as
    /// written), [`KeyWrite::Conflict`] when another record was there (left
    /// as it is), [`KeyWrite::ModeChanged`] when the guard failed.
    pub async fn create(
        &self,
        id: &str,
        value: &[u8],
        guard: Option<i64>,
    ) -> Result<KeyWrite, StoreError> {
        let key = keys::apikey(id);
        let txn = guarded(
            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            TxnOp::put(key.clone(), value.to_vec(), None),
            &key,
            guard,
        );
        let resp = self
            .endpoints
            .txn("create api key", self.timeout, txn)
            .await?;
        Ok(outcome(&resp, value, guard))
    }

    /// Replaces the record at `id` with `value` if it is still at
    /// `mod_revision` (and, with a `guard`, the security mode key still at
    /// that mod revision): as [`ApiKeyStore::create`], with
    /// [`KeyWrite::Conflict`] when the record changed in between.
    pub async fn replace(
        &self,
        id: &str,
        value: &[u8],
        mod_revision: i64,
        guard: Option<i64>,
    ) -> Result<KeyWrite, StoreError> {
        let key = keys::apikey(id);
        let txn = guarded(
            Compare::mod_revision(key.clone(), CompareOp::Equal, mod_revision),
            TxnOp::put(key.clone(), value.to_vec(), None),
            &key,
            guard,
        );
        let resp = self
            .endpoints
            .txn("update api key", self.timeout, txn)
            .await?;
        Ok(outcome(&resp, value, guard))
    }

    /// Follows the records from `from_revision` on, calling `apply` for
    /// each change in order, until the watch fails or etcd compacted past
    /// `from_revision` (`follow_key`).
    pub async fn follow(&self, from_revision: i64, mut apply: impl FnMut(KeyChange)) -> FollowEnd {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from_revision);
        let watched = Watched {
            what: "watch api keys",
            key: keys::apikeys_prefix(),
            opts,
        };
        follow_key(&self.endpoints, self.timeout, watched, |event| {
            let Some(key) = event.kv().and_then(stored) else {
                return;
            };
            match event.event_type() {
                EventType::Put => apply(KeyChange::Put(key)),
                // A delete event's key carries the revision of the delete
                // as its mod revision.
                EventType::Delete => apply(KeyChange::Delete(key.id, key.mod_revision)),
            }
        })
        .await
    }
}

/// How a guarded key write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyWrite {
    /// Written; the record's mod revision.
    Written(i64),
    /// The record was not as expected (another one has the id, or it
    /// changed since it was read); nothing written.
    Conflict,
    /// The cluster's security mode changed since the guard's revision;
    /// nothing written.
    ModeChanged,
}

/// One put of an API key record under `condition`, and the guard on the
/// security mode key when given; the failure branch reads the record (and
/// the mode key) back.
fn guarded(condition: Compare, put: TxnOp, key: &str, guard: Option<i64>) -> Txn {
    let mut when = vec![condition];
    let mut otherwise = vec![TxnOp::get(key, None)];
    if let Some(mode_revision) = guard {
        when.push(unchanged_since(mode_revision));
        otherwise.push(TxnOp::get(keys::AUTH_MODE, None));
    }
    Txn::new().when(when).and_then([put]).or_else(otherwise)
}

/// [`KeyWrite`] of a [`guarded`] transaction that wrote `value`.
fn outcome(resp: &etcd_client::TxnResponse, value: &[u8], guard: Option<i64>) -> KeyWrite {
    if let Some(revision) = written(resp, value) {
        return KeyWrite::Written(revision);
    }
    let Some(expected) = guard else {
        return KeyWrite::Conflict;
    };
    let mode_revision = resp
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .nth(1)
        .map(|get| get.kvs().first().map_or(0, |kv| kv.mod_revision()));
    match mode_revision {
        Some(at) if at != expected => KeyWrite::ModeChanged,
        _ => KeyWrite::Conflict,
    }
}

/// What [`follow_key`] watches: the operation's name (for logs and
/// errors), the key (or prefix)
/// and the watch options (start revision, prefix).
pub(super) struct Watched {
    pub(super) what: &'static str,
    pub(super) key: &'static str,
    pub(super) opts: WatchOptions,
}

/// Follows `watched`, calling `on_event` for each event in order, until the
/// watch fails or etcd compacted past its start revision. Like the holder
/// watch, a member that goes silent (hung) is asked for a progress report
/// after a request timeout and counts as failed after a second one.
pub(super) async fn follow_key(
    endpoints: &Endpoints,
    timeout: Duration,
    watched: Watched,
    mut on_event: impl FnMut(&etcd_client::Event),
) -> FollowEnd {
    let Watched { what, key, opts } = watched;
    let opened = endpoints
        .call_at(what, timeout, |mut c| {
            let opts = opts.clone();
            async move { c.watch(key, Some(opts)).await }
        })
        .await;
    let (mut stream, position) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            debug!(watch = what, error = %snowkeep_core::DisplayChain(&e), "watch failed to open on every endpoint");
            return FollowEnd::Failed;
        }
    };
    loop {
        let Some(message) = super::watch::next_message(&mut stream, timeout).await else {
            warn!(
                watch = what,
                endpoint = endpoints.url_at(position),
                "watch got no answer; reopening it on the next endpoint"
            );
            endpoints.failed_at(position);
            return FollowEnd::Failed;
        };
        match message {
            Ok(Some(resp)) if resp.canceled() => return FollowEnd::Compacted,
            Ok(Some(resp)) => resp.events().iter().for_each(&mut on_event),
            Ok(None) | Err(_) => {
                debug!(
                    watch = what,
                    endpoint = endpoints.url_at(position),
                    "watch stream failed; reopening it"
                );
                endpoints.failed_at(position);
                return FollowEnd::Failed;
            }
        }
    }
}

/// The mod revision of `value` as a write transaction of one put left it:
/// the transaction's revision when it committed; else, when the failure
/// branch's get found `value` itself (an earlier attempt of the same write
/// committed and its answer was lost), that key's mod revision; else `None`.
pub(super) fn written(resp: &etcd_client::TxnResponse, value: &[u8]) -> Option<i64> {
    if resp.succeeded() {
        return resp.header().map(|h| h.revision());
    }
    resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .filter(|kv| kv.value() == value)
            .map(|kv| kv.mod_revision()),
        _ => None,
    })
}

/// The compare that holds while the security-mode key is still at `mod_revision`
/// (0: still absent): the guard of a write that must not commit once the
/// mode changed since it was read.
pub(super) fn unchanged_since(mod_revision: i64) -> Compare {
    Compare::mod_revision(keys::AUTH_MODE, CompareOp::Equal, mod_revision)
}
