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

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{Layout, MachineId, Millis, SharedClock};
use tracing::{error, info, warn};

use super::keys::{self, decode_record, encode_record, quoted};
use super::pool::ClaimReads;
use super::{claim_ids, ClaimRequest, Endpoints, EtcdStore};
use snowkeep_core::claim::{Capacity, HeldId, StoreError};
use snowkeep_core::lease::records::{
    authorize, released_fence, FenceRead, KeyQuota, LeaseCheck, LeaseToken, Renewal,
    RequesterAbout, RequesterGrant, RequesterId, RequesterStore, FENCE_MARGIN, MAX_REQUESTER_IDS,
};
use snowkeep_core::metrics::{self as m, KeyKind};
use snowkeep_core::text::{hex, unhex32};

/// How many times an Acquire with an API key counts its holdings again
/// after concurrent Acquires with the same key changed them.
const QUOTA_ATTEMPTS: u32 = 8;

/// How one claim of a new requester's machine ids ended
/// ([`RequesterLeases::claim_new`]).
enum NewClaim {
    /// Granted: the machine ids and the new lease token.
    Granted(Vec<HeldId>, LeaseToken),
    /// Another holding of the API key was written since the count: count
    /// again.
    QuotaRaced,
    /// Another grant of the requester was committed first (or an ended
    /// grant's keys were in the way, now revoked): read its record again.
    RequesterRaced,
}

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
        layout
            .to_layout_ms(self.clock.unix_ms())
            .unwrap_or_default()
    }

    fn fence_for(&self, layout: &Layout, duration: Duration) -> Millis {
        let ahead = u64::try_from((duration + FENCE_MARGIN).as_millis()).unwrap_or(u64::MAX);
        Millis(self.now(layout).get().saturating_add(ahead))
    }

    /// Moves every key of `record` onto a new lease of `duration` and raises
    /// the fences, in one transaction guarded by the old lease and the token;
    /// all or nothing.
    async fn extend(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        mut record: Record,
        layout: Layout,
        duration: Duration,
    ) -> Result<RequesterGrant, StoreError> {
        // A concurrent renewal by the same requester (a Renew racing its own
        // Acquire retry) moves the keys to another lease first: follow it
        // rather than declare the lease void. Each lost race means another
        // renewal won, so this is progress; the bound only stops a livelock.
        for _ in 0..64 {
            match self
                .extend_once(namespace, requester, &record, layout, duration)
                .await?
            {
                Some(grant) => return Ok(grant),
                None => match self.record(namespace, requester).await? {
                    Some(fresh)
                        if fresh.lease_id != record.lease_id
                            && fresh.ids == record.ids
                            && fresh.token == record.token =>
                    {
                        record = fresh;
                    }
                    _ => break,
                },
            }
        }
        // A key changed under the requester: give back whatever is left and
        // answer "you hold nothing", a definitive stop.
        warn!(
            namespace,
            requester = %requester.tag(),
            "requester's keys changed; its lease is void"
        );
        self.revoke(record.lease_id).await;
        Ok(RequesterGrant::nothing(duration, layout))
    }

    /// One attempt of [`Self::extend`]: `None` when the guard failed.
    async fn extend_once(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        record: &Record,
        layout: Layout,
        duration: Duration,
    ) -> Result<Option<RequesterGrant>, StoreError> {
        let current = self.own_fences(namespace, &record.machine_ids()).await?;
        // A fence of its own that cannot be read cannot be kept from going
        // down: refuse (naming the key) before anything is granted or written.
        for (&id, read) in &current {
            if let FenceRead::Corrupt(value) = read {
                return Err(StoreError::Corrupt {
                    key: keys::fence(namespace, id),
                    value: value.clone(),
                });
            }
        }
        let new_lease = self.grant_lease(duration).await?;
        let fence = self.fence_for(&layout, duration);
        let holder = keys::requester_holder(&requester.key());
        let held: Vec<HeldId> = record
            .ids
            .iter()
            .map(|&(machine_id, floor)| HeldId {
                machine_id,
                floor,
                // Never lower a fence while it is held.
                fence: match current.get(&machine_id) {
                    Some(FenceRead::Value(f)) => fence.max(*f),
                    _ => fence,
                },
            })
            .collect();
        let ns = namespace.to_owned();
        let on_new_lease = || Some(PutOptions::new().with_lease(new_lease));
        let guard = record.unchanged(&ns, &requester.key());
        let mut ops = Vec::new();
        for h in &held {
            let hk = keys::holder(&ns, h.machine_id);
            ops.push(TxnOp::put(hk, holder.clone(), on_new_lease()));
            ops.push(TxnOp::put(
                keys::fence(&ns, h.machine_id),
                h.fence.get().to_string(),
                None,
            ));
        }
        let rk = keys::requester(&ns, &requester.key());
        ops.push(TxnOp::put(
            rk.clone(),
            encode_record(&held, record.key_id.as_deref()),
            on_new_lease(),
        ));
        ops.push(TxnOp::put(
            keys::token(&ns, &requester.key()),
            hex(&record.token.unwrap_or_default()),
            on_new_lease(),
        ));
        // The description and key holding move in a transaction of their
        // own (move_hold): with 63 machine ids this one has 128 operations.
        // The failure branch reads the record: a transaction retried on
        // another endpoint after its first attempt committed (and the answer
        // was lost) finds the record already on the new lease, which only
        // this renewal knows.
        let txn = Txn::new()
            .when(guard)
            .and_then(ops)
            .or_else([TxnOp::get(rk, None)]);
        let resp = self
            .endpoints
            .txn("requester renew txn", self.timeout, txn)
            .await;
        let grant = RequesterGrant {
            held,
            duration,
            layout,
            token: None,
            known: false,
        };
        let committed = |r: &etcd_client::TxnResponse| {
            r.succeeded()
                || r.op_responses().iter().any(|op| match op {
                    TxnOpResponse::Get(get) => get.kvs().iter().any(|kv| kv.lease() == new_lease),
                    _ => false,
                })
        };
        match resp {
            Ok(r) if committed(&r) => {
                self.move_hold(namespace, requester, record, new_lease, grant.held.len())
                    .await?;
                self.revoke(record.lease_id).await;
                Ok(Some(grant))
            }
            Ok(_) => {
                self.revoke(new_lease).await;
                Ok(None)
            }
            Err(e) => {
                // The transaction may have committed before the answer was
                // lost: then the keys are on the new lease, and revoking it
                // would delete them under a healthy requester.
                if let Ok(Some(now)) = self.record(namespace, requester).await {
                    if now.lease_id == new_lease {
                        self.move_hold(namespace, requester, record, new_lease, grant.held.len())
                            .await?;
                        self.revoke(record.lease_id).await;
                        return Ok(Some(grant));
                    }
                }
                self.revoke(new_lease).await;
                Err(e)
            }
        }
    }

    /// An Acquire of a requester that holds machine ids (`record`): with
    /// its `token`, the same machine ids with the lease reset to `duration`
    /// (never shortened) and the same token; [`StoreError::TokenRefused`]
    /// without it and [`StoreError::CountMismatch`] for another `count`,
    /// with nothing changed.
    #[allow(clippy::too_many_arguments)]
    async fn acquire_again(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &RequesterId,
        record: Record,
        count: u32,
        duration: Duration,
        token: Option<&LeaseToken>,
    ) -> Result<RequesterGrant, StoreError> {
        record.authorize(token)?;
        if record.ids.len() != count as usize {
            return Err(StoreError::CountMismatch {
                held: record.ids.len(),
                asked: count,
            });
        }
        // A repeated Acquire never shortens a live lease: a late retry
        // (10 min) after a Renew (48 h) would cut the lease that the
        // Renew's answer promised. (A Renew sets its own duration, which
        // its answer reports.)
        let duration = duration.max(self.remaining(record.lease_id).await);
        let mut grant = self
            .extend(namespace, requester, record, layout, duration)
            .await?;
        grant.known = !grant.held.is_empty();
        if grant.known {
            grant.token = token.cloned();
        }
        Ok(grant)
    }

    /// One claim of a new requester's machine ids: a lease, the claim
    /// transactions, then the fences, record, token, description (and, with
    /// a quota, the key's holding) in one transaction, which commits only
    /// while the requester has no record, token (or holding of the key):
    /// each put would replace another grant's and leave that grant's machine
    /// ids held and counted nowhere. [`NewClaim::QuotaRaced`] when another
    /// holding of the key was written since `counted`'s revision,
    /// [`NewClaim::RequesterRaced`] when another grant of the requester was
    /// committed first (or keys of an ended grant were still there: their
    /// lease is revoked); nothing is left claimed then, nor on an error.
    #[allow(clippy::too_many_arguments)]
    async fn claim_new(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &RequesterId,
        count: u32,
        duration: Duration,
        counted: Option<(&KeyQuota, i64)>,
        about: &RequesterAbout,
    ) -> Result<NewClaim, StoreError> {
        let lease_id = self.grant_lease(duration).await?;
        let holder = keys::requester_holder(&requester.key());
        let now = self.now(&layout);
        let (absent_floor, max_floor) =
            ClaimRequest::floors(now, self.fence_horizon, self.max_fence_wait);
        let want = ClaimRequest {
            namespace,
            holder: &holder,
            range: self.range_in(&layout),
            count: count as usize,
            lease_id,
            now,
            absent_floor,
            max_floor,
            max_own_floor: max_floor,
            prefer: &[],
            take_own: false,
            known: &[],
            index: false,
        };
        let claimed = claim_ids(
            &self.endpoints,
            self.timeout,
            want,
            &mut ClaimReads::default(),
        )
        .await;
        let held = match claimed {
            Ok(claimed) => claimed.held,
            Err(e) => {
                self.revoke(lease_id).await;
                return Err(e);
            }
        };
        let fence = self.fence_for(&layout, duration);
        let held: Vec<HeldId> = held
            .into_iter()
            .map(|h| HeldId {
                fence: fence.max(h.floor),
                ..h
            })
            .collect();
        let token = LeaseToken::generate();
        let ns = namespace.to_owned();
        let on_lease = || Some(PutOptions::new().with_lease(lease_id));
        let mut ops: Vec<TxnOp> = held
            .iter()
            .map(|h| {
                TxnOp::put(
                    keys::fence(&ns, h.machine_id),
                    h.fence.get().to_string(),
                    None,
                )
            })
            .collect();
        let key_id = counted.map(|(q, _)| q.key_id.as_str());
        let rk = keys::requester(&ns, &requester.key());
        let tk = keys::token(&ns, &requester.key());
        ops.push(TxnOp::put(
            rk.clone(),
            encode_record(&held, key_id),
            on_lease(),
        ));
        ops.push(TxnOp::put(tk.clone(), hex(&token.digest()), on_lease()));
        ops.push(TxnOp::put(
            keys::about(&ns, &requester.key()),
            serde_json::to_vec(about).unwrap_or_default(),
            on_lease(),
        ));
        let absent = |key: &str| Compare::version(key, CompareOp::Equal, 0);
        let mut guard: Vec<Compare> = held
            .iter()
            .map(|h| Compare::lease(keys::holder(&ns, h.machine_id), CompareOp::Equal, lease_id))
            .collect();
        guard.push(absent(&rk));
        guard.push(absent(&tk));
        // The failure branch reads what the guard is about (compares are
        // free; these gets are the else branch's only operations): the
        // record and token, then the key's holding and holdings.
        let mut on_failure = vec![TxnOp::get(rk, None), TxnOp::get(tk, None)];
        if let Some((q, revision)) = counted {
            let prefix = keys::key_holds_prefix(&q.key_id);
            let hold = keys::key_hold(&q.key_id, &ns, &requester.key());
            ops.push(TxnOp::put(hold.clone(), held.len().to_string(), on_lease()));
            guard.push(absent(&hold));
            guard.push(
                Compare::mod_revision(prefix.clone(), CompareOp::Less, revision + 1).with_prefix(),
            );
            on_failure.push(TxnOp::get(hold, None));
            on_failure.push(TxnOp::get(prefix, Some(GetOptions::new().with_prefix())));
        }
        let txn = Txn::new().when(guard).and_then(ops).or_else(on_failure);
        let resp = self
            .endpoints
            .txn("requester fence txn", self.timeout, txn)
            .await;
        let r = match resp {
            Ok(r) if r.succeeded() => return Ok(NewClaim::Granted(held, token)),
            Ok(r) => r,
            Err(e) => {
                // Had the transaction committed before the answer was
                // lost, every key of the grant is on this claim's lease:
                // revoking it takes back a grant nobody was told about.
                self.revoke(lease_id).await;
                return Err(e);
            }
        };
        let ops = r.op_responses();
        match got(&ops, 0) {
            // A retry of this transaction (on another endpoint) after its
            // first attempt committed and the answer was lost.
            Some((_, lease)) if lease == lease_id => return Ok(NewClaim::Granted(held, token)),
            // Another Acquire of this requester was granted first.
            Some(_) => {
                self.revoke(lease_id).await;
                info!(namespace, requester = %requester.tag(), "another Acquire of this requester was granted first; gave back this one's claim");
                return Ok(NewClaim::RequesterRaced);
            }
            None => {}
        }
        self.revoke(lease_id).await;
        // No record, but its token (or the key's holding) is still there:
        // what a grant that ended (Release, or a lease declared void) left
        // while its lease's revocation failed or is under way. Nothing of a
        // live grant is on that lease (its record is gone), so revoke it
        // and claim again.
        let leftover = [1, 2]
            .into_iter()
            .filter(|&i| i == 1 || counted.is_some())
            .find_map(|i| got(&ops, i));
        if let Some((_, left)) = leftover.filter(|&(_, left)| left != 0) {
            warn!(namespace, requester = %requester.tag(), lease_id = left, "keys of an ended grant of this requester are still in etcd; revoking their lease");
            self.revoke(left).await;
            return Ok(NewClaim::RequesterRaced);
        }
        let raced = counted.is_some_and(|(_, revision)| {
            ops.iter().skip(3).any(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().iter().any(|kv| kv.mod_revision() > revision),
                _ => false,
            })
        });
        if raced {
            return Ok(NewClaim::QuotaRaced);
        }
        Err(StoreError::LeaseLost {
            reason: snowkeep_core::claim::LossReason::HolderChanged,
        })
    }

    /// After a renewal moved `record`'s keys onto `new_lease`: puts its API
    /// key holding (when it acquired with a key) and its description (when
    /// it has one) on the new lease too, in a transaction of its own (a
    /// 63-id renewal's uses all 128 operations etcd allows), guarded by the
    /// record being on the new lease. On an error the old lease must not be
    /// revoked: it keeps the holding alive (counted, never under-counted)
    /// until the caller's retry moves it.
    async fn move_hold(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        record: &Record,
        new_lease: i64,
        held: usize,
    ) -> Result<(), StoreError> {
        let on_new_lease = || Some(PutOptions::new().with_lease(new_lease));
        let mut ops = Vec::new();
        if let Some(key_id) = &record.key_id {
            ops.push(TxnOp::put(
                keys::key_hold(key_id, namespace, &requester.key()),
                held.to_string(),
                on_new_lease(),
            ));
        }
        if let Some(about) = &record.about {
            ops.push(TxnOp::put(
                keys::about(namespace, &requester.key()),
                about.clone(),
                on_new_lease(),
            ));
        }
        if ops.is_empty() {
            return Ok(());
        }
        let rk = keys::requester(namespace, &requester.key());
        let txn = Txn::new()
            .when([Compare::lease(rk, CompareOp::Equal, new_lease)])
            .and_then(ops);
        self.endpoints
            .txn("move key holding", self.timeout, txn)
            .await
            .map(|_| ())
    }

    /// The machine ids `quota`'s key holds through the Lease API now,
    /// cluster-wide, and the revision they were counted at; an unreadable
    /// holding counts as [`MAX_REQUESTER_IDS`] (never under-counted).
    async fn key_holdings(&mut self, quota: &KeyQuota) -> Result<(u32, i64), StoreError> {
        let prefix = keys::key_holds_prefix(&quota.key_id);
        let resp = self
            .endpoints
            .call("count key holdings", self.timeout, |mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let held = resp
            .kvs()
            .iter()
            .map(|kv| {
                std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or_else(|| {
                        warn!(key = %String::from_utf8_lossy(kv.key()), value = %quoted(kv.value()), "unreadable API key holding: counted as {MAX_REQUESTER_IDS} machine ids until its lease ends");
                        MAX_REQUESTER_IDS
                    })
            })
            .fold(0u32, u32::saturating_add);
        Ok((held, revision))
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
        let now = record
            .layout
            .to_layout_ms(self.clock.unix_ms())
            .unwrap_or_default();
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

impl RequesterStore for RequesterLeases {
    async fn admit(&mut self, namespace: &str) -> Result<u64, StoreError> {
        let record = self.namespace(namespace).await?;
        self.check_floor(namespace, &record)?;
        Ok(record.incarnation)
    }

    /// The namespace's layout; [`StoreError::UnknownNamespace`] when none is recorded.
    async fn layout(&mut self, namespace: &str) -> Result<Layout, StoreError> {
        let key = keys::layout(namespace);
        let resp = self
            .endpoints
            .call("read layout", self.timeout, |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        let kv = resp
            .kvs()
            .first()
            .ok_or_else(|| StoreError::UnknownNamespace {
                namespace: namespace.to_owned(),
            })?;
        Ok(namespace_record(namespace, &key, kv.value())?.layout)
    }

    /// Claims `count` machine ids for `requester` for `duration` and returns
    /// them with a new lease token. When the requester already holds machine
    /// ids, a call presenting their `token` gets them back with the lease
    /// reset to `duration` (an idempotent retry; the same token), failing
    /// with [`StoreError::CountMismatch`] when it holds a different number;
    /// without the token it fails with [`StoreError::TokenRefused`] and
    /// nothing changes. `layout` is the namespace's, as [`Self::layout`] read it.
    async fn acquire(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &RequesterId,
        count: u32,
        duration: Duration,
        token: Option<&LeaseToken>,
        quota: Option<&KeyQuota>,
        about: &RequesterAbout,
    ) -> Result<RequesterGrant, StoreError> {
        // With a quota: count the key's holdings, claim, and commit the
        // claim's holding only if no holding of the key was written since
        // the count (etcd compares the whole prefix), so the holdings
        // committed never exceed the quota; a lost race counts again.
        // Every claim also commits only while the requester has no record:
        // of concurrent Acquires of one requester, one is granted and the
        // others read its record again and are answered from it (without
        // its token: refused).
        let mut attempts = 0;
        let mut requester_races = 0;
        let (held, token) = loop {
            if let Some(record) = self.record(namespace, requester).await? {
                return self
                    .acquire_again(namespace, layout, requester, record, count, duration, token)
                    .await;
            }
            let counted = match quota {
                Some(q) => {
                    let (held, revision) = self.key_holdings(q).await?;
                    if held.saturating_add(count) > q.max {
                        return Err(StoreError::KeyQuotaExceeded {
                            key_id: q.key_id.clone(),
                            held,
                            max: q.max,
                            asked: count,
                        });
                    }
                    Some((q, revision))
                }
                None => None,
            };
            match self
                .claim_new(
                    namespace, layout, requester, count, duration, counted, about,
                )
                .await?
            {
                NewClaim::Granted(held, token) => break (held, token),
                NewClaim::QuotaRaced => {
                    attempts += 1;
                    if attempts >= QUOTA_ATTEMPTS {
                        return Err(StoreError::KeyQuotaContended {
                            key_id: quota.map(|q| q.key_id.clone()).unwrap_or_default(),
                            attempts,
                        });
                    }
                }
                NewClaim::RequesterRaced => {
                    // Each lost race means another Acquire of this requester
                    // was granted; its record answers the next pass. The
                    // bound only stops a livelock (granted and released
                    // again each time).
                    requester_races += 1;
                    if requester_races >= QUOTA_ATTEMPTS {
                        return Err(StoreError::TokenRefused {
                            reason: "other Acquires of this requester were granted first",
                        });
                    }
                }
            }
        };
        info!(namespace, requester = %requester.tag(), machine_ids = ?held.iter().map(|h| h.machine_id.get()).collect::<Vec<_>>(), "leased machine ids to a requester");
        Ok(RequesterGrant {
            held,
            duration,
            layout,
            token: Some(token),
            known: false,
        })
    }

    /// Extends the requester's lease to `duration` and raises its fences, for
    /// the caller presenting its `token` ([`StoreError::TokenRefused`]
    /// otherwise, checked first, with nothing changed); an empty grant when
    /// it holds nothing (its lease is gone), for which nothing is written.
    /// Then, before anything is extended, the namespace must stand for a
    /// grant of `incarnation` (0 skips the comparison): [`Renewal::Gone`] when
    /// it does not exist, is another incarnation or is rolled back.
    async fn renew(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        duration: Duration,
        token: Option<&LeaseToken>,
        incarnation: u64,
    ) -> Result<Renewal, StoreError> {
        let record = self.authorized(namespace, requester, token).await?;
        let standing = match self.standing(namespace, incarnation).await? {
            Ok(standing) => standing,
            Err(gone) => return Ok(Renewal::Gone(gone)),
        };
        let grant = match record {
            Some(record) => {
                let mut grant = self
                    .extend(namespace, requester, record, standing.layout, duration)
                    .await?;
                grant.known = !grant.held.is_empty();
                grant
            }
            None => RequesterGrant::nothing(duration, standing.layout),
        };
        Ok(Renewal::Granted {
            grant,
            incarnation: standing.incarnation,
        })
    }

    /// Gives the requester's machine ids back, for the caller presenting its
    /// `token` ([`StoreError::TokenRefused`] otherwise, with nothing
    /// changed): each fence in `last_used` is lowered towards it as
    /// [`released_fence`] allows (others keep theirs), every key of the
    /// requester is deleted and its lease revoked. Returns how many machine
    /// ids were released (0 when it held none).
    async fn release(
        &mut self,
        namespace: &str,
        layout: Option<Layout>,
        requester: &RequesterId,
        last_used: &HashMap<MachineId, Millis>,
        token: Option<&LeaseToken>,
    ) -> Result<u32, StoreError> {
        let Some(record) = self.authorized(namespace, requester, token).await? else {
            return Ok(0);
        };
        let layout = match layout {
            Some(layout) => layout,
            None => self.layout(namespace).await?,
        };
        let current = self.own_fences(namespace, &record.machine_ids()).await?;
        let now = self.now(&layout);
        let ns = namespace.to_owned();
        let guard = record.unchanged(&ns, &requester.key());
        let mut ops = Vec::new();
        for &(machine_id, floor) in &record.ids {
            let hk = keys::holder(&ns, machine_id);
            let read = current
                .get(&machine_id)
                .cloned()
                .unwrap_or(FenceRead::Missing);
            if let FenceRead::Corrupt(_) = read {
                warn!(namespace, machine_id = machine_id.get(), key = %keys::fence(&ns, machine_id), "releasing a machine id whose fence is unreadable: the key is left as it is, so the machine id stays out of use until it is repaired");
            }
            if let Some(fence) =
                released_fence(floor, last_used.get(&machine_id).copied(), &read, now)
            {
                ops.push(TxnOp::put(
                    keys::fence(&ns, machine_id),
                    fence.get().to_string(),
                    None,
                ));
            }
            ops.push(TxnOp::delete(hk, None));
        }
        ops.push(TxnOp::delete(keys::requester(&ns, &requester.key()), None));
        ops.push(TxnOp::delete(keys::token(&ns, &requester.key()), None));
        // The description (and an API key holding) are on the lease, which
        // is revoked below: with 63 machine ids this transaction already
        // has etcd's 128 operations.
        let txn = Txn::new().when(guard).and_then(ops);
        let resp = self
            .endpoints
            .txn("requester release txn", self.timeout, txn)
            .await?;
        // The holder asked to let go, so its lease goes either way: when the
        // guard failed (a key deleted by hand, say), revoking drops what is
        // left and keeps every fence where it was.
        self.revoke(record.lease_id).await;
        if !resp.succeeded() {
            return Ok(0);
        }
        info!(
            namespace,
            requester = %requester.tag(),
            released = record.ids.len(),
            "requester released its machine ids"
        );
        Ok(record.ids.len() as u32)
    }

    /// Counts the machine ids of this deployment's range in a namespace;
    /// returns the counts and the range.
    async fn capacity(
        &mut self,
        namespace: &str,
    ) -> Result<(Capacity, std::ops::Range<u32>), StoreError> {
        let layout = self.layout(namespace).await?;
        let range = self.range_in(&layout);
        let mut reader = super::CapacityReader {
            endpoints: self.endpoints.clone(),
            namespace: namespace.to_owned(),
            range: range.clone(),
            timeout: self.timeout,
        };
        Ok((reader.read().await?, range))
    }

    /// Whether `requester`'s lease in `namespace` still stands, for the
    /// caller presenting its `token`: like every call that acts on a lease it
    /// reads the requester's record and checks the token first
    /// ([`StoreError::TokenRefused`] when it holds machine ids and the token
    /// is missing or wrong, with nothing else read). Then by reads only (the
    /// one write: marking the namespace rolled back when etcd shows a
    /// restore). `incarnation` 0 and an empty `machine_ids` skip those
    /// comparisons. Errors only when etcd does not answer or a record is
    /// unreadable.
    async fn check(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        token: Option<&LeaseToken>,
        incarnation: u64,
        machine_ids: &[u32],
    ) -> Result<LeaseCheck, StoreError> {
        let held = self.authorized(namespace, requester, token).await?;
        if let Err(gone) = self.standing(namespace, incarnation).await? {
            return Ok(gone);
        }
        let Some(held) = held else {
            return Ok(LeaseCheck::LeaseGone);
        };
        if !machine_ids.is_empty() {
            let mut asked: Vec<u32> = machine_ids.to_vec();
            let mut have: Vec<u32> = held.ids.iter().map(|(id, _)| u32::from(id.get())).collect();
            asked.sort_unstable();
            have.sort_unstable();
            if asked != have {
                return Ok(LeaseCheck::LeaseGone);
            }
        }
        // Every holder key still names this requester on its lease (one
        // read-only transaction: no raft entry).
        let holder = keys::requester_holder(&requester.key());
        let gets: Vec<TxnOp> = held
            .ids
            .iter()
            .map(|(id, _)| TxnOp::get(keys::holder(namespace, *id), None))
            .collect();
        let resp = self
            .endpoints
            .txn("check holders", self.timeout, Txn::new().and_then(gets))
            .await?;
        let intact = resp.op_responses().into_iter().all(|r| match r {
            TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .is_some_and(|kv| kv.value() == holder.as_bytes() && kv.lease() == held.lease_id),
            _ => false,
        });
        if !intact {
            return Ok(LeaseCheck::LeaseGone);
        }
        // Unlike `remaining`, an etcd failure is an error here, never "gone".
        let lease_id = held.lease_id;
        let ttl = self
            .endpoints
            .call("lease ttl", self.timeout, |mut c| async move {
                c.lease_time_to_live(lease_id, None).await
            })
            .await?
            .ttl();
        match u64::try_from(ttl) {
            Ok(secs) if secs > 0 => Ok(LeaseCheck::Valid {
                remaining: Duration::from_secs(secs),
            }),
            _ => Ok(LeaseCheck::LeaseGone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_value_is_cut_to_a_hundred_characters() {
        assert_eq!(quoted(b"not-a-number"), "not-a-number");
        let long = "x".repeat(500);
        assert_eq!(quoted(long.as_bytes()), format!("{}…", "x".repeat(100)));
    }
}
