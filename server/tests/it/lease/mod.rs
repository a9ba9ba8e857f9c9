//! The Lease API and the Rust clients: grants, tokens, its etcd records, client
//! clock skew, and the `RequesterStore` contract on etcd.

mod client_skew;
mod lease_api;
mod lease_api_records;
mod lease_api_skew;
mod lease_api_tokens;
mod requester_conformance;
