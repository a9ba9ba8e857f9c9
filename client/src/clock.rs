//! Time enters snowkeep here and nowhere else (clippy bans `SystemTime::now` and
//! `Instant::now` elsewhere), so generation and lease logic can be tested with an
//! injected [`ManualClock`] and never sleep, and loops that sleep on tokio's
//! timer with a [`TokioClock`] under tokio's paused time.
//!
//! Two clocks matter (docs/design.md, the safety invariant): the **wall clock** (Unix ms) is what ids stamp
//! and may jump; the **monotonic clock** measures lease deadlines and never does.
//! The monotonic clock has two readings: [`Clock::now`], exact, and
//! [`Clock::monotonic_ns`], the cheapest the platform offers, which the
//! generator reads once per id (docs/design.md, "One clock read per id")
//! unless the clock also offers [`MsTicks`], a count a thread advances at
//! every wall-clock millisecond, which then keeps the generator's window
//! with no clock read at all (docs/design.md, "No clock read per id").

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::layout::{Layout, Millis};
use crate::ticker::{MsTicks, Ticker};

/// A source of wall and monotonic time.
pub trait Clock: Send + Sync + 'static {
    /// Wall time in milliseconds since the Unix epoch (may step backwards).
    fn unix_ms(&self) -> u64;
    /// Monotonic time; never goes backwards.
    fn now(&self) -> Instant;
    /// Monotonic time in nanoseconds from an origin of this clock's choosing
    /// (fixed for the clock's life), read as cheaply as the platform allows.
    /// It must never stop while [`Clock::now`] moves on, and should keep
    /// `now()`'s pace.
    ///
    /// The generator reads it once per id (none while [`Clock::ms_ticks`]
    /// keeps its window), and [`Clock::now`] and
    /// [`Clock::unix_ms`] about once per millisecond, so it measures spans of
    /// at most 1 ms with it. It trusts it over such a span only when, since
    /// the previous exact reading, it kept at least half the pace of `now()`
    /// and did not go back, and it stops trusting it as soon as a reading is
    /// not above the one before; otherwise every id reads the exact clocks.
    fn monotonic_ns(&self) -> u64;

    /// The millisecond tick that keeps this clock's windows, if it has one:
    /// asked once, when a generator is made. `None` (the default) makes the
    /// generator read [`Clock::monotonic_ns`] once per id instead. A clock
    /// that offers ticks must advance them just after every wall-clock
    /// millisecond boundary (a window they keep lasts until they move), from
    /// a thread of its own, as the system clock's tick thread does;
    /// [`ManualClock::ticking`] advances them on every change of its time.
    fn ms_ticks(&self) -> Option<Arc<MsTicks>> {
        None
    }

    /// Wall time in `layout`'s milliseconds (since its epoch); 0 before the
    /// epoch, which no stamp can reach ([`Layout::to_layout_ms`]).
    fn layout_ms(&self, layout: &Layout) -> Millis {
        layout.to_layout_ms(self.unix_ms()).unwrap_or_default()
    }
}

/// `d` in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// Returns the system clock as a [`SharedClock`].
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place wall time is read
    fn unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| Millis::of(d).get())
            .unwrap_or(0)
    }

    #[allow(clippy::disallowed_methods)] // the one place monotonic time is read
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// The CPU's time-stamp counter scaled to nanoseconds, through
    /// [`quanta`] (where the CPU has an invariant TSC; elsewhere quanta reads
    /// the OS's monotonic clock, as [`Clock::now`] does). 10 to 15 ns
    /// against about 23 ns for `now()` on a KVM guest. The first call in a process
    /// calibrates the counter against the monotonic clock (10 ms, at most
    /// 200 ms); [`crate::Generator::new`] makes that call.
    fn monotonic_ns(&self) -> u64 {
        static FAST: OnceLock<(quanta::Clock, u64)> = OnceLock::new();
        let (clock, origin) = FAST.get_or_init(|| {
            let clock = quanta::Clock::new();
            let origin = clock.raw();
            (clock, origin)
        });
        // 0 if the counter reads below the origin (reset by a suspend).
        clock.delta_as_nanos(*origin, clock.raw())
    }

    /// The process-wide tick thread's count (`snowkeep-ms-tick`, which also
    /// wakes callers waiting for the next millisecond): `None` only if that
    /// thread could not be started.
    fn ms_ticks(&self) -> Option<Arc<MsTicks>> {
        Ticker::global().ticks()
    }
}

/// A clock moved by hand, for tests: wall time can be set anywhere (also
/// backwards), monotonic time only advances.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    /// (wall time since the Unix epoch, monotonic time moved so far).
    state: Mutex<(Duration, Duration)>,
    /// Advanced on every change of either clock, when the clock ticks.
    ticks: Option<Arc<MsTicks>>,
}

impl ManualClock {
    /// Creates a clock at wall time `unix_ms`.
    pub fn new(unix_ms: u64) -> Arc<Self> {
        Self::with_ticks(unix_ms, None)
    }

    /// Like [`ManualClock::new`], with [`MsTicks`] advanced on every change
    /// of either clock (so a generator on it keeps its windows by the tick,
    /// as on the system clock, and sees every change at its next id).
    pub fn ticking(unix_ms: u64) -> Arc<Self> {
        Self::with_ticks(unix_ms, Some(MsTicks::manual()))
    }

    fn with_ticks(unix_ms: u64, ticks: Option<Arc<MsTicks>>) -> Arc<Self> {
        Arc::new(Self {
            base: SystemClock.now(),
            state: Mutex::new((Duration::from_millis(unix_ms), Duration::ZERO)),
            ticks,
        })
    }

    /// Its ticks, when it was made [`ManualClock::ticking`].
    pub fn ticks(&self) -> Option<&Arc<MsTicks>> {
        self.ticks.as_ref()
    }

    fn ticked(&self) {
        if let Some(t) = &self.ticks {
            if MsTicks::running(t.read()) {
                t.advance();
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, (Duration, Duration)> {
        self.state
            .lock()
            .expect("manual clock lock is never poisoned")
    }

    /// Advances both clocks by `by` (the wall clock reads whole ms, so
    /// steps below 1 ms add up on it).
    pub fn advance(&self, by: Duration) {
        let mut s = self.state();
        s.0 += by;
        s.1 += by;
        drop(s);
        self.ticked();
    }

    /// Sets the wall clock (a step, forwards or backwards); monotonic time is untouched.
    pub fn set_unix_ms(&self, unix_ms: u64) {
        self.state().0 = Duration::from_millis(unix_ms);
        self.ticked();
    }
}

impl Clock for ManualClock {
    fn unix_ms(&self) -> u64 {
        Millis::of(self.state().0).get()
    }
    fn now(&self) -> Instant {
        self.base + self.state().1
    }
    /// Monotonic time moved so far (by [`ManualClock::advance`]).
    fn monotonic_ns(&self) -> u64 {
        nanos(self.state().1)
    }
    fn ms_ticks(&self) -> Option<Arc<MsTicks>> {
        self.ticks.clone()
    }
}

/// A clock on tokio's time, for tests of loops that take instants from the
/// clock and sleep on tokio's timer: its monotonic time is
/// `tokio::time::Instant::now()`, and its wall time moves with it (whole ms)
/// from where it started, plus any steps. Under tokio's paused time
/// (`#[tokio::test(start_paused = true)]`) the clock and the sleeps then
/// agree, and a test runs hours of lease time in microseconds.
///
/// Create it inside the runtime (tokio's clock is read at creation).
#[derive(Debug)]
pub struct TokioClock {
    base: tokio::time::Instant,
    base_unix_ms: u64,
    /// Wall-clock steps so far, ms (negative: set back).
    stepped_ms: Mutex<i64>,
}

impl TokioClock {
    /// A clock whose wall time reads `unix_ms` now.
    pub fn new(unix_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            base: tokio::time::Instant::now(),
            base_unix_ms: unix_ms,
            stepped_ms: Mutex::new(0),
        })
    }

    /// Steps the wall clock by `by_ms` (negative: backwards); monotonic time
    /// is untouched.
    pub fn step_unix_ms(&self, by_ms: i64) {
        *self
            .stepped_ms
            .lock()
            .expect("tokio clock lock is never poisoned") += by_ms;
    }
}

impl Clock for TokioClock {
    fn unix_ms(&self) -> u64 {
        let elapsed = Millis::of(self.base.elapsed()).get();
        let stepped = *self
            .stepped_ms
            .lock()
            .expect("tokio clock lock is never poisoned");
        self.base_unix_ms
            .saturating_add(elapsed)
            .saturating_add_signed(stepped)
    }

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    /// Monotonic time since the clock was created.
    fn monotonic_ns(&self) -> u64 {
        nanos(self.base.elapsed())
    }
}
