//! Time enters snowkeep here and nowhere else (clippy bans `SystemTime::now` and
//! `Instant::now` elsewhere), so generation and lease logic can be tested with an
//! injected [`ManualClock`] and never sleep.
//!
//! Two clocks matter (docs/design.md, the safety invariant): the **wall clock** (Unix ms) is what ids stamp
//! and may jump; the **monotonic clock** measures lease deadlines and never does.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall and monotonic time.
pub trait Clock: Send + Sync + 'static {
    /// Wall time in milliseconds since the Unix epoch (may step backwards).
    fn unix_ms(&self) -> u64;
    /// Monotonic time; never goes backwards.
    fn now(&self) -> Instant;
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
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    #[allow(clippy::disallowed_methods)] // the one place monotonic time is read
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock moved by hand, for tests: wall time can be set anywhere (also
/// backwards), monotonic time only advances.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    state: Mutex<(u64, Duration)>,
}

impl ManualClock {
    /// Creates a clock at wall time `unix_ms`.
    pub fn new(unix_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            base: SystemClock.now(),
            state: Mutex::new((unix_ms, Duration::ZERO)),
        })
    }

    /// Advances both clocks by `by`.
    pub fn advance(&self, by: Duration) {
        let mut s = self
            .state
            .lock()
            .expect("manual clock lock is never poisoned");
        s.0 += u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        s.1 += by;
    }

    /// Sets the wall clock (a step, forwards or backwards); monotonic time is untouched.
    pub fn set_unix_ms(&self, unix_ms: u64) {
        self.state
            .lock()
            .expect("manual clock lock is never poisoned")
            .0 = unix_ms;
    }
}

impl Clock for ManualClock {
    fn unix_ms(&self) -> u64 {
        self.state
            .lock()
            .expect("manual clock lock is never poisoned")
            .0
    }
    fn now(&self) -> Instant {
        self.base
            + self
                .state
                .lock()
                .expect("manual clock lock is never poisoned")
                .1
    }
}
