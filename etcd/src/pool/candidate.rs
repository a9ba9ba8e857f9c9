//! One candidate's claim transaction (the holder key, and the fence key it
//! creates when missing), what its answer means, and the floor it gives.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use snowkeep_client::{MachineId, Millis};
use tracing::{debug, error, warn};

use super::super::endpoints::Endpoints;
use super::super::fence_count::{self, Block, Counter, MissingFence};
use super::super::{keys, namespace};
use super::ClaimRequest;
use snowkeep_core::claim::candidates::{Candidate, CandidateKind};
use snowkeep_core::claim::StoreError;

/// One candidate's claim: its keys, its fence-count block as the pool read
/// found it, and the fence key the claim creates when none is there.
pub(super) struct Attempt {
    candidate: Candidate,
    /// The holder key.
    holder: String,
    /// The fence key.
    fence: String,
    pub(super) block_no: u16,
    block: Block,
    block_key: String,
    /// What a claim creating the missing fence key writes (`None`: the key
    /// is there).
    missing: Option<MissingFence>,
    /// The value a created fence key gets: the floor `missing` picks, or the
    /// request's `created_fence` when higher.
    created: Millis,
}

impl Attempt {
    /// `candidate`'s claim in namespace `ns`, with its block of `blocks`;
    /// when its fence key is not `fence_present` in the pool, the claim
    /// creates it, with the floor [`fence_count::missing_fence`] picks from
    /// `root` and `(namespace_floor, absent_floor)`, at that floor or
    /// `created_fence` when higher.
    pub(super) fn new(
        ns: &str,
        candidate: Candidate,
        blocks: &BTreeMap<u16, Block>,
        root: &Counter,
        fence_present: bool,
        (namespace_floor, absent_floor, created_fence): (Millis, Millis, Millis),
    ) -> Self {
        let machine_id = candidate.machine_id;
        let block_no = keys::fence_count_block_of(machine_id);
        let block = blocks.get(&block_no).cloned().unwrap_or_default();
        // No fence key in the pool: this claim creates it.
        let missing = (!fence_present)
            .then(|| fence_count::missing_fence(&block, root, namespace_floor, absent_floor));
        let created = missing.map_or(Millis(0), |m| m.floor.max(created_fence));
        Self {
            candidate,
            holder: keys::holder(ns, machine_id),
            fence: keys::fence(ns, machine_id),
            block_no,
            block_key: keys::fence_count_block(ns, block_no),
            block,
            missing,
            created,
        }
    }

    /// Whether the claim re-bases the machine id's fence-count block.
    pub(super) fn rebases(&self) -> bool {
        self.missing.is_some_and(|m| m.rebase.is_some())
    }
}

/// The claim transaction of `a`: the holder key put on the claim's lease,
/// guarded by it being free (or this holder's own) and the namespace record
/// unchanged; the fence read second, or created with its marker (and a
/// re-base or the block's count read again) when missing; then the instance
/// key, and the peer key in the claim's `first` transaction. The failure
/// branch reads the holder key, the fence, the record and the block's key,
/// in that order.
pub(super) fn claim_txn(
    want: &ClaimRequest<'_>,
    record: &namespace::ClaimGuard,
    a: &Attempt,
    first: bool,
) -> Txn {
    let ns = want.namespace;
    let (holder, fence, block_key) = (&a.holder, &a.fence, &a.block_key);
    let holder_guard = match a.candidate.kind {
        CandidateKind::Own => Compare::value(holder.clone(), CompareOp::Equal, want.holder),
        CandidateKind::Free => Compare::create_revision(holder.clone(), CompareOp::Equal, 0),
    };
    let mut when = vec![holder_guard, record.compare()];
    let mut then = vec![TxnOp::put(
        holder.clone(),
        want.holder,
        Some(PutOptions::new().with_lease(want.lease_id)),
    )];
    match &a.missing {
        // The success branch answers the fence second.
        None => then.push(TxnOp::get(fence.clone(), None)),
        Some(m) => {
            when.push(Compare::version(fence.clone(), CompareOp::Equal, 0));
            then.push(TxnOp::put(fence.clone(), a.created.get().to_string(), None));
            then.push(TxnOp::put(
                keys::fence_count_marker(ns, a.block_no),
                "",
                None,
            ));
            if let Some(base) = m.rebase {
                when.push(match a.block.own {
                    Counter::Absent => {
                        Compare::create_revision(block_key.clone(), CompareOp::Equal, 0)
                    }
                    _ => Compare::mod_revision(
                        block_key.clone(),
                        CompareOp::Equal,
                        a.block.own_revision,
                    ),
                });
                then.push(TxnOp::put(block_key.clone(), base.encode(), None));
            } else if m.distrust.is_none() {
                // Counted again after the creation, at this revision.
                then.extend(confirm_reads(ns, a.block_no));
            }
        }
    }
    if want.index {
        // Not bound to the lease: it outlives the claim, so a restart
        // finds the machine id it released last (see `instance`).
        // Last, after the reads the code below finds by position.
        then.push(TxnOp::put(
            keys::instance_claim(ns, want.holder, a.candidate.machine_id),
            "",
            None,
        ));
    }
    if let (true, Some((key, address))) = (first, &want.peer) {
        // On the claim's lease: the key goes when the lease does.
        let on_lease = PutOptions::new().with_lease(want.lease_id);
        then.push(TxnOp::put(key.clone(), address.clone(), Some(on_lease)));
    }
    // The failure branch reads the holder key first: a transaction
    // retried on another endpoint after its first attempt committed
    // (and the answer was lost) finds the key already ours, under our
    // lease. It answers the fence second, reads the namespace record
    // third, to tell a changed record from a lost race, and the
    // block's key fourth, to tell a re-base that lost to another.
    Txn::new().when(when).and_then(then).or_else([
        TxnOp::get(holder.clone(), None),
        TxnOp::get(fence.clone(), None),
        TxnOp::get(record.key.clone(), None),
        TxnOp::get(block_key.clone(), None),
    ])
}

/// What a claim transaction's answer means for the claim.
pub(super) enum Answer {
    /// The machine id is claimed (now, or by an earlier attempt of this
    /// transaction whose answer was lost).
    Committed,
    /// The namespace record changed, or another claim re-based the block:
    /// read the record and the pool again.
    ReadPoolAgain,
    /// Another claim took the machine id: try the next candidate.
    NextCandidate,
}

/// Reads the answer `resp` of `a`'s claim transaction in `round`.
pub(super) fn answer(
    want: &ClaimRequest<'_>,
    record: &namespace::ClaimGuard,
    a: &Attempt,
    resp: &etcd_client::TxnResponse,
    round: usize,
) -> Answer {
    let machine_id = a.candidate.machine_id;
    // Our lease is this claim's own, and only this transaction puts
    // it on a holder key, guarded by the record: a key already ours is
    // this claim's earlier commit, made while the record was unchanged.
    let already_ours = !resp.succeeded()
        && got(resp, 0)
            .is_some_and(|kv| kv.value() == want.holder.as_bytes() && kv.lease() == want.lease_id);
    if resp.succeeded() || already_ours {
        return Answer::Committed;
    }
    if record.changed(resp, 2) {
        debug!(
            round,
            "the namespace record changed during the claim; reading it again"
        );
        return Answer::ReadPoolAgain;
    }
    let holder_free = match (a.candidate.kind, got(resp, 0)) {
        (CandidateKind::Free, kv) => kv.is_none(),
        (CandidateKind::Own, kv) => kv.is_some_and(|kv| kv.value() == want.holder.as_bytes()),
    };
    let block_moved = got(resp, 3).map_or(0, |kv| kv.mod_revision()) != a.block.own_revision;
    if holder_free && a.missing.is_some_and(|m| m.rebase.is_some()) && block_moved {
        debug!(
            machine_id = machine_id.get(),
            block = a.block_no,
            round,
            "another claim re-based this fence-count block; reading the pool again"
        );
        return Answer::ReadPoolAgain;
    }
    debug!(
        machine_id = machine_id.get(),
        round, "claim lost a race, trying the next candidate"
    );
    Answer::NextCandidate
}

/// The floor of `a`'s machine id once its claim committed (`resp`), and its
/// fence key's value and mod revision as the claim left it (`(floor, fence,
/// revision)`). A block the claim re-based goes to `rebased`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn floor_after_commit(
    endpoints: &Endpoints,
    timeout: Duration,
    ns: &str,
    record: &namespace::ClaimGuard,
    absent_floor: Millis,
    a: &Attempt,
    resp: &etcd_client::TxnResponse,
    rebased: &mut Vec<u16>,
) -> Result<(Millis, Millis, i64), StoreError> {
    match (a.missing, resp.succeeded()) {
        (Some(m), true) => {
            if m.rebase.is_some() {
                rebased.push(a.block_no);
            }
            floor_of_created(endpoints, timeout, ns, absent_floor, a, &m, resp).await
        }
        (Some(m), false) if m.distrust.is_none() => {
            // An earlier attempt of this claim created the key, and
            // its confirmation was lost with its answer: take the
            // conservative floor rather than count again.
            let Some(created) = got(resp, 1).map(|kv| kv.mod_revision()) else {
                // Gone already: someone else deletes keys here.
                return Err(StoreError::LeaseLost {
                    reason: snowkeep_core::claim::LossReason::HolderChanged,
                });
            };
            raise_created(endpoints, timeout, a, created, absent_floor.max(m.floor)).await
        }
        // The fence as the transaction read it: in the success
        // branch, or in the failure branch of a retry that found its
        // earlier attempt committed.
        _ => match got(resp, 1) {
            Some(kv) => {
                let floor = keys::decode_fence(&a.fence, kv.value())?.max(record.floor);
                Ok((floor, floor, kv.mod_revision()))
            }
            None => Ok((absent_floor, absent_floor, 0)),
        },
    }
}

/// The floor of a machine id whose fence key `a`'s claim created (`m`, as
/// the pool read predicted), once the claim committed (`resp`): the
/// predicted floor when the count read inside the transaction still vouches
/// for it (or it was never trusted, and is logged), else the conservative
/// floor, raised on the key too when above the value created. With the key's
/// value and mod revision, as for [`floor_after_commit`].
async fn floor_of_created(
    endpoints: &Endpoints,
    timeout: Duration,
    ns: &str,
    absent_floor: Millis,
    a: &Attempt,
    m: &MissingFence,
    resp: &etcd_client::TxnResponse,
) -> Result<(Millis, Millis, i64), StoreError> {
    let machine_id = a.candidate.machine_id;
    let txn_revision = resp.header().map(|h| h.revision()).unwrap_or(0);
    let check = match m.distrust {
        Some(why) => Err(why),
        None => confirm_missing(resp, 3),
    };
    match check {
        Ok(()) => {
            debug!(
                namespace = ns,
                machine_id = machine_id.get(),
                floor_ms = m.floor.get(),
                "claimed a never-used machine id at the namespace floor"
            );
            Ok((m.floor, a.created, txn_revision))
        }
        Err(why) if m.distrust.is_some() => {
            note_distrust(ns, machine_id, a.block_no, why, m.floor, m, "");
            Ok((m.floor, a.created, txn_revision))
        }
        Err(why) => {
            // Something changed the block between the read
            // and the claim: fall back to the conservative
            // floor, on the key too.
            let floor = absent_floor.max(m.floor);
            let raised = raise_created(endpoints, timeout, a, txn_revision, floor).await?;
            note_distrust(
                ns,
                machine_id,
                a.block_no,
                why,
                floor,
                m,
                " (found by the claim transaction after the pool read vouched for the count)",
            );
            Ok(raised)
        }
    }
}

/// The first key of `resp`'s `i`-th operation, when that is a get that found one.
fn got(resp: &etcd_client::TxnResponse, i: usize) -> Option<KeyValue> {
    match resp.op_responses().get(i) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
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

/// `(floor, fence, revision)` of the fence key `a`'s claim created (at mod
/// revision `created`, value `a.created`) given the conservative `floor`:
/// raised to it when above the value created ([`raise_created_fence`]).
async fn raise_created(
    endpoints: &Endpoints,
    timeout: Duration,
    a: &Attempt,
    created: i64,
    floor: Millis,
) -> Result<(Millis, Millis, i64), StoreError> {
    if floor <= a.created {
        return Ok((floor, a.created, created));
    }
    let raised = raise_created_fence(endpoints, timeout, &a.fence, created, floor).await?;
    Ok((floor, floor, raised))
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
