//! The Lease API and the Rust clients: grants, tokens, its etcd records, and client
//! clock skew.

mod client_skew;
mod lease_api;
mod lease_api_records;
mod lease_api_skew;
mod lease_api_tokens;
