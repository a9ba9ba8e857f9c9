//! The claim loop's decisions against a scripted [`ClaimStore`] double, on
//! tokio's paused time with a [`TokioClock`], so every figure is exact: when
//! each store call happens (ms since start), what it carries, and what the
//! generators see. etcd's own semantics are the integration tests' business.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use snowkeep_client::{
    FenceDemand, GenerateError, Generator, GeneratorMetrics, Grant, Layout, MachineId, Millis,
    TokioClock,
};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

#[path = "tests_wait.rs"]
mod wait;

use super::{
    Claim, ClaimManager, ClaimStore, ClaimTiming, HeldId, HolderWatch, LossReason, OnLeaseLost,
    Slot, StoreError,
};

/// Layout ms at the start of every test.
const START_MS: u64 = 1_000_000;
/// The lease TTL: renewals every 1 s.
const TTL: Duration = Duration::from_secs(3);
/// The outage budget: 2 s.
const BUDGET_MS: u64 = 2_000;
/// Fences are raised 1.5 budgets ahead (3 s), once they are one budget or
/// less ahead, busy or idle: once per half budget (1 s).
const LEAD_MS: u64 = 3_000;

/// A store call as the double saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Claim,
    /// The fences asked for, and whether any grant was published then.
    Advance {
        fences: Vec<u64>,
        published: bool,
    },
    Renew,
    /// The fences given back, and whether every grant was withdrawn then.
    Release {
        last_used: Vec<u64>,
        withdrawn: bool,
    },
    Abandon,
    CheckNamespace,
    /// Asked how soon a holder's lease of a full range ends.
    LeaseEnd,
}

type Log = Arc<Mutex<Vec<(u64, Call)>>>;

/// A store that hands out scripted claims and records every call with the
/// ms since the test started.
struct FakeStore {
    start: tokio::time::Instant,
    log: Log,
    /// Claims handed out in order; once empty, a claim never answers.
    claims: VecDeque<Vec<HeldId>>,
    /// Errors answered to claims before any of `claims` (in order).
    refusals: VecDeque<StoreError>,
    /// Answers to [`ClaimStore::holder_lease_end`], in order; once empty,
    /// `Ok(None)`.
    lease_ends: VecDeque<Result<Option<Duration>, StoreError>>,
    /// Machine ids that are this instance's own whenever a claim holds them
    /// ([`Claim::own_fences`]).
    own: Vec<MachineId>,
    /// Whether the store answers: renewals (with a new deadline now + TTL)
    /// and fence writes succeed, or time out.
    up: Arc<AtomicBool>,
    /// Resolves the holder watch of the first hold when the test says so.
    holder_watch: Mutex<Option<oneshot::Receiver<LossReason>>>,
    /// The generators' grant channels, to see what was published at each call.
    grants: Vec<watch::Receiver<Option<Grant>>>,
}

impl FakeStore {
    fn record(&self, call: Call) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap();
        self.log.lock().unwrap().push((ms, call));
    }

    fn any_published(&self) -> bool {
        self.grants.iter().any(|g| g.borrow().is_some())
    }
}

impl ClaimStore for FakeStore {
    type Lease = ();

    async fn claim(&mut self) -> Result<Claim, StoreError> {
        self.record(Call::Claim);
        if let Some(e) = self.refusals.pop_front() {
            return Err(e);
        }
        let Some(held) = self.claims.pop_front() else {
            return std::future::pending().await;
        };
        let own_fences = held
            .iter()
            .map(|h| h.machine_id)
            .filter(|m| self.own.contains(m))
            .collect();
        Ok(Claim {
            held,
            deadline: Some(now() + TTL),
            lease: (),
            own_fences,
        })
    }

    async fn advance_fences(
        &mut self,
        _claim: &Claim,
        fences: &[Millis],
    ) -> Result<(), StoreError> {
        let published = self.any_published();
        self.record(Call::Advance {
            fences: fences.iter().map(|f| f.get()).collect(),
            published,
        });
        if self.up.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(StoreError::Timeout {
                op: "fence txn",
                after: Duration::from_millis(500),
            })
        }
    }

    async fn renew(&mut self, _claim: &Claim) -> Result<Instant, StoreError> {
        self.record(Call::Renew);
        if self.up.load(Ordering::SeqCst) {
            Ok(now() + TTL)
        } else {
            Err(StoreError::Timeout {
                op: "keepalive",
                after: Duration::from_millis(500),
            })
        }
    }

    async fn release(&mut self, _claim: &Claim, last_used: &[Millis]) -> Result<(), StoreError> {
        let withdrawn = !self.any_published();
        self.record(Call::Release {
            last_used: last_used.iter().map(|f| f.get()).collect(),
            withdrawn,
        });
        Ok(())
    }

    async fn abandon(&mut self, _claim: &Claim) {
        self.record(Call::Abandon);
    }

    fn watch_holders(&self, _claim: &Claim) -> HolderWatch {
        match self.holder_watch.lock().unwrap().take() {
            Some(rx) => Box::pin(async move {
                match rx.await {
                    Ok(reason) => Ok(reason),
                    Err(_) => std::future::pending().await,
                }
            }),
            None => Box::pin(std::future::pending()),
        }
    }

    async fn check_namespace(&mut self) -> Result<(), StoreError> {
        self.record(Call::CheckNamespace);
        Ok(())
    }

    async fn holder_lease_end(&mut self) -> Result<Option<Duration>, StoreError> {
        self.record(Call::LeaseEnd);
        self.lease_ends.pop_front().unwrap_or(Ok(None))
    }

    fn may_claim_others(&self) -> bool {
        true
    }
}

/// The monotonic instant now (tokio's paused clock, as [`TokioClock`] reads it).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn held(machine_id: u16, floor: u64) -> HeldId {
    HeldId {
        machine_id: MachineId(machine_id),
        floor: Millis(floor),
        fence: Millis(floor),
    }
}

/// What the double answers and how the loop is timed, for
/// [`Harness::start_scripted`].
pub(super) struct Script {
    /// Errors answered to the first claims.
    pub(super) refusals: Vec<StoreError>,
    /// Answers to [`ClaimStore::holder_lease_end`] (then `Ok(None)`).
    pub(super) lease_ends: Vec<Result<Option<Duration>, StoreError>>,
    /// Claims handed out after the refusals (one generator slot per machine
    /// id of the first).
    pub(super) claims: Vec<Vec<HeldId>>,
    /// Machine ids that are the instance's own in any claim.
    pub(super) own: Vec<MachineId>,
    /// Whether the store answers renewals and fence writes.
    pub(super) up: bool,
    /// `--on-lease-lost`.
    pub(super) on_lease_lost: OnLeaseLost,
    /// Resolves the first hold's holder watch when the test says so.
    pub(super) holder_watch: Option<oneshot::Receiver<LossReason>>,
    /// The outage budget (the fence lead is 1.5 of it); `--max-fence-wait`
    /// is 10 s.
    pub(super) outage_budget: Duration,
    /// The namespace's layout.
    pub(super) layout: Layout,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            refusals: Vec::new(),
            lease_ends: Vec::new(),
            claims: Vec::new(),
            own: Vec::new(),
            up: true,
            on_lease_lost: OnLeaseLost::Exit,
            holder_watch: None,
            outage_budget: Duration::from_millis(BUDGET_MS),
            layout: Layout::default(),
        }
    }
}

/// The pieces of one test: the manager's run, its generators and grant
/// channels, the call log and the release token.
struct Harness {
    start: tokio::time::Instant,
    log: Log,
    grants: Vec<watch::Receiver<Option<Grant>>>,
    generators: Vec<Arc<Generator>>,
    release: CancellationToken,
    run: tokio::task::JoinHandle<Result<(), StoreError>>,
    /// Whether the store answers.
    up: Arc<AtomicBool>,
}

impl Harness {
    /// Starts a manager over `claims` (one generator slot per machine id of
    /// the first), at layout time [`START_MS`].
    fn start(
        claims: Vec<Vec<HeldId>>,
        up: bool,
        on_lease_lost: OnLeaseLost,
        holder_watch: Option<oneshot::Receiver<LossReason>>,
    ) -> Self {
        Self::start_refused(Vec::new(), claims, up, on_lease_lost, holder_watch)
    }

    /// Like [`Harness::start`], with the store answering `refusals` to the
    /// first claims.
    fn start_refused(
        refusals: Vec<StoreError>,
        claims: Vec<Vec<HeldId>>,
        up: bool,
        on_lease_lost: OnLeaseLost,
        holder_watch: Option<oneshot::Receiver<LossReason>>,
    ) -> Self {
        Self::start_scripted(Script {
            refusals,
            claims,
            up,
            on_lease_lost,
            holder_watch,
            ..Script::default()
        })
    }

    /// Starts a manager over what `script` says.
    pub(super) fn start_scripted(script: Script) -> Self {
        let Script {
            refusals,
            lease_ends,
            claims,
            own,
            up,
            on_lease_lost,
            holder_watch,
            outage_budget,
            layout,
        } = script;
        let clock = TokioClock::new(layout.to_unix_ms(Millis(START_MS)));
        let start = tokio::time::Instant::now();
        let log = Log::default();
        let (mut slots, mut grants, mut generators) = (Vec::new(), Vec::new(), Vec::new());
        let demand = FenceDemand::new();
        for _ in &claims[0] {
            let (tx, rx) = watch::channel(None);
            let generator = Generator::with_demand(
                layout,
                clock.clone(),
                rx.clone(),
                Duration::from_millis(100),
                GeneratorMetrics::default(),
                demand.clone(),
            );
            generators.push(generator.clone());
            grants.push(rx);
            slots.push(Slot {
                grant: tx,
                generator,
            });
        }
        let store = FakeStore {
            start,
            log: log.clone(),
            claims: claims.into(),
            refusals: refusals.into(),
            lease_ends: lease_ends.into(),
            own,
            up: Arc::new(AtomicBool::new(up)),
            holder_watch: Mutex::new(holder_watch),
            grants: grants.clone(),
        };
        let timing = ClaimTiming {
            lease_ttl: TTL,
            outage_budget,
            max_fence_wait: Duration::from_secs(10),
            on_lease_lost,
        };
        let up = store.up.clone();
        let release = CancellationToken::new();
        let manager = ClaimManager::new(store, layout, "ns".into(), clock, timing, slots, demand);
        let run = tokio::spawn(manager.run(release.clone()));
        Self {
            start,
            log,
            grants,
            generators,
            release,
            run,
            up,
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap()
    }

    /// Waits for the next change of slot `i`'s grant; the ms it came at and
    /// the grant then.
    async fn next_grant(&mut self, i: usize) -> (u64, Option<Grant>) {
        self.grants[i].changed().await.unwrap();
        let grant = *self.grants[i].borrow_and_update();
        (self.elapsed_ms(), grant)
    }

    fn log(&self) -> Vec<(u64, Call)> {
        self.log.lock().unwrap().clone()
    }

    /// Waits for the loop to end.
    async fn ended(&mut self) -> Result<(), StoreError> {
        (&mut self.run).await.unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_is_published_only_past_the_floor_and_after_its_fence_is_persisted() {
    // Floor 1.5 s ahead of the clock: the loop waits until the clock is at
    // floor + 1, writes the fence 1.5 budgets ahead, and only then publishes.
    let floor = START_MS + 1_500;
    let mut h = Harness::start(vec![vec![held(7, floor)]], true, OnLeaseLost::Exit, None);
    let (at, grant) = h.next_grant(0).await;
    assert_eq!(at, 1_501);
    let fence = floor + 1 + LEAD_MS;
    assert_eq!(
        grant,
        Some(Grant {
            machine_id: MachineId(7),
            floor: Millis(floor),
            fence: Millis(fence),
            // The fence alone bounds issuance, not the lease deadline.
            deadline: None,
        })
    );
    assert_eq!(
        h.log(),
        vec![
            (0, Call::Claim),
            (1_000, Call::Renew),
            (1_000, Call::CheckNamespace),
            (
                1_501,
                Call::Advance {
                    fences: vec![fence],
                    published: false
                }
            ),
        ]
    );
    // The generator stamps at once, inside (floor, fence].
    let id = h.generators[0].next_id().await.unwrap();
    let decoded = Layout::default().decode(id).unwrap();
    assert_eq!(
        (decoded.timestamp, decoded.machine_id),
        (Millis(floor + 1), MachineId(7))
    );
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// In 1 s ticks the loop waits for the tick after the floor's, not the ms
/// after the floor: the generator stamps a tick's first ms, and only above
/// the floor, so a grant published at floor + 1 would refuse its first ids
/// for the rest of the floor's second.
#[tokio::test(start_paused = true)]
async fn a_grant_in_1s_ticks_is_published_at_the_tick_after_the_floors() {
    let layout = Layout::default().with_time_unit(1_000).unwrap();
    // START_MS is 1,000,000 ms (a tick start): the floor falls 1 ms into the
    // second tick after it.
    let floor = START_MS + 1_001;
    let mut h = Harness::start_scripted(Script {
        claims: vec![vec![held(7, floor)]],
        layout,
        ..Script::default()
    });
    let (at, grant) = h.next_grant(0).await;
    assert_eq!(at, 2_000);
    assert_eq!(grant.map(|g| g.floor), Some(Millis(floor)));
    let id = h.generators[0].next_id().await.unwrap();
    let decoded = layout.decode(id).unwrap();
    assert_eq!(
        (decoded.timestamp, decoded.machine_id),
        (Millis(START_MS + 2_000), MachineId(7))
    );
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// A claim whose store persisted every fence more than one budget ahead (a
/// never-used machine id's fence key, which the etcd store creates at the
/// value a first raise would write) is published at once with those fences,
/// with no write of its own; the first raise comes when the lowest fence is
/// one budget ahead, and lifts both.
#[tokio::test(start_paused = true)]
async fn a_claim_fenced_a_lead_ahead_is_published_at_once_without_a_write() {
    let floor = START_MS - 1_000;
    let (low, high) = (START_MS + LEAD_MS - 10, START_MS + LEAD_MS);
    let ahead = |machine_id, fence| HeldId {
        machine_id: MachineId(machine_id),
        floor: Millis(floor),
        fence: Millis(fence),
    };
    let claim = vec![ahead(4, low), ahead(6, high)];
    let mut h = Harness::start(vec![claim], true, OnLeaseLost::Exit, None);
    let (at, first) = h.next_grant(0).await;
    assert_eq!(at, 0);
    let grant = |machine_id, fence| Grant {
        machine_id: MachineId(machine_id),
        floor: Millis(floor),
        fence: Millis(fence),
        deadline: None,
    };
    assert_eq!(first, Some(grant(4, low)));
    assert_eq!(*h.grants[1].borrow(), Some(grant(6, high)));
    let id = h.generators[0].next_id().await.unwrap();
    assert_eq!(
        Layout::default().decode(id).unwrap().timestamp,
        Millis(START_MS)
    );
    let first_raise = LEAD_MS - 10 - BUDGET_MS;
    tokio::time::sleep_until(h.start + Duration::from_millis(first_raise + 1)).await;
    let advances: Vec<(u64, Call)> = h
        .log()
        .into_iter()
        .filter(|(_, c)| matches!(c, Call::Advance { .. }))
        .collect();
    let raised = START_MS + first_raise + LEAD_MS;
    assert_eq!(
        advances,
        vec![(
            first_raise,
            Call::Advance {
                fences: vec![raised; 2],
                published: true
            }
        )]
    );
    assert_eq!(*h.grants[1].borrow(), Some(grant(6, raised)));
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// Layout ms of `id`.
fn ts(id: u64) -> u64 {
    Layout::default().decode(id).unwrap().timestamp.get()
}

#[tokio::test(start_paused = true)]
async fn an_outage_issues_on_past_the_lease_deadline_stops_exactly_at_the_fence_and_resumes() {
    let floor = START_MS - 1_000;
    let mut h = Harness::start(vec![vec![held(3, floor)]], true, OnLeaseLost::Exit, None);
    let (at, grant) = h.next_grant(0).await;
    assert_eq!(at, 0);
    let fence = START_MS + LEAD_MS;
    assert_eq!(grant.map(|g| g.fence), Some(Millis(fence)));
    // The store stops answering at 500 ms, with the holder busy.
    tokio::time::sleep(Duration::from_millis(500)).await;
    h.up.store(false, Ordering::SeqCst);
    for at in [500, 1_500, 2_500, 2_999, 3_000] {
        tokio::time::sleep_until(h.start + Duration::from_millis(at)).await;
        let id = h.generators[0].next_id().await.unwrap();
        // Past the lease deadline (3 s after the claim, never renewed) too.
        assert_eq!(ts(id), START_MS + at, "at {at} ms");
    }
    tokio::time::sleep_until(h.start + Duration::from_millis(3_001)).await;
    // One ms past the fence: refused at once (no raise can happen), and the
    // grant is still published: nothing was lost, the store is just away.
    assert_eq!(
        h.generators[0].next_id().await,
        Err(GenerateError::FenceReached {
            fence: Millis(fence)
        })
    );
    assert!(!h.generators[0].is_ready());
    assert_eq!(h.grants[0].borrow().map(|g| g.fence), Some(Millis(fence)));
    // Back at 4 s: the next renewal succeeds, the fence write follows, and
    // issuance resumes without a new claim.
    tokio::time::sleep_until(h.start + Duration::from_millis(4_000)).await;
    h.up.store(true, Ordering::SeqCst);
    let (at, grant) = h.next_grant(0).await;
    assert_eq!(at, 4_000);
    assert_eq!(
        grant.map(|g| g.fence),
        Some(Millis(START_MS + 4_000 + LEAD_MS))
    );
    assert_eq!(
        ts(h.generators[0].next_id().await.unwrap()),
        START_MS + 4_000
    );
    let log = h.log();
    assert_eq!(
        log.iter().filter(|(_, c)| *c == Call::Claim).count(),
        1,
        "no new claim: {log:?}"
    );
    // While the store was away, the busy holder tried its fence write at 1 s
    // (one budget ahead) and every 250 ms after each failure.
    let advances: Vec<u64> = log
        .iter()
        .filter(|(_, c)| matches!(c, Call::Advance { .. }))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(
        advances,
        vec![
            0, 1_000, 1_250, 1_500, 1_750, 2_000, 2_250, 2_500, 2_750, 3_000, 3_250, 3_500, 3_750,
            4_000
        ]
    );
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// An idle holder (nothing stamped for ten budgets) keeps its lowest fence
/// at least one budget ahead of its clock at every moment, at exactly one
/// write per half budget, so an outage starting at any time leaves it a
/// whole budget of issuance.
#[tokio::test(start_paused = true)]
async fn an_idle_holder_keeps_its_fences_one_budget_ahead_at_one_write_per_half_budget() {
    let floor = START_MS - 1_000;
    let mut h = Harness::start(
        vec![vec![held(4, floor), held(6, floor)]],
        true,
        OnLeaseLost::Exit,
        None,
    );
    let (at, _) = h.next_grant(0).await;
    assert_eq!(at, 0);
    let end = 10 * BUDGET_MS;
    for at in (0..=end).step_by(50) {
        tokio::time::sleep_until(h.start + Duration::from_millis(at)).await;
        for grant in &h.grants {
            let fence = grant.borrow().expect("published").fence.get();
            let ahead = fence - (START_MS + at);
            assert!(
                (BUDGET_MS..=LEAD_MS).contains(&ahead),
                "at {at} ms the fence is {ahead} ms ahead"
            );
        }
    }
    // Let the write due at the last instant run.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let advances: Vec<(u64, Call)> = h
        .log()
        .into_iter()
        .filter(|(_, c)| matches!(c, Call::Advance { .. }))
        .collect();
    let expected: Vec<(u64, Call)> = (0..=end)
        .step_by(usize::try_from(BUDGET_MS / 2).unwrap())
        .map(|at| {
            (
                at,
                Call::Advance {
                    fences: vec![START_MS + at + LEAD_MS; 2],
                    published: at > 0,
                },
            )
        })
        .collect();
    assert_eq!(expected.len(), 21);
    assert_eq!(advances, expected);
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_busy_holder_raises_all_its_fences_in_one_write_once_per_half_budget() {
    let floor = START_MS - 1_000;
    let mut h = Harness::start(
        vec![vec![held(1, floor), held(2, floor)]],
        true,
        OnLeaseLost::Exit,
        None,
    );
    let (at, _) = h.next_grant(0).await;
    assert_eq!(at, 0);
    // Machine id 1 stamps every 100 ms for 4.5 s; 2 never does.
    for at in (100..=4_500).step_by(100) {
        tokio::time::sleep_until(h.start + Duration::from_millis(at)).await;
        assert_eq!(ts(h.generators[0].next_id().await.unwrap()), START_MS + at);
    }
    let advances: Vec<(u64, Vec<u64>)> = h
        .log()
        .into_iter()
        .filter_map(|(at, c)| match c {
            Call::Advance { fences, .. } => Some((at, fences)),
            _ => None,
        })
        .collect();
    let both = |at: u64| (at, vec![START_MS + at + LEAD_MS; 2]);
    assert_eq!(
        advances,
        vec![both(0), both(1_000), both(2_000), both(3_000), both(4_000)]
    );
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_deleted_holder_key_withdraws_at_once_gives_the_claim_up_and_claims_again() {
    let floor = START_MS - 1_000;
    let (lose, watch) = oneshot::channel();
    let mut h = Harness::start(
        vec![vec![held(5, floor)]],
        true,
        OnLeaseLost::Reclaim,
        Some(watch),
    );
    let (at, _) = h.next_grant(0).await;
    assert_eq!(at, 0);
    tokio::time::sleep(Duration::from_millis(700)).await;
    lose.send(LossReason::HolderChanged).unwrap();
    let (at, grant) = h.next_grant(0).await;
    assert_eq!((at, grant), (700, None));
    // Let the loop reach its next claim (which never answers).
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        h.log(),
        vec![
            (0, Call::Claim),
            (
                0,
                Call::Advance {
                    fences: vec![START_MS + LEAD_MS],
                    published: false
                }
            ),
            (700, Call::Abandon),
            (700, Call::Claim),
        ]
    );
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn release_withdraws_then_drains_then_lowers_each_fence_to_its_last_stamp() {
    // Two machine ids: 7 stamps once at 200 ms, 9 never.
    let (floor7, floor9) = (START_MS - 1_000, START_MS - 2_000);
    let mut h = Harness::start(
        vec![vec![held(7, floor7), held(9, floor9)]],
        true,
        OnLeaseLost::Exit,
        None,
    );
    let (at, _) = h.next_grant(0).await;
    assert_eq!(at, 0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let id = h.generators[0].next_id().await.unwrap();
    assert_eq!(
        Layout::default().decode(id).unwrap().timestamp,
        Millis(START_MS + 200)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.release.cancel();
    assert!(h.ended().await.is_ok());
    assert_eq!(
        h.log(),
        vec![
            (0, Call::Claim),
            (
                0,
                Call::Advance {
                    fences: vec![START_MS + LEAD_MS, START_MS + LEAD_MS],
                    published: false
                }
            ),
            (
                400,
                Call::Release {
                    last_used: vec![START_MS + 200, floor9],
                    withdrawn: true
                }
            ),
        ]
    );
    // Drained: nothing is stamped under the old grant any more.
    assert!(h.generators[0].next_id().await.is_err());
}

/// Every machine id fenced 12 s ahead (more than --max-fence-wait, 10 s,
/// and within what a holder could have set): after three claims given back
/// in a row the loop stops claiming other machine ids, which would only
/// write a fence key for each, and waits until the fence is within 10 s.
#[tokio::test(start_paused = true)]
async fn a_namespace_fenced_ahead_everywhere_is_waited_for_not_claimed_through() {
    let floor = START_MS + 12_000;
    let claims = (0..6).map(|i| vec![held(i, floor)]).collect();
    let mut h = Harness::start(claims, true, OnLeaseLost::Exit, None);
    // Claiming through all six would leave none to hold: no grant at all.
    let (at, grant) = tokio::time::timeout(Duration::from_secs(60), h.next_grant(0))
        .await
        .expect("a grant within 60 s");
    assert_eq!(at, 12_001);
    assert_eq!(grant.map(|g| g.machine_id), Some(MachineId(3)));
    let calls: Vec<(u64, Call)> = h
        .log()
        .into_iter()
        .filter(|(_, c)| matches!(c, Call::Claim | Call::Abandon))
        .collect();
    assert_eq!(
        calls,
        vec![
            (0, Call::Claim),
            (0, Call::Abandon),
            (0, Call::Claim),
            (0, Call::Abandon),
            (0, Call::Claim),
            (0, Call::Abandon),
            (2_000, Call::Claim),
        ]
    );
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// The log lines of one test, as the server's formatter writes them.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    /// The lines that contain `text`.
    fn lines_with(&self, text: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

/// A loss the loop claims again at once (`--on-lease-lost reclaim`) is a
/// warning, not an error: the server comes back by itself.
#[tokio::test(start_paused = true)]
async fn a_lease_loss_claimed_again_is_logged_as_a_warning() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    // The test's runtime is one thread: the manager's task logs here too.
    let _guard = tracing::subscriber::set_default(subscriber);
    let floor = START_MS - 1_000;
    let (lose, watch) = oneshot::channel();
    let mut h = Harness::start(
        vec![vec![held(5, floor)], vec![held(6, floor)]],
        true,
        OnLeaseLost::Reclaim,
        Some(watch),
    );
    let (at, _) = h.next_grant(0).await;
    assert_eq!(at, 0);
    lose.send(LossReason::Expired).unwrap();
    // Withdrawn, then granted again on the next claim (the channel may
    // show only the last of the two).
    let (mut at, mut grant) = h.next_grant(0).await;
    if grant.is_none() {
        (at, grant) = h.next_grant(0).await;
    }
    assert_eq!((at, grant.map(|g| g.machine_id)), (0, Some(MachineId(6))));
    let lost = logs.lines_with("machine-id lease lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert!(
        lost[0].contains(" WARN ") && lost[0].contains("claiming again"),
        "{}",
        lost[0]
    );
    assert_eq!(logs.lines_with(" ERROR "), Vec::<String>::new());
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// A full range (machine ids 3..4).
pub(super) fn full_range() -> StoreError {
    StoreError::NoFreeMachineId {
        namespace: "ns".into(),
        capacity: 1,
        start: 3,
        end: 4,
    }
}

/// A first claim that finds the range full of a lease ending in 3 s is
/// retried with backoff (NOT_SERVING meanwhile) instead of ending the loop,
/// and holds the machine id once it is free. The store is asked about the
/// leases once: the wait's end does not move.
#[tokio::test(start_paused = true)]
async fn a_range_full_of_an_ending_lease_is_waited_for() {
    let mut h = Harness::start_scripted(Script {
        refusals: (0..4).map(|_| full_range()).collect(),
        lease_ends: vec![Ok(Some(Duration::from_secs(3)))],
        claims: vec![vec![held(3, START_MS - 1_000)]],
        ..Script::default()
    });
    let (at, grant) = h.next_grant(0).await;
    // Backoff 100, 200, 400 and 800 ms between the five claims.
    assert_eq!(
        (at, grant.map(|g| g.machine_id)),
        (1_500, Some(MachineId(3)))
    );
    let claims: Vec<u64> = h
        .log()
        .into_iter()
        .filter(|(_, c)| *c == Call::Claim)
        .map(|(at, _)| at)
        .collect();
    assert_eq!(claims, vec![0, 100, 300, 700, 1_500]);
    let asked: Vec<(u64, Call)> = h
        .log()
        .into_iter()
        .filter(|(_, c)| *c == Call::LeaseEnd)
        .collect();
    assert_eq!(asked, vec![(0, Call::LeaseEnd)]);
    h.release.cancel();
    assert!(h.ended().await.is_ok());
}

/// The wait is bounded: past the ending lease's end plus 2 s the full range
/// ends the loop as before; a full range without an ending lease ends it at
/// once.
#[tokio::test(start_paused = true)]
async fn a_range_full_past_the_ending_lease_ends_the_loop() {
    let mut h = Harness::start_scripted(Script {
        refusals: (0..20).map(|_| full_range()).collect(),
        lease_ends: vec![Ok(Some(Duration::from_secs(1)))],
        claims: vec![vec![held(3, START_MS - 1_000)]],
        ..Script::default()
    });
    let err = h.ended().await.unwrap_err();
    assert!(matches!(err, StoreError::NoFreeMachineId { .. }), "{err}");
    // Claims at 0, 100, 300, 700, 1500 and 3100 ms: the last is past 3 s.
    assert_eq!(h.elapsed_ms(), 3_100);

    let mut h = Harness::start_scripted(Script {
        refusals: vec![full_range()],
        lease_ends: vec![Ok(None)],
        claims: vec![vec![held(3, START_MS - 1_000)]],
        ..Script::default()
    });
    assert!(matches!(
        h.ended().await,
        Err(StoreError::NoFreeMachineId { .. })
    ));
    assert_eq!(h.elapsed_ms(), 0);
    assert_eq!(h.log(), vec![(0, Call::Claim), (0, Call::LeaseEnd)]);
}

/// etcd refusing the server's permissions at its first claim (a read-only
/// user that the start's read check let through) ends the loop with the
/// refusal (exit 64, as at connect) instead of retrying it for good; once
/// the instance has held machine ids the same refusal is an outage, retried.
#[tokio::test(start_paused = true)]
async fn a_refused_first_claim_ends_the_loop_and_a_later_one_is_retried() {
    let refused = || StoreError::AccessRefused {
        endpoint: "http://127.0.0.1:2379".into(),
        problem: super::AccessProblem::Permission {
            user: "\"reader\"".into(),
        },
        source: "etcdserver: permission denied".into(),
    };
    let mut h = Harness::start_refused(
        vec![refused()],
        vec![vec![held(3, START_MS - 1_000)]],
        true,
        OnLeaseLost::Exit,
        None,
    );
    let err = h.ended().await.unwrap_err();
    assert!(matches!(err, StoreError::AccessRefused { .. }), "{err}");
    assert_eq!(h.log(), vec![(0, Call::Claim)]);
    assert!(!super::claiming::retried(&refused(), false));
    assert!(super::claiming::retried(&refused(), true));
    // Other retryable errors stay retried at the first claim.
    let timeout = StoreError::Timeout {
        op: "claim txn",
        after: Duration::from_secs(2),
    };
    assert!(super::claiming::retried(&timeout, false));
}

/// The [`ClaimStore`] contract (`super::conformance`) on this double, for
/// the clauses whose answers the double decides itself: the shape of a
/// claim (distinct machine ids, fence >= floor), a renewal's deadline and
/// the same-machine-ids rule. What a store remembers between claims
/// (persisted fences, released ones, another holder) is scripted by each
/// test here, and held to the contract on the single-instance and etcd
/// stores.
#[tokio::test]
async fn the_double_keeps_the_claim_store_contract_where_it_decides() {
    use super::conformance as c;
    let double = |claims: Vec<Vec<HeldId>>| FakeStore {
        start: tokio::time::Instant::now(),
        log: Log::default(),
        claims: claims.into(),
        refusals: VecDeque::new(),
        lease_ends: VecDeque::new(),
        own: Vec::new(),
        up: Arc::new(AtomicBool::new(true)),
        holder_watch: Mutex::new(None),
        grants: Vec::new(),
    };
    let two = || vec![held(1, START_MS), held(2, START_MS)];
    c::claim_holds_distinct_machine_ids_fenced_at_or_above_their_floor(&mut double(vec![two()]), 2)
        .await;
    c::a_renewal_moves_the_deadline_ahead(&mut double(vec![two()])).await;
    c::a_store_that_claims_the_same_ids_says_so(&mut double(vec![two(), two()])).await;
}
