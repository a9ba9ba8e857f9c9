//! The one place errors become gRPC statuses (DESIGN §4), by exhaustive match.

use snowkeep_client::GenerateError;
use tonic::{Code, Status};
use tracing::debug;

use crate::config::MAX_BATCH;

/// Errors a gRPC handler returns.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The generator could not issue.
    #[error(transparent)]
    Generate(#[from] GenerateError),
    /// `NextIds.count` out of range.
    #[error("count must be between 1 and {max}, got {got}")]
    InvalidCount {
        /// Given.
        got: u32,
        /// Maximum.
        max: u32,
    },
    /// `StreamIds.batch_size` out of range.
    #[error("batch_size must be between 1 and {max} (0 means 1000), got {got}")]
    InvalidBatchSize {
        /// Given.
        got: u32,
        /// Maximum.
        max: u32,
    },
    /// The lease store could not be read.
    #[error("the lease store could not be read")]
    Store(#[source] crate::lease::LeaseError),
    /// An id with the sign bit set.
    #[error("id {id} has its top bit set; snowkeep ids are 63-bit")]
    InvalidId {
        /// Given.
        id: u64,
    },
}

impl ApiError {
    /// The count error for `got`.
    pub fn count(got: u32) -> Self {
        ApiError::InvalidCount {
            got,
            max: MAX_BATCH,
        }
    }
}

fn code_of(err: &ApiError) -> Code {
    match err {
        ApiError::InvalidCount { .. }
        | ApiError::InvalidBatchSize { .. }
        | ApiError::InvalidId { .. } => Code::InvalidArgument,
        ApiError::Store(_) => Code::Unavailable,
        ApiError::Generate(g) => match g {
            GenerateError::NoGrant
            | GenerateError::LeaseExpired
            | GenerateError::ClockBehindFence { .. }
            | GenerateError::FenceReached { .. }
            | GenerateError::ClockSteppedBack { .. }
            | GenerateError::ClockBeforeEpoch => Code::Unavailable,
            GenerateError::LayoutExhausted { .. } => Code::FailedPrecondition,
        },
    }
}

impl From<ApiError> for Status {
    fn from(err: ApiError) -> Self {
        let code = code_of(&err);
        let message = match &err {
            ApiError::Generate(g) if code == Code::Unavailable => {
                format!("{g}; retry shortly or on another snowkeep server")
            }
            other => crate::DisplayChain(other).to_string(),
        };
        // Per-request refusals would flood the logs while issuance is stopped;
        // the lease loop logs the cause once, and metrics count the refusals.
        debug!(code = ?code, error = %crate::DisplayChain(&err), "request refused");
        Status::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use snowkeep_client::Millis;

    use super::*;

    #[test]
    fn each_error_maps_to_its_code() {
        let table: Vec<(ApiError, Code)> = vec![
            (ApiError::count(0), Code::InvalidArgument),
            (
                ApiError::InvalidBatchSize { got: 1, max: 1 },
                Code::InvalidArgument,
            ),
            (ApiError::InvalidId { id: 1 << 63 }, Code::InvalidArgument),
            (
                ApiError::Store(crate::lease::LeaseError::Timeout {
                    op: "x",
                    after: Duration::ZERO,
                }),
                Code::Unavailable,
            ),
            (GenerateError::NoGrant.into(), Code::Unavailable),
            (GenerateError::LeaseExpired.into(), Code::Unavailable),
            (
                GenerateError::ClockBehindFence {
                    wait: Duration::ZERO,
                }
                .into(),
                Code::Unavailable,
            ),
            (
                GenerateError::FenceReached { fence: Millis(1) }.into(),
                Code::Unavailable,
            ),
            (
                GenerateError::ClockSteppedBack {
                    by: Duration::ZERO,
                    max: Duration::ZERO,
                }
                .into(),
                Code::Unavailable,
            ),
            (GenerateError::ClockBeforeEpoch.into(), Code::Unavailable),
            (
                GenerateError::LayoutExhausted { max: Millis(1) }.into(),
                Code::FailedPrecondition,
            ),
        ];
        for (err, code) in table {
            assert_eq!(Status::from(err).code(), code);
        }
    }

    #[test]
    fn count_error_names_the_allowed_range() {
        let s = Status::from(ApiError::count(0));
        assert_eq!(s.message(), "count must be between 1 and 100000, got 0");
    }
}
