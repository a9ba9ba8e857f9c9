//! A handle that takes ids in runs: [`Pinned`], owned by one worker, and
//! the runs each thread keeps for [`GeneratorSet::next_id`](super::GeneratorSet::next_id).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::Generator;
use crate::error::GenerateError;
use crate::ticker::{CacheLine, MsTicks};

/// One machine id of a [`GeneratorSet`](super::GeneratorSet), pinned to one
/// worker ([`GeneratorSet::pin`](super::GeneratorSet::pin)): its ids come
/// from that machine id only, most of them with no write to memory any
/// other thread touches.
///
/// # Runs
///
/// On a clock with [`MsTicks`](crate::MsTicks) (the system clock), the
/// handle takes ids from its machine id's generator in *runs*: consecutive
/// ids of one millisecond, taken under the generator's lock like any other
/// ids (so they are stamped, and counted as issued, when the run is taken),
/// and only from a window the tick keeps (so not within 2 ms of the
/// deadline: one id at a time there). It hands them out one by one while
/// the tick reads what it read when the run was taken and the generator's
/// runs were not ended ([`Generator::end_runs`]), with two loads and no
/// shared write. A new millisecond ends the run, and so does a new or
/// withdrawn grant once the lease source (the embedded generator does) or
/// any call of the generator ends the runs; its ids left over are a gap,
/// never reused. A run starts at one id and doubles while runs are used up
/// within their millisecond, up to the generator's step (1/8 of a
/// millisecond's sequence, so other callers of the machine id keep their
/// turn); it halves when a millisecond ends with ids left over.
///
/// The ids of a run are stamped when it is taken, under the grant in force
/// then, so handing one out later (after its grant was withdrawn, until the
/// runs end or the tick moves) is what a caller does that keeps an id and
/// uses it later: a successor stamps above the fence, which is at or above
/// every stamp (docs/design.md, "No clock read per id"). A stalled tick
/// thread lets a run go on past its millisecond, at most to its end (one
/// step).
///
/// Its ids ascend: each run, and each batch of
/// [`Pinned::next_ids`], comes after the one before it in the machine id's
/// sequence. Ids of different handles on one machine id interleave.
///
/// It takes `&mut self`, as a handle owned by one worker does; a clone is a
/// new handle on the same machine id with no run of its own.
#[derive(Debug)]
pub struct Pinned {
    generator: Arc<Generator>,
    runner: Runner,
}

impl Clone for Pinned {
    fn clone(&self) -> Self {
        Pinned::new(self.generator.clone())
    }
}

impl Pinned {
    pub(super) fn new(generator: Arc<Generator>) -> Self {
        Self {
            runner: Runner::new(&generator),
            generator,
        }
    }

    /// One id from the pinned machine id.
    ///
    /// # Errors
    /// As [`Generator::next_id`]: no grant (stopped, or not yet granted), the
    /// fence reached, the clock stepped back too far.
    #[inline]
    pub async fn next_id(&mut self) -> Result<u64, GenerateError> {
        match self.runner.next_in_run() {
            Some(id) => Ok(id),
            None => self.runner.take_run(&self.generator).await,
        }
    }

    /// `count` strictly ascending ids from the pinned machine id, after
    /// every id this handle gave before (what is left of its run is a gap).
    ///
    /// # Errors
    /// As [`Pinned::next_id`]; on an error the ids already taken are
    /// dropped (a gap, never a reuse).
    pub async fn next_ids(&mut self, count: u64) -> Result<Vec<u64>, GenerateError> {
        self.runner.end_run();
        self.generator.next_ids(count).await
    }

    /// The machine id it takes ids from, while a grant is in force.
    pub fn machine_id(&self) -> Option<crate::layout::MachineId> {
        self.generator.grant().map(|g| g.machine_id)
    }
}

/// A run of one generator's ids and what ends it, without the generator
/// itself (the caller passes it to [`Runner::take_run`]), so a thread's
/// runner keeps no generator alive.
#[derive(Debug)]
pub(super) struct Runner {
    /// The generator's ticks, one pointer nearer.
    ticks: Option<Arc<MsTicks>>,
    /// The generator's count of [`Generator::end_runs`].
    ended: Arc<CacheLine<AtomicU64>>,
    run: Run,
}

/// A run: ids `next..end`, taken at tick `tick` while the generator's
/// runs-ended count read `ended`.
#[derive(Debug, Clone, Copy)]
struct Run {
    next: u64,
    end: u64,
    tick: u64,
    ended: u64,
    /// Ids the next run asks for.
    size: u64,
}

impl Runner {
    fn new(generator: &Generator) -> Self {
        Self {
            ticks: generator.ticks.clone(),
            ended: generator.runs_ended.clone(),
            // No run, at a tick no count reads while running.
            run: Run {
                next: 0,
                end: 0,
                tick: u64::MAX,
                ended: 0,
                size: 1,
            },
        }
    }

    /// Ends the run: what is left of it is a gap.
    fn end_run(&mut self) {
        self.run.end = self.run.next;
    }

    /// The next id of the run, while the tick reads what it read when the
    /// run was taken and the runs were not ended since.
    #[inline]
    fn next_in_run(&mut self) -> Option<u64> {
        let run = &mut self.run;
        if run.next < run.end
            && self.ticks.as_deref().map(MsTicks::read) == Some(run.tick)
            && self.ended.load(Ordering::Acquire) == run.ended
        {
            run.next += 1;
            return Some(run.next - 1);
        }
        None
    }

    /// Takes a new run from `generator` (the one this runner was made for)
    /// and returns its first id.
    async fn take_run(&mut self, generator: &Generator) -> Result<u64, GenerateError> {
        debug_assert!(Arc::ptr_eq(&self.ended, &generator.runs_ended));
        let tick = generator.tick();
        let run = self.run;
        // The run is over whatever this take does: a take that fails (or is
        // cancelled) must not leave it to be handed out.
        self.end_run();
        let used_up = run.next == run.end;
        let size = if used_up && tick == Some(run.tick) {
            (run.size * 2).min(generator.step)
        } else {
            (run.size / 2).max(1)
        };
        // Read before the take: runs ended after it end this one.
        let ended = self.ended.load(Ordering::Acquire);
        // A run only from a window the tick keeps (so it ends when that
        // window would); otherwise one id, as any caller takes it.
        let taken = tick
            .filter(|&t| MsTicks::running(t))
            .and_then(|t| generator.take_in_tick(t, size));
        let t = match taken {
            Some(t) => t,
            None => match generator.take_now(1)? {
                Some(t) => t,
                // Queued callers or a used-up millisecond: one id in turn.
                None => generator.take_waiting(1).await?,
            },
        };
        self.run = Run {
            next: t.first + 1,
            end: t.first + t.count,
            tick: tick.unwrap_or(u64::MAX),
            ended,
            size,
        };
        Ok(t.first)
    }
}

/// Identifies a [`GeneratorSet`](super::GeneratorSet) to the runs its
/// threads keep: the set holds the only strong reference, each thread's
/// entry a weak one, so the address is no other set's while an entry
/// names it, and an entry whose set is gone is seen to be (and dropped on
/// the thread's next new entry).
pub(super) type SetToken = Arc<()>;

/// How many (set, slot) runs a thread keeps; past it the least recently
/// made goes (its run's rest is a gap).
const THREAD_RUNS: usize = 8;

/// One thread's run for one slot of one set.
#[derive(Debug)]
struct ThreadRun {
    /// The set's token's address: what a lookup compares (a number, so the
    /// futures that hold it stay `Send`).
    key: usize,
    slot: usize,
    /// Keeps that address the set's while this entry lives.
    set: Weak<()>,
    /// `None` while a new run is being taken for it.
    runner: Option<Runner>,
}

impl ThreadRun {
    #[inline]
    fn is(&self, key: usize, slot: usize) -> bool {
        self.key == key && self.slot == slot
    }
}

/// A thread's runs: the one made last inline (one load nearer), the
/// others after it.
#[derive(Debug)]
struct ThreadRuns {
    last: Option<ThreadRun>,
    others: Vec<ThreadRun>,
}

impl ThreadRuns {
    #[inline]
    fn find(&mut self, key: usize, slot: usize) -> Option<&mut ThreadRun> {
        if self.last.as_ref().is_some_and(|r| r.is(key, slot)) {
            return self.last.as_mut();
        }
        self.find_other(key, slot)
    }

    #[cold]
    fn find_other(&mut self, key: usize, slot: usize) -> Option<&mut ThreadRun> {
        self.others.iter_mut().find(|r| r.is(key, slot))
    }

    /// Adds `run` as the one made last: entries of sets that are gone go
    /// first, then the oldest past [`THREAD_RUNS`].
    fn add(&mut self, run: ThreadRun) {
        self.others.extend(self.last.take());
        self.others.retain(|r| r.set.strong_count() > 0);
        let excess = (self.others.len() + 1).saturating_sub(THREAD_RUNS);
        self.others.drain(..excess);
        self.last = Some(run);
    }
}

/// `f` on this thread's runs; `None` while the thread is being torn down
/// or its runs are in use (neither happens on the path of an id).
#[inline]
fn with_thread_runs<R>(f: impl FnOnce(&mut ThreadRuns) -> Option<R>) -> Option<R> {
    RUNS.try_with(|runs| f(&mut *runs.try_borrow_mut().ok()?))
        .ok()
        .flatten()
}

thread_local! {
    /// This thread's runs for [`GeneratorSet::next_id`](super::GeneratorSet::next_id):
    /// a thread local of this crate, whose access is inlined (a lookup in a
    /// table per set, or one in another crate, is a call, and costs about
    /// as much as the rest of an id).
    static RUNS: RefCell<ThreadRuns> = const {
        RefCell::new(ThreadRuns { last: None, others: Vec::new() })
    };
}

/// The next id of this thread's run for slot `slot` of the set `set`, or
/// `None` (no run, or it ended): then [`from_new_thread_run`]. No write any
/// other thread sees.
#[inline]
pub(super) fn from_thread_run(set: &SetToken, slot: usize) -> Option<u64> {
    let key = Arc::as_ptr(set).addr();
    with_thread_runs(|runs| runs.find(key, slot)?.runner.as_mut()?.next_in_run())
}

/// A new run of `generator` (slot `slot` of `set`) for this thread, and
/// its first id. The thread's runner is taken out while the run is taken,
/// which may wait, and put back as the runner of the thread the caller is
/// on then (a task may move). The run was taken in this poll, on that
/// thread, so after every run that thread's runner holds: it replaces it
/// (whose rest is a gap), and the ids that thread hands out still ascend.
pub(super) async fn from_new_thread_run(
    set: &SetToken,
    slot: usize,
    generator: &Generator,
) -> Result<u64, GenerateError> {
    let key = Arc::as_ptr(set).addr();
    let taken = with_thread_runs(|runs| runs.find(key, slot)?.runner.take());
    let mut runner = taken.unwrap_or_else(|| Runner::new(generator));
    let id = runner.take_run(generator).await?;
    // A thread being torn down, or a runs table in use, keeps no runner.
    with_thread_runs(|runs| {
        match runs.find(key, slot) {
            Some(run) => run.runner = Some(runner),
            None => runs.add(ThreadRun {
                key,
                slot,
                set: Arc::downgrade(set),
                runner: Some(runner),
            }),
        }
        Some(())
    });
    Ok(id)
}
