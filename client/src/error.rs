//! Errors of the client crate.

use std::time::Duration;

use thiserror::Error;

use crate::layout::Millis;

/// Why the generator issued no id. Every variant except
/// [`GenerateError::LayoutExhausted`] is transient: retry later or elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GenerateError {
    /// No valid grant: the lease is not (yet or any more) held, or issuance was
    /// stopped for shutdown.
    #[error("no valid machine-id lease is held")]
    NoGrant,
    /// The grant's local lease deadline has passed (monotonic clock).
    #[error("the machine-id lease passed its local deadline")]
    LeaseExpired,
    /// The clock has not yet passed the previous holder's fence (DESIGN §2.3).
    #[error("clock is behind the previous holder's fence by {wait:?}")]
    ClockBehindFence {
        /// How long until the clock passes the fence.
        wait: Duration,
    },
    /// The clock reached the persisted fence and the fence was not raised in
    /// time (etcd unreachable or slow) (DESIGN §2.1).
    #[error("clock reached the persisted fence {fence} that has not been raised")]
    FenceReached {
        /// The fence, in layout ms.
        fence: Millis,
    },
    /// The wall clock stepped back further than the generator waits out (DESIGN §2.5).
    #[error("clock stepped back by {by:?}, more than the {max:?} that is waited out")]
    ClockSteppedBack {
        /// How far back the clock is from the last stamped timestamp.
        by: Duration,
        /// The largest step that is waited out.
        max: Duration,
    },
    /// The wall clock is earlier than the layout's epoch.
    #[error("clock is before the layout epoch")]
    ClockBeforeEpoch,
    /// The clock is past the last timestamp the layout can carry.
    #[error("clock is past the layout's last timestamp {max}")]
    LayoutExhausted {
        /// The largest timestamp of the layout.
        max: Millis,
    },
}

impl GenerateError {
    /// True when retrying later (or on another server) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            GenerateError::NoGrant
            | GenerateError::LeaseExpired
            | GenerateError::ClockBehindFence { .. }
            | GenerateError::FenceReached { .. }
            | GenerateError::ClockSteppedBack { .. }
            | GenerateError::ClockBeforeEpoch => true,
            GenerateError::LayoutExhausted { .. } => false,
        }
    }
}
