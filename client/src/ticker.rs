//! The millisecond tick: what callers wait on when a millisecond's sequence
//! is used up, and the count ([`MsTicks`]) that keeps the generator's windows.
//!
//! Waiting for the next millisecond cannot use tokio's timer: it fires on
//! whole-millisecond ticks of its own, up to 1 ms late, which would skip
//! milliseconds and halve throughput at the layout's limit. Spinning on
//! `yield_now` until the clock moves keeps the sequence fully used but burns
//! the CPU and the runtime's queues that other calls need, once per waiter.
//! So one thread per process, `snowkeep-ms-tick`, sleeps (a precise kernel
//! sleep, typically 50–100 µs late) until just after each wall-clock
//! millisecond boundary and wakes every waiter of every generator.
//!
//! The same thread advances the system clock's [`MsTicks`] at each of those
//! ticks: the coarse clock that keeps a generator's window with no clock
//! read per id (docs/design.md, "No clock read per id"). It runs while
//! someone waits or ids were taken within the last [`IDLE_TICKS`] ms, and
//! parks otherwise, stopping the count first (which closes every window
//! kept by it).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// Ticks without a touch (ids taken through a wall reading) or a waiter
/// after which the thread stops the count and parks: 100 ms. While ids are
/// taken, windows close every ms and their next reading touches.
pub(crate) const IDLE_TICKS: u32 = 100;

/// How long after a millisecond boundary the tick is aimed at, so that a
/// sleep that ends a little early still lands in the new millisecond.
const AFTER_BOUNDARY: Duration = Duration::from_micros(20);

/// A count advanced just after every wall-clock millisecond boundary, by
/// one thread per process, while ids are being taken: the coarse clock a
/// generator keeps its window by instead of reading a clock per id
/// (docs/design.md, "No clock read per id").
///
/// The count is even while it runs and odd while it is stopped; it never
/// repeats a value (a `u64` counting 2 per ms lasts 292 million years). A
/// window kept by the tick lasts while the count reads the value it was
/// opened at, so stopping the count closes every such window, and a stopped
/// count opens none.
#[derive(Debug)]
pub struct MsTicks {
    /// Read by every id: on a cache line of its own (with `touched` beside
    /// it, each tick's write to that would evict it from every reader).
    count: CacheLine<AtomicU64>,
    /// Set by [`MsTicks::touch`]; the driving thread clears it every tick and
    /// stops the count once it stayed clear for a while.
    touched: CacheLine<AtomicBool>,
    /// The thread to wake on a touch; `None` for a count moved by hand.
    driver: Option<Thread>,
}

/// A value alone on its cache line (two lines: adjacent-line prefetchers
/// pair them), so writes to its neighbours never evict it.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CacheLine<T>(pub(crate) T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl MsTicks {
    /// A count driven by `driver`, stopped until the first touch.
    pub(crate) fn driven_by(driver: Thread) -> Arc<Self> {
        Arc::new(Self {
            count: CacheLine(AtomicU64::new(1)),
            touched: CacheLine(AtomicBool::new(false)),
            driver: Some(driver),
        })
    }

    /// A running count moved by hand ([`MsTicks::advance`], [`MsTicks::stop`]),
    /// for tests and for clocks that tick themselves.
    pub fn manual() -> Arc<Self> {
        Arc::new(Self {
            count: CacheLine(AtomicU64::new(0)),
            touched: CacheLine(AtomicBool::new(false)),
            driver: None,
        })
    }

    /// The count now: even while running.
    #[inline]
    pub fn read(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// True when a count read as `count` was running.
    #[inline]
    pub fn running(count: u64) -> bool {
        count.is_multiple_of(2)
    }

    /// One millisecond more (the count must be running).
    pub fn advance(&self) {
        self.count.fetch_add(2, Ordering::AcqRel);
    }

    /// Stops the count, which closes every window kept by it.
    pub fn stop(&self) {
        let _ = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Self::running(c).then_some(c + 1)
            });
    }

    /// Starts a stopped count again, at a value it never had.
    pub(crate) fn start(&self) {
        let _ = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (!Self::running(c)).then_some(c + 1)
            });
    }

    /// Says that ids are being taken: keeps the driving thread ticking, or
    /// wakes it. Called on the generator's slow path (about once per ms
    /// while ids are taken), never per id.
    pub(crate) fn touch(&self) {
        if !self.touched.load(Ordering::Relaxed) {
            self.touched.store(true, Ordering::Release);
            if let Some(thread) = &self.driver {
                thread.unpark();
            }
        }
    }

    /// Whether a touch came since the last call (the driving thread's).
    pub(crate) fn take_touch(&self) -> bool {
        self.touched.swap(false, Ordering::AcqRel)
    }
}

/// Wakes waiters once per millisecond.
#[derive(Debug)]
pub(crate) struct Ticker {
    notify: Notify,
    /// Waiters now; the thread parks at 0.
    waiting: AtomicUsize,
    driver: Driver,
    /// The count advanced at every tick, when a thread drives it.
    ticks: Option<Arc<MsTicks>>,
}

#[derive(Debug)]
enum Driver {
    /// The process-wide tick thread.
    Thread(Thread),
    /// Ticked by hand ([`Ticker::tick`]), for tests.
    #[cfg_attr(not(test), allow(dead_code))]
    Manual,
    /// The thread could not be started: waiters yield to the runtime and
    /// try again, as a spin.
    Yield,
}

impl Ticker {
    /// The process-wide ticker; its thread starts on first use.
    pub(crate) fn global() -> Arc<Ticker> {
        static GLOBAL: OnceLock<Arc<Ticker>> = OnceLock::new();
        GLOBAL.get_or_init(Ticker::start).clone()
    }

    fn start() -> Arc<Ticker> {
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Ticker>>();
        let spawned = std::thread::Builder::new()
            .name("snowkeep-ms-tick".into())
            .spawn(move || {
                if let Ok(ticker) = rx.recv() {
                    ticker.run();
                }
            });
        match spawned {
            Ok(handle) => {
                let ticker = Arc::new(Ticker {
                    notify: Notify::new(),
                    waiting: AtomicUsize::new(0),
                    driver: Driver::Thread(handle.thread().clone()),
                    ticks: Some(MsTicks::driven_by(handle.thread().clone())),
                });
                // The thread holds the ticker for the life of the process.
                let _ = tx.send(ticker.clone());
                ticker
            }
            Err(_) => Arc::new(Ticker {
                notify: Notify::new(),
                waiting: AtomicUsize::new(0),
                driver: Driver::Yield,
                ticks: None,
            }),
        }
    }

    /// A ticker that ticks only when [`Ticker::tick`] is called.
    #[cfg(test)]
    pub(crate) fn manual() -> Arc<Ticker> {
        Arc::new(Ticker {
            notify: Notify::new(),
            waiting: AtomicUsize::new(0),
            driver: Driver::Manual,
            ticks: None,
        })
    }

    /// The count this ticker's thread advances, if a thread drives it.
    pub(crate) fn ticks(&self) -> Option<Arc<MsTicks>> {
        self.ticks.clone()
    }

    /// Wakes every waiter now.
    #[cfg(test)]
    pub(crate) fn tick(&self) {
        self.notify.notify_waiters();
    }

    /// Waiters parked on the ticker now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// A registration for the next tick. Make it (and `enable` it) *before*
    /// looking at the sequence, so a tick between the look and the wait is
    /// not lost.
    pub(crate) fn next_tick(&self) -> Pin<Box<Notified<'_>>> {
        let mut notified = Box::pin(self.notify.notified());
        notified.as_mut().enable();
        notified
    }

    /// Waits for the tick `notified` was registered for.
    pub(crate) async fn wait(&self, notified: Pin<Box<Notified<'_>>>) {
        match &self.driver {
            Driver::Yield => tokio::task::yield_now().await,
            Driver::Manual => self.counted(notified).await,
            Driver::Thread(thread) => {
                let wait = self.counted(notified);
                thread.unpark();
                wait.await
            }
        }
    }

    fn counted<'a>(&'a self, notified: Pin<Box<Notified<'a>>>) -> impl Future<Output = ()> + 'a {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let guard = Waiting(&self.waiting);
        async move {
            notified.await;
            drop(guard);
        }
    }

    /// The thread: while anyone waits or ids are being taken, tick just
    /// after each millisecond.
    fn run(&self) {
        // Parked until the first waiter or touch.
        let mut idle = IDLE_TICKS;
        loop {
            let touched = self.ticks.as_ref().is_some_and(|t| t.take_touch());
            idle = if touched { 0 } else { idle.saturating_add(1) };
            if self.waiting.load(Ordering::Acquire) == 0 && idle > IDLE_TICKS {
                if let Some(t) = &self.ticks {
                    t.stop();
                }
                // An unpark (a waiter, a touch) between the checks and here
                // makes park return at once.
                std::thread::park();
                continue;
            }
            if let Some(t) = &self.ticks {
                t.start();
            }
            std::thread::sleep(until_next_ms());
            if let Some(t) = &self.ticks {
                t.advance();
            }
            self.notify.notify_waiters();
        }
    }
}

/// Counts one waiter until dropped (also when the wait is cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Time until just after the next wall-clock millisecond boundary. Wall time
/// is read here for the phase of the tick only, never for a timestamp.
#[allow(clippy::disallowed_methods)]
fn until_next_ms() -> Duration {
    let into_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() % 1_000_000)
        .unwrap_or(0);
    Duration::from_nanos(u64::from(1_000_000 - into_ms)) + AFTER_BOUNDARY
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, SystemClock};

    /// Polls `ticks` every 200 µs until `done` holds for its count, for at
    /// most 5 s; returns the count that satisfied it.
    fn wait_for(ticks: &MsTicks, what: &str, done: impl Fn(u64) -> bool) -> u64 {
        let until = SystemClock.now() + Duration::from_secs(5);
        loop {
            let count = ticks.read();
            if done(count) {
                return count;
            }
            assert!(SystemClock.now() < until, "{what}: count still {count}");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The thread's count is stopped until ids are taken (a touch), then
    /// advances by 2 at each tick, stops again (odd) once nobody touched it
    /// for [`IDLE_TICKS`], and starts at a new value on the next touch.
    #[test]
    fn the_count_runs_while_ids_are_taken_and_stops_when_idle() {
        let ticker = Ticker::start();
        let ticks = ticker.ticks().expect("the tick thread started");
        let first = wait_for(&ticks, "parked at start", |c| !MsTicks::running(c));
        ticks.touch();
        let running = wait_for(&ticks, "started", |c| MsTicks::running(c) && c > first);
        let later = wait_for(&ticks, "advancing", |c| c >= running + 4);
        assert!(MsTicks::running(later));
        // No touch from here: it stops after about IDLE_TICKS ms.
        let stopped = wait_for(&ticks, "stopped when idle", |c| !MsTicks::running(c));
        assert!(stopped > later);
        ticks.touch();
        wait_for(&ticks, "started again", |c| {
            MsTicks::running(c) && c > stopped
        });
    }

    /// A manual count: stop closes (odd), start opens at a value never seen.
    #[test]
    fn a_count_never_repeats_a_value() {
        let ticks = MsTicks::manual();
        assert_eq!(ticks.read(), 0);
        ticks.advance();
        ticks.stop();
        ticks.stop();
        assert_eq!(ticks.read(), 3);
        ticks.start();
        ticks.start();
        assert_eq!(ticks.read(), 4);
    }
}
