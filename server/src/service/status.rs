//! The one place handlers' errors become gRPC statuses, by exhaustive match:
//! bad arguments are `INVALID_ARGUMENT`; no valid lease, a clock behind the
//! floor or stepped back, and a server shutting down are `UNAVAILABLE`
//! (retryable). Limit refusals take the codes `LimitError::code` gives them
//! beside their variants, so the layers of `crate::limits` need not import
//! this module.

use snowkeep_client::{GenerateError, MachineId};
use tonic::{Code, Status};
use tracing::debug;

use crate::limits::LimitError;
use snowkeep_core::batch::MAX_BATCH;
use snowkeep_core::claim::StoreError;

/// Errors a gRPC handler returns.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The generator could not issue.
    #[error(transparent)]
    Generate(#[from] GenerateError),
    /// `NextIds.count` out of range.
    #[error("count must be between 1 and {max}, got {got}")]
    InvalidCount { got: u32, max: u32 },
    /// `StreamIds.batch_size` out of range.
    #[error("batch_size must be between 1 and {max} (0 means 1000), got {got}")]
    InvalidBatchSize { got: u32, max: u32 },
    /// The store (a claim store, or the Lease API's) refused or failed.
    #[error(transparent)]
    Store(snowkeep_core::claim::StoreError),
    /// etcd has not answered since the server started.
    #[error(
        "this server is not connected to etcd yet; retry shortly or on another snowkeep server"
    )]
    StoreNotConnected,
    /// The Lease API was called on a server without etcd.
    #[error("the Lease API needs a server running on etcd (--etcd-endpoints); this one runs the single-instance store")]
    LeaseApiNeedsEtcd,
    /// The client's clock is off the server's, either way, beyond the threshold.
    #[error("client clock is {} {direction} the server, over the {} threshold: sync this host with NTP (chrony/ntpd), then retry", humantime::format_duration(*skew), humantime::format_duration(*threshold))]
    ClientClockSkew {
        /// How far off (see [`snowkeep_core::lease::skew::magnitude`]).
        skew: std::time::Duration,
        /// Which way.
        direction: snowkeep_core::lease::skew::SkewDirection,
        threshold: std::time::Duration,
    },
    /// A malformed requester identity.
    #[error("invalid requester: {reason}")]
    InvalidRequester {
        /// What is wrong.
        reason: &'static str,
    },
    /// A namespace name that breaks [`snowkeep_core::namespace::NAMESPACE_RULE`].
    #[error("invalid namespace {namespace:?}: a namespace is {rule}", rule = snowkeep_core::namespace::NAMESPACE_RULE)]
    InvalidNamespace { namespace: String },
    /// An Acquire from a client that does not say it honours time units and
    /// short layouts, in a namespace whose layout has either.
    #[error("namespace layout {layout} counts its timestamp in {unit} ms ticks or has fewer than 63 bits, and this client did not set AcquireRequest.supports_layout_shapes: a client from before layouts had units would mint ids a newer holder mints too; upgrade the client (snowkeep-client, or set the field once the client reads Layout.time_unit_ms)")]
    OldClientLayout { layout: String, unit: u64 },
    /// `Acquire.count` out of range.
    #[error("count must be between 1 and {max}, got {got}")]
    InvalidLeaseCount { got: u32, max: u32 },
    /// A lease token that is not 64 hex digits.
    #[error(
        "invalid lease_token: send the 64 hex digits that Acquire returned, or leave it empty"
    )]
    InvalidLeaseToken,
    /// A machine id that cannot exist.
    #[error("machine id {got} is out of range: the namespace's layout has {machine_bits} machine bits, so machine ids are 0 to {max}")]
    InvalidMachineId {
        got: u32,
        /// The largest machine id of the namespace's layout: `2^machine_bits - 1`.
        max: u32,
        /// Machine bits of the namespace's layout.
        machine_bits: u8,
    },
    /// An id above the layout's largest (for 63 bits: the sign bit set).
    #[error(
        "id {id} is above {max}, the largest id of the namespace's layout {layout} ({bits} bits)"
    )]
    InvalidId {
        id: u64,
        /// `2^bits - 1`.
        max: u64,
        /// The layout, as `--layout` reads it.
        layout: String,
        /// The layout's bits in all.
        bits: u8,
    },
    /// A `DecodeIdRequest.text` that is not an id of the layout; the
    /// codec's message names the width, or the character and its position.
    #[error("{0}")]
    InvalidIdText(snowkeep_client::TextIdError),
    /// A `DecodeIdRequest` with both a nonzero `id` and a `text`.
    #[error("send the id either as a number (id) or as text (text), not both: got id {id} and text {text:?}")]
    IdAndText { id: u64, text: String },
    /// A `format` that `snowkeep.v1.IdFormat` does not have.
    #[error("format {got} is not an IdFormat this server knows: use 0 (ID_FORMAT_UNSPECIFIED, numbers only) or 1 (ID_FORMAT_CROCKFORD_BASE32, numbers and texts)")]
    InvalidIdFormat { got: i32 },
    /// A `StreamIds` call ended before it sent `total` ids (or, for an
    /// unbounded stream, ended at all). The message names the ids sent, the
    /// ids asked for and what to do; the code is the cause's.
    #[error("{}", stream_ended_message(*sent, *total, cause))]
    StreamEnded {
        /// Ids sent to the client in whole batches before the end.
        sent: u64,
        /// Ids asked for (`StreamIdsRequest.total`); 0 = unbounded.
        total: u64,
        /// Why the stream ended.
        cause: StreamEnd,
    },
    /// A server limit refused the call, or its message could not be read.
    #[error(transparent)]
    Limit(#[from] LimitError),
}

/// Why a stream ended before its `total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    /// The server is shutting down (SIGTERM or SIGINT, or a lost lease under
    /// `--on-lease-lost exit`).
    Shutdown,
    /// The stream's machine id was lost and the server now holds another; a
    /// stream never changes machine id, since its ids could then not ascend.
    MachineIdChanged {
        /// The machine id the stream drew from.
        from: MachineId,
        /// The machine id the server issues from now.
        to: MachineId,
    },
    /// The generator refused (lease lost, clock stepped back, fence not
    /// raised in time, ...).
    Generate(GenerateError),
}

impl std::fmt::Display for StreamEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamEnd::Shutdown => write!(f, "this server is shutting down"),
            StreamEnd::MachineIdChanged { from, to } => write!(
                f,
                "the lease on machine id {} was lost and this server now issues from machine id {}",
                from.get(),
                to.get()
            ),
            StreamEnd::Generate(g) => write!(f, "{g}"),
        }
    }
}

impl StreamEnd {
    /// True when another server, or this one later, may serve the rest.
    fn is_retryable(&self) -> bool {
        match self {
            StreamEnd::Shutdown | StreamEnd::MachineIdChanged { .. } => true,
            StreamEnd::Generate(g) => g.is_retryable(),
        }
    }
}

/// `"stream ended early: 1000 of 5000 ids sent; <cause>; <remedy>"`, or for an
/// unbounded stream (`total` 0) `"stream ended: 1000 ids sent; ..."`.
fn stream_ended_message(sent: u64, total: u64, cause: &StreamEnd) -> String {
    let ids = |n: u64| if n == 1 { "id" } else { "ids" };
    let head = if total == 0 {
        format!("stream ended: {sent} {} sent; {cause}", ids(sent))
    } else {
        format!(
            "stream ended early: {sent} of {total} {} sent; {cause}",
            ids(total)
        )
    };
    let what = if total == 0 {
        "open a new stream".to_owned()
    } else {
        let rest = total.saturating_sub(sent);
        format!("ask for the remaining {rest} {}", ids(rest))
    };
    match cause {
        StreamEnd::Shutdown => format!("{head}; {what} on another snowkeep server"),
        c if c.is_retryable() => format!(
            "{head}; {what} on another snowkeep server, or on this one once it is ready again"
        ),
        // Not retryable (the layout has no timestamps left): no server of
        // this namespace can issue more.
        _ => head,
    }
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
        | ApiError::InvalidId { .. }
        | ApiError::InvalidIdText(_)
        | ApiError::IdAndText { .. }
        | ApiError::InvalidIdFormat { .. } => Code::InvalidArgument,
        ApiError::InvalidRequester { .. }
        | ApiError::InvalidNamespace { .. }
        | ApiError::InvalidLeaseCount { .. }
        | ApiError::InvalidLeaseToken
        | ApiError::InvalidMachineId { .. } => Code::InvalidArgument,
        ApiError::ClientClockSkew { .. }
        | ApiError::LeaseApiNeedsEtcd
        | ApiError::OldClientLayout { .. } => Code::FailedPrecondition,
        ApiError::StoreNotConnected => Code::Unavailable,
        ApiError::Store(e) => match e {
            StoreError::UnknownNamespace { .. } => Code::NotFound,
            StoreError::InvalidNamespace { .. } => Code::InvalidArgument,
            StoreError::NoFreeMachineId { .. } | StoreError::KeyQuotaExceeded { .. } => {
                Code::ResourceExhausted
            }
            StoreError::KeyQuotaContended { .. } => Code::Unavailable,
            // Concurrency, as etcd's own "try again": the caller repeats.
            StoreError::EvictContended { .. } => Code::Aborted,
            // Not FAILED_PRECONDITION: clients retry that (a skew refusal
            // heals with NTP); another Acquire cannot fix a count mismatch.
            StoreError::CountMismatch { .. } => Code::AlreadyExists,
            // The caller is who it says, but holds no right to this lease.
            StoreError::TokenRefused { .. } => Code::PermissionDenied,
            StoreError::LayoutExhausted { .. } => Code::FailedPrecondition,
            // Until an operator confirms a floor (the message says how);
            // clients retry FAILED_PRECONDITION with backoff.
            StoreError::NamespaceRolledBack { .. } => Code::FailedPrecondition,
            StoreError::NamespaceNotCreated { .. } => Code::NotFound,
            // An operator must choose a floor (the message says how).
            StoreError::NamespaceNeedsFloor { .. } => Code::FailedPrecondition,
            StoreError::NamespaceFloorAhead { .. } => Code::Unavailable,
            // Like the namespace's other refusals: an operator must repair
            // the record (the message names its key and how).
            StoreError::CorruptNamespace { .. } => Code::FailedPrecondition,
            StoreError::AuthModeMismatch { .. } => Code::FailedPrecondition,
            StoreError::BadFloor { .. } | StoreError::MigrationFloorNotSet { .. } => Code::Internal,
            StoreError::FenceTooFarAhead { .. }
            | StoreError::LeaseLost { .. }
            | StoreError::Timeout { .. }
            | StoreError::Request { .. }
            | StoreError::AccessRefused { .. }
            | StoreError::Io { .. } => Code::Unavailable,
            StoreError::Corrupt { .. }
            | StoreError::LayoutMismatch { .. }
            | StoreError::ClockBeforeEpoch { .. }
            | StoreError::DuplicateInstance { .. }
            | StoreError::StateLocked { .. } => Code::Internal,
        },
        // Mapped beside the variants (`crate::limits`), which answer
        // without this file.
        ApiError::Limit(l) => l.code(),
        ApiError::Generate(g) => generate_code(g),
        ApiError::StreamEnded { cause, .. } => match cause {
            StreamEnd::Shutdown | StreamEnd::MachineIdChanged { .. } => Code::Unavailable,
            StreamEnd::Generate(g) => generate_code(g),
        },
    }
}

fn generate_code(g: &GenerateError) -> Code {
    match g {
        GenerateError::NoGrant
        | GenerateError::LeaseExpired
        | GenerateError::ClockBehindFloor { .. }
        | GenerateError::FenceReached { .. }
        | GenerateError::ClockSteppedBack { .. }
        | GenerateError::ClockBeforeEpoch => Code::Unavailable,
        GenerateError::LayoutExhausted { .. } => Code::FailedPrecondition,
    }
}

impl From<ApiError> for Status {
    fn from(err: ApiError) -> Self {
        let code = code_of(&err);
        let message = match &err {
            ApiError::Generate(g) if code == Code::Unavailable => {
                format!("{g}; retry shortly or on another snowkeep server")
            }
            other => snowkeep_core::DisplayChain(other).to_string(),
        };
        // Per-request refusals would flood the logs while issuance is stopped;
        // the claim loop logs the cause once, and metrics count the refusals.
        debug!(code = ?code, error = %snowkeep_core::DisplayChain(&err), "request refused");
        Status::new(code, message)
    }
}

#[cfg(test)]
mod tests;
