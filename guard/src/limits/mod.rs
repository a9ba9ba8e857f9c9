//! Bounded resources under hostile or broken clients: whatever clients do,
//! the server's memory, file descriptors and CPU stay within what
//! [`Limits`] sets (docs/operations.md has the sums).
//!
//! | piece | bounds |
//! | --- | --- |
//! | [`conn`] | accept errors back off; open connections; silent and idle connections; connections that hold shutdown |
//! | [`calls`] | unary calls and streams in progress, and the memory they hold, until their responses have left the process |
//! | [`admission`] | keyless calls in pools of their own; each key's share of the pools; how long a request may take to arrive |
//! | [`weight`] | how much memory a call reserves: the [`Weigh`] its builder hands in |
//! | [`wire`] | statuses of malformed and oversized messages |
//! | [`settings`] | [`Limits`], the flags' defaults and the size parser |
//! | [`LimitError`] | what a client is told when a limit refuses its call, and its status |
//! | [`Throttle`] | at most one log line per period for a repeated event |
//! | tonic's builder (in the server's `run`) | HTTP/2 streams per connection, keepalive pings, header list size, flow-control windows |
//! | the generated services (in the server's `router`) | message sizes |

pub mod admission;
mod alarm;
pub mod calls;
pub mod conn;
mod error;
pub mod settings;
mod throttle;
pub mod weight;
pub mod wire;

pub use error::LimitError;
pub use settings::Limits;
pub use throttle::Throttle;
pub use weight::Weigh;

/// The status a client gets for `error`: its code is mapped beside the
/// variants ([`LimitError::code`]), the same one the server's
/// `service::status` gives.
fn status(error: LimitError) -> tonic::Status {
    error.into()
}
