//! The weight of a call: the most memory its response can make the server
//! hold at once, read from its request before it runs, so that
//! [`super::calls`] can reserve it. The guard knows no protobuf message:
//! whoever builds the [`CallLimits`](super::calls::CallLimits) hands in a
//! [`Weigh`] for the methods whose responses grow with the request.

use super::LimitError;

/// gRPC's length-prefix of every message, bytes.
pub const GRPC_HEADER: usize = 5;
/// Weight of the responses that do not grow with the request (health,
/// info, Lease API and reflection answers are a few KiB), bytes.
pub const SMALL_RESPONSE: usize = 64 * 1024;

/// How much memory a call's response can hold: the part of the call limits
/// that reads the request's message.
pub trait Weigh: std::fmt::Debug + Send + Sync + 'static {
    /// Weight in bytes of the response of a call to `path`
    /// (`/package.Service/Method`), from its request `frame` (one
    /// length-prefixed gRPC message, at most `--max-recv-message-size`
    /// bytes): what the call can make the server hold at once.
    /// [`SMALL_RESPONSE`] for a method whose response does not grow with
    /// its request, or a request the handler will refuse.
    ///
    /// # Errors
    /// A [`LimitError`] when one response message would be larger than
    /// `max_send` bytes: the call is refused before it runs.
    fn weigh(&self, path: &str, frame: &[u8], max_send: usize) -> Result<usize, LimitError>;
}

/// Weighs every call at [`SMALL_RESPONSE`]: for services none of whose
/// responses grow with the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Small;

impl Weigh for Small {
    fn weigh(&self, _path: &str, _frame: &[u8], _max_send: usize) -> Result<usize, LimitError> {
        Ok(SMALL_RESPONSE)
    }
}
