//! The per-holder sequence state machine: pure, no IO, no waiting. Time comes in
//! as arguments so every rule is unit-tested with exact values.

use std::time::{Duration, Instant};

use super::Grant;
use crate::clock::nanos;
use crate::error::GenerateError;
use crate::layout::{Layout, MachineId, Millis};
use crate::ticker::MsTicks;

/// A run of `count` consecutive ids starting at `first`, all stamped with
/// `timestamp` (consecutive sequences of one ms are consecutive integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The first id of the run.
    pub first: u64,
    /// How many ids, at least 1.
    pub count: u64,
    /// The timestamp they carry (layout ms).
    pub timestamp: Millis,
    /// True when this run took the last sequence of its millisecond.
    pub exhausted: bool,
}

/// The outcome of one step of issuance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Ids were taken.
    Ids(Taken),
    /// This millisecond's sequence is used up; try again in the next ms.
    SequenceExhausted,
    /// The clock stepped back by at most the tolerated step; wait this long.
    ClockBackward {
        /// How long until the clock is back at the last stamped timestamp.
        wait: Duration,
    },
}

/// How long one wall-clock reading is stamped from, by the monotonic clock:
/// 1 ms. Within it, ids go on at the timestamp that reading admitted, and
/// the wall clock is not read again (see [`SequenceState::take_again`]).
pub(super) const WALL_READING_LASTS: Duration = Duration::from_millis(1);

/// Last stamped timestamp and next sequence for the machine id in use.
#[derive(Debug)]
pub(super) struct SequenceState {
    /// `None` until the first grant is seen.
    cursor: Option<Cursor>,
    /// While `Some`, the cursor's timestamp was admitted by a wall-clock
    /// reading under the grant still in force (the caller checks that), and
    /// ids may be taken at it again without reading the wall clock.
    window: Option<Window>,
    /// The last exact reading and the cheap one taken just before it:
    /// `(Clock::monotonic_ns, Clock::now)`.
    last_reading: Option<(u64, Instant)>,
}

/// The span, on the cheap monotonic clock (`Clock::monotonic_ns`), in
/// which a wall-clock reading serves.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// The last cheap reading served: the one taken before the wall reading,
    /// then each id's. An id is served only at a reading above it, so a
    /// cheap clock that stops or goes back closes the window at once.
    last: u64,
    /// The reading serves below this: at most [`WALL_READING_LASTS`] after
    /// the cheap reading taken before it, and at most half the time that
    /// was left to the grant's deadline.
    until: u64,
    /// The id of sequence 0 at the cursor's timestamp.
    base: u64,
    /// `Some(count)`: the window is kept by the millisecond tick instead of
    /// `last` and `until`: it lasts while the tick reads `count`.
    tick: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Cursor {
    machine_id: MachineId,
    /// The last timestamp stamped, or the grant floor before any stamp.
    last: Millis,
    /// The next free sequence at `last`; `sequences_per_tick` when used up.
    next_seq: u64,
}

impl SequenceState {
    pub(super) fn new() -> Self {
        Self {
            cursor: None,
            window: None,
            last_reading: None,
        }
    }

    /// Ends the window of the last wall-clock reading: the next step reads
    /// the wall clock. The caller calls this whenever the grant changed.
    pub(super) fn close_window(&mut self) {
        self.window = None;
    }

    /// Takes up to `want` ids at the last stamped timestamp without reading
    /// the wall clock or `Clock::now`: only inside the window of the wall
    /// reading that admitted that timestamp, and while the millisecond has
    /// sequence left (`per_ms` sequences). The window is the tick's when it
    /// was [kept by the tick](Self::keep_by_tick): open while `tick` (the
    /// count now) is the count it was opened at, and `cheap` is not read.
    /// Otherwise `cheap()` (`Clock::monotonic_ns`) must read above the last
    /// cheap reading served and below the window's end. `None` means "read
    /// the clocks and [`SequenceState::take`]".
    ///
    /// The caller must have checked that the grant is the one the window was
    /// opened under (and [`close_window`](Self::close_window) otherwise). The
    /// timestamp was then admitted under this very grant: it is above the
    /// floor, at or below the fence and the layout's last timestamp, and not
    /// behind the last stamp, so stamping it again keeps every rule of
    /// [`admit`]. The deadline, the one rule that moves with time, is kept
    /// by the window's end: on the cheap clock it closes before half the
    /// time left to the deadline has passed; a window kept by the tick was
    /// opened at least 2 ms before the deadline and closes at the next
    /// millisecond boundary, as long as the tick thread runs
    /// (docs/design.md, "No clock read per id", for when it does not).
    #[inline]
    pub(super) fn take_again(
        &mut self,
        tick: Option<u64>,
        cheap: impl FnOnce() -> u64,
        want: u64,
        per_ms: u64,
    ) -> Option<Taken> {
        let window = self.window.as_mut()?;
        match window.tick {
            Some(_) => return self.take_in_tick(tick?, want, per_ms),
            None => {
                let now_ns = cheap();
                if now_ns <= window.last || now_ns >= window.until {
                    return None;
                }
                window.last = now_ns;
            }
        }
        let base = window.base;
        self.take_in_window(base, want, per_ms)
    }

    /// [`SequenceState::take_again`] for a window kept by the tick, which
    /// reads `tick` now: `None` when there is no such window, or it was
    /// opened at another count.
    #[inline]
    pub(super) fn take_in_tick(&mut self, tick: u64, want: u64, per_ms: u64) -> Option<Taken> {
        let window = self.window.as_ref()?;
        if window.tick != Some(tick) {
            return None;
        }
        let base = window.base;
        self.take_in_window(base, want, per_ms)
    }

    /// Up to `want` ids at the cursor's timestamp, whose sequence 0 is id
    /// `base`, while the millisecond has sequence left (`per_ms`): the
    /// part every open window shares.
    #[inline]
    fn take_in_window(&mut self, base: u64, want: u64, per_ms: u64) -> Option<Taken> {
        let cursor = self.cursor.as_mut()?;
        if cursor.next_seq >= per_ms {
            return None;
        }
        let count = want.min(per_ms - cursor.next_seq);
        let first = base + cursor.next_seq;
        cursor.next_seq += count;
        Some(Taken {
            first,
            count,
            timestamp: cursor.last,
            exhausted: cursor.next_seq == per_ms,
        })
    }

    /// Lets the window the last step opened be kept by the millisecond tick
    /// read as `tick` before that step's clock readings: only a window of
    /// the full [`WALL_READING_LASTS`] (at least 2 ms left to the deadline)
    /// and only while the tick runs ([`MsTicks::running`]).
    pub(super) fn keep_by_tick(&mut self, tick: u64) {
        if let Some(w) = &mut self.window {
            if MsTicks::running(tick) && w.until.saturating_sub(w.last) >= nanos(WALL_READING_LASTS)
            {
                w.tick = Some(tick);
            }
        }
    }

    /// Records an exact reading `now_mono` and the cheap one `now_ns` taken
    /// just before it, and says how long (ns on the cheap clock) a wall
    /// reading taken now may serve under `grant`: `None` when the cheap
    /// clock cannot be trusted now, because since the last exact reading it
    /// went back or kept less than half the pace of the exact clock. (The
    /// first reading has nothing to compare with and is trusted; a cheap
    /// clock that stops inside its window still closes it at the next id.)
    fn window_span(&mut self, grant: &Grant, now_ns: u64, now_mono: Instant) -> Option<u64> {
        let trusted = match self.last_reading.replace((now_ns, now_mono)) {
            None => true,
            Some((ns, mono)) => {
                now_ns >= ns && now_ns - ns >= nanos(now_mono.saturating_duration_since(mono)) / 2
            }
        };
        if !trusted {
            return None;
        }
        let span = nanos(WALL_READING_LASTS);
        Some(match grant.deadline {
            None => span,
            Some(d) => span.min(nanos(d.saturating_duration_since(now_mono)) / 2),
        })
    }

    /// The machine id in use and its last stamped timestamp (or its floor).
    pub(super) fn last(&self) -> Option<(MachineId, Millis)> {
        self.cursor.map(|c| (c.machine_id, c.last))
    }

    /// The cursor a step under `grant` starts from: ours, or, for a new
    /// machine id or a floor at or above what we stamped (someone — possibly
    /// an earlier us — may have stamped up to it), a fresh one past the floor.
    fn cursor_for(&self, grant: &Grant, per_ms: u64) -> Cursor {
        match self.cursor {
            Some(c) if c.machine_id == grant.machine_id && c.last > grant.floor => c,
            _ => Cursor {
                machine_id: grant.machine_id,
                last: grant.floor,
                next_seq: per_ms,
            },
        }
    }

    /// What [`admit`] says for a step under `grant` now, without changing the
    /// state: readiness asks this, [`SequenceState::take`] acts on it.
    pub(super) fn admit(
        &self,
        layout: &Layout,
        grant: &Grant,
        now_unix: u64,
        now_mono: Instant,
        max_backward_wait: Duration,
    ) -> Result<Admit, GenerateError> {
        let last = self.cursor_for(grant, layout.sequences_per_tick()).last;
        admit(layout, grant, last, now_unix, now_mono, max_backward_wait)
    }

    /// One step of issuance under `grant` at wall time `now_unix` (Unix ms),
    /// monotonic time `now_mono` and cheap monotonic time `now_ns`
    /// (`Clock::monotonic_ns`, read before the other two). A step that issues
    /// opens the window in which [`SequenceState::take_again`] goes on
    /// without reading the clocks.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn take(
        &mut self,
        layout: &Layout,
        grant: &Grant,
        now_unix: u64,
        now_mono: Instant,
        now_ns: u64,
        want: u64,
        max_backward_wait: Duration,
    ) -> Result<Step, GenerateError> {
        let span = self.window_span(grant, now_ns, now_mono);
        let per_ms = layout.sequences_per_tick();
        let cursor = self.cursor_for(grant, per_ms);
        let admitted = admit(
            layout,
            grant,
            cursor.last,
            now_unix,
            now_mono,
            max_backward_wait,
        );
        // Whatever this step finds, the last reading's window is over: it is
        // opened again only below, by a reading that admits a stamp.
        self.window = None;
        // An expired grant leaves the state as it was; any other step moves
        // to the grant's cursor, so drain reports the machine id now held.
        if admitted == Err(GenerateError::LeaseExpired) {
            return Err(GenerateError::LeaseExpired);
        }
        self.cursor = Some(cursor);
        let cursor = self.cursor.as_mut().expect("cursor was just set");
        let now = match admitted? {
            Admit::Now(now) => now,
            Admit::Backward { wait } => return Ok(Step::ClockBackward { wait }),
        };
        if now > cursor.last {
            cursor.last = now;
            cursor.next_seq = first_sequence(cursor.next_seq, per_ms);
        } else if cursor.next_seq >= per_ms {
            return Ok(Step::SequenceExhausted);
        }
        self.window = span.map(|span| Window {
            last: now_ns,
            until: now_ns.saturating_add(span),
            base: layout.encode(cursor.last, cursor.machine_id, 0),
            tick: None,
        });
        Ok(Step::Ids(cursor.issue(layout, want, per_ms)))
    }
}

impl Cursor {
    /// Issues up to `want` ids at `last` from `next_seq`, at least one (the
    /// caller checked that the millisecond has sequence left).
    fn issue(&mut self, layout: &Layout, want: u64, per_ms: u64) -> Taken {
        let count = want.min(per_ms - self.next_seq);
        debug_assert!(count > 0);
        let first = layout.encode(self.last, self.machine_id, self.next_seq);
        self.next_seq += count;
        Taken {
            first,
            count,
            timestamp: self.last,
            exhausted: self.next_seq == per_ms,
        }
    }
}

/// The sequence a new tick starts at, given where the last tick left off
/// (`left_off`, its next free sequence; `per_tick` when used up or when
/// nothing was stamped yet): `left_off` while it is below half the range,
/// else 0.
///
/// Why: restarting at 0 in every tick makes the low bits of ids taken at low
/// traffic all 0 (at one id per ms, `id % 16` is always 0 and a table
/// sharded by `id % 16` fills one shard). Going on from where the last tick
/// left off spreads them over the whole range. Resetting once the last tick
/// passed half the range (CosId's `sequenceResetThreshold` rule) keeps at
/// least half of a tick's sequences usable when traffic rises, and a
/// saturated machine id (every tick used up) starts each tick at 0, so it
/// still reaches the layout's limit. Ids stay strictly ascending: a later
/// tick is a larger timestamp field, whatever its first sequence.
pub(super) fn first_sequence(left_off: u64, per_tick: u64) -> u64 {
    if left_off < per_tick / 2 {
        left_off
    } else {
        0
    }
}

/// What the clock allows under a grant, before any sequence is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// Stamp at `now` (layout ms), at or after the last stamped timestamp.
    Now(Millis),
    /// The clock is behind the last stamped timestamp by at most the step
    /// that is waited out: wait this long, then ask again.
    Backward {
        /// How long until the clock is back at the last stamped timestamp.
        wait: Duration,
    },
}

/// The one rule for whether a holder may stamp now: both issuance
/// ([`SequenceState::take`]) and readiness (`Generator::is_ready`) follow it,
/// so health never says SERVING while every call fails. `last` is the last
/// timestamp stamped under `grant`'s machine id, or its floor before any
/// stamp (layout ms); `now_unix` is Unix ms, `now_mono` the monotonic clock.
/// In order:
///
/// 1. the monotonic clock is before the grant's deadline, if any;
/// 2. the wall clock is at or after the layout's epoch;
/// 3. the first ms of its tick ([`Layout::tick_start`], the ms itself at
///    1 ms units) is above the floor (the previous holders' fences), so a
///    tick the previous holder could stamp is never stamped again;
/// 4. it is at or below the fence persisted for this holder;
/// 5. it is at or below the layout's last timestamp;
/// 6. its tick has not stepped back from `last` further than
///    `max_backward_wait` (a smaller step is [`Admit::Backward`], waited out).
///
/// What it admits is the tick's first ms: every reading within one tick
/// stamps the same value.
///
/// The fence comes before the backwards step: a clock past the fence is
/// refused at once, not after waiting out a step.
pub(super) fn admit(
    layout: &Layout,
    grant: &Grant,
    last: Millis,
    now_unix: u64,
    now_mono: Instant,
    max_backward_wait: Duration,
) -> Result<Admit, GenerateError> {
    if grant.deadline.is_some_and(|d| now_mono >= d) {
        return Err(GenerateError::LeaseExpired);
    }
    let now = layout
        .to_layout_ms(now_unix)
        .ok_or(GenerateError::ClockBeforeEpoch)?;
    let stamp = layout.tick_start(now);
    if stamp <= grant.floor {
        let above = layout.first_stamp_after(grant.floor);
        return Err(GenerateError::ClockBehindFloor {
            wait: Duration::from_millis(above.0 - now.0),
        });
    }
    if now > grant.fence {
        return Err(GenerateError::FenceReached { fence: grant.fence });
    }
    if now > layout.max_timestamp() {
        return Err(GenerateError::LayoutExhausted {
            max: layout.max_timestamp(),
        });
    }
    if stamp < last {
        // `last` is a stamp (a tick's first ms) or a floor kept from an
        // earlier grant, which may lie inside `now`'s tick: the clock is back
        // once a tick starts at or above it.
        let unit = layout.time_unit_ms();
        let back = last.0.div_ceil(unit).saturating_mul(unit);
        let by = Duration::from_millis(back.saturating_sub(now.0));
        if by <= max_backward_wait {
            return Ok(Admit::Backward { wait: by });
        }
        return Err(GenerateError::ClockSteppedBack {
            by,
            max: max_backward_wait,
        });
    }
    Ok(Admit::Now(stamp))
}
