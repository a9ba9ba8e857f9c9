//! snowkeep-guard: what stands between the network and the gRPC handlers of
//! a snowkeep server: bounds on connections, calls, memory and messages under
//! hostile or broken clients, the `--allow-cidrs` allow-list, and TLS with
//! certificates reloaded from their files.
//!
//! It knows none of snowkeep's protobuf messages: the server hands the call
//! limits a [`limits::Weigh`] that reads how much memory a call's response
//! can hold from its request. It depends on no other snowkeep crate (they all
//! sit above the protos): the names of its metrics are spelled again in
//! [`metric_names`], checked against the catalog by the server's tests.
//!
//! | module | owns |
//! | --- | --- |
//! | [`metric_names`] | the names of the metrics it records (entries of `snowkeep_core::metrics`) |
//! | `chain` | an error with its sources, for logs and statuses |
//! | [`conn_info`] | what a connection shares with its calls (`ConnInfo`, `ConnState`) |
//! | [`allow`] | the `--allow-cidrs` allow-list layer (PERMISSION_DENIED for other peers) |
//! | [`tls`] | TLS on the gRPC port: the files, their reload, the acceptor new connections take |
//! | [`limits`] | bounds on connections, calls, memory and messages; `Limits`, `LimitError`, the `Weigh` trait |
//!
//! No two of these modules import each other, directly or through others
//! (the server's `tests/layering.rs` checks it): `limits` uses the others,
//! `allow` uses `conn_info`, `tls` uses `metric_names` and `chain`.

pub mod allow;
mod chain;
pub mod conn_info;
pub mod limits;
pub mod metric_names;
pub mod tls;
