//! Why a call was refused at a limit, or its message could not be read, and
//! the gRPC status a client gets for it. The codes are mapped here, beside
//! the variants, so the layers of `limits` answer without the server's
//! `service`; the server's `service::status` gives `ApiError::Limit` the
//! same codes.

use thiserror::Error;
use tonic::{Code, Status};
use tracing::debug;

/// A call refused by the server's limits, or a malformed or oversized
/// message. Every message names the flag to change or what to send instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LimitError {
    /// Every slot of a pool is taken.
    #[error("this server already has {max} {calls} in progress, its limit ({flag}); retry with backoff or call another snowkeep server")]
    Busy {
        /// `unary calls` or `streams`.
        calls: &'static str,
        /// The pool's slots.
        max: usize,
        /// The flag that sets them.
        flag: &'static str,
    },
    /// One API key has its most calls of a pool in progress.
    #[error("API key {key_id} already has {max} {calls} in progress on this server, the most one key may have ({flag}); retry with backoff, spread the calls over more keys, or call another snowkeep server")]
    KeyBusy {
        /// The key's id.
        key_id: String,
        /// `unary calls` or `streams`.
        calls: &'static str,
        /// The most per key.
        max: usize,
        /// The flag that sets it.
        flag: &'static str,
    },
    /// One remote address has its most keyless calls of a pool in progress.
    #[error("{peer} already has {max} {calls} without an API key in progress on this server, the most one address may have ({flag}); retry with backoff, or send an API key")]
    PeerBusy {
        /// The remote IP address.
        peer: String,
        /// `keyless unary calls` or `keyless streams`.
        calls: &'static str,
        /// The most per address.
        max: usize,
        /// The flag that sets it.
        flag: &'static str,
    },
    /// A streamed request (ImportStream) sent no whole message for
    /// `--request-timeout` after its last one.
    #[error("no whole message of this streamed request arrived within {} of the one before (--request-timeout); send the pieces one after another, without pauses", humantime::format_duration(*after))]
    StreamStalled {
        /// The timeout.
        after: std::time::Duration,
    },
    /// The request message did not arrive within `--request-timeout`.
    #[error("the request did not arrive in full within {} of the call's headers (--request-timeout); send each request whole, at once", humantime::format_duration(*after))]
    RequestTimeout {
        /// The timeout.
        after: std::time::Duration,
    },
    /// The pool's memory is reserved by calls in progress.
    #[error("this server's memory for {calls} is in use: {need} more bytes do not fit in its {pool} bytes (a share of --max-call-memory); retry with backoff or call another snowkeep server")]
    MemoryInUse {
        /// `unary calls` or `streams`.
        calls: &'static str,
        /// Bytes the call asked for.
        need: usize,
        /// Bytes of the pool.
        pool: usize,
    },
    /// The call needs more memory than its whole pool.
    #[error("this call needs {need} bytes of server memory, more than the {pool} bytes this server gives all {calls} (a share of --max-call-memory); ask for fewer ids per call")]
    CallTooLarge {
        /// `unary calls` or `streams`.
        calls: &'static str,
        /// Bytes the call needs.
        need: usize,
        /// Bytes of the pool.
        pool: usize,
    },
    /// A request message over `--max-recv-message-size`.
    #[error("the request message is {len} bytes, over this server's limit of {max} bytes (--max-recv-message-size)")]
    RequestTooLarge {
        /// Its length, bytes.
        len: usize,
        /// The limit, bytes.
        max: usize,
    },
    /// A `NextIds` response over `--max-send-message-size`.
    #[error("{count} ids make a {len}-byte response message, over this server's limit of {max} bytes (--max-send-message-size); ask for at most {fit} ids per call")]
    IdsTooLarge {
        /// Ids asked for.
        count: usize,
        /// Their message, bytes.
        len: usize,
        /// The limit, bytes.
        max: usize,
        /// The most ids that fit.
        fit: usize,
    },
    /// `StreamIds` batches over `--max-send-message-size`.
    #[error("batch_size {batch} makes {len}-byte messages, over this server's limit of {max} bytes (--max-send-message-size); use a batch_size of at most {fit}")]
    BatchTooLarge {
        /// Ids per batch.
        batch: usize,
        /// A batch's message, bytes.
        len: usize,
        /// The limit, bytes.
        max: usize,
        /// The largest batch that fits.
        fit: usize,
    },
    /// A response message over `--max-send-message-size` (any method).
    #[error("the response message is {len} bytes, over this server's limit of {max} bytes (--max-send-message-size); ask for less per call")]
    ResponseTooLarge {
        /// Its length, bytes.
        len: usize,
        /// The limit, bytes.
        max: usize,
    },
    /// Request bytes that do not decode as the method's message.
    #[error("the request is not a valid protobuf message for this method ({detail}); build requests from snowkeep's .proto files")]
    InvalidMessage {
        /// The decoder's words.
        detail: String,
    },
    /// The request body ends inside a gRPC message.
    #[error("the request body ends inside a gRPC message: its length prefix promises more bytes than were sent")]
    TruncatedMessage,
    /// A gRPC message prefix whose compression flag is neither 0 nor 1.
    #[error("the request message starts with compression flag {flag}; a gRPC message starts with 0 (uncompressed) or 1 (compressed)")]
    InvalidCompressionFlag {
        /// The flag byte.
        flag: u8,
    },
}

impl LimitError {
    /// The gRPC code of this refusal: `RESOURCE_EXHAUSTED` for a full pool or
    /// an oversized message, `DEADLINE_EXCEEDED` for a request that was too
    /// slow to arrive, `INVALID_ARGUMENT` for one that cannot be read.
    pub fn code(&self) -> Code {
        match self {
            LimitError::Busy { .. }
            | LimitError::KeyBusy { .. }
            | LimitError::PeerBusy { .. }
            | LimitError::MemoryInUse { .. }
            | LimitError::CallTooLarge { .. }
            | LimitError::RequestTooLarge { .. }
            | LimitError::IdsTooLarge { .. }
            | LimitError::BatchTooLarge { .. }
            | LimitError::ResponseTooLarge { .. } => Code::ResourceExhausted,
            LimitError::RequestTimeout { .. } | LimitError::StreamStalled { .. } => {
                Code::DeadlineExceeded
            }
            LimitError::InvalidMessage { .. }
            | LimitError::TruncatedMessage
            | LimitError::InvalidCompressionFlag { .. } => Code::InvalidArgument,
        }
    }
}

impl From<LimitError> for Status {
    /// The status of [`LimitError::code`] with the error's text, as the
    /// server's `service::status` builds every other status (logged at
    /// debug only: refusals under load would flood the logs; metrics count
    /// them).
    fn from(err: LimitError) -> Self {
        let code = err.code();
        let message = snowkeep_core::DisplayChain(&err).to_string();
        debug!(code = ?code, error = %snowkeep_core::DisplayChain(&err), "request refused");
        Status::new(code, message)
    }
}
