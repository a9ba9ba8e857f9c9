//! Integration tests of snowkeep-server against real etcd processes that the
//! tests start themselves (free ports, temp dirs), and of the embedded store.

// A test binary: helpers panic on anything unexpected, like the tests do.
#![allow(clippy::unwrap_used)]

mod claims;
mod client_skew;
mod config_refusals;
mod embedded;
mod embedded_ranges;
mod endpoints;
mod etcd_faults;
mod fairness;
mod instance_ids;
mod issuance;
mod layout_change;
mod lease;
mod lease_api;
mod lease_corrupt;
mod lease_records;
mod lease_skew;
mod lease_tokens;
mod limits;
mod namespace_overlap;
mod observability;
mod pool_reads;
mod protos;
mod release;
mod rollback;
mod streams;
mod support;
mod tampering;
mod tools;
