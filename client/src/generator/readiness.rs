//! Whether a generator can issue now ([`Generator::is_ready`]), and how long
//! that answer holds by the clocks alone ([`Generator::readiness_holds_for`]),
//! so health can turn at the very moment calls start or stop being refused
//! instead of at its next periodic look.

use std::time::{Duration, Instant};

use super::sequence::{self, Admit};
use super::{Generator, Grant};
use crate::error::GenerateError;

/// `n` milliseconds.
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Generator {
    /// True when a call would issue now: a grant whose deadline has not
    /// passed, a clock inside (floor, fence] and the layout, and no backwards
    /// step beyond what is waited out: the same rule a take follows
    /// (`sequence::admit`). Health and readiness follow this, so they never
    /// say SERVING while every call fails. (It reads the clocks each time:
    /// for under 1 ms after a wall-clock step it may say "not ready" while
    /// calls still get ids at the timestamp read before the step.)
    pub fn is_ready(&self) -> bool {
        let Some(g) = *self.grant.borrow() else {
            return false;
        };
        match self.admitted(&g).0 {
            Ok(_) => true,
            // The fence was reached (a clock jump, the end of an outage):
            // a call gets it raised.
            Err(GenerateError::FenceReached { .. }) => self.raisable(),
            Err(_) => false,
        }
    }

    /// The longest [`Generator::is_ready`]'s answer can stay what it is now
    /// while the grant stays the same: until the clock passes the fence or
    /// the layout's last timestamp (1 ms after it reads the earlier of the
    /// two), until the lease deadline, until the clock passes the floor or
    /// the layout's epoch, or until a backwards step shrinks to what is
    /// waited out, whichever comes first. `None` when only a new grant (or a
    /// change in whether a raise can be asked for) can change it: no grant,
    /// the deadline passed, the fence reached.
    ///
    /// The fence and floor are judged on the wall clock, so a waiter that
    /// sleeps this long on the monotonic clock may wake a little early or
    /// late when the two drift; it then asks again.
    pub fn readiness_holds_for(&self) -> Option<Duration> {
        let g = (*self.grant.borrow())?;
        let (admitted, now_mono) = self.admitted(&g);
        let by_clock = match admitted {
            Ok(_) => {
                // The last millisecond admitted: the fence, or the layout's
                // last timestamp when that comes first.
                let last = g.fence.min(self.layout.max_timestamp());
                let now = self.clock.layout_ms(&self.layout);
                Some(ms(last.0.saturating_add(1).saturating_sub(now.0)))
            }
            Err(GenerateError::ClockBehindFloor { wait }) => Some(wait),
            // Steps are whole ms: the first one waited out is `max` in whole ms.
            Err(GenerateError::ClockSteppedBack { by, max }) => {
                let waited = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
                Some(by.saturating_sub(ms(waited)))
            }
            Err(GenerateError::ClockBeforeEpoch) => Some(ms(self
                .layout
                .epoch_unix_ms()
                .saturating_sub(self.clock.unix_ms()))),
            Err(_) => None,
        };
        let to_deadline = g.deadline.map(|d| d.saturating_duration_since(now_mono));
        [by_clock, to_deadline]
            .into_iter()
            .flatten()
            .filter(|d| !d.is_zero())
            .min()
    }

    /// `sequence::admit` for `g` at the clocks' readings now, with the
    /// monotonic reading it used.
    fn admitted(&self, g: &Grant) -> (Result<Admit, GenerateError>, Instant) {
        let (now_unix, now_mono) = (self.clock.unix_ms(), self.clock.now());
        let admitted = match self.state.try_lock() {
            Ok(state) => {
                state
                    .sequence
                    .admit(&self.layout, g, now_unix, now_mono, self.max_backward_wait)
            }
            // A busy lock means someone is issuing right now: judge the
            // grant and the clock alone.
            Err(_) => sequence::admit(
                &self.layout,
                g,
                g.floor,
                now_unix,
                now_mono,
                self.max_backward_wait,
            ),
        };
        (admitted, now_mono)
    }

    /// True when a raise asked for now would be acted on.
    pub(super) fn raisable(&self) -> bool {
        self.demand.as_ref().is_some_and(|d| d.raisable())
    }
}
