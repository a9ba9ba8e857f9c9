//! The one place errors become gRPC statuses (DESIGN §4), by exhaustive match.

use snowkeep_client::GenerateError;
use tonic::{Code, Status};
use tracing::debug;

use crate::config::MAX_BATCH;
use crate::lease::LeaseError;

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
    /// The lease store refused or failed.
    #[error(transparent)]
    Lease(crate::lease::LeaseError),
    /// etcd has not answered since the server started.
    #[error(
        "this server is not connected to etcd yet; retry shortly or on another snowkeep server"
    )]
    StoreNotConnected,
    /// The Lease API was called on a server without etcd.
    #[error("the Lease API needs a server running on etcd (--etcd-endpoints); this one runs the embedded single-instance store")]
    LeaseApiNeedsEtcd,
    /// The client's clock is behind the server's beyond the threshold.
    #[error("client clock is {} behind the server, over the {} threshold: sync this host with NTP (chrony/ntpd), then retry", humantime::format_duration(*skew), humantime::format_duration(*threshold))]
    ClientClockBehind {
        /// Skew (server − client).
        skew: std::time::Duration,
        /// The threshold.
        threshold: std::time::Duration,
    },
    /// A malformed requester identity.
    #[error("invalid requester: {reason}")]
    InvalidRequester {
        /// What is wrong.
        reason: &'static str,
    },
    /// A malformed namespace.
    #[error("invalid namespace {namespace:?}: use 1-64 characters of A-Z a-z 0-9 _ . -")]
    InvalidNamespace {
        /// Given.
        namespace: String,
    },
    /// `Acquire.count` out of range.
    #[error("count must be between 1 and {max}, got {got}")]
    InvalidLeaseCount {
        /// Given.
        got: u32,
        /// Maximum.
        max: u32,
    },
    /// A lease token that is not 64 hex digits.
    #[error(
        "invalid lease_token: send the 64 hex digits that Acquire returned, or leave it empty"
    )]
    InvalidLeaseToken,
    /// A machine id that cannot exist.
    #[error("machine id {got} is out of range (at most 65535)")]
    InvalidMachineId {
        /// Given.
        got: u32,
    },
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
        ApiError::InvalidRequester { .. }
        | ApiError::InvalidNamespace { .. }
        | ApiError::InvalidLeaseCount { .. }
        | ApiError::InvalidLeaseToken
        | ApiError::InvalidMachineId { .. } => Code::InvalidArgument,
        ApiError::ClientClockBehind { .. } | ApiError::LeaseApiNeedsEtcd => {
            Code::FailedPrecondition
        }
        ApiError::StoreNotConnected => Code::Unavailable,
        ApiError::Lease(e) => match e {
            LeaseError::UnknownNamespace { .. } => Code::NotFound,
            LeaseError::NoFreeMachineId { .. } => Code::ResourceExhausted,
            // Not FAILED_PRECONDITION: clients retry that (a skew refusal
            // heals with NTP); another Acquire cannot fix a count mismatch.
            LeaseError::CountMismatch { .. } => Code::AlreadyExists,
            // The caller is who it says, but holds no right to this lease.
            LeaseError::TokenRefused { .. } => Code::PermissionDenied,
            LeaseError::LayoutExhausted { .. } => Code::FailedPrecondition,
            LeaseError::FenceTooFarAhead { .. }
            | LeaseError::LeaseLost { .. }
            | LeaseError::Timeout { .. }
            | LeaseError::Etcd(_)
            | LeaseError::Io { .. } => Code::Unavailable,
            LeaseError::Corrupt { .. }
            | LeaseError::LayoutMismatch { .. }
            | LeaseError::ClockBeforeEpoch { .. }
            | LeaseError::DuplicateInstance { .. }
            | LeaseError::StateLocked { .. } => Code::Internal,
        },
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
                ApiError::Lease(LeaseError::Timeout {
                    op: "x",
                    after: Duration::ZERO,
                }),
                Code::Unavailable,
            ),
            (
                ApiError::Lease(LeaseError::UnknownNamespace {
                    namespace: "x".into(),
                }),
                Code::NotFound,
            ),
            (
                ApiError::Lease(LeaseError::NoFreeMachineId {
                    namespace: "x".into(),
                    capacity: 1,
                    start: 0,
                    end: 1,
                }),
                Code::ResourceExhausted,
            ),
            (
                ApiError::Lease(LeaseError::CountMismatch { held: 1, asked: 2 }),
                Code::AlreadyExists,
            ),
            (
                ApiError::ClientClockBehind {
                    skew: Duration::from_secs(900),
                    threshold: Duration::from_secs(600),
                },
                Code::FailedPrecondition,
            ),
            (ApiError::LeaseApiNeedsEtcd, Code::FailedPrecondition),
            (
                ApiError::Lease(LeaseError::TokenRefused { reason: "x" }),
                Code::PermissionDenied,
            ),
            (ApiError::InvalidLeaseToken, Code::InvalidArgument),
            (ApiError::StoreNotConnected, Code::Unavailable),
            (
                ApiError::InvalidRequester { reason: "x" },
                Code::InvalidArgument,
            ),
            (
                ApiError::InvalidNamespace {
                    namespace: "x".into(),
                },
                Code::InvalidArgument,
            ),
            (
                ApiError::InvalidLeaseCount { got: 0, max: 256 },
                Code::InvalidArgument,
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
    fn a_skew_refusal_names_skew_threshold_and_remedy() {
        let s = Status::from(ApiError::ClientClockBehind {
            skew: Duration::from_secs(900),
            threshold: Duration::from_secs(600),
        });
        assert_eq!(
            s.message(),
            "client clock is 15m behind the server, over the 10m threshold: sync this host with NTP (chrony/ntpd), then retry"
        );
    }

    #[test]
    fn count_error_names_the_allowed_range() {
        let s = Status::from(ApiError::count(0));
        assert_eq!(s.message(), "count must be between 1 and 100000, got 0");
    }
}
