//! Bounded resources under hostile or broken clients: whatever clients do,
//! the server's memory, file descriptors and CPU stay within what
//! [`crate::config::Limits`] sets.
//!
//! | piece | bounds |
//! | --- | --- |
//! | [`conn`] | accept errors back off; open connections; silent and idle connections; connections that hold shutdown |
//! | tonic's builder (in [`crate::run`]) | HTTP/2 keepalive pings |

pub mod conn;
mod throttle;

pub use throttle::Throttle;
