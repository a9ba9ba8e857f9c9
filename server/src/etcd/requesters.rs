//! Machine-id leases of embedded requesters (the Lease API), on etcd.
//!
//! A requester's machine ids hang off one etcd lease with the requester's
//! duration (first lease 10 min, renewed 48 h by default): its holder keys
//! (value `requester/{key}`) and its record `requester/{key}` = `id:floor,…`.
//! Renewing grants a new lease and moves every key onto it in one
//! transaction guarded by the old lease still owning them, so a renewal
//! either keeps all machine ids or none.
//!
//! Fences: the requester's generator stamps only up to the fence,
//! which is set to the lease's expiry plus [`FENCE_MARGIN`] before the grant is
//! returned. After the lease expires, a new holder waits at most the margin.
//! On release the requester reports its last timestamps and each fence is
//! lowered to it. The floor (previous holder's fence) is kept in the record so
//! a repeated Acquire returns the same floors.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{Layout, MachineId, Millis, SharedClock};
use tracing::{info, warn};

use super::{claim_ids, keys, parse_fence, ClaimRequest, Endpoints, EtcdStore};
use crate::lease::{Capacity, HeldId, LeaseError};

/// How far beyond the lease's expiry a requester's fence is set: covers a
/// requester clock running ahead of the server's.
pub const FENCE_MARGIN: Duration = Duration::from_secs(60);

/// Most machine ids one requester may hold. A renewal writes two keys per
/// machine id plus the record, and etcd allows 128 operations per transaction
/// (`--max-txn-ops` default), so 63.
pub const MAX_REQUESTER_IDS: u32 = 63;

/// A requester's machine ids after Acquire or Renew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequesterGrant {
    /// Machine ids with floors and fences; empty when the requester holds none.
    pub held: Vec<HeldId>,
    /// The lease duration of this grant.
    pub duration: Duration,
    /// The namespace layout.
    pub layout: Layout,
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

/// A requester's record: its lease and machine ids with floors.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    lease_id: i64,
    ids: Vec<(MachineId, Millis)>,
}

fn encode_record(held: &[HeldId]) -> String {
    held.iter()
        .map(|h| format!("{}:{}", h.machine_id.get(), h.floor.get()))
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn decode_record(
    key: &str,
    value: &[u8],
) -> Result<Vec<(MachineId, Millis)>, LeaseError> {
    let corrupt = || LeaseError::Corrupt {
        key: key.to_owned(),
        value: String::from_utf8_lossy(value).into_owned(),
    };
    let text = std::str::from_utf8(value).map_err(|_| corrupt())?;
    text.split(',')
        .map(|pair| {
            let (id, floor) = pair.split_once(':').ok_or_else(corrupt)?;
            Ok((
                MachineId(id.parse().map_err(|_| corrupt())?),
                Millis(floor.parse().map_err(|_| corrupt())?),
            ))
        })
        .collect()
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs().max(1)).unwrap_or(i64::MAX)
}

impl RequesterLeases {
    /// Shares the store's endpoints (a separate copy, so API calls never wait
    /// behind the server's own lease loop).
    pub fn new(store: &EtcdStore) -> Self {
        Self {
            endpoints: store.endpoints.clone(),
            clock: store.clock.clone(),
            timeout: store.settings.request_timeout,
            fence_horizon: store.settings.fence_horizon,
            max_fence_wait: store.settings.max_fence_wait,
            range: store.settings.machine_id_range.clone(),
        }
    }

    /// The namespace's layout; [`LeaseError::UnknownNamespace`] when none is recorded.
    pub async fn layout(&mut self, namespace: &str) -> Result<Layout, LeaseError> {
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
            .ok_or_else(|| LeaseError::UnknownNamespace {
                namespace: namespace.to_owned(),
            })?;
        Ok(super::namespace::NamespaceRecord::parse(&key, kv.value())?.layout)
    }

    async fn record(
        &mut self,
        namespace: &str,
        requester: &str,
    ) -> Result<Option<Record>, LeaseError> {
        let key = keys::requester(namespace, requester);
        let resp = self
            .endpoints
            .call("read requester", self.timeout, |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => Ok(Some(Record {
                lease_id: kv.lease(),
                ids: decode_record(&key, kv.value())?,
            })),
        }
    }

    async fn fences(&mut self, namespace: &str) -> Result<HashMap<MachineId, Millis>, LeaseError> {
        let prefix = keys::fence_prefix(namespace);
        let resp = self
            .endpoints
            .call("read fences", self.timeout, |mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        resp.kvs()
            .iter()
            .filter_map(|kv| keys::machine_id_of(kv.key(), &prefix).map(|id| (id, kv)))
            .map(|(id, kv)| Ok((id, parse_fence(&prefix, kv.value())?)))
            .collect()
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

    async fn grant_lease(&mut self, duration: Duration) -> Result<i64, LeaseError> {
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
            warn!(lease_id, error = %crate::DisplayChain(&e), "could not revoke a requester lease; it expires by itself");
        }
    }

    fn fence_for(&self, layout: &Layout, duration: Duration) -> Millis {
        let now = layout
            .to_layout_ms(self.clock.unix_ms())
            .unwrap_or_default();
        let ahead = u64::try_from((duration + FENCE_MARGIN).as_millis()).unwrap_or(u64::MAX);
        Millis(now.get().saturating_add(ahead))
    }

    /// Claims `count` machine ids for `requester` for `duration`, or — when the
    /// requester already holds machine ids — returns them with the lease reset
    /// to `duration` (idempotent retry), failing with
    /// [`LeaseError::CountMismatch`] when it holds a different number.
    /// `layout` is the namespace's, as [`Self::layout`] read it.
    pub async fn acquire(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &str,
        count: u32,
        duration: Duration,
    ) -> Result<RequesterGrant, LeaseError> {
        if let Some(record) = self.record(namespace, requester).await? {
            if record.ids.len() != count as usize {
                return Err(LeaseError::CountMismatch {
                    held: record.ids.len(),
                    asked: count,
                });
            }
            // A repeated Acquire never shortens a live lease: a late retry
            // (10 min) after a Renew (48 h) would cut the lease that the
            // Renew's answer promised. (A Renew sets its own duration, which
            // its answer reports.)
            let duration = duration.max(self.remaining(record.lease_id).await);
            return self
                .extend(namespace, requester, record, layout, duration)
                .await;
        }
        let lease_id = self.grant_lease(duration).await?;
        let holder = keys::requester_holder(requester);
        let now = layout
            .to_layout_ms(self.clock.unix_ms())
            .unwrap_or_default();
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
            prefer: &[],
        };
        let claimed = claim_ids(&self.endpoints, self.timeout, want).await;
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
        let ns = namespace.to_owned();
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
        ops.push(TxnOp::put(
            keys::requester(&ns, requester),
            encode_record(&held),
            Some(PutOptions::new().with_lease(lease_id)),
        ));
        let guard: Vec<Compare> = held
            .iter()
            .map(|h| Compare::lease(keys::holder(&ns, h.machine_id), CompareOp::Equal, lease_id))
            .collect();
        let txn = Txn::new().when(guard).and_then(ops);
        let resp = self
            .endpoints
            .txn("requester fence txn", self.timeout, txn)
            .await;
        match resp {
            Ok(r) if r.succeeded() => {}
            Ok(_) => {
                self.revoke(lease_id).await;
                return Err(LeaseError::LeaseLost {
                    reason: crate::lease::LossReason::HolderChanged,
                });
            }
            Err(e) => {
                self.revoke(lease_id).await;
                return Err(e);
            }
        }
        info!(namespace, requester, machine_ids = ?held.iter().map(|h| h.machine_id.get()).collect::<Vec<_>>(), "leased machine ids to a requester");
        Ok(RequesterGrant {
            held,
            duration,
            layout,
        })
    }

    /// Extends the requester's lease to `duration` and raises its fences;
    /// an empty grant when it holds nothing (its lease is gone). `layout` is
    /// the namespace's, as [`Self::layout`] read it.
    pub async fn renew(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &str,
        duration: Duration,
    ) -> Result<RequesterGrant, LeaseError> {
        match self.record(namespace, requester).await? {
            Some(record) => {
                self.extend(namespace, requester, record, layout, duration)
                    .await
            }
            None => Ok(RequesterGrant {
                held: Vec::new(),
                duration,
                layout,
            }),
        }
    }

    /// Moves every key of `record` onto a new lease of `duration` and raises
    /// the fences, in one transaction guarded by the old lease; all or nothing.
    async fn extend(
        &mut self,
        namespace: &str,
        requester: &str,
        mut record: Record,
        layout: Layout,
        duration: Duration,
    ) -> Result<RequesterGrant, LeaseError> {
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
                    Some(fresh) if fresh.lease_id != record.lease_id && fresh.ids == record.ids => {
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
            requester, "requester's keys changed; its lease is void"
        );
        self.revoke(record.lease_id).await;
        Ok(RequesterGrant {
            held: Vec::new(),
            duration,
            layout,
        })
    }

    /// One attempt of [`Self::extend`]: `None` when the guard failed.
    async fn extend_once(
        &mut self,
        namespace: &str,
        requester: &str,
        record: &Record,
        layout: Layout,
        duration: Duration,
    ) -> Result<Option<RequesterGrant>, LeaseError> {
        let current = self.fences(namespace).await?;
        let new_lease = self.grant_lease(duration).await?;
        let fence = self.fence_for(&layout, duration);
        let holder = keys::requester_holder(requester);
        let held: Vec<HeldId> = record
            .ids
            .iter()
            .map(|&(machine_id, floor)| HeldId {
                machine_id,
                floor,
                // Never lower a fence while it is held.
                fence: fence.max(current.get(&machine_id).copied().unwrap_or_default()),
            })
            .collect();
        let ns = namespace.to_owned();
        let mut guard = Vec::new();
        let mut ops = Vec::new();
        for h in &held {
            let hk = keys::holder(&ns, h.machine_id);
            guard.push(Compare::lease(
                hk.clone(),
                CompareOp::Equal,
                record.lease_id,
            ));
            ops.push(TxnOp::put(
                hk,
                holder.clone(),
                Some(PutOptions::new().with_lease(new_lease)),
            ));
            ops.push(TxnOp::put(
                keys::fence(&ns, h.machine_id),
                h.fence.get().to_string(),
                None,
            ));
        }
        let rk = keys::requester(&ns, requester);
        guard.push(Compare::lease(
            rk.clone(),
            CompareOp::Equal,
            record.lease_id,
        ));
        ops.push(TxnOp::put(
            rk.clone(),
            encode_record(&held),
            Some(PutOptions::new().with_lease(new_lease)),
        ));
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
        let committed = |r: &etcd_client::TxnResponse| {
            r.succeeded()
                || r.op_responses().iter().any(|op| match op {
                    TxnOpResponse::Get(get) => get.kvs().iter().any(|kv| kv.lease() == new_lease),
                    _ => false,
                })
        };
        match resp {
            Ok(r) if committed(&r) => {
                self.revoke(record.lease_id).await;
                Ok(Some(RequesterGrant {
                    held,
                    duration,
                    layout,
                }))
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
                        self.revoke(record.lease_id).await;
                        return Ok(Some(RequesterGrant {
                            held,
                            duration,
                            layout,
                        }));
                    }
                }
                self.revoke(new_lease).await;
                Err(e)
            }
        }
    }

    /// Gives the requester's machine ids back: each fence in `last_used` is
    /// lowered to it (others keep theirs), the keys are deleted and the lease
    /// revoked. Returns how many machine ids were released.
    pub async fn release(
        &mut self,
        namespace: &str,
        requester: &str,
        last_used: &HashMap<MachineId, Millis>,
    ) -> Result<u32, LeaseError> {
        let Some(record) = self.record(namespace, requester).await? else {
            return Ok(0);
        };
        let current = self.fences(namespace).await?;
        let ns = namespace.to_owned();
        let mut guard = Vec::new();
        let mut ops = Vec::new();
        for &(machine_id, floor) in &record.ids {
            let hk = keys::holder(&ns, machine_id);
            guard.push(Compare::lease(
                hk.clone(),
                CompareOp::Equal,
                record.lease_id,
            ));
            if let Some(&last) = last_used.get(&machine_id) {
                // Never below the floor (the previous holder may have stamped up
                // to it) and never above the current fence (a release must not
                // fence a machine id out of use).
                let fence = current.get(&machine_id).copied().unwrap_or(floor);
                let lowered = last.max(floor).min(fence.max(floor));
                ops.push(TxnOp::put(
                    keys::fence(&ns, machine_id),
                    lowered.get().to_string(),
                    None,
                ));
            }
            ops.push(TxnOp::delete(hk, None));
        }
        ops.push(TxnOp::delete(keys::requester(&ns, requester), None));
        let txn = Txn::new().when(guard).and_then(ops);
        let resp = self
            .endpoints
            .txn("requester release txn", self.timeout, txn)
            .await?;
        self.revoke(record.lease_id).await;
        if resp.succeeded() {
            info!(
                namespace,
                requester,
                released = record.ids.len(),
                "requester released its machine ids"
            );
            Ok(record.ids.len() as u32)
        } else {
            Ok(0)
        }
    }

    /// This deployment's range, cut to the machine ids `layout` has.
    fn range_in(&self, layout: &Layout) -> std::ops::Range<u32> {
        let count = layout.machine_id_count();
        self.range.start.min(count)..self.range.end.min(count)
    }

    /// Counts the machine ids of this deployment's range in a namespace;
    /// returns the counts and the range.
    pub async fn capacity(
        &mut self,
        namespace: &str,
    ) -> Result<(Capacity, std::ops::Range<u32>), LeaseError> {
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

    /// Records the last skew seen from `requester` (ms, server − client) for
    /// `keep`; best effort.
    pub async fn record_skew(
        &mut self,
        namespace: &str,
        requester: &str,
        skew_ms: i64,
        keep: Duration,
    ) {
        let key = keys::skew(namespace, requester);
        let ttl = secs(keep);
        let put = self
            .endpoints
            .call("record skew", self.timeout, |mut c| {
                let key = key.clone();
                async move {
                    let lease = c.lease_grant(ttl, None).await?;
                    c.put(
                        key,
                        skew_ms.to_string(),
                        Some(PutOptions::new().with_lease(lease.id())),
                    )
                    .await
                }
            })
            .await;
        if let Err(e) = put {
            warn!(namespace, requester, error = %crate::DisplayChain(&e), "could not record the requester's clock skew");
        }
    }
}

/// What [`RequesterLeases::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCheck {
    /// The lease stands, with this much left at the server.
    Valid {
        /// Time left on the requester's etcd lease.
        remaining: Duration,
    },
    /// The requester holds nothing, or other machine ids.
    LeaseGone,
    /// The namespace does not exist, or is another incarnation than the grant's.
    NamespaceGone,
    /// etcd was restored from an older snapshot: the namespace is rolled back.
    RolledBack,
}

// The namespace record and the holder check (the rollback detection).
impl RequesterLeases {
    /// The namespace record, after the rollback check of every Lease API call
    /// that claims, renews or checks: [`LeaseError::UnknownNamespace`] when
    /// absent, [`LeaseError::NamespaceRolledBack`] when rolled back or found
    /// restored now (then marked).
    pub async fn namespace(
        &mut self,
        namespace: &str,
    ) -> Result<super::namespace::NamespaceRecord, LeaseError> {
        let unix_ms = self.clock.unix_ms();
        super::namespace::guard(&self.endpoints, self.timeout, namespace, unix_ms)
            .await
            .map(|(record, _)| record)
    }

    /// Refuses a new claim while the namespace's confirmed floor is further
    /// ahead than `--max-fence-wait` ([`LeaseError::NamespaceFloorAhead`],
    /// UNAVAILABLE: retry once the clock is within it).
    pub fn check_floor(
        &self,
        namespace: &str,
        record: &super::namespace::NamespaceRecord,
    ) -> Result<(), LeaseError> {
        let now = record
            .layout
            .to_layout_ms(self.clock.unix_ms())
            .unwrap_or_default();
        let ahead = Duration::from_millis(record.floor.get().saturating_sub(now.get()));
        if ahead > self.max_fence_wait {
            return Err(LeaseError::NamespaceFloorAhead {
                namespace: namespace.to_owned(),
                until: super::namespace::rfc3339(record.layout.to_unix_ms(record.floor)),
                ahead,
                max: self.max_fence_wait,
            });
        }
        Ok(())
    }

    /// Whether `requester`'s lease in `namespace` still stands, by reads only
    /// (the one write: marking the namespace rolled back when etcd shows a
    /// restore). `incarnation` 0 and an empty `machine_ids` skip those
    /// comparisons. Errors only when etcd does not answer or a record is
    /// unreadable.
    pub async fn check(
        &mut self,
        namespace: &str,
        requester: &str,
        incarnation: u64,
        machine_ids: &[u32],
    ) -> Result<LeaseCheck, LeaseError> {
        let record = match self.namespace(namespace).await {
            Ok(record) => record,
            Err(LeaseError::UnknownNamespace { .. }) => return Ok(LeaseCheck::NamespaceGone),
            Err(LeaseError::NamespaceRolledBack { .. }) => return Ok(LeaseCheck::RolledBack),
            Err(e) => return Err(e),
        };
        if incarnation != 0 && record.incarnation != 0 && incarnation != record.incarnation {
            return Ok(LeaseCheck::NamespaceGone);
        }
        let Some(held) = self.record(namespace, requester).await? else {
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
        let holder = keys::requester_holder(requester);
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
            etcd_client::TxnOpResponse::Get(get) => get
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
