//! Integration tests of snowkeep-server against real etcd processes that the
//! tests start themselves (free ports, temp dirs), and of the single-instance store.
//! One folder per feature, each feature's fault tests beside it; the harness
//! is the crate snowkeep-test-support.

// A test binary: helpers panic on anything unexpected, like the tests do.
#![allow(clippy::unwrap_used)]

mod admin;
mod claim;
mod config;
mod files;
mod http;
mod lease;
mod resources;
mod security;
mod store;
mod telemetry;
