//! Bounded resources under hostile or broken clients: whatever clients do,
//! the server's memory, file descriptors and CPU stay within what
//! [`crate::config::Limits`] sets (docs/operations.md has the sums).
//!
//! | piece | bounds |
//! | --- | --- |
//! | [`conn`] | accept errors back off; open connections; silent and idle connections; connections that hold shutdown |
//! | [`calls`] | unary calls and streams in progress, and the memory they hold, until their responses have left the process |
//! | [`wire`] | statuses of malformed and oversized messages |
//! | tonic's builder (in [`crate::run`]) | HTTP/2 streams per connection, keepalive pings, header list size, flow-control windows |
//! | the generated services (in [`crate::service::router`]) | message sizes |

pub mod calls;
pub mod conn;
mod throttle;
pub mod wire;

pub use throttle::Throttle;
