//! One round of a claim ([`super::claim_ids`]): the pool read it
//! ranks (a window, or the whole range), its candidates in the claim order
//! (docs/design.md, *Claim lifecycle*), and what a full range's read hands
//! on to the question of how soon a holder's lease ends.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Duration;

use snowkeep_client::{MachineId, Millis};
use tracing::debug;

use super::ClaimRequest;
use crate::endpoints::Endpoints;
use crate::pool_read::{range_blocks, read_pool, window_blocks, Pool};
use snowkeep_core::claim::candidates::{rank_candidates, Candidate, CandidateKind};
use snowkeep_core::claim::{HeldId, StoreError};

/// The etcd leases of the holder keys of `range` in `holder_leases`, each
/// once, in machine id order; keys on no lease left out, and so are the
/// ones this claim took already (on `own`, its lease, revoked when the
/// claim gives up: not a holder to wait for).
pub(super) fn range_leases(
    holder_leases: &BTreeMap<MachineId, i64>,
    range: &Range<u32>,
    own: i64,
) -> Vec<i64> {
    let mut seen = BTreeSet::new();
    holder_leases
        .iter()
        .filter(|(id, &lease)| range.contains(&u32::from(id.get())) && lease != 0 && lease != own)
        .filter_map(|(_, &lease)| seen.insert(lease).then_some(lease))
        .collect()
}

/// One round's read of the pool and its candidates, best first, with the
/// first machine id skipped for a fence too far ahead (from a whole read).
///
/// Unless `whole` is set, it reads a window first ([`window_blocks`]: a few
/// blocks from a random one on, and the blocks of the `known` and `prefer`
/// machine ids) and ranks only the window's machine ids. A window whose
/// candidates all need a wait (a fence ahead) does not count: the claim
/// order takes a machine id that needs a wait only when the whole pool has
/// none without. The round then reads the whole pool, and so does every later
/// round of the claim (`whole` is set). The whole pool is every block of the
/// claim's range ([`range_blocks`]), not the namespace's other ranges.
pub(super) async fn read_round(
    endpoints: &Endpoints,
    timeout: Duration,
    want: &ClaimRequest<'_>,
    namespace_floor: Millis,
    held: &[HeldId],
    whole: &mut bool,
) -> Result<(Pool, Vec<Candidate>, Option<(MachineId, Millis)>), StoreError> {
    let mut keys_read = 0;
    if !*whole {
        let known: Vec<MachineId> = want.prefer.iter().chain(want.known).copied().collect();
        let left = want.count.saturating_sub(held.len());
        let window = window_blocks(&want.range, left, &known, &mut rand::rng());
        if let Some(window) = window {
            // Boxed, as the whole read below: the claim runs on a thread
            // with a small stack, and both reads' futures are large.
            let pool =
                Box::pin(read_pool(endpoints, timeout, want.namespace, Some(window))).await?;
            let (mut candidates, _) = candidates_of(&pool, want, namespace_floor, held);
            candidates.retain(|c| {
                c.kind == CandidateKind::Own
                    || want.prefer.contains(&c.machine_id)
                    || pool
                        .view
                        .fences
                        .get(&c.machine_id)
                        .is_none_or(|&f| f < want.now)
            });
            if !candidates.is_empty() {
                return Ok((pool, candidates, None));
            }
            keys_read = pool.keys_read;
            debug!(
                namespace = want.namespace,
                "no machine id of the window can be claimed without a wait; reading the whole range"
            );
        }
        *whole = true;
    }
    let blocks = range_blocks(&want.range);
    let mut pool = Box::pin(read_pool(endpoints, timeout, want.namespace, blocks)).await?;
    pool.keys_read += keys_read;
    let (candidates, too_far) = candidates_of(&pool, want, namespace_floor, held);
    Ok((pool, candidates, too_far))
}

/// The candidates of `pool` for `want` in the claim order (the holder's own
/// machine ids, then `prefer`, then the ranking), leaving out those held
/// already, outside the read's window, or fenced beyond `max_floor` (the
/// first of those is returned too).
fn candidates_of(
    pool: &Pool,
    want: &ClaimRequest<'_>,
    namespace_floor: Millis,
    held: &[HeldId],
) -> (Vec<Candidate>, Option<(MachineId, Millis)>) {
    let mut too_far = None;
    let mut candidates: Vec<_> = rank_candidates(
        &pool.view,
        want.range.clone(),
        want.holder,
        want.now,
        &mut rand::rng(),
    )
    .into_iter()
    .filter(|c| pool.covers(c.machine_id))
    .filter(|c| held.iter().all(|h| h.machine_id != c.machine_id))
    .filter(|c| want.take_own || c.kind != CandidateKind::Own)
    .filter(|c| {
        // A stable instance restarting after a crash waits for its own
        // fences, up to one fence lead ahead.
        let max_floor = if c.kind == CandidateKind::Own || want.prefer.contains(&c.machine_id) {
            want.max_own_floor.max(want.max_floor)
        } else {
            want.max_floor
        };
        match pool.view.fences.get(&c.machine_id) {
            Some(&f) if f.max(namespace_floor) > max_floor => {
                too_far.get_or_insert((c.machine_id, f.max(namespace_floor)));
                false
            }
            None if namespace_floor > max_floor => {
                too_far.get_or_insert((c.machine_id, namespace_floor));
                false
            }
            _ => true,
        }
    })
    .collect();
    // Stable: the ranking order stays within each group.
    candidates
        .sort_by_key(|c| c.kind != CandidateKind::Own && !want.prefer.contains(&c.machine_id));
    (candidates, too_far)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ranges_leases_are_its_holders_each_once_without_this_claims_own() {
        let leases: BTreeMap<MachineId, i64> =
            [(4, 7), (5, 9), (6, 7), (7, 0), (8, 3), (9, 42), (10, 11)]
                .into_iter()
                .map(|(id, lease)| (MachineId(id), lease))
                .collect();
        // Machine ids 5..10: 9, 7, none, 3, and this claim's own lease 42;
        // 4 and 10 are outside the range.
        assert_eq!(range_leases(&leases, &(5..10), 42), vec![9, 7, 3]);
        assert_eq!(range_leases(&leases, &(0..0), 42), Vec::<i64>::new());
    }
}
