//! Criterion benchmarks of the embedded generator's hot path
//! (`GeneratorSet::next_id`, which `EmbeddedGenerator::next_id` calls), on
//! the system clock:
//!
//! - `next_id/snowkeep`: one id per call on layout 40/1/22 (22 sequence
//!   bits: 4,194,304 ids per ms, which no single caller reaches, so the
//!   sequence never runs out), with every per-id check of the generator: the
//!   grant, its deadline (a grant with a deadline, one hour away) and the
//!   fence. The future is polled once in place, as `.await` polls it.
//! - `next_id/snowkeep_now_or_never`: the same through
//!   `FutureExt::now_or_never`, which takes the future by value (a copy of
//!   it per call) and hands the `Result` back through memory: the shape of
//!   this bench before, kept to show what that costs.
//! - Beside them, in the same run and on the same bit layout:
//!   - `next_id/ferroid_lock` and `next_id/ferroid_atomic`: ferroid's
//!     thread-safe `LockSnowflakeGenerator` and `AtomicSnowflakeGenerator`
//!     on its `MonotonicClock` (a thread that stores the time in an atomic
//!     every ms, so they read no clock per id, and have no lease or fence);
//!   - `next_id/clock_read_baseline`: the one clock read each of our ids
//!     needs, `Clock::monotonic_ns` (the TSC through quanta);
//!   - `next_id/wall_and_exact_reads`: the wall clock and `Instant::now`,
//!     which each id read before and now only about one id per ms reads.
//! - `next_id/saturated`: ids one at a time as fast as the real clock
//!   allows on the default layout 41/12/10, reported as ids/s; the layout's
//!   limit is 2^sequence_bits per ms (1,024,000 ids/s).
//! - `next_id/snowkeep_pinned` and `next_id/snowkeep_by_key`: the pinned
//!   and by-key spreads (`GeneratorSet::pin`, `GeneratorSet::next_id_for`)
//!   of the unsaturated row, on a set of two machine ids.
//! - `spread/<spread>/<T>`: T threads over T machine ids on the default
//!   layout and the real clock, each thread taking ids one at a time by
//!   round robin, by thread or pinned to its own machine id; ids/s over
//!   all threads, against T × 1,024,000.

// criterion_group! and define_snowflake_id! define undocumented items.
#![allow(missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferroid::define_snowflake_id;
use ferroid::generator::{AtomicSnowflakeGenerator, LockSnowflakeGenerator, Poll};
use ferroid::time::MonotonicClock;
use futures_util::FutureExt;
use snowkeep_client::{
    Clock, Generator, GeneratorMetrics, GeneratorSet, Grant, Layout, MachineId, Millis,
    SharedClock, SystemClock,
};

/// A layout whose sequence never runs out at one caller's rate.
const WIDE: &str = "40/1/22@1767225600000";
/// The default layout.
const DEFAULT: &str = "41/12/10@1767225600000";

define_snowflake_id!(
    /// ferroid's id on the same bits as [`WIDE`]: 40 timestamp, 1 machine,
    /// 22 sequence bits.
    Wide, u64,
    reserved: 1,
    timestamp: 40,
    machine_id: 1,
    sequence: 22
);

/// A generator set of one machine id whose grant is good for an hour: a
/// fence an hour ahead and, when `deadline`, a lease deadline an hour away.
fn set(clock: SharedClock, layout: Layout, deadline: bool) -> Arc<GeneratorSet> {
    set_of(1, clock, layout, deadline)
}

/// [`set`] with machine ids 0 to `n - 1` (the layout's machine bits allowing).
fn set_of(n: u16, clock: SharedClock, layout: Layout, deadline: bool) -> Arc<GeneratorSet> {
    let now = layout
        .to_layout_ms(clock.unix_ms())
        .expect("clock after the layout epoch");
    let generators = (0..n)
        .map(|m| {
            let grant = Grant {
                machine_id: MachineId(m),
                floor: Millis(now.get() - 1),
                fence: Millis(now.get() + 3_600_000),
                deadline: deadline.then(|| clock.now() + Duration::from_secs(3600)),
            };
            let (tx, rx) = tokio::sync::watch::channel(Some(grant));
            // Keep the sender alive for the whole bench, as a lease source does.
            std::mem::forget(tx);
            Generator::new(
                layout,
                clock.clone(),
                rx,
                Duration::from_millis(100),
                GeneratorMetrics::default(),
            )
        })
        .collect();
    GeneratorSet::new(generators)
}

/// Polls `next` once in place, as `.await` in a caller polls it. Inlined,
/// so the future is built where it is polled, as in a caller's async fn:
/// out of line, the future is written to memory and read back at once, a
/// store-forwarding stall of about 20 ns on the AMD EPYC of
/// docs/benchmarks.md that no caller pays.
#[inline(always)]
fn poll_once(next: impl Future<Output = Result<u64, snowkeep_client::GenerateError>>) -> u64 {
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::pin!(next).poll(&mut cx) {
        std::task::Poll::Ready(id) => id.expect("an id"),
        std::task::Poll::Pending => panic!("waited while the sequence lasts"),
    }
}

fn next_id(c: &mut Criterion) {
    let mut group = c.benchmark_group("next_id");
    group.throughput(Throughput::Elements(1));

    // Side by side, one id per iteration, on the 40/1/22 bits.
    group.bench_function("clock_read_baseline", |b| {
        b.iter(|| black_box(SystemClock.monotonic_ns()))
    });
    group.bench_function("wall_and_exact_reads", |b| {
        b.iter(|| black_box((SystemClock.unix_ms(), SystemClock.now())))
    });
    let ours = set(SystemClock::shared(), WIDE.parse().expect("layout"), true);
    group.bench_function("snowkeep", |b| {
        b.iter(|| black_box(poll_once(ours.next_id())))
    });
    let two = set_of(
        2,
        SystemClock::shared(),
        WIDE.parse().expect("layout"),
        true,
    );
    let mut pinned = two.pin(1);
    group.bench_function("snowkeep_pinned", |b| {
        b.iter(|| black_box(poll_once(pinned.next_id())))
    });
    group.bench_function("snowkeep_by_key", |b| {
        b.iter(|| black_box(poll_once(two.next_id_for(1))))
    });
    group.bench_function("snowkeep_now_or_never", |b| {
        b.iter(|| {
            let id = ours
                .next_id()
                .now_or_never()
                .expect("never waits while the sequence lasts")
                .expect("an id");
            black_box(id)
        })
    });
    let lock: LockSnowflakeGenerator<Wide, _> =
        LockSnowflakeGenerator::new(1, MonotonicClock::default());
    group.bench_function("ferroid_lock", |b| {
        b.iter(|| loop {
            match lock.try_poll_id().expect("lock not poisoned") {
                Poll::Ready { id } => break black_box(id),
                Poll::Pending { .. } => std::thread::yield_now(),
            }
        })
    });
    let atomic: AtomicSnowflakeGenerator<Wide, _> =
        AtomicSnowflakeGenerator::new(1, MonotonicClock::default());
    group.bench_function("ferroid_atomic", |b| {
        b.iter(|| loop {
            match atomic.poll_id() {
                Poll::Ready { id } => break black_box(id),
                Poll::Pending { .. } => std::thread::yield_now(),
            }
        })
    });

    // The layout's limit on the default layout, on the real clock.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let saturated = set(
        SystemClock::shared(),
        DEFAULT.parse().expect("layout"),
        false,
    );
    const BATCH: u64 = 100_000;
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("saturated", |b| {
        b.to_async(&runtime).iter(|| {
            let saturated = saturated.clone();
            async move {
                for _ in 0..BATCH {
                    black_box(saturated.next_id().await.expect("an id"));
                }
            }
        })
    });
    group.finish();
}

/// Ids taken one at a time by one thread of `threads`, by `spread`, from
/// `set`, on the thread's own current-thread runtime.
fn take(set: &GeneratorSet, spread: &str, thread: usize, count: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let mut pinned = set.pin(thread);
    runtime.block_on(async {
        for _ in 0..count {
            let id = match spread {
                "round_robin" => set.next_id().await,
                "by_thread" => set.next_id_by_thread().await,
                _ => pinned.next_id().await,
            };
            black_box(id.expect("an id"));
        }
    });
}

/// T threads over T machine ids, by each spread, at the layout's limit.
fn spreads(c: &mut Criterion) {
    const PER_THREAD: u64 = 50_000;
    let mut group = c.benchmark_group("spread");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(4));
    for threads in [1u16, 2] {
        let set = set_of(
            threads,
            SystemClock::shared(),
            DEFAULT.parse().expect("layout"),
            false,
        );
        group.throughput(Throughput::Elements(PER_THREAD * u64::from(threads)));
        for spread in ["round_robin", "by_thread", "pinned"] {
            group.bench_function(format!("{spread}/{threads}"), |b| {
                b.iter(|| {
                    std::thread::scope(|scope| {
                        for t in 0..usize::from(threads) {
                            let set = &set;
                            scope.spawn(move || take(set, spread, t, PER_THREAD));
                        }
                    })
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, next_id, spreads);
criterion_main!(benches);
