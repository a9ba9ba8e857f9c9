//! The id shapes at the generator: coarser time units (ticks), layouts of
//! fewer than 63 bits, and where a new tick's sequence starts. Exact ids,
//! an injected clock, no sleeps.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::tests::ids;
use super::*;
use crate::clock::{Clock, ManualClock};

/// A generator on `layout` whose clock reads `ts` layout ms, under a grant of
/// machine id `machine_id` with `floor` and `fence` (layout ms).
fn generator(
    layout: Layout,
    ts: u64,
    machine_id: u16,
    floor: u64,
    fence: u64,
) -> (Arc<Generator>, Arc<ManualClock>) {
    let clock = ManualClock::new(layout.epoch_unix_ms() + ts);
    let grant = Grant {
        machine_id: MachineId(machine_id),
        floor: Millis(floor),
        fence: Millis(fence),
        deadline: None,
    };
    let (tx, rx) = watch::channel(Some(grant));
    // The sender lives as long as the generator: a closed channel would
    // read as a lost grant.
    std::mem::forget(tx);
    let g = Generator::new(
        layout,
        clock.clone(),
        rx,
        DEFAULT_MAX_BACKWARD_WAIT,
        GeneratorMetrics::default(),
    );
    (g, clock)
}

/// The js53 layout stamps ticks of 10 ms: every ms of a tick stamps the same
/// timestamp field, and the sequence goes on across them.
#[test]
fn a_10ms_layout_stamps_one_timestamp_per_tick() {
    let layout = Layout::js53();
    let at = |tick: u64, seq: u64| (tick << 14) | (5 << 8) | seq;
    let (g, clock) = generator(layout, 1_003, 5, 0, 100_000);
    assert_eq!(ids(g.try_take(2).unwrap()), vec![at(100, 0), at(100, 1)]);
    clock.advance(Duration::from_millis(6)); // 1,009: the same tick
    assert_eq!(ids(g.try_take(1).unwrap()), vec![at(100, 2)]);
    clock.advance(Duration::from_millis(1)); // 1,010: tick 101
    assert_eq!(ids(g.try_take(1).unwrap()), vec![at(101, 3)]);
    assert_eq!(layout.decode(at(101, 3)).unwrap().timestamp, Millis(1_010));
}

/// The safety rule at coarser units: a successor whose floor is its
/// predecessor's fence never stamps a tick the predecessor could stamp, even
/// when the floor falls inside a tick. At fence 1,005 the predecessor may
/// stamp tick 100 (ms 1,000 to 1,009); the successor waits for tick 101.
#[test]
fn a_floor_inside_a_tick_holds_the_successor_to_the_next_tick() {
    let layout = Layout::js53();
    let (before, _) = generator(layout, 1_005, 5, 0, 1_005);
    let last_before = ids(before.try_take(1).unwrap())[0];
    assert_eq!(layout.decode(last_before).unwrap().timestamp, Millis(1_000));
    let (after, clock) = generator(layout, 1_006, 5, 1_005, 100_000);
    assert_eq!(
        after.try_take(1),
        Err(GenerateError::ClockBehindFloor {
            wait: Duration::from_millis(4)
        })
    );
    clock.advance(Duration::from_millis(3)); // 1,009: still tick 100
    assert_eq!(
        after.try_take(1),
        Err(GenerateError::ClockBehindFloor {
            wait: Duration::from_millis(1)
        })
    );
    clock.advance(Duration::from_millis(1)); // 1,010
    let first_after = ids(after.try_take(1).unwrap())[0];
    assert_eq!(first_after, (101 << 14) | (5 << 8));
    assert!(first_after > last_before);
}

/// A fence inside a tick: the holder stamps that tick up to the fence's ms
/// and is refused past it, before the tick ends.
#[test]
fn a_fence_inside_a_tick_stops_the_holder_at_the_fence() {
    let layout = Layout::js53();
    let (g, clock) = generator(layout, 1_005, 5, 0, 1_005);
    assert_eq!(ids(g.try_take(1).unwrap()), vec![(100 << 14) | (5 << 8)]);
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        g.try_take(1),
        Err(GenerateError::FenceReached {
            fence: Millis(1_005)
        })
    );
}

/// A floor kept from an earlier grant can lie inside the clock's tick: a
/// later grant of the same machine id with a lower floor waits for the tick
/// at or above it (no underflow, no "stepped back" by centuries).
#[test]
fn a_kept_floor_inside_the_clocks_tick_is_waited_for() {
    let layout = Layout::js53();
    let epoch = layout.epoch_unix_ms();
    let mono = ManualClock::new(epoch).now();
    let grant = |floor: u64| Grant {
        machine_id: MachineId(1),
        floor: Millis(floor),
        fence: Millis(1_000),
        deadline: None,
    };
    let wait = DEFAULT_MAX_BACKWARD_WAIT;
    let mut state = sequence::SequenceState::new();
    assert_eq!(
        state.take(&layout, &grant(15), epoch + 16, mono, 1, 1, wait),
        Err(GenerateError::ClockBehindFloor {
            wait: Duration::from_millis(4)
        })
    );
    assert_eq!(
        state.take(&layout, &grant(5), epoch + 17, mono, 2, 1, wait),
        Ok(Step::ClockBackward {
            wait: Duration::from_millis(3)
        })
    );
    let step = state.take(&layout, &grant(5), epoch + 20, mono, 3, 1, wait);
    assert_eq!(ids(step.unwrap()), vec![(2 << 14) | (1 << 8)]);
}

/// The last tick of a 32-bit layout in 1 s units is stamped; the ms after
/// it is refused as the end of the layout.
#[test]
fn a_1s_layout_ends_after_its_last_tick() {
    let layout = Layout::new(20, 4, 8, 0)
        .unwrap()
        .with_time_unit(1000)
        .unwrap();
    let last_ms = (1u64 << 20) * 1000 - 1;
    assert_eq!(layout.max_timestamp(), Millis(last_ms));
    let (g, clock) = generator(layout, last_ms, 3, 0, u64::MAX);
    assert_eq!(
        ids(g.try_take(1).unwrap()),
        vec![(((1u64 << 20) - 1) << 12) | (3 << 8)]
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        g.try_take(1),
        Err(GenerateError::LayoutExhausted {
            max: Millis(last_ms)
        })
    );
}

/// Every id of a 53-bit namespace is at most 2^53 - 1 and survives a round
/// trip through a JavaScript number (an IEEE double), up to the layout's
/// last tick.
#[test]
fn js53_ids_survive_a_javascript_number() {
    let layout = Layout::js53();
    let last_ms = layout.max_timestamp().get();
    for ts in [10, 1_000, last_ms - 10, last_ms] {
        let (g, _) = generator(layout, ts, 63, 0, u64::MAX);
        let got = ids(g.try_take(256).unwrap());
        assert_eq!(got.len(), 256);
        for id in got {
            assert!(id < (1 << 53), "{id} above 2^53 - 1");
            assert_eq!(id as f64 as u64, id);
        }
    }
    let (g, _) = generator(layout, last_ms, 63, 0, u64::MAX);
    assert_eq!(
        ids(g.try_take(256).unwrap()).last(),
        Some(&((1u64 << 53) - 1))
    );
}

/// One id per ms: the sequence goes on from where the last ms left off
/// (until half the range), so the low bits spread. 4,096 ids over 4,096 ms
/// on the default layout fall 256 into each of `id % 16`'s 16 values; with a
/// sequence that restarts at 0 every ms they would all be 0.
#[test]
fn one_id_per_ms_spreads_evenly_over_id_mod_16() {
    let (g, clock) = generator(Layout::default(), 1_000, 7, 0, u64::MAX);
    let mut counts = [0u32; 16];
    let mut last = 0;
    for _ in 0..4_096 {
        let id = ids(g.try_take(1).unwrap())[0];
        assert!(id > last, "{id} after {last}");
        last = id;
        counts[(id % 16) as usize] += 1;
        clock.advance(Duration::from_millis(1));
    }
    assert_eq!(counts, [256; 16]);
    let (max, min) = (counts.iter().max().unwrap(), counts.iter().min().unwrap());
    assert!(f64::from(*max) <= 1.5 * f64::from(*min));
}

/// Where a tick's sequence starts: where the last tick left off while that
/// is below half the range, 0 once it reached half, and 0 after a full tick,
/// so a saturated machine id keeps the whole range of every tick.
#[test]
fn a_new_tick_goes_on_below_half_the_range_and_restarts_at_half() {
    let layout = Layout::default();
    let at = |ts: u64, seq: u64| layout.encode(Millis(ts), MachineId(2), seq);
    let (g, clock) = generator(layout, 1_000, 2, 0, u64::MAX);
    assert_eq!(ids(g.try_take(511).unwrap()).last(), Some(&at(1_000, 510)));
    clock.advance(Duration::from_millis(1));
    // Left off at 511, below 512: go on.
    assert_eq!(ids(g.try_take(1).unwrap()), vec![at(1_001, 511)]);
    clock.advance(Duration::from_millis(1));
    // Left off at 512, half the range: restart.
    assert_eq!(ids(g.try_take(1).unwrap()), vec![at(1_002, 0)]);
    // A whole tick used up: the next starts at 0 with all 1,024 sequences.
    let rest = ids(g.try_take(1_023).unwrap());
    assert_eq!(rest.last(), Some(&at(1_002, 1_023)));
    assert_eq!(g.try_take(1), Ok(Step::SequenceExhausted));
    clock.advance(Duration::from_millis(1));
    assert_eq!(ids(g.try_take(1_024).unwrap()).len(), 1_024);
    assert_eq!(sequence::first_sequence(511, 1_024), 511);
    assert_eq!(sequence::first_sequence(512, 1_024), 0);
    assert_eq!(sequence::first_sequence(1_024, 1_024), 0);
}
