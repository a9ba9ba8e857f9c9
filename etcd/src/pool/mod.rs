//! Claiming machine ids from a namespace's pool as `pool_read` reads it (a
//! window of it, or all of it), one guarded transaction per candidate.
//! Shared by the server's own claims and the Lease API's.

mod candidate;
mod round;

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use snowkeep_client::{MachineId, Millis};

use super::endpoints::Endpoints;
use super::namespace;
use super::pool_read::Pool;
use candidate::{answer, claim_txn, floor_after_commit, Answer, Attempt};
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
    ///
    /// [`fence_count`]: super::fence_count
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
    /// The value a claim writes into a fence key it creates, when above the
    /// floor it picks for it. The server's own claims pass the fence their
    /// first raise would write (the clock plus one fence lead,
    /// `fence_horizon`), so a never-used machine id's first grant needs no
    /// write of its own (docs/design.md, *What a claim writes*); at most
    /// `absent_floor`. Lease API claims pass `Millis(0)` (the floor): their
    /// grant transaction writes the fence it grants.
    pub(super) created_fence: Millis,
    /// `(key, value)` of the holder's peer key, put on the claim's lease by
    /// the claim's first transaction (`None`: no peer key).
    pub(super) peer: Option<(String, String)>,
}

impl ClaimRequest<'_> {
    /// `(absent_floor, max_floor)` for a claim at layout time `now`.
    pub(super) fn floors(
        now: Millis,
        fence_horizon: Duration,
        max_fence_wait: Duration,
    ) -> (Millis, Millis) {
        let after = |d: Duration| now.saturating_add(d);
        (after(fence_horizon), after(max_fence_wait))
    }
}

/// Machine ids claimed by [`claim_ids`].
pub(super) struct Claimed {
    /// The machine ids with their floors, and their fences as the claim
    /// left them (the floor, or above it for a fence key the claim created
    /// at [`ClaimRequest::created_fence`]).
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
/// (`candidate::confirm_missing`). A re-base is also guarded by the
/// block's key as read: one that fails because another re-base moved it
/// reads the pool again.
///
/// [`fence_count::missing_fence`]: super::fence_count::missing_fence
///
/// What the pool reads found goes to `reads`, a refusal's too.
pub(super) async fn claim_ids(
    endpoints: &Endpoints,
    timeout: Duration,
    want: ClaimRequest<'_>,
    reads: &mut ClaimReads,
) -> Result<Claimed, StoreError> {
    let ns = want.namespace;
    let mut claimed = Claimed::none(want.count);
    // Set once a window had no candidate: the rest of the claim reads the
    // whole pool.
    let mut whole = false;
    'rounds: for round in 0..CLAIM_ROUNDS {
        // The namespace record, read each round: a claim commits only while
        // it is unchanged (not marked rolled back since), and every floor is
        // at least the namespace floor an operator confirmed.
        let record = namespace::ClaimGuard::read(endpoints, timeout, ns).await?;
        let absent_floor = want.absent_floor.max(record.floor);
        let (pool, candidates, too_far) = read_round(
            endpoints,
            timeout,
            &want,
            record.floor,
            &claimed.held,
            &mut whole,
        )
        .await?;
        reads.keys_read += pool.keys_read;
        let Pool {
            view,
            root,
            blocks,
            holder_leases,
            ..
        } = pool;
        if candidates.is_empty() {
            return Err(refusal(&want, too_far, &holder_leases, reads));
        }
        // Blocks this claim changed since the read: no second re-base of one.
        let mut rebased = Vec::new();
        for candidate in candidates.into_iter().take(CANDIDATES_PER_ROUND) {
            let machine_id = candidate.machine_id;
            let fence_present = view.fences.contains_key(&machine_id);
            let floors = (record.floor, absent_floor, want.created_fence);
            let attempt = Attempt::new(ns, candidate, &blocks, &root, fence_present, floors);
            if attempt.rebases() && rebased.contains(&attempt.block_no) {
                continue;
            }
            let txn = claim_txn(&want, &record, &attempt, claimed.held.is_empty());
            let resp = endpoints.txn("claim txn", timeout, txn).await?;
            match answer(&want, &record, &attempt, &resp, round) {
                Answer::Committed => {}
                Answer::ReadPoolAgain => continue 'rounds,
                Answer::NextCandidate => continue,
            }
            let txn_revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            let (floor, fence, fence_revision) = floor_after_commit(
                endpoints,
                timeout,
                ns,
                &record,
                absent_floor,
                &attempt,
                &resp,
                &mut rebased,
            )
            .await?;
            let own = candidate.kind == CandidateKind::Own || want.prefer.contains(&machine_id);
            let at = (floor, fence, fence_revision);
            claimed.add(machine_id, at, txn_revision, own);
            if claimed.held.len() == want.count {
                return Ok(claimed);
            }
        }
    }
    Err(StoreError::Timeout {
        op: "claim (every candidate was taken concurrently)",
        after: timeout,
    })
}

impl Claimed {
    /// Nothing claimed yet, of `count` machine ids to claim.
    fn none(count: usize) -> Self {
        Self {
            held: Vec::with_capacity(count),
            revision: 0,
            fence_revisions: Vec::with_capacity(count),
            own: Vec::new(),
        }
    }

    /// Records `machine_id` claimed at `floor` by a transaction that
    /// committed at `txn_revision` and left its fence key at `fence` (mod
    /// revision `fence_revision`); `own` when this holder held it before.
    fn add(
        &mut self,
        machine_id: MachineId,
        (floor, fence, fence_revision): (Millis, Millis, i64),
        txn_revision: i64,
        own: bool,
    ) {
        self.revision = self.revision.max(txn_revision);
        if own {
            self.own.push(machine_id);
        }
        self.held.push(HeldId {
            machine_id,
            floor,
            fence,
        });
        self.fence_revisions.push(fence_revision);
    }
}

/// Why a round found no candidate: [`StoreError::FenceTooFarAhead`] when
/// the read found a free machine id only beyond the floor bound (`too_far`),
/// else [`StoreError::NoFreeMachineId`], for which the range's holder
/// leases go to `reads`.
fn refusal(
    want: &ClaimRequest<'_>,
    too_far: Option<(MachineId, Millis)>,
    holder_leases: &BTreeMap<MachineId, i64>,
    reads: &mut ClaimReads,
) -> StoreError {
    if let Some((machine_id, fence)) = too_far {
        let ahead = Duration::from_millis(fence.get().saturating_sub(want.now.get()));
        let max = Duration::from_millis(want.max_floor.get().saturating_sub(want.now.get()));
        return StoreError::FenceTooFarAhead {
            machine_id,
            fence,
            ahead,
            max,
        };
    }
    reads.full_range_leases = range_leases(holder_leases, &want.range, want.lease_id);
    StoreError::NoFreeMachineId {
        namespace: want.namespace.to_owned(),
        capacity: want.range.end - want.range.start,
        start: want.range.start,
        end: want.range.end,
    }
}
