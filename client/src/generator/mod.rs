//! The snowflake generator: the one piece of code that turns a [`Grant`] and the
//! clock into ids, shared by the server and the embedded client (docs/design.md).
//!
//! # The invariant it protects (docs/design.md, the safety invariant)
//!
//! No two holders of one machine id ever stamp the same timestamp. The generator
//! enforces the holder's half of that:
//!
//! 1. It stamps `t` only while its grant is valid: `t <= grant.fence` (the fence
//!    is persisted before it is published) and, where the lease has a deadline,
//!    the monotonic clock is before it.
//! 2. It stamps only `t > grant.floor`, the previous holder's fence read after
//!    the claim committed.
//! 3. Within one holder, timestamps never go backwards: a backwards clock step of
//!    at most `max_backward_wait` is waited out, a larger one is refused.
//!
//! The grant is read *under the sequence lock*, so once the lease source
//! publishes `None` and [`Generator::drain`] has taken that lock, no id can be
//! stamped under the old grant: that is what "drain before release" means here.
//!
//! # One clock read per id
//!
//! A step that reads the wall clock (and the exact monotonic clock,
//! [`Clock::now`](crate::Clock::now)) checks every rule above and, when it
//! issues, opens a *window* in which later ids are stamped with the same
//! timestamp after one cheap monotonic reading
//! ([`Clock::monotonic_ns`](crate::Clock::monotonic_ns)) each, under the same
//! grant (one atomic load tells). A stamp the reading admitted stays above the
//! floor, at or below the fence and never behind the last stamp, whatever the
//! clocks do; only the deadline moves with time, and the window keeps it:
//!
//! - it lasts at most 1 ms, and at most half the time the exact reading
//!   left to the deadline, on the cheap clock;
//! - it closes when the cheap clock stops or goes back (each id needs a
//!   reading above the last one), when the millisecond's sequence is used
//!   up, and under a new grant;
//! - it opens only if the cheap clock kept at least half the pace of the
//!   exact one since the previous exact reading.
//!
//! So an id is stamped after the deadline by the monotonic clock only if the
//! cheap clock slowed to under half its pace inside a window of at most
//! 1 ms (or a tick thread keeping the window stalled, below), and it never
//! goes past the fence. Stamps lag the wall clock by less
//! than 1 ms, and a wall-clock step is seen (and judged by the rules above) by
//! the first reading after the window it fell in.
//!
//! # No clock read per id
//!
//! On a clock with [`MsTicks`] (a count one thread advances just after
//! every wall-clock millisecond boundary), a full window is kept by that
//! count instead, so an id reads no clock. docs/design.md, "No clock read
//! per id", says what that gives up when the thread stalls, and why the
//! fence makes it safe.

mod counters;
mod demand;
mod grant_view;
mod pinned;
mod readiness;
mod sequence;
mod set;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::clock::SharedClock;
use crate::error::GenerateError;
use crate::layout::{Layout, MachineId, Millis};
use crate::ticker::{CacheLine, MsTicks, Ticker};
pub use counters::GeneratorMetrics;
pub use demand::{FenceDemand, FENCE_DEMAND_WAIT};
use grant_view::GrantView;
pub use pinned::Pinned;
use sequence::SequenceState;
pub(crate) use sequence::Step;
pub use sequence::Taken;
pub use set::GeneratorSet;

/// Default largest backwards clock step the generator waits out: 100 ms.
pub const DEFAULT_MAX_BACKWARD_WAIT: Duration = Duration::from_millis(100);

/// A caller takes at most `1/STEP_SHARE` of a millisecond's sequence per step
/// (128 ids with 10 sequence bits) before callers queued behind it get a
/// turn: a one-id call queued behind 8 streams waits about one millisecond,
/// not eight.
pub const STEP_SHARE: u64 = 8;

/// The longest a caller queues for its turn before it waits on the
/// millisecond tick without one. A call whose future stops being polled
/// without being dropped (a response body hyper no longer polls, say) while
/// it holds the turn would otherwise hold every later caller of the machine
/// id up for good; with it, they lose their order, never their ids.
pub const TURN_PATIENCE: Duration = Duration::from_millis(10);

/// The right to stamp ids under one machine id, published by a lease source
/// (the claim loop on etcd or on the single-instance store, or the Lease API client) through a
/// `tokio::sync::watch` channel. `None` in the channel means "do not issue".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The machine id held.
    pub machine_id: MachineId,
    /// Exclusive lower bound (layout ms): the previous holder's fence, read after
    /// the claim committed. Stamped timestamps are `> floor`.
    pub floor: Millis,
    /// Inclusive upper bound (layout ms): the fence persisted in the store.
    pub fence: Millis,
    /// Local lease deadline by the monotonic clock, counted from when the last
    /// successful renewal was *sent*; `None` when the store has no expiry.
    pub deadline: Option<Instant>,
}

/// Generates ascending ids for one machine id at a time. Cheap to share
/// (`Arc`); all methods take `&self`.
///
/// # Waiting, and fairness between callers
///
/// A call takes ids in steps of at most `1/STEP_SHARE` of a millisecond's
/// sequence. While nobody waits, a step is taken at once. Once a
/// millisecond's sequence is used up, callers queue for their turn in
/// arrival order: the first in the queue waits for the next millisecond
/// (woken by a process-wide tick thread, not by spinning), takes one step and
/// goes to the back of the queue if it wants more. So a small call arriving
/// behind big streams waits for one step of each stream ahead of it, and
/// waiting costs no CPU. A caller queues for its turn at most
/// [`TURN_PATIENCE`]; after that it waits on the tick out of turn, so a call
/// its caller stopped polling (without dropping it) cannot hold the others up.
pub struct Generator {
    layout: Layout,
    clock: SharedClock,
    grant: watch::Receiver<Option<Grant>>,
    state: Mutex<Issuer>,
    max_backward_wait: Duration,
    metrics: GeneratorMetrics,
    /// Ids per step: `sequences_per_tick / STEP_SHARE`, at least 1.
    step: u64,
    /// Callers queued for `turn` (or holding it); while any are, new calls
    /// queue too instead of taking ahead of them.
    queued: AtomicUsize,
    /// Served in arrival order (tokio's mutex is fair).
    turn: tokio::sync::Mutex<()>,
    /// Wakes the holder of `turn` at the next millisecond.
    ticker: Arc<Ticker>,
    /// Where a caller that finds the fence reached asks for a raise; `None`
    /// refuses it at once.
    demand: Option<Arc<FenceDemand>>,
    /// The clock's millisecond tick, which keeps full windows without a
    /// clock read per id; `None`: every id reads the cheap clock.
    ticks: Option<Arc<MsTicks>>,
    /// Advanced by [`Generator::end_runs`]: a run lasts while it reads the
    /// value it was taken at.
    runs_ended: Arc<CacheLine<AtomicU64>>,
}

/// What the sequence lock guards: the sequence, and the grant the last
/// step ran under.
struct Issuer {
    sequence: SequenceState,
    grant: GrantView,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("layout", &self.layout)
            .field("grant", &*self.grant.borrow())
            .finish_non_exhaustive()
    }
}

impl Generator {
    /// Creates a generator that stamps under whatever grant `grant` carries.
    pub fn new(
        layout: Layout,
        clock: SharedClock,
        grant: watch::Receiver<Option<Grant>>,
        max_backward_wait: Duration,
        metrics: GeneratorMetrics,
    ) -> Arc<Self> {
        Self::with_ticker(
            layout,
            clock,
            grant,
            max_backward_wait,
            metrics,
            Ticker::global(),
            None,
        )
    }

    /// Like [`Generator::new`], for a lease source that raises its fences on
    /// demand: a call that finds the fence reached asks `demand` for a raise
    /// and waits for it (at most [`FENCE_DEMAND_WAIT`]) while the source says
    /// it can raise, and readiness counts such a generator as ready.
    pub fn with_demand(
        layout: Layout,
        clock: SharedClock,
        grant: watch::Receiver<Option<Grant>>,
        max_backward_wait: Duration,
        metrics: GeneratorMetrics,
        demand: Arc<FenceDemand>,
    ) -> Arc<Self> {
        Self::with_ticker(
            layout,
            clock,
            grant,
            max_backward_wait,
            metrics,
            Ticker::global(),
            Some(demand),
        )
    }

    fn with_ticker(
        layout: Layout,
        clock: SharedClock,
        grant: watch::Receiver<Option<Grant>>,
        max_backward_wait: Duration,
        metrics: GeneratorMetrics,
        ticker: Arc<Ticker>,
        demand: Option<Arc<FenceDemand>>,
    ) -> Arc<Self> {
        // Set the cheap clock up now (the system clock calibrates the TSC
        // once per process, 10 to 200 ms), not on the first id.
        clock.monotonic_ns();
        let ticks = clock.ms_ticks();
        Arc::new(Self {
            ticks,
            layout,
            clock,
            state: Mutex::new(Issuer {
                sequence: SequenceState::new(),
                grant: GrantView::new(grant.clone()),
            }),
            grant,
            max_backward_wait,
            metrics,
            step: (layout.sequences_per_tick() / STEP_SHARE).max(1),
            queued: AtomicUsize::new(0),
            turn: tokio::sync::Mutex::new(()),
            ticker,
            demand,
            runs_ended: Arc::default(),
        })
    }

    /// Ends every run of ids taken from this generator (pinned handles' and
    /// [`GeneratorSet::next_id`]'s): each hands out nothing more and takes
    /// its next id here. A lease source calls it after publishing a grant
    /// (or withdrawing one), so no id is handed out after the change: the
    /// embedded generator does. The generator calls it itself when a call
    /// finds the grant changed; otherwise a run ends at the next tick (or
    /// at its end, one step, while the tick thread stalls), which is safe
    /// (docs/design.md, "No clock read per id").
    pub fn end_runs(&self) {
        self.runs_ended.fetch_add(1, Ordering::Release);
    }

    /// The layout ids are stamped with.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The grant in force now, if any.
    pub fn grant(&self) -> Option<Grant> {
        *self.grant.borrow()
    }

    /// The last timestamp stamped under the current machine id (its floor
    /// before any stamp), or `None` before any grant was seen.
    pub fn last_stamped(&self) -> Option<Millis> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.sequence.last().map(|(_, last)| last)
    }

    /// Takes up to `want` ids in one step without waiting: a run of consecutive
    /// ids in one millisecond, or the reason to wait, or an error.
    ///
    /// A step inside the window of the last wall reading reads the tick
    /// count (a window kept by the tick) or the cheap monotonic clock
    /// ([`Clock::monotonic_ns`](crate::Clock::monotonic_ns)) once; the wall
    /// clock and the exact monotonic clock are read only when that window is
    /// closed (see "One clock read per id" and "No clock read per id" in
    /// this module).
    #[inline]
    pub(crate) fn try_take(&self, want: u64) -> Result<Step, GenerateError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let tick = self.tick();
        // The cheap reading, if the window needed one: the wall reading
        // below starts from it.
        let mut now_ns = None;
        if state.grant.same() {
            let per_ms = self.layout.sequences_per_tick();
            let cheap = || *now_ns.get_or_insert_with(|| self.clock.monotonic_ns());
            if let Some(t) = state.sequence.take_again(tick, cheap, want, per_ms) {
                drop(state);
                self.count_issued(&t);
                return Ok(Step::Ids(t));
            }
        } else {
            state.sequence.close_window();
            self.end_runs();
        }
        self.take_reading(state, tick, now_ns, want)
    }

    /// One id from a window kept by the tick, or `None` (no such window, or
    /// callers queued): then [`Generator::take_now`]. The id comes back in a
    /// register, with no step or error built around it.
    #[inline]
    pub(crate) fn take_one_in_tick(&self) -> Option<u64> {
        let tick = self.tick()?;
        self.take_in_tick(tick, 1).map(|t| t.first)
    }

    /// Up to `want` ids from a window kept by the tick that reads `tick`,
    /// or `None`: no such window (a clock without ticks, a new tick or
    /// grant, the millisecond used up, less than 2 ms to the deadline) or
    /// callers queued. A pinned handle takes its runs only here, so a run
    /// never outlasts the window it came from.
    #[inline]
    pub(crate) fn take_in_tick(&self, tick: u64, want: u64) -> Option<Taken> {
        if self.queued.load(Ordering::Acquire) != 0 {
            return None;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.grant.same() {
            return None;
        }
        let per_ms = self.layout.sequences_per_tick();
        let t = state.sequence.take_in_tick(tick, want, per_ms)?;
        drop(state);
        self.count_issued(&t);
        Some(t)
    }

    /// The tick count now, when the clock has ticks.
    #[inline]
    fn tick(&self) -> Option<u64> {
        self.ticks.as_deref().map(MsTicks::read)
    }

    /// [`Generator::try_take`] with a wall-clock reading, under the grant
    /// in force now. `tick` is the count read before any clock, `now_ns`
    /// the cheap reading if one was taken since.
    #[cold]
    #[inline(never)]
    fn take_reading(
        &self,
        mut state: std::sync::MutexGuard<'_, Issuer>,
        tick: Option<u64>,
        now_ns: Option<u64>,
        want: u64,
    ) -> Result<Step, GenerateError> {
        if let Some(ticks) = &self.ticks {
            ticks.touch();
        }
        let grant = state.grant.read().ok_or(GenerateError::NoGrant)?;
        let now_ns = now_ns.unwrap_or_else(|| self.clock.monotonic_ns());
        let now_mono = self.clock.now();
        let now_unix = self.clock.unix_ms();
        let step = state.sequence.take(
            &self.layout,
            &grant,
            now_unix,
            now_mono,
            now_ns,
            want,
            self.max_backward_wait,
        );
        if let (Ok(Step::Ids(_)), Some(tick)) = (&step, tick) {
            state.sequence.keep_by_tick(tick);
        }
        drop(state);
        match &step {
            Ok(Step::Ids(t)) => self.count_issued(t),
            Ok(Step::SequenceExhausted) => {}
            Ok(Step::ClockBackward { .. }) => self.metrics.backward_waited.increment(1),
            Err(GenerateError::ClockSteppedBack { .. }) => {
                self.metrics.backward_halted.increment(1)
            }
            Err(_) => {}
        }
        step
    }

    #[inline]
    fn count_issued(&self, t: &Taken) {
        self.metrics.ids_issued.increment(t.count);
        if t.exhausted {
            self.metrics.sequence_exhausted.increment(1);
        }
    }

    /// Returns `count` strictly ascending ids, waiting out sequence exhaustion
    /// and small backwards clock steps. On an error, ids already taken for this
    /// batch are dropped (a gap, never a reuse).
    pub async fn next_ids(&self, count: u64) -> Result<Vec<u64>, GenerateError> {
        let mut ids = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        self.fill(count, |t| ids.extend(t.first..t.first + t.count))
            .await?;
        Ok(ids)
    }

    /// Like [`Generator::next_ids`] but hands each run of consecutive ids to
    /// `sink`, so callers can avoid materialising ids they only forward.
    pub async fn fill(&self, count: u64, mut sink: impl FnMut(Taken)) -> Result<(), GenerateError> {
        let mut left = count;
        while left > 0 {
            let t = self.take_run(left).await?;
            left -= t.count;
            sink(t);
        }
        Ok(())
    }

    /// One id: the embedded generator's hot path, with no batch allocated.
    pub async fn next_id(&self) -> Result<u64, GenerateError> {
        if let Some(id) = self.take_one_in_tick() {
            return Ok(id);
        }
        match self.take_now(1) {
            Ok(Some(t)) => Ok(t.first),
            Ok(None) => Ok(self.take_waiting(1).await?.first),
            // A fence the lease source can raise: ask for it (cold path).
            Err(GenerateError::FenceReached { .. }) if self.raisable() => {
                Ok(self.take_run(1).await?.first)
            }
            Err(e) => Err(e),
        }
    }

    /// Takes a run of up to `min(want, step)` ids (see
    /// [`Generator::take_in_turn`]); a fence found reached is raised on
    /// demand first when the lease source can raise it.
    async fn take_run(&self, want: u64) -> Result<Taken, GenerateError> {
        match self.take_in_turn(want).await {
            Err(GenerateError::FenceReached { fence }) if self.raisable() => {
                self.raise_fence(fence).await;
                self.take_in_turn(want).await
            }
            taken => taken,
        }
    }

    /// Asks the lease source to raise the fence `reached` and waits until a
    /// grant without it (a higher fence, or none) is published, at most
    /// [`FENCE_DEMAND_WAIT`].
    async fn raise_fence(&self, reached: Millis) {
        let Some(demand) = &self.demand else { return };
        let mut grant = self.grant.clone();
        demand.request();
        let _ = tokio::time::timeout(FENCE_DEMAND_WAIT, async {
            loop {
                if grant.borrow_and_update().map(|g| g.fence) != Some(reached) {
                    return;
                }
                if grant.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// Takes a run of up to `min(want, step)` ids, waiting out sequence
    /// exhaustion and small backwards clock steps in turn with the other
    /// callers (see [`Generator`]).
    async fn take_in_turn(&self, want: u64) -> Result<Taken, GenerateError> {
        let want = want.min(self.step);
        match self.take_now(want)? {
            Some(t) => Ok(t),
            None => self.take_waiting(want).await,
        }
    }

    /// A run of up to `want` ids (at most one step) when it needs no wait:
    /// `Ok(None)` means "wait for it with [`Generator::take_waiting`]": the
    /// millisecond's sequence is used up, the clock stepped back a little,
    /// or callers are queued ahead. A plain function, so the calls that do
    /// not wait (almost all) run no async state machine of their own.
    #[inline]
    pub(crate) fn take_now(&self, want: u64) -> Result<Option<Taken>, GenerateError> {
        if self.queued.load(Ordering::Acquire) != 0 {
            return Ok(None);
        }
        match self.try_take(want)? {
            Step::Ids(t) => Ok(Some(t)),
            Step::SequenceExhausted | Step::ClockBackward { .. } => Ok(None),
        }
    }

    /// Waits for a run of up to `want` ids (at most one step) in turn with
    /// the other callers, as described on [`Generator`]. Boxed: the waiting
    /// state (turn, timeout, tick) is large, and is built only by calls that
    /// wait.
    pub(crate) fn take_waiting(
        &self,
        want: u64,
    ) -> Pin<Box<impl Future<Output = Result<Taken, GenerateError>> + '_>> {
        Box::pin(self.wait_for_run(want.min(self.step)))
    }

    async fn wait_for_run(&self, want: u64) -> Result<Taken, GenerateError> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let _queued = Queued(&self.queued);
        let _turn = tokio::time::timeout(TURN_PATIENCE, self.turn.lock())
            .await
            .ok();
        loop {
            let tick = self.ticker.next_tick();
            match self.try_take(want)? {
                Step::Ids(t) => return Ok(t),
                Step::SequenceExhausted => self.ticker.wait(tick).await,
                Step::ClockBackward { wait } => tokio::time::sleep(wait).await,
            }
        }
    }

    /// Blocks issuance behind the sequence lock and returns the last timestamp
    /// stamped (or the floor when nothing was stamped) for the machine id of the
    /// state. The lease source must have published `None` first: after this
    /// returns, no id can be stamped under the old grant. Used before release to
    /// lower the fence (design.md, fence protocol rule 4).
    pub fn drain(&self) -> Option<(MachineId, Millis)> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert!(
            self.grant.borrow().is_none(),
            "drain before the grant is withdrawn"
        );
        // Nothing more from runs taken before (their ids are within last).
        self.end_runs();
        state.sequence.last()
    }
}

/// Counts one caller in [`Generator::take_waiting`]'s queue until dropped.
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod shape_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tick_tests;
