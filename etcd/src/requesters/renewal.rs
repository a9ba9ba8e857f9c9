//! Renewing a requester's lease: every key moved onto a new etcd lease in
//! one guarded transaction, then its API key holding and description.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{Layout, MachineId, Millis};
use tracing::warn;

use super::super::keys::{self, encode_record};
use super::{Record, RequesterLeases};
use snowkeep_core::claim::{HeldId, StoreError};
use snowkeep_core::lease::records::{FenceRead, LeaseToken, RequesterGrant, RequesterId};
use snowkeep_core::text::hex;

impl RequesterLeases {
    /// Moves every key of `record` onto a new lease of `duration` and raises
    /// the fences, in one transaction guarded by the old lease and the token;
    /// all or nothing.
    pub(super) async fn extend(
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
        refuse_corrupt_fence(namespace, &current)?;
        let new_lease = self.grant_lease(duration).await?;
        let fence = self.fence_for(&layout, duration);
        let held = renewed_held(record, &current, fence);
        let txn = renewal_txn(namespace, requester, record, &held, new_lease);
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
    pub(super) async fn acquire_again(
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
}

/// [`StoreError::Corrupt`] naming the first unreadable fence of `current`
/// (the requester's own fences in `namespace`).
fn refuse_corrupt_fence(
    namespace: &str,
    current: &HashMap<MachineId, FenceRead>,
) -> Result<(), StoreError> {
    for (&id, read) in current {
        if let FenceRead::Corrupt(value) = read {
            return Err(StoreError::Corrupt {
                key: keys::fence(namespace, id),
                value: value.clone(),
            });
        }
    }
    Ok(())
}

/// `record`'s machine ids with their floors, each fence at `fence` or the
/// `current` one when higher: a fence is never lowered while it is held.
fn renewed_held(
    record: &Record,
    current: &HashMap<MachineId, FenceRead>,
    fence: Millis,
) -> Vec<HeldId> {
    record
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
        .collect()
}

/// The renewal of `record` as `held`: every holder key, the record and the
/// token key put on `new_lease` and every fence raised, guarded by
/// [`Record::unchanged`]; the failure branch reads the record.
fn renewal_txn(
    namespace: &str,
    requester: &RequesterId,
    record: &Record,
    held: &[HeldId],
    new_lease: i64,
) -> Txn {
    let holder = keys::requester_holder(&requester.key());
    let ns = namespace.to_owned();
    let on_new_lease = || Some(PutOptions::new().with_lease(new_lease));
    let guard = record.unchanged(&ns, &requester.key());
    let mut ops = Vec::new();
    for h in held {
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
        encode_record(held, record.key_id.as_deref()),
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
    Txn::new()
        .when(guard)
        .and_then(ops)
        .or_else([TxnOp::get(rk, None)])
}
