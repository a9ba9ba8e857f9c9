//! Integration tests of snowkeep-server against real etcd processes that the
//! tests start themselves (free ports, temp dirs), and of the embedded store.

// A test binary: helpers panic on anything unexpected, like the tests do.
#![allow(clippy::unwrap_used)]

mod claims;
mod embedded;
mod endpoints;
mod etcd_faults;
mod issuance;
mod lease;
mod lease_api;
mod observability;
mod release;
mod support;
mod tampering;
