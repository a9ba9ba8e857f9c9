//! The claim loop's waits, against the store double of [`super`]: how long
//! a claimed machine id's previous fence is waited for (one's own fence up
//! to a fence lead, any other up to `--max-fence-wait`), and what a full
//! range does when the store cannot tell how soon its holders' leases end.

use std::time::Duration;

use snowkeep_client::MachineId;

use super::{full_range, held, Call, Harness, Script, START_MS};
use crate::claim::StoreError;

/// An outage budget of 60 s: a fence lead of 90 s, against the harness's
/// `--max-fence-wait` of 10 s.
const BUDGET: Duration = Duration::from_secs(60);

fn claims_and_abandons(h: &Harness) -> Vec<(u64, Call)> {
    h.log()
        .into_iter()
        .filter(|(_, c)| matches!(c, Call::Claim | Call::Abandon))
        .collect()
}

/// A two-id claim of a stable instance back from a crash: machine id 5 is
/// its own (its fence 80 s ahead, within the 90 s lead), machine id 6 a
/// stranger's fenced 30 s ahead (past the 10 s --max-fence-wait). Giving
/// the claim back would give up id 5 with it (the claim's one etcd lease
/// holds both), so the claim waits the 80 s for both and is never given
/// back.
#[tokio::test(start_paused = true)]
async fn a_claim_holding_an_own_id_waits_for_all_its_ids_and_keeps_them() {
    let own = START_MS + 80_000;
    let mut h = Harness::start_scripted(Script {
        claims: vec![vec![held(5, own), held(6, START_MS + 30_000)]],
        own: vec![MachineId(5)],
        outage_budget: BUDGET,
        ..Script::default()
    });
    let (at, grant) = h.next_grant(0).await;
    assert_eq!(
        (at, grant.map(|g| g.machine_id)),
        (80_001, Some(MachineId(5)))
    );
    let (at, grant) = h.next_grant(1).await;
    assert_eq!(
        (at, grant.map(|g| g.machine_id)),
        (80_001, Some(MachineId(6)))
    );
    assert_eq!(claims_and_abandons(&h), vec![(0, Call::Claim)]);
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// The same stranger's id fenced 30 s ahead, in a claim without an id of
/// its own: given back too (its wait is --max-fence-wait, 10 s).
#[tokio::test(start_paused = true)]
async fn a_strangers_id_fenced_past_the_fence_wait_is_given_back() {
    let mut h = Harness::start_scripted(Script {
        claims: vec![
            vec![held(6, START_MS + 30_000)],
            vec![held(7, START_MS - 1_000)],
        ],
        own: vec![MachineId(5)],
        outage_budget: BUDGET,
        ..Script::default()
    });
    let (at, grant) = h.next_grant(0).await;
    assert_eq!((at, grant.map(|g| g.machine_id)), (0, Some(MachineId(7))));
    assert_eq!(
        claims_and_abandons(&h),
        vec![(0, Call::Claim), (0, Call::Abandon), (0, Call::Claim)]
    );
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

fn unanswered() -> StoreError {
    StoreError::Timeout {
        op: "lease ttl",
        after: Duration::from_millis(500),
    }
}

fn claims_and_asks(h: &Harness) -> Vec<(u64, Call)> {
    h.log()
        .into_iter()
        .filter(|(_, c)| matches!(c, Call::Claim | Call::LeaseEnd))
        .collect()
}

/// A first claim finds the range full and etcd does not answer about the
/// holders' leases, five times in a row: the loop retries with backoff,
/// asking again at each refusal, and never gives up; the sixth claim holds.
#[tokio::test(start_paused = true)]
async fn a_full_range_whose_lease_ends_cannot_be_asked_is_retried_not_given_up() {
    let mut h = Harness::start_scripted(Script {
        refusals: (0..5).map(|_| full_range()).collect(),
        lease_ends: (0..5).map(|_| Err(unanswered())).collect(),
        claims: vec![vec![held(3, START_MS - 1_000)]],
        ..Script::default()
    });
    let (at, grant) = h.next_grant(0).await;
    assert_eq!(
        (at, grant.map(|g| g.machine_id)),
        (3_100, Some(MachineId(3)))
    );
    let mut expected = Vec::new();
    for at in [0, 100, 300, 700, 1_500] {
        expected.push((at, Call::Claim));
        expected.push((at, Call::LeaseEnd));
    }
    expected.push((3_100, Call::Claim));
    assert_eq!(claims_and_asks(&h), expected);
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// A store that never answers about the holders' leases: claimed again for
/// one fence lead (3 s with the 2 s budget) from the first unanswered ask,
/// then the refusal stands. Claims at 0, 100, 300, 700, 1500 and 3100 ms,
/// each asking.
#[tokio::test(start_paused = true)]
async fn a_lease_question_never_answered_is_retried_for_one_fence_lead_only() {
    let mut h = Harness::start_scripted(Script {
        refusals: (0..50).map(|_| full_range()).collect(),
        lease_ends: (0..50).map(|_| Err(unanswered())).collect(),
        // Never reached: the 50 refusals outlast the wait.
        claims: vec![vec![held(3, START_MS - 1_000)]],
        ..Script::default()
    });
    let err = h.ended().await.unwrap_err();
    assert!(matches!(err, StoreError::NoFreeMachineId { .. }), "{err}");
    assert_eq!(h.elapsed_ms(), 3_100);
    let mut expected = Vec::new();
    for at in [0, 100, 300, 700, 1_500, 3_100] {
        expected.push((at, Call::Claim));
        expected.push((at, Call::LeaseEnd));
    }
    assert_eq!(claims_and_asks(&h), expected);
}

/// One unanswered ask, then an answer: the wait runs from that answer
/// (100 ms + 1 s + 2 s), and is not asked about again.
#[tokio::test(start_paused = true)]
async fn the_wait_for_an_ending_lease_starts_at_the_first_answer() {
    let mut h = Harness::start_scripted(Script {
        refusals: (0..20).map(|_| full_range()).collect(),
        lease_ends: vec![Err(unanswered()), Ok(Some(Duration::from_secs(1)))],
        claims: vec![vec![held(3, START_MS - 1_000)]],
        ..Script::default()
    });
    let err = h.ended().await.unwrap_err();
    assert!(matches!(err, StoreError::NoFreeMachineId { .. }), "{err}");
    // Claims at 0, 100, 300, 700, 1500 and 3100 ms; the deadline is 3100.
    assert_eq!(h.elapsed_ms(), 3_100);
    let asks: Vec<(u64, Call)> = claims_and_asks(&h)
        .into_iter()
        .filter(|(_, c)| *c == Call::LeaseEnd)
        .collect();
    assert_eq!(asks, vec![(0, Call::LeaseEnd), (100, Call::LeaseEnd)]);
}
