//! Errors of the client crate.

use std::time::Duration;

use thiserror::Error;

use crate::layout::{LayoutError, Millis};

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
    /// The clock has not yet passed the grant's floor, the fences of the
    /// machine id's previous holders (design.md, fence protocol rule 3).
    #[error("clock is behind the machine id's floor (its previous holders' fences) by {wait:?}")]
    ClockBehindFloor {
        /// How long until the clock passes the floor.
        wait: Duration,
    },
    /// The clock reached the persisted fence and the fence was not raised in
    /// time (etcd unreachable or slow) (design.md, fence protocol rule 1).
    #[error("clock reached the persisted fence {fence} that has not been raised")]
    FenceReached {
        /// The fence, in layout ms.
        fence: Millis,
    },
    /// The wall clock stepped back further than the generator waits out (design.md, fence protocol rule 5).
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
            | GenerateError::ClockBehindFloor { .. }
            | GenerateError::FenceReached { .. }
            | GenerateError::ClockSteppedBack { .. }
            | GenerateError::ClockBeforeEpoch => true,
            GenerateError::LayoutExhausted { .. } => false,
        }
    }
}

/// Why a client call or an embedded generator failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// A parameter refused before any call (a count outside 1 to 100000,
    /// an id above the layout's largest).
    #[error("invalid {parameter}: {detail}")]
    InvalidArgument {
        /// The parameter's name, as the contract names it (`count`,
        /// `batch_size`, `id`).
        parameter: &'static str,
        /// What is wrong, with the value.
        detail: String,
    },
    /// [`crate::IdPool::next_id`] after [`crate::IdPool::close`].
    #[error("the id pool is closed")]
    PoolClosed,
    /// An endpoint URL could not be used.
    #[error("invalid endpoints: {endpoint:?} is not host:port, http://host:port or https://host:port (a port of 1 to 65535)")]
    InvalidEndpoint {
        /// The endpoint as given, which does not parse as a URI.
        endpoint: String,
    },
    /// TLS settings that cannot be used (a file that cannot be read).
    #[error("TLS settings cannot be used: {detail}")]
    Tls {
        /// What is wrong.
        detail: String,
    },
    /// No server address to call.
    #[error("invalid endpoints: the list is empty; give at least one snowkeep server")]
    NoServers,
    /// A DNS name did not resolve.
    #[error("cannot resolve {name}")]
    Resolve {
        /// The DNS name that was looked up.
        name: String,
        /// The resolver's error.
        #[source]
        source: std::io::Error,
    },
    /// The server answered with an error status.
    #[error("server answered {}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    /// A grant's layout is invalid.
    #[error("the server granted an invalid layout")]
    BadLayout(#[source] LayoutError),
    /// A granted machine id does not fit the layout's machine bits.
    #[error("the server granted machine id {machine_id}, outside {machine_bits} machine bits")]
    MachineIdOutOfRange {
        /// The machine id in the grant.
        machine_id: u32,
        /// Bits the granted layout gives machine ids.
        machine_bits: u8,
    },
    /// The grant was already expired when it arrived.
    #[error("the grant was already expired by the local clock")]
    GrantExpired,
    /// The grant has a different number of machine ids than asked for.
    #[error("asked for {asked} machine ids, the server granted {granted}")]
    GrantCount {
        /// Machine ids the Acquire asked for.
        asked: u32,
        /// Machine ids the grant carried.
        granted: usize,
    },
    /// The grant lists one machine id more than once: two slots would stamp
    /// the same ids.
    #[error("the server granted machine id {machine_id} more than once")]
    GrantDuplicate {
        /// The machine id listed twice.
        machine_id: u32,
    },
    /// The local clock is further behind the granted floor (the previous
    /// holders' fences, near the server's clock) than a start waits; the
    /// machine ids were released.
    #[error("the local clock is {wait:?} behind the granted machine ids' floor, more than the {max:?} a start waits: sync this host with NTP (or raise EmbeddedConfig::max_floor_wait); the machine ids were released")]
    ClockBehindFloor {
        /// How long until the clock would pass the floor.
        wait: Duration,
        /// The longest wait: `EmbeddedConfig::max_floor_wait`, or the time
        /// left on the lease when that is shorter.
        max: Duration,
    },
    /// The local clock is already past a granted fence (the lease's end by the
    /// server's clock, plus a margin): this host's clock is ahead of the
    /// server's by more than the lease covers, so no id could be stamped.
    /// The machine ids were released.
    #[error("the local clock is {past:?} past the granted fence, so no id could be stamped: this host's clock is ahead of the server's by more than the lease covers; sync it with NTP; the machine ids were released")]
    ClockPastFence {
        /// How far past the earliest granted fence the local clock is.
        past: Duration,
    },
    /// No id arrived in time (every server failing, or none reachable).
    #[error("no id within {waited:?}; last error: {last_error}")]
    PoolEmpty {
        /// How long `next_id` waited.
        waited: std::time::Duration,
        /// The last refill error.
        last_error: String,
    },
    /// A finite `StreamIds` stream ended with OK before it delivered the
    /// `total` ids asked for (a server older than the one that says so with
    /// an error status). Ask for the rest again.
    #[error("the server ended the stream after {received} of {total} ids with OK; ask for the remaining {} ids again", total.saturating_sub(*received))]
    ShortStream {
        /// Ids received.
        received: u64,
        /// Ids asked for.
        total: u64,
    },
    /// A call that asked for the ids as text (`IdFormat` Crockford base32)
    /// got a different number of texts than ids: the server predates texts
    /// and ignored the request's `format`. Another (upgraded) server may
    /// answer; or encode the ids with [`crate::text_id::encode`] under the
    /// namespace's layout.
    #[error("asked for ids as text, the server returned {ids} ids and {texts} texts: it predates IdFormat; upgrade it, or encode the ids with snowkeep_client::text_id under the namespace's layout")]
    NoTexts {
        /// Ids received.
        ids: usize,
        /// Texts received.
        texts: usize,
    },
}

impl ClientError {
    /// True when the same call may succeed later or on another server.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Status(s) => is_retryable_code(s.code()),
            ClientError::Resolve { .. }
            | ClientError::PoolEmpty { .. }
            | ClientError::ShortStream { .. }
            | ClientError::NoTexts { .. } => true,
            ClientError::InvalidEndpoint { .. }
            | ClientError::InvalidArgument { .. }
            | ClientError::PoolClosed
            | ClientError::Tls { .. }
            | ClientError::NoServers
            | ClientError::BadLayout(_)
            | ClientError::MachineIdOutOfRange { .. }
            | ClientError::GrantExpired
            | ClientError::GrantCount { .. }
            | ClientError::GrantDuplicate { .. }
            | ClientError::ClockBehindFloor { .. }
            | ClientError::ClockPastFence { .. } => false,
        }
    }
}

impl ClientError {
    /// The gRPC code this error stands for, as every official client reports
    /// it (`conformance/README.md`): the server's code for
    /// [`ClientError::Status`]; `INVALID_ARGUMENT` for what is refused
    /// before any call; `FAILED_PRECONDITION` for a closed pool or a grant
    /// that cannot be used; `UNAVAILABLE` for an empty pool, a short stream
    /// or a name that did not resolve.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            ClientError::Status(s) => s.code(),
            ClientError::InvalidArgument { .. }
            | ClientError::InvalidEndpoint { .. }
            | ClientError::Tls { .. }
            | ClientError::NoServers => Code::InvalidArgument,
            ClientError::Resolve { .. }
            | ClientError::PoolEmpty { .. }
            | ClientError::ShortStream { .. }
            | ClientError::NoTexts { .. } => Code::Unavailable,
            ClientError::PoolClosed
            | ClientError::BadLayout(_)
            | ClientError::MachineIdOutOfRange { .. }
            | ClientError::GrantExpired
            | ClientError::GrantCount { .. }
            | ClientError::GrantDuplicate { .. }
            | ClientError::ClockBehindFloor { .. }
            | ClientError::ClockPastFence { .. } => Code::FailedPrecondition,
        }
    }
}

/// The one list of gRPC status codes after which the same call may succeed
/// later or on another snowkeep server. [`ClientError::is_retryable`], the
/// remote client's retries on the next server and the embedded generator's
/// Acquire retries all follow it. Why each code is on it:
///
/// - `UNAVAILABLE`: the server holds no valid lease, its clock is behind a
///   floor or stepped back, it is shutting down or not connected to etcd
///   yet, or the connection failed; another server or a later call may
///   serve.
/// - `DEADLINE_EXCEEDED`: no answer in time (a slow or unreachable server);
///   the call may not even have arrived.
/// - `UNKNOWN` and `CANCELLED`: how tonic reports a connection that broke or
///   was reset mid-call, for example by a server going away.
/// - `RESOURCE_EXHAUSTED`: the server is at one of its limits (calls in
///   progress, call memory), or the namespace has no free machine id; the
///   server's message says to retry with backoff or call another server.
/// - `ABORTED`: by gRPC convention, a conflict that a retry at a higher level
///   resolves.
/// - `INTERNAL`: a broken HTTP/2 exchange, or a server that found a record it
///   cannot read; another server, or the same one after an operator's fix,
///   may answer.
/// - `FAILED_PRECONDITION`: the Lease API's refusals that heal without the
///   caller changing its request: a clock skew over the threshold (heals
///   once the host syncs with NTP) and a rolled-back namespace (heals once an
///   operator confirms a floor).
/// - `NOT_FOUND`: the namespace is not created yet; an operator creates it
///   with `--create-namespace-only`.
///
/// Every other code (`INVALID_ARGUMENT`, `PERMISSION_DENIED`,
/// `ALREADY_EXISTS`, `UNAUTHENTICATED`, `UNIMPLEMENTED`, `OUT_OF_RANGE`,
/// `DATA_LOSS`, `OK`) says the request itself is wrong or refused, so
/// sending it again cannot help.
pub(crate) fn is_retryable_code(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::ResourceExhausted
            | tonic::Code::Aborted
            | tonic::Code::Internal
            | tonic::Code::FailedPrecondition
            | tonic::Code::NotFound
    )
}

/// Why an embedded generator stopped issuing for good (fail-fast
/// rules); the application should stop or restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum StopReason {
    /// Renew answered with no machine ids: the lease is gone at the server.
    #[error("the server holds no lease for this requester any more")]
    LeaseGone,
    /// Renew was refused with PERMISSION_DENIED: the server holds this
    /// requester's machine ids under another lease token (its lease ended
    /// and someone acquired under the same identity), so they are not ours.
    #[error(
        "the server refused this generator's lease token: its machine ids are no longer its own"
    )]
    TokenRefused,
    /// Renew answered with other machine ids than the ones held.
    #[error("the server renewed {renewed} machine ids, {held} are held")]
    MachineIdsChanged {
        /// Machine ids this generator holds.
        held: usize,
        /// Machine ids the renewal answered with.
        renewed: usize,
    },
    /// The lease passed its local deadline without a successful renewal.
    #[error("the lease expired by the local clock before a renewal succeeded")]
    Expired,
    /// `shutdown` was called.
    #[error("the generator was shut down")]
    ShutDown,
    /// After a renewal the local clock was still past a granted fence: this
    /// host's clock runs ahead of the server's by more than the renewed lease
    /// covers. The machine ids were released.
    #[error("the local clock is {past:?} past the renewed fence (ahead of the server's by more than the lease covers); the machine ids were released: sync this host with NTP")]
    ClockPastFence {
        /// How far past the earliest renewed fence the local clock was.
        past: Duration,
    },
    /// The namespace does not exist any more, or was created again since the
    /// grant: etcd lost the state behind the lease (Check or Renew said so).
    #[error("the namespace no longer exists as granted (etcd lost its state)")]
    NamespaceGone,
    /// etcd was restored from an older snapshot: the namespace is rolled back
    /// until an operator confirms a floor (Check or Renew said so).
    #[error("etcd was restored from an older snapshot; the namespace is rolled back")]
    NamespaceRolledBack,
}

/// The canonical (upper-case) name of a gRPC status code, as the gRPC
/// specification and the rest of snowkeep's documentation write it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn a_clock_behind_the_floor_says_floor() {
        let err = GenerateError::ClockBehindFloor {
            wait: Duration::from_millis(3),
        };
        assert_eq!(
            err.to_string(),
            "clock is behind the machine id's floor (its previous holders' fences) by 3ms"
        );
        assert!(err.is_retryable());
    }

    #[test]
    fn the_retryable_codes_are_exactly_the_nine_listed() {
        let table = [
            (Code::Ok, false),
            (Code::Cancelled, true),
            (Code::Unknown, true),
            (Code::InvalidArgument, false),
            (Code::DeadlineExceeded, true),
            (Code::NotFound, true),
            (Code::AlreadyExists, false),
            (Code::PermissionDenied, false),
            (Code::ResourceExhausted, true),
            (Code::FailedPrecondition, true),
            (Code::Aborted, true),
            (Code::OutOfRange, false),
            (Code::Unimplemented, false),
            (Code::Internal, true),
            (Code::Unavailable, true),
            (Code::DataLoss, false),
            (Code::Unauthenticated, false),
        ];
        for (code, retryable) in table {
            assert_eq!(is_retryable_code(code), retryable, "{code:?}");
            assert_eq!(
                ClientError::Status(tonic::Status::new(code, "x")).is_retryable(),
                retryable,
                "{code:?}"
            );
        }
    }
}
