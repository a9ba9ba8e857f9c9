//! The cluster's security mode in etcd (`/snowkeep/v1/auth-mode`): read,
//! written with a compare-and-swap on its mod revision (and, to turn keys
//! on, on the admin key record that made it safe), and followed with a
//! watch. This module moves bytes only: what a value means is
//! the server's (`auth::cluster`).

use std::time::Duration;

use etcd_client::{Compare, CompareOp, EventType, Txn, TxnOp, WatchOptions};

use super::apikeys::{follow_key, unchanged_since, written, FollowEnd, Watched};
use super::{keys, Endpoints, EtcdStore};
use snowkeep_core::claim::StoreError;

/// The stored mode as read: its value (`None` when the key is absent) and
/// mod revision (0 when absent), the guard of a compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMode {
    /// The stored bytes, `None` when absent.
    pub value: Option<Vec<u8>>,
    /// Its mod revision, 0 when absent.
    pub mod_revision: i64,
}

/// Reads, writes and follows the mode key.
#[derive(Clone)]
pub struct AuthModeStore {
    endpoints: Endpoints,
    timeout: Duration,
}

impl std::fmt::Debug for AuthModeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthModeStore").finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// The cluster's security mode key, on the store's endpoints.
    pub fn auth_mode(&self) -> AuthModeStore {
        AuthModeStore {
            endpoints: self.endpoints.clone(),
            timeout: self.settings.request_timeout,
        }
    }
}

fn stored(kv: Option<&etcd_client::KeyValue>) -> StoredMode {
    match kv {
        Some(kv) => StoredMode {
            value: Some(kv.value().to_vec()),
            mod_revision: kv.mod_revision(),
        },
        None => StoredMode {
            value: None,
            mod_revision: 0,
        },
    }
}

impl AuthModeStore {
    /// The stored mode, and the etcd revision it was read at (a linearized
    /// read: a change committed before the call is seen).
    pub async fn read(&self) -> Result<(StoredMode, i64), StoreError> {
        let (kv, revision) = self
            .endpoints
            .get_key("read auth mode", self.timeout, keys::AUTH_MODE)
            .await?;
        Ok((stored(kv.as_ref()), revision))
    }

    /// Writes `value` if the key is still at `expected` (its mod revision,
    /// 0 for absent) and, with a `guard` (an API key's id and the mod
    /// revision its record was judged at), that key's record is unchanged
    /// too: `Ok(mod revision)` when written (or found written by an earlier
    /// attempt of this call), `Err(what is stored)` when either changed in
    /// between (the caller reads both again).
    pub async fn write(
        &self,
        value: &[u8],
        expected: i64,
        guard: Option<(&str, i64)>,
    ) -> Result<Result<i64, StoredMode>, StoreError> {
        let mut compares = vec![unchanged_since(expected)];
        if let Some((key_id, mod_revision)) = guard {
            compares.push(Compare::mod_revision(
                keys::apikey(key_id),
                CompareOp::Equal,
                mod_revision,
            ));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::put(keys::AUTH_MODE, value.to_vec(), None)])
            .or_else([TxnOp::get(keys::AUTH_MODE, None)]);
        let resp = self
            .endpoints
            .txn("write auth mode", self.timeout, txn)
            .await?;
        if let Some(revision) = written(&resp, value) {
            return Ok(Ok(revision));
        }
        let current = resp.op_responses().into_iter().find_map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => Some(stored(get.kvs().first())),
            _ => None,
        });
        Ok(Err(current.unwrap_or(StoredMode {
            value: None,
            mod_revision: 0,
        })))
    }

    /// Follows the key from `from_revision` on, calling `apply` with each
    /// change in order, until the watch fails or etcd compacted past
    /// `from_revision`; the caller reads it again, then follows again.
    pub async fn follow(&self, from_revision: i64, mut apply: impl FnMut(StoredMode)) -> FollowEnd {
        let watched = Watched {
            what: "watch auth mode",
            key: keys::AUTH_MODE,
            opts: WatchOptions::new().with_start_revision(from_revision),
        };
        follow_key(&self.endpoints, self.timeout, watched, |event| {
            let Some(kv) = event.kv() else { return };
            match event.event_type() {
                EventType::Put => apply(stored(Some(kv))),
                // Absent again: the guard of a next write is 0.
                EventType::Delete => apply(stored(None)),
            }
        })
        .await
    }
}
