//! A handle that takes ids in runs: [`Pinned`], owned by one worker, and
//! the runs each thread keeps for [`GeneratorSet::next_id`](super::GeneratorSet::next_id).

use std::cell::RefCell;
use std::sync::Arc;

use super::grant_view::GrantView;
use super::Generator;
use crate::error::GenerateError;
use crate::ticker::MsTicks;
use thread_local::ThreadLocal;

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
/// the tick and the grant are the ones the run was taken under, with two
/// loads and no shared write; a new millisecond or a new grant ends the
/// run, and its ids left over are a gap, never reused. A run starts at one id and doubles while runs are
/// used up within their millisecond, up to the generator's step (1/8 of a
/// millisecond's sequence, so other callers of the machine id keep their
/// turn); it halves when a millisecond ends with ids left over.
///
/// The ids of a run are stamped when it is taken, so handing one out later
/// (a withdrawn grant ends the run at the next id, but the withdrawal may
/// come while an id is being handed out) is what a caller does that keeps
/// an id and uses it later: a successor stamps above the release's fence,
/// which is at or above every stamp (docs/design.md, "No clock read per
/// id"). A stalled tick thread lets a run go on past its millisecond, at
/// most to its end (one step).
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
    /// Its own view of the grant: seen when the run was taken.
    grant: GrantView,
    /// The generator's ticks, one pointer nearer.
    ticks: Option<Arc<MsTicks>>,
    run: Run,
}

/// A pinned handle's run: ids `next..end`, taken at tick `tick`.
#[derive(Debug, Clone, Copy)]
struct Run {
    next: u64,
    end: u64,
    tick: u64,
    /// Ids the next run asks for.
    size: u64,
}

impl Clone for Pinned {
    fn clone(&self) -> Self {
        Pinned::new(self.generator.clone())
    }
}

impl Pinned {
    pub(super) fn new(generator: Arc<Generator>) -> Self {
        let grant = GrantView::new(generator.grant.clone());
        Self {
            ticks: generator.ticks.clone(),
            generator,
            grant,
            // No run, at a tick no count reads while running.
            run: Run {
                next: 0,
                end: 0,
                tick: u64::MAX,
                size: 1,
            },
        }
    }

    /// One id from the pinned machine id.
    ///
    /// # Errors
    /// As [`Generator::next_id`]: no grant (stopped, or not yet granted), the
    /// fence reached, the clock stepped back too far.
    #[inline]
    pub async fn next_id(&mut self) -> Result<u64, GenerateError> {
        match self.next_in_run() {
            Some(id) => Ok(id),
            None => self.take_run().await,
        }
    }

    /// The next id of the run, while the tick and the grant are the ones it
    /// was taken under.
    #[inline]
    pub(super) fn next_in_run(&mut self) -> Option<u64> {
        let run = &mut self.run;
        if run.next < run.end
            && self.ticks.as_deref().map(MsTicks::read) == Some(run.tick)
            && self.grant.same()
        {
            run.next += 1;
            return Some(run.next - 1);
        }
        None
    }

    /// Takes a new run from the generator and returns its first id.
    pub(super) async fn take_run(&mut self) -> Result<u64, GenerateError> {
        let tick = self.generator.tick();
        let run = self.run;
        // The run is over whatever this take does: a take that fails (or is
        // cancelled) must not leave it to be handed out under a grant seen
        // below.
        self.run.end = self.run.next;
        let used_up = run.next == run.end;
        let size = if used_up && tick == Some(run.tick) {
            (run.size * 2).min(self.generator.step)
        } else {
            (run.size / 2).max(1)
        };
        // Seen before the take: a grant sent after this ends the run.
        self.grant.mark_seen();
        // A run only from a window the tick keeps (so it ends when that
        // window would); otherwise one id, as any caller takes it.
        let run = tick
            .filter(|&t| MsTicks::running(t))
            .and_then(|t| self.generator.take_in_tick(t, size));
        let t = match run {
            Some(t) => t,
            None => match self.generator.take_now(1)? {
                Some(t) => t,
                // Queued callers or a used-up millisecond: one id in turn.
                None => self.generator.take_waiting(1).await?,
            },
        };
        self.run = Run {
            next: t.first + 1,
            end: t.first + t.count,
            tick: tick.unwrap_or(u64::MAX),
            size,
        };
        Ok(t.first)
    }

    /// `count` strictly ascending ids from the pinned machine id, after
    /// every id this handle gave before (what is left of its run is a gap).
    ///
    /// # Errors
    /// As [`Pinned::next_id`]; on an error the ids already taken are
    /// dropped (a gap, never a reuse).
    pub async fn next_ids(&mut self, count: u64) -> Result<Vec<u64>, GenerateError> {
        self.run.end = self.run.next;
        self.generator.next_ids(count).await
    }

    /// The machine id it takes ids from, while a grant is in force.
    pub fn machine_id(&self) -> Option<crate::layout::MachineId> {
        self.generator.grant().map(|g| g.machine_id)
    }
}

/// Each thread's handle on one generator, for
/// [`GeneratorSet::next_id`](super::GeneratorSet::next_id): kept by the set,
/// freed with it.
pub(super) type ThreadRuns = ThreadLocal<RefCell<Option<Pinned>>>;

/// The next id of this thread's run in `runs`, or `None` (no run, or it
/// ended): then [`from_new_thread_run`]. No write any other thread sees.
#[inline]
pub(super) fn from_thread_run(runs: &ThreadRuns) -> Option<u64> {
    let cell = runs.get()?;
    let mut handle = cell.try_borrow_mut().ok()?;
    handle.as_mut()?.next_in_run()
}

/// A new run of `g` for this thread, and its first id. The thread's handle
/// is taken out of `runs` (`g`'s) while the run is taken, which may wait,
/// and put back as the handle of the thread the caller is on then, unless
/// that one has a handle already (then this run's rest is a gap).
pub(super) async fn from_new_thread_run(
    runs: &ThreadRuns,
    g: &Arc<Generator>,
) -> Result<u64, GenerateError> {
    let taken = runs
        .get()
        .and_then(|cell| cell.try_borrow_mut().ok()?.take());
    let mut handle = taken.unwrap_or_else(|| Pinned::new(g.clone()));
    let id = handle.take_run().await?;
    if let Ok(mut slot) = runs.get_or(|| RefCell::new(None)).try_borrow_mut() {
        slot.get_or_insert(handle);
    }
    Ok(id)
}
