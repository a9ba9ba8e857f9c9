//! Criterion benchmarks of the embedded generator's hot path
//! (`GeneratorSet::next_ids`, which `EmbeddedGenerator::next_id` calls):
//!
//! - `next_id/unsaturated`: one id per call on a clock that moves on every
//!   512 ids, so the sequence never runs out: the cost of the generator alone
//!   (target ≤ 50 ns), beside `next_id/clock_reads_baseline`, the two clock
//!   reads each id needs.
//! - `next_id/saturated`: ids one at a time as fast as the real clock allows,
//!   reported as ids/s; the layout's limit is 2^sequence_bits per ms
//!   (1,024,000 ids/s for 41/12/10).

// criterion_group! defines an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::FutureExt;
use snowkeep_client::{
    Clock, Generator, GeneratorMetrics, GeneratorSet, Grant, Layout, MachineId, Millis,
    SharedClock, SystemClock,
};

const LAYOUT: &str = "41/12/10@1767225600000";

/// A clock that costs what the system clock costs (both reads go to the
/// kernel's clocks) but whose wall time moves on 1 ms every 512 reads, so the
/// sequence never runs out.
#[derive(Debug, Default)]
struct Unsaturated {
    reads: AtomicU64,
}

impl Clock for Unsaturated {
    fn unix_ms(&self) -> u64 {
        black_box(SystemClock.unix_ms());
        1_800_000_000_000 + self.reads.fetch_add(1, Ordering::Relaxed) / 512
    }
    fn now(&self) -> Instant {
        SystemClock.now()
    }
}

fn set(clock: SharedClock, layout: Layout) -> Arc<GeneratorSet> {
    let now = layout
        .to_layout_ms(clock.unix_ms())
        .expect("clock after the layout epoch");
    let grant = Grant {
        machine_id: MachineId(1),
        floor: Millis(now.get() - 1),
        fence: Millis(now.get() + 3_600_000),
        deadline: None,
    };
    let (_tx, rx) = tokio::sync::watch::channel(Some(grant));
    // Keep the sender alive for the whole bench.
    std::mem::forget(_tx);
    GeneratorSet::new(vec![Generator::new(
        layout,
        clock,
        rx,
        Duration::from_millis(100),
        GeneratorMetrics::default(),
    )])
}

fn next_id(c: &mut Criterion) {
    let layout: Layout = LAYOUT.parse().expect("layout");
    let mut group = c.benchmark_group("next_id");

    // The baseline: the two clock reads every id needs (wall time for its
    // timestamp, monotonic time for the lease deadline).
    group.throughput(Throughput::Elements(1));
    group.bench_function("clock_reads_baseline", |b| {
        b.iter(|| black_box((SystemClock.unix_ms(), SystemClock.now())))
    });

    let unsaturated = set(Arc::new(Unsaturated::default()), layout);
    group.throughput(Throughput::Elements(1));
    group.bench_function("unsaturated", |b| {
        b.iter(|| {
            let id = unsaturated
                .next_id()
                .now_or_never()
                .expect("never waits while unsaturated")
                .expect("an id");
            black_box(id)
        })
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let saturated = set(SystemClock::shared(), layout);
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

criterion_group!(benches, next_id);
criterion_main!(benches);
