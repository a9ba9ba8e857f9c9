//! Unit tests of the generator with an injected clock: exact ids, no sleeps.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::sync::watch;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::layout::DEFAULT_EPOCH_UNIX_MS;

/// A generator on the default layout whose clock reads `ts` layout ms.
fn generator_at(
    ts: u64,
    grant: Grant,
) -> (
    Arc<Generator>,
    Arc<ManualClock>,
    watch::Sender<Option<Grant>>,
) {
    let clock = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + ts);
    let (tx, rx) = watch::channel(Some(grant));
    let generator = Generator::new(
        Layout::default(),
        clock.clone(),
        rx,
        DEFAULT_MAX_BACKWARD_WAIT,
        GeneratorMetrics::default(),
    );
    (generator, clock, tx)
}

fn grant(machine_id: u16, floor: u64, fence: u64) -> Grant {
    Grant {
        machine_id: MachineId(machine_id),
        floor: Millis(floor),
        fence: Millis(fence),
        deadline: None,
    }
}

/// Moves `clock` on by 1 ms every real millisecond until aborted.
fn moving_clock(clock: Arc<ManualClock>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(1));
        loop {
            every.tick().await;
            clock.advance(Duration::from_millis(1));
        }
    })
}

/// The ids of a step that issued; panics on any other step.
pub(super) fn ids(step: Step) -> Vec<u64> {
    match step {
        Step::Ids(t) => (t.first..t.first + t.count).collect(),
        other => panic!("expected ids, got {other:?}"),
    }
}

#[test]
fn machine_5_at_ts_1000_issues_reference_ids() {
    let (g, _, _) = generator_at(1000, grant(5, 0, 10_000));
    assert_eq!(
        ids(g.try_take(6).unwrap()),
        (4_194_309_120..=4_194_309_125).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn next_id_issues_the_same_reference_ids_one_at_a_time() {
    let (g, clock, _) = generator_at(1000, grant(5, 0, 10_000));
    let mut got = Vec::new();
    for _ in 0..6 {
        got.push(g.next_id().await.unwrap());
    }
    assert_eq!(got, (4_194_309_120..=4_194_309_125).collect::<Vec<_>>());
    // Past the millisecond's sequence it moves on with the clock.
    g.try_take(1018).unwrap();
    clock.advance(Duration::from_millis(1));
    assert_eq!(g.next_id().await, Ok(((1001 << 12) | 5) << 10));
}

#[test]
fn the_1025th_id_on_machine_0_moves_to_the_next_ms() {
    let (g, clock, _) = generator_at(1000, grant(0, 0, 10_000));
    let step = g.try_take(1024).unwrap();
    assert!(matches!(
        step,
        Step::Ids(Taken {
            exhausted: true,
            ..
        })
    ));
    let first = ids(step);
    assert_eq!(first.len(), 1024);
    assert_eq!(first[0], 1000 << 22);
    assert_eq!(g.try_take(1), Ok(Step::SequenceExhausted));
    clock.advance(Duration::from_millis(1));
    assert_eq!(ids(g.try_take(1).unwrap()), vec![4_198_498_304]);
}

#[test]
fn a_run_stops_at_the_end_of_the_millisecond() {
    let (g, _, _) = generator_at(1000, grant(0, 0, 10_000));
    let step = g.try_take(1000).unwrap();
    assert!(matches!(
        step,
        Step::Ids(Taken {
            count: 1000,
            exhausted: false,
            ..
        })
    ));
    let rest = ids(g.try_take(1000).unwrap());
    assert_eq!(rest.len(), 24);
    assert_eq!(*rest.last().unwrap(), (1000 << 22) + 1023);
}

#[test]
fn never_stamps_above_the_fence() {
    let (g, clock, _) = generator_at(1000, grant(1, 0, 1000));
    assert!(g.is_ready());
    assert!(matches!(g.try_take(1), Ok(Step::Ids(_))));
    clock.advance(Duration::from_millis(1));
    assert!(!g.is_ready(), "not ready once the clock passed the fence");
    assert_eq!(
        g.try_take(1),
        Err(GenerateError::FenceReached {
            fence: Millis(1000)
        })
    );
}

#[test]
fn never_stamps_at_or_below_the_floor() {
    let (g, clock, _) = generator_at(1000, grant(1, 1002, 5000));
    assert!(!g.is_ready());
    assert_eq!(
        g.try_take(1),
        Err(GenerateError::ClockBehindFloor {
            wait: Duration::from_millis(3)
        })
    );
    clock.advance(Duration::from_millis(2));
    assert_eq!(
        g.try_take(1),
        Err(GenerateError::ClockBehindFloor {
            wait: Duration::from_millis(1)
        })
    );
    clock.advance(Duration::from_millis(1));
    let got = ids(g.try_take(1).unwrap());
    assert_eq!(
        Layout::default().decode(got[0]).unwrap().timestamp,
        Millis(1003)
    );
}

#[test]
fn a_new_floor_at_the_last_stamp_skips_the_rest_of_that_ms() {
    let (g, clock, tx) = generator_at(1000, grant(1, 0, 5000));
    ids(g.try_take(1).unwrap());
    // The lease was lost and re-claimed; the fence read at the re-claim is 1000.
    tx.send_replace(Some(grant(1, 1000, 5000)));
    assert!(matches!(
        g.try_take(1),
        Err(GenerateError::ClockBehindFloor { .. })
    ));
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        Layout::default()
            .decode(ids(g.try_take(1).unwrap())[0])
            .unwrap()
            .timestamp,
        Millis(1001)
    );
}

/// Sets the wall clock to `unix_ms` as the monotonic clock moves on 1 ms:
/// a wall step is seen by the first wall reading after the last one's
/// millisecond, [`sequence::WALL_READING_LASTS`].
fn step_wall_then_a_millisecond(clock: &ManualClock, unix_ms: u64) {
    clock.set_unix_ms(unix_ms - 1);
    clock.advance(sequence::WALL_READING_LASTS);
}

#[test]
fn a_small_backwards_step_is_waited_out() {
    let (g, clock, _) = generator_at(1000, grant(1, 0, 5000));
    ids(g.try_take(1).unwrap());
    step_wall_then_a_millisecond(&clock, DEFAULT_EPOCH_UNIX_MS + 960);
    assert_eq!(
        g.try_take(1),
        Ok(Step::ClockBackward {
            wait: Duration::from_millis(40)
        })
    );
    clock.set_unix_ms(DEFAULT_EPOCH_UNIX_MS + 1000);
    // Same ms as the last stamp: the sequence continues, no reuse.
    assert_eq!(
        ids(g.try_take(1).unwrap()),
        vec![(1000 << 22) + (1 << 10) + 1]
    );
}

#[test]
fn a_large_backwards_step_halts_issuance() {
    let (g, clock, _) = generator_at(5000, grant(1, 0, 10_000));
    ids(g.try_take(1).unwrap());
    clock.set_unix_ms(DEFAULT_EPOCH_UNIX_MS + 4950);
    assert!(g.is_ready(), "a step that is waited out keeps it ready");
    step_wall_then_a_millisecond(&clock, DEFAULT_EPOCH_UNIX_MS + 4000);
    assert!(
        !g.is_ready(),
        "a step that halts issuance makes it not ready"
    );
    assert_eq!(
        g.try_take(1),
        Err(GenerateError::ClockSteppedBack {
            by: Duration::from_millis(1000),
            max: DEFAULT_MAX_BACKWARD_WAIT
        })
    );
}

/// Within 1 ms (monotonic) of a wall reading, ids go on at the timestamp
/// it admitted, whatever the wall clock does meanwhile; the next reading
/// sees the step and applies the rules to it.
#[test]
fn a_wall_step_inside_the_last_readings_millisecond_is_seen_by_the_next_reading() {
    let layout = Layout::default();
    let at = |ts: u64, seq: u64| layout.encode(Millis(ts), MachineId(1), seq);
    let (g, clock, _tx) = generator_at(1000, grant(1, 0, 5000));
    let us = Duration::from_micros;
    assert_eq!(ids(g.try_take(1).unwrap()), vec![at(1000, 0)]);
    // Back 40 ms, 1 µs and 2 µs after the reading: still ms 1000, next
    // sequences.
    clock.set_unix_ms(DEFAULT_EPOCH_UNIX_MS + 960);
    clock.advance(us(1));
    assert_eq!(ids(g.try_take(2).unwrap()), vec![at(1000, 1), at(1000, 2)]);
    clock.advance(us(1));
    assert_eq!(ids(g.try_take(1).unwrap()), vec![at(1000, 3)]);
    // 1 ms after the reading the wall reads 961: 39 ms to wait out.
    clock.advance(us(998));
    assert_eq!(
        g.try_take(1),
        Ok(Step::ClockBackward {
            wait: Duration::from_millis(39)
        })
    );
    // Forward to 4000 (inside the fence): 4000 from the next reading on,
    // its sequence going on from where ms 1000 left off (4).
    clock.set_unix_ms(DEFAULT_EPOCH_UNIX_MS + 4000);
    assert_eq!(ids(g.try_take(1).unwrap()), vec![at(4000, 4)]);
    // Forward past the fence (5000) inside the millisecond: the stamp stays
    // 4000 (at or below the fence); the next reading refuses.
    clock.set_unix_ms(DEFAULT_EPOCH_UNIX_MS + 6000);
    clock.advance(us(1));
    assert_eq!(ids(g.try_take(1).unwrap()), vec![at(4000, 5)]);
    clock.advance(us(999));
    assert_eq!(
        g.try_take(1),
        Err(GenerateError::FenceReached {
            fence: Millis(5000)
        })
    );
}

/// A generator on the default layout at `ts` layout ms whose grant has a
/// lease deadline `deadline` from now.
fn generator_with_deadline(
    clock: Arc<dyn Clock>,
    manual: &ManualClock,
    deadline: Duration,
) -> (Arc<Generator>, watch::Sender<Option<Grant>>) {
    let grant = Grant {
        deadline: Some(manual.now() + deadline),
        ..grant(2, 0, 10_000)
    };
    generator_with_grant(clock, grant)
}

/// A generator on the default layout and `clock` under `grant`.
pub(super) fn generator_with_grant(
    clock: Arc<dyn Clock>,
    grant: Grant,
) -> (Arc<Generator>, watch::Sender<Option<Grant>>) {
    let (tx, rx) = watch::channel(Some(grant));
    let g = Generator::new(
        Layout::default(),
        clock,
        rx,
        DEFAULT_MAX_BACKWARD_WAIT,
        GeneratorMetrics::default(),
    );
    (g, tx)
}

/// Near the deadline a wall reading serves for half the time left, so
/// the monotonic clock is read exactly more and more often, and the first
/// id at the deadline is refused.
#[test]
fn ids_stop_exactly_at_the_lease_deadline_by_the_monotonic_clock() {
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = CountingClock::new(manual.clone());
    let (g, _tx) = generator_with_deadline(clock.clone(), &manual, Duration::from_micros(1000));
    let us = Duration::from_micros;
    // Reading at 0 µs: 1000 µs left, it serves for 500 µs.
    ids(g.try_take(1).unwrap());
    manual.advance(us(499));
    ids(g.try_take(1).unwrap());
    assert_eq!(clock.counts()[..2], [1, 1]);
    // 500 µs: a new reading (250 µs left of 500: it serves for 250 µs).
    manual.advance(us(1));
    ids(g.try_take(1).unwrap());
    assert_eq!(clock.counts()[..2], [2, 2]);
    manual.advance(us(249));
    ids(g.try_take(1).unwrap());
    assert_eq!(clock.counts()[..2], [2, 2]);
    // 750 µs, 875 µs, ...: one reading each time half the rest has passed.
    manual.advance(us(1));
    ids(g.try_take(1).unwrap());
    manual.advance(us(125));
    ids(g.try_take(1).unwrap());
    assert_eq!(clock.counts()[..2], [4, 4]);
    // 999 µs still issues; 1000 µs is the deadline.
    manual.advance(us(124));
    ids(g.try_take(1).unwrap());
    manual.advance(us(1));
    assert_eq!(g.try_take(1), Err(GenerateError::LeaseExpired));
}

/// A clock whose cheap monotonic reading can be frozen, set back or slowed
/// down, while its exact monotonic clock moves on as a [`ManualClock`]'s.
#[derive(Debug)]
struct UnsteadyClock {
    inner: Arc<ManualClock>,
    /// `Some(ns)`: the cheap reading is stuck at `ns`.
    stuck_at: std::sync::Mutex<Option<u64>>,
    /// The cheap reading runs this many times slower than the exact one.
    slower: u64,
    wall_reads: std::sync::atomic::AtomicU64,
}

impl UnsteadyClock {
    fn new(inner: Arc<ManualClock>, slower: u64) -> Arc<Self> {
        Arc::new(Self {
            inner,
            stuck_at: std::sync::Mutex::new(None),
            slower,
            wall_reads: Default::default(),
        })
    }

    fn wall_reads(&self) -> u64 {
        self.wall_reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Clock for UnsteadyClock {
    fn unix_ms(&self) -> u64 {
        self.wall_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.unix_ms()
    }
    fn now(&self) -> std::time::Instant {
        self.inner.now()
    }
    fn monotonic_ns(&self) -> u64 {
        let stuck = *self.stuck_at.lock().unwrap();
        stuck.unwrap_or_else(|| self.inner.monotonic_ns() / self.slower)
    }
}

/// A cheap clock that stops is not trusted: every id reads the exact
/// clocks again, so the deadline stays exact.
#[test]
fn a_cheap_clock_that_stops_is_not_trusted() {
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = UnsteadyClock::new(manual.clone(), 1);
    let wall_reads = || clock.wall_reads();
    let (g, _tx) = generator_with_deadline(clock.clone(), &manual, Duration::from_millis(10));
    let ms = Duration::from_millis;
    ids(g.try_take(1).unwrap());
    manual.advance(Duration::from_micros(1));
    ids(g.try_take(1).unwrap());
    assert_eq!(wall_reads(), 1);
    // It stops at 0.5 ms, inside the window, while the exact clock moves
    // on. Its first reading there still looks like progress; from the next
    // id on, each id reads the clocks.
    *clock.stuck_at.lock().unwrap() = Some(500_000);
    manual.advance(Duration::from_micros(499));
    ids(g.try_take(1).unwrap());
    assert_eq!(wall_reads(), 1);
    for n in 2..=4 {
        manual.advance(ms(1));
        ids(g.try_take(1).unwrap());
        assert_eq!(wall_reads(), n);
    }
    // ... up to the deadline (10 ms), which holds by the exact clock.
    manual.advance(Duration::from_micros(6499));
    ids(g.try_take(1).unwrap());
    assert_eq!(wall_reads(), 5);
    manual.advance(Duration::from_micros(1));
    assert_eq!(g.try_take(1), Err(GenerateError::LeaseExpired));
}

/// A cheap clock that reads below the start of the window (a counter reset
/// by a suspend, say) closes it at once.
#[test]
fn a_cheap_clock_that_goes_back_closes_the_window() {
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    manual.advance(Duration::from_millis(5));
    let clock = UnsteadyClock::new(manual.clone(), 1);
    let (g, _tx) = generator_with_deadline(clock.clone(), &manual, Duration::from_secs(10));
    ids(g.try_take(1).unwrap());
    *clock.stuck_at.lock().unwrap() = Some(0);
    manual.advance(Duration::from_micros(1));
    ids(g.try_take(1).unwrap());
    manual.advance(Duration::from_micros(1));
    ids(g.try_take(1).unwrap());
    assert_eq!(clock.wall_reads(), 3);
}

/// A cheap clock that keeps less than half the pace of the exact one
/// between two readings is not trusted: every id reads the exact clocks,
/// and the deadline holds (a window measured on it would run past it).
#[test]
fn a_cheap_clock_at_a_quarter_pace_is_not_trusted() {
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = UnsteadyClock::new(manual.clone(), 4);
    let (g, _tx) = generator_with_deadline(clock.clone(), &manual, Duration::from_millis(10));
    let us = Duration::from_micros;
    // The first reading is trusted: a window of 1 ms on the cheap clock,
    // 4 ms of real time.
    ids(g.try_take(1).unwrap());
    manual.advance(us(3996));
    ids(g.try_take(1).unwrap());
    assert_eq!(clock.wall_reads(), 1);
    // At 4 ms it ends; the next reading finds the cheap clock at a quarter
    // pace: from then on each id reads the clocks.
    manual.advance(us(4));
    for n in 2..=4 {
        ids(g.try_take(1).unwrap());
        assert_eq!(clock.wall_reads(), n);
        manual.advance(Duration::from_millis(2));
    }
    // 10 ms is the deadline.
    assert_eq!(g.try_take(1), Err(GenerateError::LeaseExpired));
}

#[test]
fn refuses_after_the_lease_deadline() {
    let clock = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let deadline = clock.now() + Duration::from_millis(10);
    let (_tx, rx) = watch::channel(Some(Grant {
        deadline: Some(deadline),
        ..grant(2, 0, 10_000)
    }));
    let g = Generator::new(
        Layout::default(),
        clock.clone(),
        rx,
        DEFAULT_MAX_BACKWARD_WAIT,
        GeneratorMetrics::default(),
    );
    assert!(g.is_ready());
    assert!(matches!(g.try_take(1), Ok(Step::Ids(_))));
    clock.advance(Duration::from_millis(10));
    assert!(!g.is_ready());
    assert_eq!(g.try_take(1), Err(GenerateError::LeaseExpired));
}

#[test]
fn refuses_without_a_grant_and_before_the_epoch() {
    let (g, clock, tx) = generator_at(1000, grant(1, 0, 5000));
    tx.send_replace(None);
    assert_eq!(g.try_take(1), Err(GenerateError::NoGrant));
    tx.send_replace(Some(grant(1, 0, 5000)));
    clock.set_unix_ms(DEFAULT_EPOCH_UNIX_MS - 1);
    assert_eq!(g.try_take(1), Err(GenerateError::ClockBeforeEpoch));
}

#[test]
fn a_clock_past_a_lowered_fence_is_refused_at_once_not_after_a_backwards_wait() {
    let (g, clock, tx) = generator_at(1500, grant(1, 0, 2000));
    ids(g.try_take(1).unwrap());
    // A renewal lowered the fence below the last stamp, and the clock stepped
    // back 50 ms (inside the step that is waited out) but stays past it.
    tx.send_replace(Some(grant(1, 0, 1000)));
    clock.set_unix_ms(DEFAULT_EPOCH_UNIX_MS + 1450);
    assert!(!g.is_ready());
    assert_eq!(
        g.try_take(1),
        Err(GenerateError::FenceReached {
            fence: Millis(1000)
        })
    );
}

#[test]
fn readiness_says_ready_exactly_when_a_take_would_issue_or_wait() {
    // A deadline in a case's grant is replaced by the generator's "now".
    let expired = Grant {
        deadline: Some(ManualClock::new(0).now()),
        ..grant(1, 0, 5000)
    };
    // (clock after the first stamp at 1000, grant then) and whether a take
    // issues or waits.
    let max = Layout::default().max_timestamp().get();
    let cases: Vec<(u64, Option<Grant>, bool)> = vec![
        (1000, Some(grant(1, 0, 5000)), true),
        (1001, Some(grant(1, 0, 5000)), true),
        (960, Some(grant(1, 0, 5000)), true),
        (899, Some(grant(1, 0, 5000)), false),
        (1001, Some(grant(1, 1001, 5000)), false),
        (1002, Some(grant(1, 1001, 5000)), true),
        (5000, Some(grant(1, 0, 5000)), true),
        (5001, Some(grant(1, 0, 5000)), false),
        (950, Some(grant(1, 0, 900)), false),
        (1000, Some(grant(2, 0, 5000)), true),
        (990, Some(grant(2, 0, 5000)), true),
        (1000, Some(expired), false),
        (max + 1, Some(grant(1, 0, max + 10)), false),
        (1000, None, false),
    ];
    for (i, (at, later, issues)) in cases.into_iter().enumerate() {
        let (g, clock, tx) = generator_at(1000, grant(1, 0, 5000));
        ids(g.try_take(1).unwrap());
        tx.send_replace(later.map(|l| Grant {
            deadline: l.deadline.map(|_| clock.now()),
            ..l
        }));
        clock.set_unix_ms(DEFAULT_EPOCH_UNIX_MS + at);
        let ready = g.is_ready();
        let step = g.try_take(1);
        assert_eq!(ready, issues, "case {i}: is_ready, take gave {step:?}");
        assert_eq!(
            step.is_ok(),
            issues,
            "case {i}: take gave {step:?}, is_ready {ready}"
        );
    }
}

#[test]
fn drain_reports_the_last_stamped_timestamp() {
    let (g, clock, tx) = generator_at(1000, grant(7, 900, 5000));
    ids(g.try_take(3).unwrap());
    clock.advance(Duration::from_millis(5));
    ids(g.try_take(3).unwrap());
    tx.send_replace(None);
    assert_eq!(g.drain(), Some((MachineId(7), Millis(1005))));
}

#[tokio::test]
async fn next_ids_crosses_milliseconds_in_ascending_order() {
    let (g, clock, _) = generator_at(1000, grant(3, 0, 1_000_000));
    // The clock only moves when the test moves it, so run the batch while a
    // second task moves it on by 1 ms every real millisecond.
    let moving = moving_clock(clock);
    let got = g.next_ids(3000).await.unwrap();
    moving.abort();
    assert_eq!(got.len(), 3000);
    assert!(got.windows(2).all(|w| w[0] < w[1]));
    let layout = Layout::default();
    assert!(got
        .iter()
        .all(|&id| layout.decode(id).unwrap().machine_id == MachineId(3)));
}

proptest! {
    /// Whatever the wall clock does, one holder's ids strictly ascend and never
    /// leave (floor, fence].
    #[test]
    fn ids_of_one_holder_strictly_ascend(steps in proptest::collection::vec((-30i64..40, 1u64..2000), 1..200)) {
        let (g, clock, _) = generator_at(1000, grant(9, 990, 4000));
        let layout = Layout::default();
        let mut last: Option<u64> = None;
        for (jump, want) in steps {
            let now = clock.unix_ms() as i64 + jump;
            clock.set_unix_ms(now as u64);
            if let Ok(Step::Ids(t)) = g.try_take(want) {
                let ts = layout.decode(t.first).unwrap().timestamp;
                prop_assert!(ts > Millis(990) && ts <= Millis(4000));
                if let Some(l) = last { prop_assert!(t.first > l); }
                last = Some(t.first + t.count - 1);
            }
        }
    }
}

#[test]
fn sequence_exhaustion_counts_each_millisecond_once() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
        let (_tx, rx) = watch::channel(Some(grant(0, 0, 10_000)));
        let g = Generator::new(
            Layout::default(),
            clock.clone(),
            rx,
            DEFAULT_MAX_BACKWARD_WAIT,
            GeneratorMetrics {
                sequence_exhausted: metrics::counter!("exhausted"),
                ..GeneratorMetrics::default()
            },
        );
        for _ in 0..3 {
            ids(g.try_take(1024).unwrap());
            // Spinning on an exhausted millisecond must not count again.
            for _ in 0..100 {
                assert_eq!(g.try_take(1), Ok(Step::SequenceExhausted));
            }
            clock.advance(Duration::from_millis(1));
        }
        ids(g.try_take(10).unwrap());
    });
    let counts: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key.key().name().to_owned(), value))
        .collect();
    assert_eq!(
        counts,
        vec![(
            "exhausted".to_owned(),
            metrics_util::debugging::DebugValue::Counter(3)
        )]
    );
}

/// A clock whose reads are counted: wall (`unix_ms`), exact monotonic
/// (`now`) and cheap monotonic (`monotonic_ns`).
#[derive(Debug)]
pub(super) struct CountingClock {
    inner: Arc<ManualClock>,
    reads: std::sync::atomic::AtomicU64,
    exact_reads: std::sync::atomic::AtomicU64,
    cheap_reads: std::sync::atomic::AtomicU64,
}

impl CountingClock {
    pub(super) fn new(inner: Arc<ManualClock>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            reads: Default::default(),
            exact_reads: Default::default(),
            cheap_reads: Default::default(),
        })
    }

    /// (wall, exact monotonic, cheap monotonic) reads so far.
    pub(super) fn counts(&self) -> [u64; 3] {
        [&self.reads, &self.exact_reads, &self.cheap_reads]
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Clock for CountingClock {
    fn unix_ms(&self) -> u64 {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.unix_ms()
    }
    fn now(&self) -> std::time::Instant {
        self.exact_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.now()
    }
    fn monotonic_ns(&self) -> u64 {
        self.cheap_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.monotonic_ns()
    }
    fn ms_ticks(&self) -> Option<Arc<crate::MsTicks>> {
        self.inner.ms_ticks()
    }
}

/// The hot path reads one clock per id, the cheap monotonic one (for the
/// deadline and the age of the last wall reading). The wall clock and the
/// exact monotonic clock are read once per millisecond of monotonic time,
/// and again under every new grant, even an equal one.
#[tokio::test]
async fn an_id_reads_one_clock_and_the_wall_clock_is_read_once_per_millisecond() {
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = CountingClock::new(manual.clone());
    let (tx, rx) = watch::channel(Some(Grant {
        deadline: Some(manual.now() + Duration::from_secs(10)),
        ..grant(5, 0, 10_000)
    }));
    let g = Generator::new(
        Layout::default(),
        clock.clone(),
        rx,
        DEFAULT_MAX_BACKWARD_WAIT,
        GeneratorMetrics::default(),
    );
    // Generator::new sets the cheap clock up with one read.
    assert_eq!(clock.counts(), [0, 0, 1]);
    // 100 ids 1 µs apart, in one millisecond of monotonic time.
    let first = ((1000u64 << 12) | 5) << 10;
    for seq in 0..100 {
        assert_eq!(g.next_id().await, Ok(first + seq));
        manual.advance(Duration::from_micros(1));
    }
    assert_eq!(clock.counts(), [1, 1, 101]);
    // 1 ms of monotonic time after the reading the clocks are read again,
    // once; ms 1001 goes on from sequence 100, where ms 1000 left off.
    manual.advance(Duration::from_micros(900));
    let next = (((1001u64 << 12) | 5) << 10) + 100;
    for seq in 0..100 {
        assert_eq!(g.next_id().await, Ok(next + seq));
        manual.advance(Duration::from_micros(1));
    }
    assert_eq!(clock.counts(), [2, 2, 201]);
    // A batch is one step: one cheap read for 28 ids.
    assert_eq!(g.next_ids(28).await, Ok((next + 100..next + 128).collect()));
    // The sequence went on to 228 in ms 1001.
    assert_eq!(next + 128, (((1001u64 << 12) | 5) << 10) + 228);
    assert_eq!(clock.counts(), [2, 2, 202]);
    manual.advance(Duration::from_micros(1));
    // A new grant (here an equal one, sent again) is read with the clocks.
    let same = *tx.borrow();
    tx.send_replace(same);
    assert_eq!(g.next_id().await, Ok(next + 128));
    assert_eq!(clock.counts(), [3, 3, 203]);
    // So is every id while the cheap clock does not move (it is not to be
    // trusted then).
    assert_eq!(g.next_id().await, Ok(next + 129));
    assert_eq!(clock.counts(), [4, 4, 204]);
}

#[tokio::test]
async fn a_small_call_behind_streams_gets_its_turn_in_the_next_millisecond() {
    let (g, clock, _tx) = generator_at(1000, grant(5, 0, 1_000_000));
    ids(g.try_take(1024).unwrap());
    // Three streams wanting two milliseconds each, then a one-id call, all
    // arriving while millisecond 1000 is used up.
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move {
                let mut runs = Vec::new();
                g.fill(2048, |t| runs.push((t.first & 1023, t.count)))
                    .await
                    .map(|()| runs)
            })
        })
        .collect();
    let small = {
        let g = g.clone();
        tokio::spawn(async move { g.next_ids(1).await })
    };
    // Let every task arrive (this runtime has one thread: each yield runs
    // every task that is ready once).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    clock.advance(Duration::from_millis(1));
    let small = tokio::time::timeout(Duration::from_secs(5), small)
        .await
        .expect("the one-id call is served in millisecond 1001")
        .unwrap()
        .unwrap();
    // Each stream took one step (128 ids) of millisecond 1001 first, in
    // arrival order; the one-id call had the fourth turn.
    assert_eq!(small, vec![(((1001 << 12) | 5) << 10) | 384]);
    let moving = moving_clock(clock);
    let mut firsts = Vec::new();
    for s in streams {
        let runs = tokio::time::timeout(Duration::from_secs(5), s)
            .await
            .expect("the streams finish once the clock moves on")
            .unwrap()
            .unwrap();
        assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), 2048);
        assert!(runs.iter().all(|r| r.1 <= 128));
        firsts.push(runs[0]);
    }
    moving.abort();
    assert_eq!(firsts, vec![(0, 128), (128, 128), (256, 128)]);
}

// On paused time: the turn patience (10 ms of tokio time) must not run out
// while the test yields, as it did on a loaded machine.
#[tokio::test(start_paused = true)]
async fn callers_waiting_for_the_next_millisecond_do_not_spin() {
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = CountingClock::new(manual.clone());
    let (_tx, rx) = watch::channel(Some(grant(2, 0, 1_000_000)));
    let ticker = Ticker::manual();
    let g = Generator::with_ticker(
        Layout::default(),
        clock.clone(),
        rx,
        DEFAULT_MAX_BACKWARD_WAIT,
        GeneratorMetrics::default(),
        ticker.clone(),
        None,
    );
    ids(g.try_take(1024).unwrap());
    let reads = || clock.counts()[0];
    let before = reads();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move { g.next_ids(1000).await })
        })
        .collect();
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    // The first caller looked twice (once on arrival, once holding the
    // turn) and waits for the tick; the other seven queue behind it
    // without looking. Nobody looks again until the tick.
    assert_eq!(reads() - before, 2);
    assert_eq!(ticker.waiting(), 1);
    assert_eq!(g.queued.load(Ordering::Acquire), 8);
    // A tick in the same millisecond: the one waiter looks once more.
    ticker.tick();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(reads() - before, 3);
    // The next millisecond: 1024 ids go out in 8 steps, one per caller, in
    // turn; then the first waits again.
    manual.advance(Duration::from_millis(1));
    ticker.tick();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(ticker.waiting(), 1);
    assert_eq!(g.queued.load(Ordering::Acquire), 8);
    // Until every caller has its 1000 ids: 8000 ids, 8 ms in all.
    for _ in 0..7 {
        manual.advance(Duration::from_millis(1));
        ticker.tick();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }
    for w in waiters {
        let got = w.await.unwrap().unwrap();
        assert_eq!(got.len(), 1000);
    }
    assert_eq!(g.queued.load(Ordering::Acquire), 0);
    assert_eq!(ticker.waiting(), 0);
}

/// A caller that holds the turn and is then neither polled nor dropped
/// delays the callers behind it by the turn patience, not for good.
#[tokio::test(start_paused = true)]
async fn a_caller_no_longer_polled_holds_the_others_up_only_for_the_turn_patience() {
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let (_tx, rx) = watch::channel(Some(grant(2, 0, 1_000_000)));
    let ticker = Ticker::manual();
    let g = Generator::with_ticker(
        Layout::default(),
        manual.clone(),
        rx,
        DEFAULT_MAX_BACKWARD_WAIT,
        GeneratorMetrics::default(),
        ticker.clone(),
        None,
    );
    ids(g.try_take(1024).unwrap());
    // It takes the turn, finds ms 1000 used up and waits for the tick.
    let mut stuck = Box::pin(g.next_ids(1));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(std::future::Future::poll(stuck.as_mut(), &mut cx).is_pending());
    assert_eq!(ticker.waiting(), 1);
    manual.advance(Duration::from_millis(1));
    let started = tokio::time::Instant::now();
    let other = {
        let g = g.clone();
        tokio::spawn(async move { g.next_ids(3).await })
    };
    let got = tokio::time::timeout(Duration::from_secs(1), other)
        .await
        .expect("the call behind a stuck one is served")
        .unwrap()
        .unwrap();
    let first = ((1001u64 << 12) | 2) << 10;
    assert_eq!(got, vec![first, first + 1, first + 2]);
    assert_eq!(started.elapsed(), TURN_PATIENCE);
    drop(stuck);
}

/// A generator at layout ms 2,000 whose fence (1,000) is reached, with a
/// fence demand; the demand's lease source says `raisable`.
fn reached_with_demand(
    raisable: bool,
) -> (
    Arc<Generator>,
    watch::Sender<Option<Grant>>,
    Arc<FenceDemand>,
) {
    let clock = crate::clock::TokioClock::new(DEFAULT_EPOCH_UNIX_MS + 2_000);
    let (tx, rx) = watch::channel(Some(grant(6, 0, 1_000)));
    let demand = FenceDemand::new();
    demand.set_raisable(raisable);
    let g = Generator::with_demand(
        Layout::default(),
        clock,
        rx,
        DEFAULT_MAX_BACKWARD_WAIT,
        GeneratorMetrics::default(),
        demand.clone(),
    );
    (g, tx, demand)
}

#[tokio::test(start_paused = true)]
async fn a_reached_fence_is_refused_at_once_when_no_raise_can_happen() {
    let (g, _tx, _demand) = reached_with_demand(false);
    assert!(!g.is_ready());
    let started = tokio::time::Instant::now();
    assert_eq!(
        g.next_id().await,
        Err(GenerateError::FenceReached {
            fence: Millis(1_000)
        })
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_reached_fence_is_raised_on_demand_and_the_call_stamps_under_the_new_one() {
    let (g, tx, demand) = reached_with_demand(true);
    assert!(g.is_ready(), "ready: a call gets the fence raised");
    let source = tokio::spawn(async move {
        demand.requested().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        tx.send_replace(Some(grant(6, 0, 5_000)));
        tx
    });
    let started = tokio::time::Instant::now();
    let id = g.next_id().await.unwrap();
    let d = Layout::default().decode(id).unwrap();
    // Stamped when the raise came, 5 ms later.
    assert_eq!((d.timestamp, d.machine_id), (Millis(2_005), MachineId(6)));
    assert_eq!(started.elapsed(), Duration::from_millis(5));
    drop(source.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_raise_that_never_comes_is_waited_for_at_most_the_demand_wait() {
    let (g, _tx, demand) = reached_with_demand(true);
    let started = tokio::time::Instant::now();
    assert_eq!(
        g.next_id().await,
        Err(GenerateError::FenceReached {
            fence: Millis(1_000)
        })
    );
    assert_eq!(started.elapsed(), FENCE_DEMAND_WAIT);
    // The request is there for the lease source to find.
    tokio::time::timeout(Duration::ZERO, demand.requested())
        .await
        .expect("a pending request");
}

/// How long readiness holds by the clocks alone (what health sleeps on): to
/// the first millisecond past the fence, to the lease deadline, to the first
/// stamp above the floor, and for a step back beyond what is waited out,
/// until it shrinks to that; nothing once the fence is reached.
#[test]
fn readiness_holds_until_the_next_clock_edge() {
    let ms = Duration::from_millis;
    let (g, clock, tx) = generator_at(1000, grant(1, 0, 5000));
    assert_eq!(
        (g.is_ready(), g.readiness_holds_for()),
        (true, Some(ms(4001)))
    );
    tx.send_replace(Some(Grant {
        deadline: Some(clock.now() + ms(700)),
        ..grant(1, 0, 5000)
    }));
    assert_eq!(
        (g.is_ready(), g.readiness_holds_for()),
        (true, Some(ms(700)))
    );

    let (g, _, _) = generator_at(1000, grant(1, 1500, 5000));
    assert_eq!(
        (g.is_ready(), g.readiness_holds_for()),
        (false, Some(ms(501)))
    );

    let (g, clock, _) = generator_at(1000, grant(1, 0, 5000));
    ids(g.try_take(1).unwrap());
    step_wall_then_a_millisecond(&clock, DEFAULT_EPOCH_UNIX_MS + 700);
    // 300 ms back, 100 ms waited out: not ready for another 200 ms.
    assert_eq!(
        (g.is_ready(), g.readiness_holds_for()),
        (false, Some(ms(200)))
    );

    let (g, _, tx) = generator_at(6000, grant(1, 0, 5000));
    assert_eq!((g.is_ready(), g.readiness_holds_for()), (false, None));
    tx.send_replace(None);
    assert_eq!((g.is_ready(), g.readiness_holds_for()), (false, None));
}

/// The edges a review found missing or wrong: the layout's last timestamp
/// before the fence, a fence at `u64::MAX` (an overflow), a backwards step
/// against a wait that is not whole ms, and a clock before the epoch.
#[test]
fn readiness_edges_at_the_layouts_ends_and_odd_waits() {
    let ms = Duration::from_millis;
    let at = |layout: Layout, unix_ms: u64, grant: Grant, max_back: Duration| {
        let clock = ManualClock::new(unix_ms);
        let (tx, rx) = watch::channel(Some(grant));
        let metrics = GeneratorMetrics::default();
        let g = Generator::new(layout, clock.clone(), rx, max_back, metrics);
        (g, clock, tx)
    };
    // 12 timestamp bits: the last timestamp is 4095, before the fence.
    let short = Layout::new(12, 10, 10, DEFAULT_EPOCH_UNIX_MS).unwrap();
    let (g, clock, _tx) = at(
        short,
        DEFAULT_EPOCH_UNIX_MS + 4000,
        grant(1, 0, 10_000),
        ms(100),
    );
    assert_eq!(
        (g.is_ready(), g.readiness_holds_for()),
        (true, Some(ms(96)))
    );
    clock.advance(ms(96));
    assert!(!g.is_ready());

    let (g, _, _tx) = generator_at(1000, grant(1, 0, u64::MAX));
    let last = Layout::default().max_timestamp().0;
    assert_eq!(g.readiness_holds_for(), Some(ms(last + 1 - 1000)));

    // 200 ms back, 100.5 ms waited out: ready once 100 ms back, in 100 ms.
    let (g, clock, _tx) = at(
        Layout::default(),
        DEFAULT_EPOCH_UNIX_MS + 1000,
        grant(1, 0, 5000),
        Duration::from_micros(100_500),
    );
    ids(g.try_take(1).unwrap());
    step_wall_then_a_millisecond(&clock, DEFAULT_EPOCH_UNIX_MS + 800);
    assert_eq!(
        (g.is_ready(), g.readiness_holds_for()),
        (false, Some(ms(100)))
    );
    clock.advance(ms(100));
    assert!(g.is_ready());

    let (g, clock, _tx) = at(
        Layout::default(),
        DEFAULT_EPOCH_UNIX_MS - 100,
        grant(1, 0, 5000),
        ms(100),
    );
    assert_eq!(
        (g.is_ready(), g.readiness_holds_for()),
        (false, Some(ms(100)))
    );
    clock.advance(ms(100));
    // At the epoch (layout ms 0), still not above the floor 0: 1 ms more.
    assert_eq!(
        (g.is_ready(), g.readiness_holds_for()),
        (false, Some(ms(1)))
    );
    clock.advance(ms(1));
    assert!(g.is_ready());
}
