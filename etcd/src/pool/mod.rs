//! Claiming machine ids from a namespace's pool as `pool_read` reads it (a
//! window of it, or all of it), one guarded transaction per candidate.
//! Shared by the server's own claims and the Lease API's.

mod round;

use std::ops::Range;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{MachineId, Millis};
use tracing::{debug, error, warn};

use super::endpoints::Endpoints;
use super::fence_count::{self, Counter, MissingFence};
use super::pool_read::Pool;
use super::{keys, namespace};
use round::{range_leases, read_round};
use snowkeep_core::claim::candidates::CandidateKind;
use snowkeep_core::claim::{HeldId, StoreError};

/// Candidates tried per read of the pool before reading it again.
const CANDIDATES_PER_ROUND: usize = 8;
/// Pool reads per claim before giving up on this attempt (the caller retries).
const CLAIM_ROUNDS: usize = 16;

/// What to claim: `count` machine ids of `range` in `namespace` for the holder
/// value `holder`, bound to `lease_id`, ranked at layout time `now`.
pub(super) struct ClaimRequest<'a> {
    pub(super) namespace: &'a str,
    pub(super) holder: &'a str,
    pub(super) range: Range<u32>,
    pub(super) count: usize,
    pub(super) lease_id: i64,
    pub(super) now: Millis,
    /// The conservative floor of a machine id without a fence key (layout
    /// ms): its clock plus how far ahead any live holder may stamp, here
    /// `now + fence_horizon`. A missing key may be a deleted one (operator,
    /// script) under a holder that is still stamping up to its fence. Used
    /// only when the namespace's fence count cannot vouch that the key was
    /// never written (see [`fence_count`]); otherwise the floor is the
    /// namespace floor.
    pub(super) absent_floor: Millis,
    /// Machine ids whose fence is above this are skipped (`now + max_fence_wait`).
    pub(super) max_floor: Millis,
    /// The same bound for the machine ids this holder held before (`Own`
    /// candidates and `prefer`): a stable instance restarting after a crash
    /// waits for its own fences, up to one fence lead ahead.
    pub(super) max_own_floor: Millis,
    /// Free machine ids to try first, after the ones the holder still holds
    /// (a crashed predecessor's, under the same instance id).
    pub(super) prefer: &'a [MachineId],
    /// Whether a machine id whose holder key already names `holder` is
    /// rebound to this claim's lease (a crashed predecessor's, under the
    /// same instance id). Lease API requesters pass `false`: such a key is a
    /// grant of the same requester, perhaps a concurrent Acquire's that
    /// committed, and moving it onto this claim's lease would take it from
    /// that grant (and lose it when this claim gives up).
    pub(super) take_own: bool,
    /// Machine ids found by key that this holder holds or released last:
    /// their blocks are part of every window, so the claim order sees them
    /// (see [`read_round`]).
    pub(super) known: &'a [MachineId],
    /// Whether each claim transaction also records the machine id under
    /// the holder's instance key (`instance/{holder}/{machine_id}`), where
    /// the holder's next claims find it by key: a server with a stable
    /// instance id.
    pub(super) index: bool,
}

impl ClaimRequest<'_> {
    /// `(absent_floor, max_floor)` for a claim at layout time `now`.
    pub(super) fn floors(
        now: Millis,
        fence_horizon: Duration,
        max_fence_wait: Duration,
    ) -> (Millis, Millis) {
        let after = |d: Duration| {
            Millis(
                now.get()
                    .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            )
        };
        (after(fence_horizon), after(max_fence_wait))
    }
}

/// Machine ids claimed by [`claim_ids`].
pub(super) struct Claimed {
    /// The machine ids with their floors.
    pub(super) held: Vec<HeldId>,
    /// The highest revision a claim transaction committed at.
    pub(super) revision: i64,
    /// The fence key's mod revision as each claim left it (its read inside
    /// the transaction, or the transaction's own revision when the claim
    /// created the key; 0: no key), in `held` order: the guard of the
    /// holder's first fence write.
    pub(super) fence_revisions: Vec<i64>,
    /// The machine ids of `held` this holder held before: its own holder
    /// keys taken back, and the `prefer` ones (a crashed predecessor's).
    /// Their floors are its own fences.
    pub(super) own: Vec<MachineId>,
}

/// What a claim's pool reads found, whether it succeeded or not.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct ClaimReads {
    /// Keys the claim's pool reads returned, over every round.
    pub(super) keys_read: u64,
    /// After a refusal for a full range ([`StoreError::NoFreeMachineId`]):
    /// the etcd leases of the range's holder keys, each once, in machine id
    /// order, as the read that found the range full saw them (requester
    /// records and keys on no lease left out), for the caller to ask about
    /// without reading the range again. Empty otherwise.
    pub(super) full_range_leases: Vec<i64>,
}

/// Claims machine ids one atomic transaction per candidate; each floor is the
/// fence read *inside* the claiming transaction, or after it committed (a
/// fence read before the claim may be stale: the previous holder may still
/// have raised it just before its lease expired). Partial claims are left
/// bound to the lease: the caller revokes it on error.
///
/// A candidate without a fence key gets one in its claim transaction (the
/// floor as value), with a creation marker of its fence-count block, guarded
/// by the key still being absent; [`fence_count::missing_fence`] picks the
/// floor, and the transaction counts the block again to confirm it
/// ([`confirm_missing`]). A re-base is also guarded by the block's key as
/// read: one that fails because another re-base moved it reads the pool
/// again.
///
/// What the pool reads found goes to `reads`, a refusal's too.
pub(super) async fn claim_ids(
    endpoints: &Endpoints,
    timeout: Duration,
    want: ClaimRequest<'_>,
    reads: &mut ClaimReads,
) -> Result<Claimed, StoreError> {
    let ns = want.namespace;
    let mut held: Vec<HeldId> = Vec::with_capacity(want.count);
    let mut fence_revisions = Vec::with_capacity(want.count);
    let mut revision = 0;
    let mut own = Vec::new();
    // Set once a window had no candidate: the rest of the claim reads the
    // whole pool.
    let mut whole = false;
    'rounds: for round in 0..CLAIM_ROUNDS {
        // The namespace record, read each round: a claim commits only while
        // it is unchanged (not marked rolled back since), and every floor is
        // at least the namespace floor an operator confirmed.
        let record = namespace::ClaimGuard::read(endpoints, timeout, ns).await?;
        let absent_floor = want.absent_floor.max(record.floor);
        let (pool, candidates, too_far) =
            read_round(endpoints, timeout, &want, record.floor, &held, &mut whole).await?;
        reads.keys_read += pool.keys_read;
        let Pool {
            view,
            root,
            blocks,
            holder_leases,
            ..
        } = pool;
        if let (true, Some((machine_id, fence))) = (candidates.is_empty(), too_far) {
            let ahead = Duration::from_millis(fence.get().saturating_sub(want.now.get()));
            let max = Duration::from_millis(want.max_floor.get().saturating_sub(want.now.get()));
            return Err(StoreError::FenceTooFarAhead {
                machine_id,
                fence,
                ahead,
                max,
            });
        }
        if candidates.is_empty() {
            reads.full_range_leases = range_leases(&holder_leases, &want.range, want.lease_id);
            return Err(StoreError::NoFreeMachineId {
                namespace: ns.to_owned(),
                capacity: want.range.end - want.range.start,
                start: want.range.start,
                end: want.range.end,
            });
        }
        // Blocks this claim changed since the read: no second re-base of one.
        let mut rebased = Vec::new();
        for candidate in candidates.into_iter().take(CANDIDATES_PER_ROUND) {
            let machine_id = candidate.machine_id;
            let holder = keys::holder(ns, machine_id);
            let fence = keys::fence(ns, machine_id);
            let block_no = keys::fence_count_block_of(machine_id);
            let block = blocks.get(&block_no).cloned().unwrap_or_default();
            let block_key = keys::fence_count_block(ns, block_no);
            // No fence key in the pool: this claim creates it.
            let missing = (!view.fences.contains_key(&machine_id))
                .then(|| fence_count::missing_fence(&block, &root, record.floor, absent_floor));
            if missing.is_some_and(|m| m.rebase.is_some()) && rebased.contains(&block_no) {
                continue;
            }
            let holder_guard = match candidate.kind {
                CandidateKind::Own => Compare::value(holder.clone(), CompareOp::Equal, want.holder),
                CandidateKind::Free => {
                    Compare::create_revision(holder.clone(), CompareOp::Equal, 0)
                }
            };
            let mut when = vec![holder_guard, record.compare()];
            let mut then = vec![TxnOp::put(
                holder.clone(),
                want.holder,
                Some(PutOptions::new().with_lease(want.lease_id)),
            )];
            match &missing {
                // The success branch answers the fence second.
                None => then.push(TxnOp::get(fence.clone(), None)),
                Some(m) => {
                    when.push(Compare::version(fence.clone(), CompareOp::Equal, 0));
                    then.push(TxnOp::put(fence.clone(), m.floor.get().to_string(), None));
                    then.push(TxnOp::put(keys::fence_count_marker(ns, block_no), "", None));
                    if let Some(base) = m.rebase {
                        when.push(match block.own {
                            Counter::Absent => {
                                Compare::create_revision(block_key.clone(), CompareOp::Equal, 0)
                            }
                            _ => Compare::mod_revision(
                                block_key.clone(),
                                CompareOp::Equal,
                                block.own_revision,
                            ),
                        });
                        then.push(TxnOp::put(block_key.clone(), base.encode(), None));
                    } else if m.distrust.is_none() {
                        // Counted again after the creation, at this revision.
                        then.extend(confirm_reads(ns, block_no));
                    }
                }
            }
            if want.index {
                // Not bound to the lease: it outlives the claim, so a restart
                // finds the machine id it released last (see `instance`).
                // Last, after the reads the code below finds by position.
                then.push(TxnOp::put(
                    keys::instance_claim(ns, want.holder, machine_id),
                    "",
                    None,
                ));
            }
            // The failure branch reads the holder key first: a transaction
            // retried on another endpoint after its first attempt committed
            // (and the answer was lost) finds the key already ours, under our
            // lease. It answers the fence second, reads the namespace record
            // third, to tell a changed record from a lost race, and the
            // block's key fourth, to tell a re-base that lost to another.
            let txn = Txn::new().when(when).and_then(then).or_else([
                TxnOp::get(holder, None),
                TxnOp::get(fence.clone(), None),
                TxnOp::get(record.key.clone(), None),
                TxnOp::get(block_key, None),
            ]);
            let resp = endpoints.txn("claim txn", timeout, txn).await?;
            let got = |i: usize| match resp.op_responses().get(i) {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
                _ => None,
            };
            // Our lease is this claim's own, and only this transaction puts
            // it on a holder key, guarded by the record: a key already ours is
            // this claim's earlier commit, made while the record was unchanged.
            let already_ours = !resp.succeeded()
                && got(0).is_some_and(|kv| {
                    kv.value() == want.holder.as_bytes() && kv.lease() == want.lease_id
                });
            if !resp.succeeded() && !already_ours {
                if record.changed(&resp, 2) {
                    debug!(
                        round,
                        "the namespace record changed during the claim; reading it again"
                    );
                    continue 'rounds;
                }
                let holder_free = match (candidate.kind, got(0)) {
                    (CandidateKind::Free, kv) => kv.is_none(),
                    (CandidateKind::Own, kv) => {
                        kv.is_some_and(|kv| kv.value() == want.holder.as_bytes())
                    }
                };
                let block_moved = got(3).map_or(0, |kv| kv.mod_revision()) != block.own_revision;
                if holder_free && missing.is_some_and(|m| m.rebase.is_some()) && block_moved {
                    debug!(
                        machine_id = machine_id.get(),
                        block = block_no,
                        round,
                        "another claim re-based this fence-count block; reading the pool again"
                    );
                    continue 'rounds;
                }
                debug!(
                    machine_id = machine_id.get(),
                    round, "claim lost a race, trying the next candidate"
                );
                continue;
            }
            let txn_revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            let (floor, fence_revision) = match (missing, resp.succeeded()) {
                (Some(m), true) => {
                    if m.rebase.is_some() {
                        rebased.push(block_no);
                    }
                    let check = match m.distrust {
                        Some(why) => Err(why),
                        None => confirm_missing(&resp, 3),
                    };
                    match check {
                        Ok(()) => {
                            debug!(
                                namespace = ns,
                                machine_id = machine_id.get(),
                                floor_ms = m.floor.get(),
                                "claimed a never-used machine id at the namespace floor"
                            );
                            (m.floor, txn_revision)
                        }
                        Err(why) if m.distrust.is_some() => {
                            note_distrust(ns, machine_id, block_no, why, m.floor, &m, "");
                            (m.floor, txn_revision)
                        }
                        Err(why) => {
                            // Something changed the block between the read
                            // and the claim: fall back to the conservative
                            // floor, on the key too.
                            let floor = absent_floor.max(m.floor);
                            let raised = raise_created_fence(
                                endpoints,
                                timeout,
                                &fence,
                                txn_revision,
                                floor,
                            )
                            .await?;
                            note_distrust(ns, machine_id, block_no, why, floor, &m, " (found by the claim transaction after the pool read vouched for the count)");
                            (floor, raised)
                        }
                    }
                }
                (Some(m), false) if m.distrust.is_none() => {
                    // An earlier attempt of this claim created the key, and
                    // its confirmation was lost with its answer: take the
                    // conservative floor rather than count again.
                    let Some(created) = got(1).map(|kv| kv.mod_revision()) else {
                        // Gone already: someone else deletes keys here.
                        return Err(StoreError::LeaseLost {
                            reason: snowkeep_core::claim::LossReason::HolderChanged,
                        });
                    };
                    let floor = absent_floor.max(m.floor);
                    let raised =
                        raise_created_fence(endpoints, timeout, &fence, created, floor).await?;
                    (floor, raised)
                }
                // The fence as the transaction read it: in the success
                // branch, or in the failure branch of a retry that found its
                // earlier attempt committed.
                _ => match got(1) {
                    Some(kv) => (
                        keys::decode_fence(&fence, kv.value())?.max(record.floor),
                        kv.mod_revision(),
                    ),
                    None => (absent_floor, 0),
                },
            };
            revision = revision.max(txn_revision);
            if candidate.kind == CandidateKind::Own || want.prefer.contains(&machine_id) {
                own.push(machine_id);
            }
            held.push(HeldId {
                machine_id,
                floor,
                fence: floor,
            });
            fence_revisions.push(fence_revision);
            if held.len() == want.count {
                return Ok(Claimed {
                    held,
                    revision,
                    fence_revisions,
                    own,
                });
            }
        }
    }
    Err(StoreError::Timeout {
        op: "claim (every candidate was taken concurrently)",
        after: timeout,
    })
}

/// The reads that count a block again inside the claim transaction that
/// created one of its fence keys, after the creation: the block's key, the
/// namespace's root, its fence keys and its creation markers (counts only).
fn confirm_reads(namespace: &str, block: u16) -> [TxnOp; 4] {
    let (start, end) = keys::block_fences(namespace, block);
    [
        TxnOp::get(keys::fence_count_block(namespace, block), None),
        TxnOp::get(keys::fence_count_root(namespace), None),
        TxnOp::get(
            start,
            Some(GetOptions::new().with_range(end).with_count_only()),
        ),
        TxnOp::get(
            keys::fence_count_markers(namespace, block),
            Some(GetOptions::new().with_prefix().with_count_only()),
        ),
    ]
}

/// Whether the [`confirm_reads`] answered from operation `at` on of `resp`
/// still vouch that no fence key of the block was deleted (see
/// [`fence_count::vouches`]): `Err` with why not.
fn confirm_missing(
    resp: &etcd_client::TxnResponse,
    at: usize,
) -> Result<(), fence_count::Distrust> {
    let ops = resp.op_responses();
    let get = |i: usize| match ops.get(at + i) {
        Some(TxnOpResponse::Get(get)) => Some(get.clone()),
        _ => None,
    };
    let (Some(own), Some(now_root), Some(fences), Some(markers)) = (get(0), get(1), get(2), get(3))
    else {
        return Err(fence_count::Distrust::Absent);
    };
    let own = Counter::decode(own.kvs().first().map(|kv| kv.value()));
    let now_root = Counter::decode(now_root.kvs().first().map(|kv| kv.value()));
    let count = |g: &etcd_client::GetResponse| u64::try_from(g.count()).unwrap_or(0);
    match fence_count::vouches(own.or(&now_root), count(&markers), count(&fences)) {
        None => Ok(()),
        Some(why) => Err(why),
    }
}

/// Raises the fence key this claim created (at mod revision `created`) to
/// `floor`, guarded by it being unchanged; returns the new mod revision.
/// [`StoreError::LeaseLost`] when someone else wrote it meanwhile (the
/// caller revokes the claim's lease and claims again).
async fn raise_created_fence(
    endpoints: &Endpoints,
    timeout: Duration,
    fence: &str,
    created: i64,
    floor: Millis,
) -> Result<i64, StoreError> {
    let txn = Txn::new()
        .when([Compare::mod_revision(fence, CompareOp::Equal, created)])
        .and_then([TxnOp::put(fence, floor.get().to_string(), None)])
        .or_else([TxnOp::get(fence, None)]);
    let resp = endpoints.txn("raise created fence", timeout, txn).await?;
    if resp.succeeded() {
        return Ok(resp.header().map(|h| h.revision()).unwrap_or(0));
    }
    // A retry that finds its own earlier attempt committed.
    match resp.op_responses().first() {
        Some(TxnOpResponse::Get(get)) => match get.kvs().first() {
            Some(kv) if kv.value() == floor.get().to_string().as_bytes() => Ok(kv.mod_revision()),
            _ => Err(StoreError::LeaseLost {
                reason: snowkeep_core::claim::LossReason::HolderChanged,
            }),
        },
        _ => Err(StoreError::LeaseLost {
            reason: snowkeep_core::claim::LossReason::HolderChanged,
        }),
    }
}

/// Logs a claim of `machine_id` (fence-count block `block`) at `floor`
/// whose missing fence key the count did not vouch for, `why`, `how` it was
/// found (`m` as the pool read predicted): at error when fence keys were
/// deleted, else at warn.
fn note_distrust(
    namespace: &str,
    machine_id: MachineId,
    block: u16,
    why: fence_count::Distrust,
    floor: Millis,
    m: &MissingFence,
    how: &str,
) {
    let then = if m.rebase.is_some() {
        "the block is counted again from the keys present; its machine ids without a fence key start at this floor or later from now on"
    } else if m.distrust.is_some() {
        "the block stays untrusted while a held machine id of it lacks its fence key"
    } else {
        "the next claim in the block re-bases it"
    };
    let floor_ms = floor.get();
    if matches!(why, fence_count::Distrust::Deleted { .. }) {
        error!(namespace, machine_id = machine_id.get(), block, floor_ms, "{why}{how}: a missing fence key may have been deleted under a live holder, so this claim of machine id {} starts one fence lead ahead; {then}", machine_id.get());
    } else {
        warn!(namespace, machine_id = machine_id.get(), block, floor_ms, "{why}{how}: this claim of machine id {} without a fence key starts one fence lead ahead; {then}", machine_id.get());
    }
}
