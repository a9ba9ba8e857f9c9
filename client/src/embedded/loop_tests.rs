//! The renew loop's decisions against a scripted Lease API double, on
//! tokio's paused time with a [`TokioClock`]: when each call is made (ms
//! since the grant was sent) and what the generator is left with.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use snowkeep_proto::v1 as pb;

use super::api::{ApiCall, LeaseApi};
use super::{EmbeddedConfig, EmbeddedGenerator, Requester};
use crate::clock::TokioClock;
use crate::error::StopReason;
use crate::layout::{Layout, Millis};

/// Layout ms when each test starts.
const START_MS: u64 = 5_000_000;

/// A Lease API that answers Renew from a script (then never again) and
/// records each call with the ms since the test started.
struct FakeApi {
    start: tokio::time::Instant,
    renews: Mutex<VecDeque<Result<pb::LeaseGrant, tonic::Status>>>,
    /// How long each Renew answer takes to arrive.
    renew_delay: Duration,
    /// Check answers, in order (then never again).
    checks: Mutex<VecDeque<pb::CheckResponse>>,
    calls: Mutex<Vec<(u64, &'static str)>>,
}

impl FakeApi {
    fn new(renews: Vec<Result<pb::LeaseGrant, tonic::Status>>) -> Arc<Self> {
        Self::scripted(renews, Duration::ZERO, vec![])
    }

    fn scripted(
        renews: Vec<Result<pb::LeaseGrant, tonic::Status>>,
        renew_delay: Duration,
        checks: Vec<pb::CheckResponse>,
    ) -> Arc<Self> {
        Arc::new(Self {
            start: tokio::time::Instant::now(),
            renews: Mutex::new(renews.into()),
            renew_delay,
            checks: Mutex::new(checks.into()),
            calls: Mutex::default(),
        })
    }

    fn record(&self, call: &'static str) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap();
        self.calls.lock().unwrap().push((ms, call));
    }

    fn calls(&self) -> Vec<(u64, &'static str)> {
        self.calls.lock().unwrap().clone()
    }
}

impl LeaseApi for FakeApi {
    fn renew(&self, _request: pb::RenewRequest) -> ApiCall<pb::LeaseGrant> {
        self.record("renew");
        let answer = self.renews.lock().unwrap().pop_front();
        let delay = self.renew_delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            match answer {
                Some(answer) => answer,
                None => std::future::pending().await,
            }
        })
    }

    fn check(&self, _request: pb::CheckRequest) -> ApiCall<pb::CheckResponse> {
        self.record("check");
        let answer = self.checks.lock().unwrap().pop_front();
        Box::pin(async move {
            match answer {
                Some(answer) => Ok(answer),
                None => std::future::pending().await,
            }
        })
    }

    fn release(&self, _request: pb::ReleaseRequest) -> ApiCall<pb::ReleaseResponse> {
        self.record("release");
        Box::pin(async { Ok(pb::ReleaseResponse { released: 1 }) })
    }
}

/// A grant of machine id 4 (floor 1 s behind the start, fence 10 min ahead)
/// for `expires_in_ms`.
fn grant(expires_in_ms: u64) -> pb::LeaseGrant {
    let layout = Layout::default();
    pb::LeaseGrant {
        machine_ids: vec![pb::LeasedMachineId {
            machine_id: 4,
            floor_ms: START_MS - 1_000,
            fence_ms: START_MS + 600_000,
        }],
        lease_duration_ms: expires_in_ms,
        expires_in_ms,
        layout: Some(pb::Layout::from(&layout)),
        lease_token: "ab".repeat(32),
        ..Default::default()
    }
}

/// Accepts `grant(first_expires_in_ms)` sent now, with Check off.
async fn accepted(api: Arc<FakeApi>, first_expires_in_ms: u64) -> EmbeddedGenerator {
    accepted_checking(api, first_expires_in_ms, Duration::ZERO).await
}

/// Accepts `grant(first_expires_in_ms)` sent now, checking every `check_interval`.
async fn accepted_checking(
    api: Arc<FakeApi>,
    first_expires_in_ms: u64,
    check_interval: Duration,
) -> EmbeddedGenerator {
    let clock = TokioClock::new(Layout::default().to_unix_ms(Millis(START_MS)));
    let mut config = EmbeddedConfig::new("http://127.0.0.1:1", "ns");
    config.check_interval = check_interval;
    let sent = tokio::time::Instant::now().into_std();
    EmbeddedGenerator::accept(
        config,
        Requester::current(),
        clock,
        api,
        grant(first_expires_in_ms),
        sent,
    )
    .await
    .unwrap()
}

/// Polls `done` every 10 ms of (paused) time until it holds, failing after `within`.
async fn until(within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn renews_at_once_then_at_half_of_each_granted_lease() {
    let api = FakeApi::new(vec![
        Ok(grant(60_000)),
        Ok(grant(40_000)),
        Ok(grant(60_000)),
    ]);
    let generator = accepted(api.clone(), 60_000).await;
    until(Duration::from_secs(60), || api.calls().len() == 3).await;
    // 0: the first renewal proves the path; 30 s = half of 60 s; 50 s =
    // 30 s + half of 40 s.
    assert_eq!(
        api.calls(),
        vec![(0, "renew"), (30_000, "renew"), (50_000, "renew")]
    );
    // The published deadline counts from the last renewal's send time.
    let grant = generator.shared.generators[0].grant().unwrap();
    assert_eq!(
        grant.deadline,
        Some(api.start.into_std() + Duration::from_millis(50_000 + 60_000))
    );
    assert!(generator.next_id().await.is_ok());
    assert_eq!(generator.stopped(), None);
}

#[tokio::test(start_paused = true)]
async fn an_empty_renewal_stops_issuance_at_once_and_for_good() {
    let empty = pb::LeaseGrant {
        gone_reason: pb::LeaseCheckReason::LeaseGone as i32,
        ..Default::default()
    };
    let api = FakeApi::new(vec![Ok(empty)]);
    let generator = accepted(api.clone(), 60_000).await;
    until(Duration::from_secs(1), || generator.stopped().is_some()).await;
    assert_eq!(generator.stopped(), Some(StopReason::LeaseGone));
    assert!(!generator.is_ready());
    assert!(generator.next_id().await.is_err());
    // No renewal after the stop, and no Release: the lease is already gone.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(api.calls(), vec![(0, "renew")]);
}

/// In 1 s ticks, accept waits for the tick after the floor's (not the ms
/// after the floor), so the first id issues instead of failing with
/// ClockBehindFloor for the rest of the floor's second.
#[tokio::test(start_paused = true)]
async fn the_first_id_after_a_floor_wait_in_1s_ticks_issues() {
    let layout: Layout = "41/12/10@1767225600000/1s".parse().unwrap();
    let api = FakeApi::new(vec![]);
    let mut g = grant(60_000);
    g.layout = Some(pb::Layout::from(&layout));
    g.machine_ids[0].floor_ms = START_MS + 1;
    let clock = TokioClock::new(layout.to_unix_ms(Millis(START_MS)));
    let mut config = EmbeddedConfig::new("http://127.0.0.1:1", "ns");
    config.check_interval = Duration::ZERO;
    let sent = tokio::time::Instant::now().into_std();
    let e = EmbeddedGenerator::accept(config, Requester::current(), clock, api, g, sent)
        .await
        .unwrap();
    let id = e.next_id().await.unwrap();
    let tick = layout.tick_start(Millis(START_MS)).get() + 1_000;
    assert_eq!(layout.decode(id).unwrap().timestamp, Millis(tick));
}

/// A Renew that never answers (a stopped server) does not hold the stop:
/// `stopped()` says `Expired` at the lease's deadline, not when the call
/// times out (10 s later with the default request timeout), and no id is
/// issued after it.
#[tokio::test(start_paused = true)]
async fn a_hung_renewal_stops_at_the_deadline_not_at_its_timeout() {
    // The first renewal grants 6 s from its send (0 ms); the second, due at
    // 3 s, never answers.
    let api = FakeApi::new(vec![Ok(grant(6_000))]);
    let generator = accepted(api.clone(), 60_000).await;
    until(Duration::from_secs(5), || api.calls().len() == 2).await;
    assert_eq!(api.calls(), vec![(0, "renew"), (3_000, "renew")]);
    assert!(generator.next_id().await.is_ok());
    tokio::time::sleep_until(api.start + Duration::from_millis(5_990)).await;
    assert_eq!(generator.stopped(), None);
    tokio::time::sleep_until(api.start + Duration::from_millis(6_001)).await;
    assert_eq!(generator.stopped(), Some(StopReason::Expired));
    assert!(generator.next_id().await.is_err());
}

/// A Check that finds the lease gone while a Renew is in flight stops
/// issuance for good: the renewal's answer, arriving after the stop, must
/// not publish its grant again (it would issue on a machine id an operator
/// evicted, or after etcd was rolled back, until the lease's deadline).
#[tokio::test(start_paused = true)]
async fn a_renewal_answered_after_a_check_stopped_issuance_publishes_nothing() {
    let gone = pb::CheckResponse {
        valid: false,
        reason: pb::LeaseCheckReason::LeaseGone as i32,
        ..Default::default()
    };
    // The first renewal (sent at 0) answers at 2 s; the Check at 1 s says
    // the lease is gone.
    let api = FakeApi::scripted(vec![Ok(grant(60_000))], Duration::from_secs(2), vec![gone]);
    let generator = accepted_checking(api.clone(), 60_000, Duration::from_secs(1)).await;
    until(Duration::from_secs(2), || generator.stopped().is_some()).await;
    assert_eq!(generator.stopped(), Some(StopReason::LeaseGone));
    tokio::time::sleep_until(api.start + Duration::from_millis(2_500)).await;
    assert_eq!(api.calls(), vec![(0, "renew"), (1_000, "check")]);
    assert_eq!(generator.stopped(), Some(StopReason::LeaseGone));
    assert!(!generator.is_ready());
    assert!(generator.next_id().await.is_err());
    assert_eq!(generator.shared.generators[0].grant(), None);
}

/// A grant that names one machine id twice is refused: two slots on one
/// machine id would stamp the same ids (found by the Go port's review).
#[tokio::test(start_paused = true)]
async fn a_grant_listing_a_machine_id_twice_is_refused() {
    let api = FakeApi::new(vec![]);
    let mut twice = grant(60_000);
    twice.machine_ids.push(twice.machine_ids[0]);
    let clock = TokioClock::new(Layout::default().to_unix_ms(Millis(START_MS)));
    let mut config = EmbeddedConfig::new("http://127.0.0.1:1", "ns");
    config.machine_ids = 2;
    let sent = tokio::time::Instant::now().into_std();
    let refused = EmbeddedGenerator::accept(config, Requester::current(), clock, api, twice, sent)
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            crate::ClientError::GrantDuplicate { machine_id: 4 }
        ),
        "{refused:?}"
    );
}

/// An Acquire answer that arrives after the lease it grants has ended is
/// refused at start (so the caller releases it), not accepted as a
/// generator that stops at once and never releases.
#[tokio::test(start_paused = true)]
async fn a_grant_expired_on_arrival_is_refused() {
    let api = FakeApi::new(vec![]);
    let clock = TokioClock::new(Layout::default().to_unix_ms(Millis(START_MS)));
    let mut config = EmbeddedConfig::new("http://127.0.0.1:1", "ns");
    config.check_interval = Duration::ZERO;
    // Sent 2 s ago, for a lease of 1 s.
    let sent = tokio::time::Instant::now().into_std();
    tokio::time::advance(Duration::from_secs(2)).await;
    let refused = EmbeddedGenerator::accept(
        config,
        Requester::current(),
        clock,
        api.clone(),
        grant(1_000),
        sent,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refused, crate::ClientError::GrantExpired),
        "{refused:?}"
    );
    assert_eq!(api.calls(), vec![]);
}

/// [`grant`] accepted on a clock with ticks, where `next_id` hands ids out
/// of per-thread runs, renewing as `api` answers; and the first id of
/// `START_MS`.
async fn accepted_ticking(api: Arc<FakeApi>) -> (EmbeddedGenerator, u64) {
    let clock = crate::clock::ManualClock::ticking(Layout::default().to_unix_ms(Millis(START_MS)));
    let generator = EmbeddedGenerator::accept(
        EmbeddedConfig::new("http://127.0.0.1:1", "ns"),
        Requester::current(),
        clock.clone(),
        api,
        grant(60_000),
        crate::clock::Clock::now(&*clock),
    )
    .await
    .unwrap();
    let first = Layout::default().encode(Millis(START_MS), crate::layout::MachineId(4), 0);
    (generator, first)
}

/// A stop ends the runs of ids threads took before it: not one id after.
#[tokio::test(start_paused = true)]
async fn a_stop_ends_every_run_at_once() {
    let (generator, first) = accepted_ticking(FakeApi::new(vec![])).await;
    // Runs of 1, 2 and then 4 (3 to 6): 4 to 6 are left in this thread's run.
    for seq in 0..4 {
        assert_eq!(generator.next_id().await, Ok(first + seq));
    }
    generator.shared.stop(StopReason::LeaseGone);
    assert_eq!(
        generator.next_id().await,
        Err(crate::error::GenerateError::NoGrant)
    );
}

/// A renewal's grant ends the runs taken under the one before: every id
/// handed out after it is published comes from a run taken under it.
#[tokio::test(start_paused = true)]
async fn a_published_renewal_ends_the_runs_before_it() {
    let api = FakeApi::scripted(vec![Ok(grant(50_000))], Duration::from_secs(1), vec![]);
    let (generator, first) = accepted_ticking(api.clone()).await;
    let deadline = || generator.shared.generators[0].grant().unwrap().deadline;
    let before = deadline();
    for seq in 0..4 {
        assert_eq!(generator.next_id().await, Ok(first + seq));
    }
    until(Duration::from_secs(2), || deadline() != before).await;
    // 4 to 6 are a gap; the new run halves to 2 (7 and 8).
    assert_eq!(generator.next_id().await, Ok(first + 7));
    assert_eq!(generator.next_id().await, Ok(first + 8));
}
