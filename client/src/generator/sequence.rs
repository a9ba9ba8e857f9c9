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
        if grant.deadline.is_some_and(|d| now_mono >= d) {
            return Err(GenerateError::LeaseExpired);
        }
        let per_ms = layout.sequences_per_ms();
        // A new machine id, or a floor at or above what we stamped (someone —
        // possibly an earlier us — may have stamped up to it): start past it.
        let cursor = match self.cursor {
            Some(c) if c.machine_id == grant.machine_id && c.last > grant.floor => c,
            _ => Cursor {
                machine_id: grant.machine_id,
                last: grant.floor,
                next_seq: per_ms,
            },
        };
        self.cursor = Some(cursor);
        let cursor = self.cursor.as_mut().expect("cursor was just set");

        let now = layout
            .to_layout_ms(now_unix)
            .ok_or(GenerateError::ClockBeforeEpoch)?;
        if now <= grant.floor {
            return Err(GenerateError::ClockBehindFence {
                wait: Duration::from_millis(grant.floor.0 - now.0 + 1),
            });
        }
        if now < cursor.last {
            let by = Duration::from_millis(cursor.last.0 - now.0);
            if by <= max_backward_wait {
                return Ok(Step::ClockBackward { wait: by });
            }
            return Err(GenerateError::ClockSteppedBack {
                by,
                max: max_backward_wait,
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
