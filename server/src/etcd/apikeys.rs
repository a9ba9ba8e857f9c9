//! API key records in etcd (`/snowkeep/v1/apikeys/<id>`, JSON that
//! `crate::auth` parses) and the watch that follows them. This module moves
//! bytes only: what a record means is `crate::auth`'s.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tracing::{debug, warn};

use super::{keys, Endpoints, EtcdStore};
use crate::claim::StoreError;

/// One stored key record: its id (from the etcd key), value and mod revision.
#[derive(Debug, Clone)]
pub(crate) struct StoredKey {
    /// The key id.
    pub(crate) id: String,
    /// The stored JSON.
    pub(crate) value: Vec<u8>,
    /// Its mod revision (the guard of a compare-and-swap).
    pub(crate) mod_revision: i64,
}

/// A change seen by [`ApiKeyStore::follow`].
#[derive(Debug, Clone)]
pub(crate) enum KeyChange {
    /// A record was written.
    Put(StoredKey),
    /// A record was deleted: its id and the revision of the delete.
    Delete(String, i64),
}

/// Why [`ApiKeyStore::follow`] returned: the caller re-lists, then follows
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FollowEnd {
    /// The watch could not be opened or failed.
    Failed,
    /// etcd compacted past the revision asked for.
    Compacted,
}

/// Reads, writes and watches API key records.
#[derive(Clone)]
pub(crate) struct ApiKeyStore {
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
    pub(crate) fn api_keys(&self) -> ApiKeyStore {
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
    pub(crate) async fn list(&self) -> Result<(Vec<StoredKey>, i64), StoreError> {
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
    pub(crate) async fn get(&self, id: &str) -> Result<Option<StoredKey>, StoreError> {
        let key = keys::apikey(id);
        let resp = self
            .endpoints
            .call("read api key", self.timeout, |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        Ok(resp.kvs().first().and_then(stored))
    }

    /// Writes `value` at `id` when no record has that id: the record's mod
    /// revision when written (a retry that finds its own earlier write
    /// counts as written), `None` when another record was there (left as it
    /// is).
    pub(crate) async fn create(&self, id: &str, value: &[u8]) -> Result<Option<i64>, StoreError> {
        let key = keys::apikey(id);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), value.to_vec(), None)])
            .or_else([TxnOp::get(key, None)]);
        let resp = self
            .endpoints
            .txn("create api key", self.timeout, txn)
            .await?;
        Ok(written(&resp, value))
    }

    /// Replaces the record at `id` with `value` if it is still at
    /// `mod_revision`: the new record's mod revision when written (or found
    /// written by an earlier attempt of this call), `None` when it changed
    /// in between.
    pub(crate) async fn replace(
        &self,
        id: &str,
        value: &[u8],
        mod_revision: i64,
    ) -> Result<Option<i64>, StoreError> {
        let key = keys::apikey(id);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                mod_revision,
            )])
            .and_then([TxnOp::put(key.clone(), value.to_vec(), None)])
            .or_else([TxnOp::get(key, None)]);
        let resp = self
            .endpoints
            .txn("update api key", self.timeout, txn)
            .await?;
        Ok(written(&resp, value))
    }

    /// Follows the records from `from_revision` on, calling `apply` for
    /// each change in order, until the watch fails or etcd compacted past
    /// `from_revision`. Like the holder watch, a member that goes silent
    /// (hung) is asked for a progress report after a request timeout and
    /// counts as failed after a second one.
    pub(crate) async fn follow(
        &self,
        from_revision: i64,
        mut apply: impl FnMut(KeyChange),
    ) -> FollowEnd {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from_revision);
        let opened = self
            .endpoints
            .call_at("watch api keys", self.timeout, |mut c| {
                let opts = opts.clone();
                async move { c.watch(keys::apikeys_prefix(), Some(opts)).await }
            })
            .await;
        let (mut stream, position) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                debug!(error = %crate::DisplayChain(&e), "API key watch failed to open on every endpoint");
                return FollowEnd::Failed;
            }
        };
        loop {
            let message = match super::watch::next_message(&mut stream, self.timeout).await {
                Some(message) => message,
                None => {
                    warn!(
                        endpoint = self.endpoints.url_at(position),
                        "API key watch got no answer; reopening it on the next endpoint"
                    );
                    self.endpoints.failed_at(position);
                    return FollowEnd::Failed;
                }
            };
            match message {
                Ok(Some(resp)) if resp.canceled() => return FollowEnd::Compacted,
                Ok(Some(resp)) => {
                    for event in resp.events() {
                        let Some(kv) = event.kv() else { continue };
                        let Some(key) = stored(kv) else { continue };
                        match event.event_type() {
                            EventType::Put => apply(KeyChange::Put(key)),
                            // A delete event's key carries the revision
                            // of the delete as its mod revision.
                            EventType::Delete => apply(KeyChange::Delete(key.id, key.mod_revision)),
                        }
                    }
                }
                Ok(None) | Err(_) => {
                    debug!(
                        endpoint = self.endpoints.url_at(position),
                        "API key watch stream failed; reopening it"
                    );
                    self.endpoints.failed_at(position);
                    return FollowEnd::Failed;
                }
            }
        }
    }
}

/// The mod revision of `value` as a write transaction of one put left it:
/// the transaction's revision when it committed; else, when the failure
/// branch's get found `value` itself (an earlier attempt of the same write
/// committed and its answer was lost), that key's mod revision; else `None`.
fn written(resp: &etcd_client::TxnResponse, value: &[u8]) -> Option<i64> {
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
