//! Windows kept by the millisecond tick and pinned runs (docs/design.md,
//! "No clock read per id"), on a [`ManualClock`] whose tick moves with it
//! or on ticks moved by hand: exact ids and exact clock reads, no sleeps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::tests::CountingClock;
use super::*;
use crate::clock::{Clock, ManualClock};
use crate::layout::DEFAULT_EPOCH_UNIX_MS;
use crate::ticker::MsTicks;

/// Machine id 5's grant: floor 0, fence 10,000, a deadline `deadline` after
/// `clock`'s now.
fn grant_until(clock: &ManualClock, deadline: Duration) -> Grant {
    Grant {
        machine_id: MachineId(5),
        floor: Millis(0),
        fence: Millis(10_000),
        deadline: Some(clock.now() + deadline),
    }
}

fn generator_on(
    clock: SharedClock,
    grant: Grant,
) -> (Arc<Generator>, watch::Sender<Option<Grant>>) {
    super::tests::generator_with_grant(clock, grant)
}

/// A set of machine id 5 alone on a ticking manual clock at layout ms 1000,
/// its deadline 10 s away.
fn ticking_set() -> (
    Arc<GeneratorSet>,
    Arc<Generator>,
    Arc<ManualClock>,
    watch::Sender<Option<Grant>>,
) {
    let manual = ManualClock::ticking(DEFAULT_EPOCH_UNIX_MS + 1000);
    let (g, tx) = generator_on(
        manual.clone(),
        grant_until(&manual, Duration::from_secs(10)),
    );
    (GeneratorSet::new(vec![g.clone()]), g, manual, tx)
}

/// Machine id 5's first id at layout ms `ts`, sequence 0.
fn at(ts: u64) -> u64 {
    ((ts << 12) | 5) << 10
}

/// On a clock with ticks an id reads no clock at all while the window is
/// open: the wall clock and the exact clock once per tick, under every new
/// grant (even an equal one), and the cheap clock only with them.
#[tokio::test]
async fn a_window_kept_by_the_tick_reads_no_clock_per_id() {
    let manual = ManualClock::ticking(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = CountingClock::new(manual.clone());
    let (g, tx) = generator_on(clock.clone(), grant_until(&manual, Duration::from_secs(10)));
    // Generator::new sets the cheap clock up with one read.
    assert_eq!(clock.counts(), [0, 0, 1]);
    for seq in 0..100 {
        assert_eq!(g.next_id().await, Ok(at(1000) + seq));
    }
    assert_eq!(clock.counts(), [1, 1, 2]);
    // The tick moves (with this clock, on any change): one reading, and ms
    // 1001 goes on from sequence 100, where ms 1000 left off.
    manual.advance(Duration::from_millis(1));
    for seq in 100..200 {
        assert_eq!(g.next_id().await, Ok(at(1001) + seq));
    }
    assert_eq!(clock.counts(), [2, 2, 3]);
    // A new grant, here an equal one sent again, closes the window too.
    let same = *tx.borrow();
    tx.send_replace(same);
    assert_eq!(g.next_id().await, Ok(at(1001) + 200));
    assert_eq!(g.next_id().await, Ok(at(1001) + 201));
    assert_eq!(clock.counts(), [3, 3, 4]);
}

/// A stopped tick keeps no window: ids read the cheap clock, as on a clock
/// without ticks, and the wall clock once per millisecond of it.
#[tokio::test]
async fn a_stopped_tick_leaves_windows_to_the_cheap_clock() {
    let manual = ManualClock::ticking(DEFAULT_EPOCH_UNIX_MS + 1000);
    manual.ticks().expect("ticking").stop();
    let clock = CountingClock::new(manual.clone());
    let (g, _tx) = generator_on(clock.clone(), grant_until(&manual, Duration::from_secs(10)));
    for seq in 0..10 {
        assert_eq!(g.next_id().await, Ok(at(1000) + seq));
        manual.advance(Duration::from_micros(1));
    }
    assert_eq!(clock.counts(), [1, 1, 11]);
}

/// Less than 2 ms before the deadline a window is measured on the cheap
/// clock, not kept by the tick, so the deadline holds to the nanosecond.
#[tokio::test]
async fn near_the_deadline_windows_are_measured_on_the_cheap_clock() {
    let manual = ManualClock::ticking(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = CountingClock::new(manual.clone());
    let ticks = manual.ticks().expect("ticking").clone();
    let (g, _tx) = generator_on(
        clock.clone(),
        grant_until(&manual, Duration::from_micros(1900)),
    );
    assert_eq!(g.next_id().await, Ok(at(1000)));
    assert_eq!(clock.counts(), [1, 1, 2]);
    // The tick does not move, yet the next id reads the cheap clock: the
    // window (half the 1.9 ms left, 0.95 ms) is not the tick's.
    let tick = ticks.read();
    assert_eq!(g.next_id().await, Ok(at(1000) + 1));
    assert_eq!(ticks.read(), tick);
    assert_eq!(clock.counts(), [2, 2, 3]);
    manual.advance(Duration::from_micros(1899));
    assert_eq!(g.next_id().await, Ok(at(1001) + 2));
    manual.advance(Duration::from_micros(1));
    assert_eq!(g.next_id().await, Err(GenerateError::LeaseExpired));
}

/// A clock whose ticks move only by hand, whatever its time does: a tick
/// thread that stalled.
#[derive(Debug)]
struct StalledTicks {
    inner: Arc<ManualClock>,
    ticks: Arc<MsTicks>,
}

impl Clock for StalledTicks {
    fn unix_ms(&self) -> u64 {
        self.inner.unix_ms()
    }
    fn now(&self) -> Instant {
        self.inner.now()
    }
    fn monotonic_ns(&self) -> u64 {
        self.inner.monotonic_ns()
    }
    fn ms_ticks(&self) -> Option<Arc<MsTicks>> {
        Some(self.ticks.clone())
    }
}

/// The bound design.md states for a stalled tick: the window stays open
/// past the deadline for at most the rest of its millisecond's sequence, at
/// the timestamp the reading admitted (at or below the fence); the next
/// reading then refuses.
#[tokio::test]
async fn a_stalled_tick_keeps_a_window_for_at_most_the_rest_of_its_millisecond() {
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = Arc::new(StalledTicks {
        inner: manual.clone(),
        ticks: MsTicks::manual(),
    });
    let (g, _tx) = generator_on(clock, grant_until(&manual, Duration::from_millis(10)));
    assert_eq!(g.next_id().await, Ok(at(1000)));
    manual.advance(Duration::from_millis(50));
    let rest: Vec<u64> = (0..1023).map(|_| ids(g.try_take(1).unwrap())[0]).collect();
    assert_eq!(rest, (at(1000) + 1..at(1000) + 1024).collect::<Vec<_>>());
    assert_eq!(g.next_id().await, Err(GenerateError::LeaseExpired));
}

/// The ids of a step that issued; panics on any other step.
fn ids(step: Step) -> Vec<u64> {
    super::tests::ids(step)
}

/// A pinned handle takes runs that double while used up within a tick,
/// hands them out without the generator (whose other callers get the ids
/// after the run), ends a run at a new tick or grant (its rest is a gap),
/// and halves after a run left over.
#[tokio::test]
async fn a_pinned_handle_hands_out_runs_that_end_with_the_tick() {
    let (set, g, manual, tx) = ticking_set();
    let mut pinned = set.pin(0);
    // Runs of 1, 2 and 4 ids.
    for seq in 0..7 {
        assert_eq!(pinned.next_id().await, Ok(at(1000) + seq));
    }
    // A run of 8 (7 to 14); the set's next id comes after it.
    assert_eq!(pinned.next_id().await, Ok(at(1000) + 7));
    assert_eq!(set.next_id().await, Ok(at(1000) + 15));
    assert_eq!(pinned.next_id().await, Ok(at(1000) + 8));
    // A new tick ends the run (9 to 14 are a gap). The first id of ms 1001
    // is one id, from the wall reading that opens its window (a run comes
    // only from a window the tick keeps), from sequence 16, where ms 1000
    // left off; the set's thread takes the next.
    manual.advance(Duration::from_millis(1));
    assert_eq!(pinned.next_id().await, Ok(at(1001) + 16));
    assert_eq!(set.next_id().await, Ok(at(1001) + 17));
    // Then a run of 8 (the 4 it halved to, doubled): 18 to 25.
    assert_eq!(pinned.next_id().await, Ok(at(1001) + 18));
    // A batch comes after every id the handle gave (19 to 25 are a gap).
    assert_eq!(
        pinned.next_ids(2).await,
        Ok(vec![at(1001) + 26, at(1001) + 27])
    );
    // A clone is a handle of its own: a run of 1.
    let mut other = pinned.clone();
    assert_eq!(other.next_id().await, Ok(at(1001) + 28));
    // The handle's next run is 16 (29 to 44).
    assert_eq!(pinned.next_id().await, Ok(at(1001) + 29));
    assert_eq!(other.next_id().await, Ok(at(1001) + 45));
    // A withdrawn grant alone leaves the run (stamped under the grant) to
    // its tick; ending the runs, as a lease source does after a send, ends
    // it at once.
    assert_eq!(pinned.next_id().await, Ok(at(1001) + 30));
    tx.send_replace(None);
    assert_eq!(pinned.next_id().await, Ok(at(1001) + 31));
    g.end_runs();
    assert_eq!(pinned.next_id().await, Err(GenerateError::NoGrant));
}

/// Ending the runs ends this run only: the next one is taken under the
/// grant in force, after the old one's ids (its rest is a gap).
#[tokio::test]
async fn ended_runs_give_way_to_a_new_run() {
    let (set, g, _, _tx) = ticking_set();
    let mut pinned = set.pin(0);
    // Runs of 1 and 2, then 4 (3 to 6).
    for seq in 0..4 {
        assert_eq!(pinned.next_id().await, Ok(at(1000) + seq));
    }
    g.end_runs();
    // The run halves to 2 (7 and 8); 4 to 6 are a gap.
    assert_eq!(pinned.next_id().await, Ok(at(1000) + 7));
    assert_eq!(set.next_id().await, Ok(at(1000) + 9));
    assert_eq!(pinned.next_id().await, Ok(at(1000) + 8));
}

/// Without ticks (or with them stopped) a pinned handle takes one id at a
/// time from the generator, as before: no run to leave a gap.
#[tokio::test]
async fn without_a_running_tick_a_pinned_handle_takes_one_id_at_a_time() {
    let manual = ManualClock::ticking(DEFAULT_EPOCH_UNIX_MS + 1000);
    manual.ticks().expect("ticking").stop();
    let (g, _tx) = generator_on(
        manual.clone(),
        grant_until(&manual, Duration::from_secs(10)),
    );
    let set = GeneratorSet::new(vec![g]);
    let mut pinned = set.pin(0);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(pinned.next_id().await.unwrap());
        got.push(set.next_id().await.unwrap());
    }
    assert_eq!(got, (at(1000)..at(1000) + 6).collect::<Vec<_>>());
}

/// A run stops at the generator's step (1/8 of the millisecond, 128 ids on
/// the default layout), so other callers keep their share of it.
#[tokio::test]
async fn a_pinned_run_is_at_most_one_step() {
    let (set, _, _, _tx) = ticking_set();
    let mut pinned = set.pin(0);
    // Runs of 1, 2, 4, ..., 64 (127 ids), then 128 (127 to 254).
    for seq in 0..128 {
        assert_eq!(pinned.next_id().await, Ok(at(1000) + seq));
    }
    assert_eq!(set.next_id().await, Ok(at(1000) + 255));
    for seq in 128..255 {
        assert_eq!(pinned.next_id().await, Ok(at(1000) + seq));
    }
    // The next run is 128 again, not 256.
    assert_eq!(pinned.next_id().await, Ok(at(1000) + 256));
    assert_eq!(set.next_id().await, Ok(at(1000) + 384));
}

/// `GeneratorSet::next_id` keeps a run per thread, as a pinned handle
/// does: the generator's other callers get the ids after it.
#[tokio::test]
async fn next_id_hands_out_this_threads_run() {
    let (set, g, _, tx) = ticking_set();
    // Runs of 1, 2 and 4, then 8 (7 to 14).
    for seq in 0..8 {
        assert_eq!(set.next_id().await, Ok(at(1000) + seq));
    }
    assert_eq!(g.next_ids(1).await, Ok(vec![at(1000) + 15]));
    assert_eq!(set.next_id().await, Ok(at(1000) + 8));
    // A withdrawn grant: the thread's run goes on within its tick until the
    // runs end, which any call of the generator that finds the grant
    // changed does.
    tx.send_replace(None);
    assert_eq!(set.next_id().await, Ok(at(1000) + 9));
    assert_eq!(g.next_ids(1).await, Err(GenerateError::NoGrant));
    assert_eq!(set.next_id().await, Err(GenerateError::NoGrant));
}

/// A thread keeps a run per set and slot: two sets over one generator
/// take runs of their own on one thread, each ascending, none repeated.
#[tokio::test]
async fn two_sets_over_one_generator_keep_runs_of_their_own() {
    let (one, g, _, _tx) = ticking_set();
    let other = GeneratorSet::new(vec![g]);
    let (mut from_one, mut from_other) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        from_one.push(one.next_id().await.unwrap());
        from_other.push(other.next_id().await.unwrap());
    }
    // Each: runs of 1, 2 and then 4, interleaved in the machine id's
    // sequence: 0 | 1 | 2,3 | 4,5 | 6..9 (two taken) | 10..13 (one taken).
    assert_eq!(
        from_one,
        vec![at(1000), at(1000) + 2, at(1000) + 3, at(1000) + 6]
    );
    assert_eq!(
        from_other,
        vec![at(1000) + 1, at(1000) + 4, at(1000) + 5, at(1000) + 10]
    );
}

/// Each thread has a run of its own: ids one thread gets ascend, ids of
/// two threads interleave within the millisecond, and none repeats.
#[test]
fn threads_take_runs_of_their_own() {
    let (set, _, _, _tx) = ticking_set();
    let on_this_thread = |n: usize| -> Vec<u64> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut ids = Vec::new();
            for _ in 0..n {
                ids.push(set.next_id().await.unwrap());
            }
            ids
        })
    };
    // This thread: runs of 1 and 2 (0, then 1 and 2), 1 and 2 handed out.
    assert_eq!(on_this_thread(2), vec![at(1000), at(1000) + 1]);
    // Another thread: a run of its own, after what was taken (3, then 4
    // and 5).
    let other = std::thread::scope(|s| s.spawn(|| on_this_thread(3)).join().unwrap());
    assert_eq!(other, vec![at(1000) + 3, at(1000) + 4, at(1000) + 5]);
    // This thread goes on with its run (2), then a run of 4 (6 to 9).
    assert_eq!(on_this_thread(2), vec![at(1000) + 2, at(1000) + 6]);
}

/// A thread's runs hold no generator: dropping the set frees its
/// generators, whatever threads took ids from it.
#[tokio::test]
async fn a_thread_that_took_ids_keeps_no_generator_alive() {
    let (set, g, _, _tx) = ticking_set();
    set.next_id().await.unwrap();
    // The set's, and this test's.
    assert_eq!(Arc::strong_count(&g), 2);
    drop(set);
    assert_eq!(Arc::strong_count(&g), 1);
}

/// Less than 2 ms before the deadline the generator's windows are not the
/// tick's, and a pinned handle takes no runs from them: one id at a time,
/// so nothing it hands out outlasts the window it came from.
#[tokio::test]
async fn near_the_deadline_a_pinned_handle_takes_no_runs() {
    let manual = ManualClock::ticking(DEFAULT_EPOCH_UNIX_MS + 1000);
    let (g, _tx) = generator_on(
        manual.clone(),
        grant_until(&manual, Duration::from_micros(1900)),
    );
    let set = GeneratorSet::new(vec![g.clone()]);
    let mut pinned = set.pin(0);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(pinned.next_id().await.unwrap());
        got.push(g.next_ids(1).await.unwrap()[0]);
    }
    assert_eq!(got, (at(1000)..at(1000) + 6).collect::<Vec<_>>());
}

/// A take that fails ends the run: after the grant is withdrawn and the
/// machine id drained, a pinned handle hands out nothing from its old run,
/// also when the grant comes back.
#[tokio::test]
async fn a_failed_take_ends_the_run_for_good() {
    let (set, g, _, tx) = ticking_set();
    let mut pinned = set.pin(0);
    assert_eq!(pinned.next_id().await, Ok(at(1000)));
    // A run of 2: 1 and 2.
    assert_eq!(pinned.next_id().await, Ok(at(1000) + 1));
    let grant = *tx.borrow();
    tx.send_replace(None);
    assert_eq!(g.drain(), Some((MachineId(5), Millis(1000))));
    assert_eq!(pinned.next_id().await, Err(GenerateError::NoGrant));
    assert_eq!(pinned.next_id().await, Err(GenerateError::NoGrant));
    // The grant back: ids go on after the old run (2 is a gap).
    tx.send_replace(grant);
    assert_eq!(pinned.next_id().await, Ok(at(1000) + 3));
}

/// A grant whose sender is gone can never change (the generator issues
/// under it for good), so runs go on under it.
#[tokio::test]
async fn runs_go_on_under_a_grant_whose_sender_is_gone() {
    let (set, g, _, tx) = ticking_set();
    drop(tx);
    let mut pinned = set.pin(0);
    // Runs of 1, 2 and 4, then 8 (7 to 14).
    for seq in 0..8 {
        assert_eq!(pinned.next_id().await, Ok(at(1000) + seq));
    }
    assert_eq!(g.next_ids(1).await, Ok(vec![at(1000) + 15]));
    assert_eq!(pinned.next_id().await, Ok(at(1000) + 8));
}

/// The futures of `next_id` are `Send`, so a task that awaits them can be
/// spawned on a multi-thread runtime (a compile-time check: it does not
/// build otherwise).
#[test]
fn next_id_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let (set, _, _, _tx) = ticking_set();
    send(&set.next_id());
    let _embedded = |e: &crate::embedded::EmbeddedGenerator| send(&e.next_id());
}

/// A task that waits for a run on one thread and ends on another leaves
/// that thread's ids ascending: the run it took there, in its last poll,
/// replaces the thread's older one (whose rest is a gap), even while the
/// tick stalls and keeps that older run open.
#[test]
fn a_task_that_moves_threads_keeps_each_threads_ids_ascending() {
    use std::future::Future;
    use std::task::{Context, Poll};
    type Task = std::pin::Pin<Box<dyn Future<Output = Result<u64, GenerateError>> + Send>>;
    let manual = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
    let clock = Arc::new(StalledTicks {
        inner: manual.clone(),
        ticks: MsTicks::manual(),
    });
    let (g, _tx) = generator_on(clock, grant_until(&manual, Duration::from_secs(10)));
    let set = GeneratorSet::new(vec![g.clone()]);
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let (task_to_b, task_on_b) = std::sync::mpsc::channel::<Task>();
    let (ids_to_a, ids_from_b) = std::sync::mpsc::channel::<Vec<u64>>();
    let set_b = set.clone();
    let b = std::thread::spawn(move || {
        let rt = rt();
        // Runs of 1, 2 and 4 (3 to 6): 4 to 6 left in thread B's run.
        let mut got: Vec<u64> = (0..4)
            .map(|_| rt.block_on(set_b.next_id()).unwrap())
            .collect();
        ids_to_a.send(got.clone()).unwrap();
        got.push(rt.block_on(task_on_b.recv().unwrap()).unwrap());
        got.push(rt.block_on(set_b.next_id()).unwrap());
        got
    });
    assert_eq!(
        ids_from_b.recv().unwrap(),
        (at(1000)..at(1000) + 4).collect::<Vec<_>>()
    );
    let rt_a = rt();
    // Ms 1000 used up: a task on this thread waits for the next one.
    rt_a.block_on(g.next_ids(1024 - 7)).unwrap();
    let set_a = set.clone();
    let mut task: Task = Box::pin(async move { set_a.next_id().await });
    let first = rt_a.block_on(std::future::poll_fn(|cx: &mut Context<'_>| {
        Poll::Ready(task.as_mut().poll(cx))
    }));
    assert!(first.is_pending());
    // The wall clock moves on; the stalled tick does not, so B's run of
    // ms 1000 stays open. The task ends on B with ms 1001's first id, and
    // B's next id comes after it, not from its old run.
    manual.advance(Duration::from_millis(1));
    task_to_b.send(task).unwrap();
    let got = b.join().unwrap();
    assert_eq!(got[4], at(1001));
    assert_eq!(got[5], at(1001) + 1);
}
