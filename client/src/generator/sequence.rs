//! The per-holder sequence state machine: pure, no IO, no waiting. Time comes in
//! as arguments so every rule is unit-tested with exact values.

use std::time::{Duration, Instant};

use super::Grant;
use crate::error::GenerateError;
use crate::layout::{Layout, MachineId, Millis};

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

/// Last stamped timestamp and next sequence for the machine id in use.
#[derive(Debug)]
pub(super) struct SequenceState {
    /// `None` until the first grant is seen.
    cursor: Option<Cursor>,
}

#[derive(Debug, Clone, Copy)]
struct Cursor {
    machine_id: MachineId,
    /// The last timestamp stamped, or the grant floor before any stamp.
    last: Millis,
    /// The next free sequence at `last`; `sequences_per_ms` when used up.
    next_seq: u64,
}

impl SequenceState {
    pub(super) fn new() -> Self {
        Self { cursor: None }
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
        let last = self.cursor_for(grant, layout.sequences_per_ms()).last;
        admit(layout, grant, last, now_unix, now_mono, max_backward_wait)
    }

    /// One step of issuance under `grant` at wall time `now_unix` (Unix ms) and
    /// monotonic time `now_mono`.
    pub(super) fn take(
        &mut self,
        layout: &Layout,
        grant: &Grant,
        now_unix: u64,
        now_mono: Instant,
        want: u64,
        max_backward_wait: Duration,
    ) -> Result<Step, GenerateError> {
        let per_ms = layout.sequences_per_ms();
        let cursor = self.cursor_for(grant, per_ms);
        let admitted = admit(
            layout,
            grant,
            cursor.last,
            now_unix,
            now_mono,
            max_backward_wait,
        );
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
            cursor.next_seq = 0;
        } else if cursor.next_seq >= per_ms {
            return Ok(Step::SequenceExhausted);
        }
        let count = want.min(per_ms - cursor.next_seq);
        debug_assert!(count > 0);
        let first = layout.encode(cursor.last, cursor.machine_id, cursor.next_seq);
        cursor.next_seq += count;
        Ok(Step::Ids(Taken {
            first,
            count,
            timestamp: cursor.last,
            exhausted: cursor.next_seq == per_ms,
        }))
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
/// 3. it is above the floor (the previous holders' fences);
/// 4. it is at or below the fence persisted for this holder;
/// 5. it is at or below the layout's last timestamp;
/// 6. it has not stepped back from `last` further than `max_backward_wait`
///    (a smaller step is [`Admit::Backward`], waited out).
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
    if now <= grant.floor {
        return Err(GenerateError::ClockBehindFloor {
            wait: Duration::from_millis(grant.floor.0 - now.0 + 1),
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
    if now < last {
        let by = Duration::from_millis(last.0 - now.0);
        if by <= max_backward_wait {
            return Ok(Admit::Backward { wait: by });
        }
        return Err(GenerateError::ClockSteppedBack {
            by,
            max: max_backward_wait,
        });
    }
    Ok(Admit::Now(now))
}
