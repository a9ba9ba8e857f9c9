//! The Lease API's records kept in etcd: [`RequesterLeases`] implements
//! `snowkeep_core::lease::records::RequesterStore` with etcd transactions.
//!
//! etcd names a requester by the SHA-256 of its identity ([`RequesterId`]),
//! never by the identity itself. A requester's machine ids hang off one etcd
//! lease with the requester's duration (first lease 10 min, renewed 48 h by
//! default): its holder keys (value `requester/{id}`), its record
//! `requester/{id}` = `id:floor,…` and its token key `token/{id}` = the
//! SHA-256 of its lease token. Renewing grants a new lease and moves every key
//! onto it in one transaction guarded by the old lease still owning them and
//! the token being unchanged, so a renewal either keeps all machine ids or
//! none, and the old lease is revoked.
//!
//! **Lease tokens.** Acquire draws 32 random bytes ([`LeaseToken`]), stores
//! only their SHA-256 and returns them once. Renew, Release, Check and an
//! Acquire retry act only for a caller that presents them (compared in
//! constant time); anyone else gets [`StoreError::TokenRefused`] and nothing
//! changes, so knowing a requester's identity grants nothing.
//!
//! **One grant per requester.** A new grant's transaction commits only while
//! the requester has no record, token (and, with an API key, no holding of
//! the key), and its claim never rebinds a holder key that already names the
//! requester. Of concurrent Acquires of one requester, one is granted; each
//! other revokes its own claim and is answered from the winner's record
//! (without the winner's token: [`StoreError::TokenRefused`]). Otherwise
//! each would replace the one before, whose machine ids would stay held on
//! its lease, counted in no holding.
//!
//! **Cost.** etcd holds one lease and `2 × machine ids + 2` keys per requester
//! that holds machine ids, and nothing for any other: a call from a requester
//! that holds nothing reads and never writes, and a refused call writes
//! nothing. Release deletes every key of the requester.
//!
//! **Fences.** The requester's generator stamps only up to the fence, which is
//! set to the lease's expiry plus [`FENCE_MARGIN`] before the grant is
//! returned. After the lease expires, a new holder waits at most the margin.
//! On release the requester reports its last timestamps and each fence is
//! lowered towards it ([`released_fence`]). The floor (previous holder's
//! fence) is kept in the record so a repeated Acquire returns the same floors.
//!
//! [`released_fence`]: snowkeep_core::lease::records::released_fence
//!
//! **Acting on a lease.** Every call that acts on a requester's lease (Renew,
//! Release, Check) reads its record (which carries the stored token hash) and
//! calls `Record::authorize` with the presented token before it reads or
//! writes anything else, the namespace record included; a further RPC of that
//! kind does the same.
//!
//! **Unreadable keys.** A requester reads only its own keys, so an unreadable
//! key of another machine id never fails its calls. An unreadable fence of its
//! own fails its Renew (with the key named) and is left as it is by its
//! Release, so that machine id stays out of use until an operator repairs it.

mod grant;
mod renewal;
mod store;

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{Layout, MachineId, Millis, SharedClock};
use tracing::{error, warn};

use super::keys::{self, decode_record, quoted};
use super::{Endpoints, EtcdStore};
use snowkeep_core::claim::StoreError;
use snowkeep_core::lease::records::{
    authorize, FenceRead, LeaseCheck, LeaseToken, RequesterId, FENCE_MARGIN,
};
use snowkeep_core::metrics::{self as m, KeyKind};
use snowkeep_core::text::{hex, unhex32};

/// How many times an Acquire with an API key counts its holdings again
/// after concurrent Acquires with the same key changed them.
const QUOTA_ATTEMPTS: u32 = 8;

/// The Lease API's view of etcd: its own copy of the endpoint clients.
#[derive(Clone)]
pub struct RequesterLeases {
    endpoints: Endpoints,
    clock: SharedClock,
    timeout: Duration,
    fence_horizon: Duration,
    max_fence_wait: Duration,
    /// This deployment's machine-id range (`--machine-id-range`): requesters
    /// get machine ids from it only, so deployments with separate etcd
    /// clusters stay disjoint.
    range: std::ops::Range<u32>,
}

impl std::fmt::Debug for RequesterLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequesterLeases").finish_non_exhaustive()
    }
}

/// A requester's record: its lease, machine ids with floors, and the stored
/// SHA-256 of its lease token (`None` when no token key is on its lease).
#[derive(Debug, PartialEq, Eq)]
struct Record {
    lease_id: i64,
    ids: Vec<(MachineId, Millis)>,
    token: Option<[u8; 32]>,
    /// The API key it acquired with (`;key=…` in the record).
    key_id: Option<String>,
    /// The requester's description ([`keys::about`]) when one is on the
    /// record's lease: moved with the record, never compared.
    about: Option<Vec<u8>>,
}

impl Record {
    fn machine_ids(&self) -> Vec<MachineId> {
        self.ids.iter().map(|&(id, _)| id).collect()
    }

    /// The guard of a transaction that changes this record: its holder keys,
    /// the record and the token key are all still on the record's etcd
    /// lease, and the token key still holds the token's hash.
    fn unchanged(&self, ns: &str, requester_key: &str) -> Vec<Compare> {
        let on_lease = |key: String| Compare::lease(key, CompareOp::Equal, self.lease_id);
        let tk = keys::token(ns, requester_key);
        let mut guard: Vec<Compare> = self
            .ids
            .iter()
            .map(|&(machine_id, _)| on_lease(keys::holder(ns, machine_id)))
            .collect();
        guard.push(on_lease(keys::requester(ns, requester_key)));
        guard.push(on_lease(tk.clone()));
        guard.push(Compare::value(
            tk,
            CompareOp::Equal,
            hex(&self.token.unwrap_or_default()),
        ));
        guard
    }

    /// Checks `token` against the stored hash ([`authorize`]).
    fn authorize(&self, token: Option<&LeaseToken>) -> Result<(), StoreError> {
        authorize(self.token.as_ref(), token)
    }
}

/// Logs an unreadable key of `kind` in `namespace` with its full name, counts
/// it in `snowkeep_corrupt_keys_total`, and returns the error naming it.
pub(super) fn corrupt_key(namespace: &str, kind: KeyKind, key: &str, value: &[u8]) -> StoreError {
    m::count_corrupt(namespace, kind, 1);
    let value = quoted(value);
    error!(namespace, kind = kind.as_str(), key, value, "unreadable key in etcd: repair or delete it (a fence only once no holder uses its machine id)");
    StoreError::Corrupt {
        key: key.to_owned(),
        value,
    }
}

/// Counts and logs `e` when it is an unreadable namespace record (kind
/// `layout` of `snowkeep_corrupt_keys_total`, the key named in full); returns it.
fn note_corrupt_namespace(namespace: &str, e: StoreError) -> StoreError {
    if let StoreError::CorruptNamespace {
        key,
        value,
        problem,
    } = &e
    {
        m::count_corrupt(namespace, KeyKind::Layout, 1);
        let value = quoted(value.as_bytes());
        error!(
            namespace,
            kind = KeyKind::Layout.as_str(),
            key,
            value,
            problem,
            "unreadable namespace record in etcd: repair it"
        );
    }
    e
}

/// Parses the namespace record at `key` of `namespace`; an unreadable one is
/// counted and logged ([`note_corrupt_namespace`]).
fn namespace_record(
    namespace: &str,
    key: &str,
    value: &[u8],
) -> Result<super::namespace::NamespaceRecord, StoreError> {
    super::namespace::NamespaceRecord::parse(key, value)
        .map_err(|e| note_corrupt_namespace(namespace, e))
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs().max(1)).unwrap_or(i64::MAX)
}

/// The key-values of a transaction's `i`-th get: `(value, lease)` of its first key.
fn got(ops: &[TxnOpResponse], i: usize) -> Option<(Vec<u8>, i64)> {
    match ops.get(i) {
        Some(TxnOpResponse::Get(get)) => get
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.lease())),
        _ => None,
    }
}

impl RequesterLeases {
    /// Shares the store's endpoints (a separate copy, so API calls never wait
    /// behind the server's own claim loop), and creates the server's
    /// namespace's Lease API series.
    pub fn new(store: &EtcdStore) -> Self {
        m::init_namespace(&store.settings.namespace);
        Self {
            endpoints: store.endpoints.clone(),
            clock: store.clock.clone(),
            timeout: store.settings.request_timeout,
            fence_horizon: store.settings.fence_horizon,
            max_fence_wait: store.settings.max_fence_wait,
            range: store.settings.machine_id_range.clone(),
        }
    }

    /// Reads the requester's record and token key together (one transaction,
    /// so at one revision); `None` when it holds nothing.
    async fn record(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
    ) -> Result<Option<Record>, StoreError> {
        let key = keys::requester(namespace, &requester.key());
        let token_key = keys::token(namespace, &requester.key());
        let gets = vec![
            TxnOp::get(key.clone(), None),
            TxnOp::get(token_key.clone(), None),
            TxnOp::get(keys::about(namespace, &requester.key()), None),
        ];
        let resp = self
            .endpoints
            .txn("read requester", self.timeout, Txn::new().and_then(gets))
            .await?;
        let ops = resp.op_responses();
        let Some((value, lease_id)) = got(&ops, 0) else {
            return Ok(None);
        };
        let ids = decode_record(&key, &value)
            .map_err(|_| corrupt_key(namespace, KeyKind::Requester, &key, &value))?;
        let token = match got(&ops, 1) {
            // Only a token on the record's own lease belongs to this grant.
            Some((hash, lease)) if lease == lease_id => Some(
                std::str::from_utf8(&hash)
                    .ok()
                    .and_then(unhex32)
                    .ok_or_else(|| corrupt_key(namespace, KeyKind::Token, &token_key, &hash))?,
            ),
            _ => None,
        };
        let about = got(&ops, 2)
            .filter(|&(_, lease)| lease == lease_id)
            .map(|(value, _)| value);
        Ok(Some(Record {
            lease_id,
            ids,
            token,
            key_id: keys::record_key_id(&value),
            about,
        }))
    }

    /// Reads the requester's record and checks `token` against it
    /// ([`Record::authorize`]), before anything else of a call that acts on
    /// its lease: [`StoreError::TokenRefused`] when it holds machine ids and
    /// the token is missing or wrong; `None` when it holds nothing.
    async fn authorized(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        token: Option<&LeaseToken>,
    ) -> Result<Option<Record>, StoreError> {
        let record = self.record(namespace, requester).await?;
        if let Some(record) = &record {
            record.authorize(token)?;
        }
        Ok(record)
    }

    /// Reads the fences of `ids` (one transaction of gets). An unreadable one
    /// is logged with its key and counted.
    async fn own_fences(
        &mut self,
        namespace: &str,
        ids: &[MachineId],
    ) -> Result<HashMap<MachineId, FenceRead>, StoreError> {
        let fence_keys: Vec<String> = ids.iter().map(|&id| keys::fence(namespace, id)).collect();
        let txn = Txn::new().and_then(
            fence_keys
                .iter()
                .map(|k| TxnOp::get(k.clone(), None))
                .collect::<Vec<_>>(),
        );
        let resp = self
            .endpoints
            .txn("read own fences", self.timeout, txn)
            .await?;
        let ops = resp.op_responses();
        Ok(ids
            .iter()
            .zip(&fence_keys)
            .enumerate()
            .map(|(i, (&id, key))| {
                let read = match got(&ops, i) {
                    None => FenceRead::Missing,
                    Some((value, _)) => match keys::decode_fence(key, &value) {
                        Ok(fence) => FenceRead::Value(fence),
                        Err(_) => match corrupt_key(namespace, KeyKind::Fence, key, &value) {
                            StoreError::Corrupt { value, .. } => FenceRead::Corrupt(value),
                            _ => FenceRead::Corrupt(String::new()),
                        },
                    },
                };
                (id, read)
            })
            .collect())
    }

    /// Time left on a lease (zero when unknown or gone).
    async fn remaining(&mut self, lease_id: i64) -> Duration {
        let ttl = self
            .endpoints
            .call("lease ttl", self.timeout, |mut c| async move {
                c.lease_time_to_live(lease_id, None).await
            })
            .await;
        ttl.map(|t| Duration::from_secs(u64::try_from(t.ttl()).unwrap_or(0)))
            .unwrap_or_default()
    }

    async fn grant_lease(&mut self, duration: Duration) -> Result<i64, StoreError> {
        let ttl = secs(duration);
        let lease = self
            .endpoints
            .call("lease grant", self.timeout, |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?;
        Ok(lease.id())
    }

    async fn revoke(&mut self, lease_id: i64) {
        if let Err(e) = self.endpoints.revoke(self.timeout, lease_id).await {
            warn!(lease_id, error = %snowkeep_core::DisplayChain(&e), "could not revoke a requester lease; it expires by itself");
        }
    }

    fn now(&self, layout: &Layout) -> Millis {
        self.clock.layout_ms(layout)
    }

    fn fence_for(&self, layout: &Layout, duration: Duration) -> Millis {
        self.now(layout).saturating_add(duration + FENCE_MARGIN)
    }

    /// This deployment's range, cut to the machine ids `layout` has.
    fn range_in(&self, layout: &Layout) -> std::ops::Range<u32> {
        let count = layout.machine_id_count();
        self.range.start.min(count)..self.range.end.min(count)
    }
}

// The namespace record and the holder check (the rollback detection).
impl RequesterLeases {
    /// The namespace record, after the rollback check of every Lease API call
    /// that claims, renews or checks: [`StoreError::UnknownNamespace`] when
    /// absent, [`StoreError::NamespaceRolledBack`] when rolled back or found
    /// restored now (then marked).
    async fn namespace(
        &mut self,
        namespace: &str,
    ) -> Result<super::namespace::NamespaceRecord, StoreError> {
        let unix_ms = self.clock.unix_ms();
        super::namespace::guard(&self.endpoints, self.timeout, namespace, unix_ms)
            .await
            .map(|(record, _)| record)
            .map_err(|e| note_corrupt_namespace(namespace, e))
    }

    /// The namespace record when a lease granted in `incarnation` (0 skips
    /// the comparison) can stand in it, else why not: the namespace does not
    /// exist or is another incarnation ([`LeaseCheck::NamespaceGone`]), or is
    /// rolled back ([`LeaseCheck::RolledBack`]). An answer, not an error:
    /// holders retry errors and would go on issuing up to their fence.
    async fn standing(
        &mut self,
        namespace: &str,
        incarnation: u64,
    ) -> Result<Result<super::namespace::NamespaceRecord, LeaseCheck>, StoreError> {
        match self.namespace(namespace).await {
            Ok(record)
                if incarnation != 0
                    && record.incarnation != 0
                    && incarnation != record.incarnation =>
            {
                Ok(Err(LeaseCheck::NamespaceGone))
            }
            Ok(record) => Ok(Ok(record)),
            Err(StoreError::UnknownNamespace { .. }) => Ok(Err(LeaseCheck::NamespaceGone)),
            Err(StoreError::NamespaceRolledBack { .. }) => Ok(Err(LeaseCheck::RolledBack)),
            Err(e) => Err(e),
        }
    }

    /// Refuses a new claim while the namespace's confirmed floor is further
    /// ahead than `--max-fence-wait` ([`StoreError::NamespaceFloorAhead`],
    /// UNAVAILABLE: retry once the clock is within it).
    fn check_floor(
        &self,
        namespace: &str,
        record: &super::namespace::NamespaceRecord,
    ) -> Result<(), StoreError> {
        let now = self.clock.layout_ms(&record.layout);
        let ahead = Duration::from_millis(record.floor.get().saturating_sub(now.get()));
        if ahead > self.max_fence_wait {
            return Err(StoreError::NamespaceFloorAhead {
                namespace: namespace.to_owned(),
                until: snowkeep_core::text::rfc3339(record.layout.to_unix_ms(record.floor)),
                ahead,
                max: self.max_fence_wait,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
