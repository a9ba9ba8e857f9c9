//! Which machine id to try to claim, in the order docs/design.md, claim lifecycle prefers:
//!
//! 1. ids this instance id already holds (a stable instance restarting, or this
//!    process re-claiming after a lost lease), then free ids this instance id
//!    released last whose fence is past (a stable instance after a clean
//!    restart). One whose fence is still ahead was held again after that
//!    release and lost, its fence raised up to 1.5 outage budgets ahead:
//!    it ranks with the waits (class 4), not before ids that need none;
//! 2. released ids whose fence is in the past (no wait);
//! 3. never-used ids (no fence key);
//! 4. free ids whose fence is still ahead, shortest wait first.
//!
//! Classes 2 and 3 are shuffled so concurrent claimers spread over the pool
//! instead of all fighting over id 0. Pure: the caller passes the pool view,
//! the clock reading and the random source. The etcd store ranks a window
//! of the pool this way, and the whole pool only when the window has no
//! candidate that needs no wait (docs/design.md, *What a claim reads*).

use std::collections::BTreeMap;
use std::ops::Range;

use rand::seq::SliceRandom;
use rand::Rng;
use snowkeep_client::{MachineId, Millis};

/// How a candidate machine id would be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateKind {
    /// The holder key names this instance id: rebind it to our lease.
    Own,
    /// No holder key: create it.
    Free,
}

/// A machine id to try, with how to claim it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The machine id.
    pub machine_id: MachineId,
    /// Own or free.
    pub kind: CandidateKind,
}

/// A snapshot of a namespace's machine ids.
#[derive(Debug, Default, Clone)]
pub struct PoolView {
    /// Holder keys present: machine id → holder's instance id.
    pub holders: BTreeMap<MachineId, String>,
    /// Fence keys present: machine id → fence (layout ms).
    pub fences: BTreeMap<MachineId, Millis>,
    /// Last-holder keys present: machine id → instance id of its last release.
    pub last_holders: BTreeMap<MachineId, String>,
    /// Machine ids whose fence key holds an unreadable value: never claimed
    /// (their true fence is unknown) until an operator repairs the key.
    pub quarantined: std::collections::BTreeSet<MachineId>,
}

/// Ranks the machine ids of `range` for `instance_id` at layout time `now`.
/// Held ids of other instances are never candidates; an empty result means the
/// range is full.
pub fn rank_candidates(
    view: &PoolView,
    range: Range<u32>,
    instance_id: &str,
    now: Millis,
    rng: &mut impl Rng,
) -> Vec<Candidate> {
    let mut own = Vec::new();
    let mut own_released = Vec::new();
    let mut released = Vec::new();
    let mut never_used = Vec::new();
    let mut ahead = Vec::new();
    for raw in range {
        let Ok(raw) = u16::try_from(raw) else { break };
        let id = MachineId(raw);
        if view.quarantined.contains(&id) {
            continue;
        }
        match (view.holders.get(&id), view.fences.get(&id)) {
            (Some(holder), _) if holder == instance_id => own.push(id),
            (Some(_), _) => {}
            (None, fence)
                if view.last_holders.get(&id).is_some_and(|h| h == instance_id)
                    && fence.is_none_or(|&f| f < now) =>
            {
                own_released.push(id)
            }
            (None, None) => never_used.push(id),
            (None, Some(&fence)) if fence < now => released.push(id),
            (None, Some(&fence)) => ahead.push((fence, id)),
        }
    }
    released.shuffle(rng);
    never_used.shuffle(rng);
    ahead.sort();
    let own = own.into_iter().map(|machine_id| Candidate {
        machine_id,
        kind: CandidateKind::Own,
    });
    let free = own_released
        .into_iter()
        .chain(released)
        .chain(never_used)
        .chain(ahead.into_iter().map(|(_, id)| id))
        .map(|machine_id| Candidate {
            machine_id,
            kind: CandidateKind::Free,
        });
    own.chain(free).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn view(holders: &[(u16, &str)], fences: &[(u16, u64)]) -> PoolView {
        PoolView {
            last_holders: BTreeMap::new(),
            quarantined: Default::default(),
            holders: holders
                .iter()
                .map(|&(m, h)| (MachineId(m), h.to_owned()))
                .collect(),
            fences: fences
                .iter()
                .map(|&(m, f)| (MachineId(m), Millis(f)))
                .collect(),
        }
    }

    fn ids(c: &[Candidate]) -> Vec<u16> {
        c.iter().map(|c| c.machine_id.get()).collect()
    }

    #[test]
    fn prefers_own_then_released_then_never_used_then_fence_ahead() {
        // 0: held by other; 1: own; 2: released, fence past; 3: never used;
        // 4: fence 900 ms ahead; 5: fence 100 ms ahead.
        let v = view(
            &[(0, "b"), (1, "a")],
            &[(0, 10), (1, 10), (2, 500), (4, 1900), (5, 1100)],
        );
        let got = rank_candidates(&v, 0..6, "a", Millis(1000), &mut StdRng::seed_from_u64(1));
        assert_eq!(ids(&got), vec![1, 2, 3, 5, 4]);
        assert_eq!(got[0].kind, CandidateKind::Own);
        assert!(got[1..].iter().all(|c| c.kind == CandidateKind::Free));
    }

    #[test]
    fn a_stable_instance_prefers_the_id_it_released_last() {
        let mut v = view(&[], &[(0, 10), (1, 10), (2, 10)]);
        v.last_holders.insert(MachineId(2), "a".into());
        v.last_holders.insert(MachineId(0), "b".into());
        let got = rank_candidates(&v, 0..3, "a", Millis(1000), &mut StdRng::seed_from_u64(3));
        assert_eq!(
            got[0],
            Candidate {
                machine_id: MachineId(2),
                kind: CandidateKind::Free
            }
        );
    }

    #[test]
    fn an_id_released_last_whose_fence_is_ahead_waits_behind_ids_that_need_no_wait() {
        // 2 was released last by "a", then held again and lost: its fence is
        // 500 ms ahead. 0: released, fence past; 1: never used; 3: fence 100
        // ms ahead.
        let mut v = view(&[], &[(0, 10), (2, 1500), (3, 1100)]);
        v.last_holders.insert(MachineId(2), "a".into());
        let got = rank_candidates(&v, 0..4, "a", Millis(1000), &mut StdRng::seed_from_u64(3));
        assert_eq!(ids(&got), vec![0, 1, 3, 2]);
    }

    #[test]
    fn a_quarantined_id_is_never_a_candidate() {
        let mut v = view(&[], &[]);
        v.quarantined.insert(MachineId(1));
        let got = rank_candidates(&v, 0..3, "a", Millis(0), &mut StdRng::seed_from_u64(1));
        let mut got = ids(&got);
        got.sort();
        assert_eq!(got, vec![0, 2]);
    }

    #[test]
    fn a_full_range_has_no_candidates() {
        let v = view(&[(3, "x"), (4, "y")], &[]);
        assert!(
            rank_candidates(&v, 3..5, "a", Millis(0), &mut StdRng::seed_from_u64(1)).is_empty()
        );
    }

    #[test]
    fn stays_inside_the_range() {
        let got = rank_candidates(
            &PoolView::default(),
            10..20,
            "a",
            Millis(0),
            &mut StdRng::seed_from_u64(7),
        );
        let mut sorted = ids(&got);
        sorted.sort();
        assert_eq!(sorted, (10..20).collect::<Vec<_>>());
    }

    #[test]
    fn concurrent_claimers_start_at_different_ids() {
        let firsts: std::collections::HashSet<u16> = (0..50)
            .map(|seed| {
                rank_candidates(
                    &PoolView::default(),
                    0..4096,
                    "a",
                    Millis(0),
                    &mut StdRng::seed_from_u64(seed),
                )[0]
                .machine_id
                .get()
            })
            .collect();
        // 50 claimers over 4096 ids: a herd on one id would give 1.
        assert!(
            firsts.len() >= 45,
            "only {} distinct first choices",
            firsts.len()
        );
    }
}
