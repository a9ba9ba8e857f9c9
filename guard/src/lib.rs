//! snowkeep-guard: what stands between the network and the gRPC handlers of
//! a snowkeep server: bounds on connections, calls, memory and messages under
//! hostile or broken clients, the `--allow-cidrs` allow-list, and TLS with
//! certificates reloaded from their files.
//!
//! It knows none of snowkeep's protobuf messages: the server hands the call
//! limits a [`limits::Weigh`] that reads how much memory a call's response
//! can hold from its request. From the crates below it takes the
//! metric names of the catalog and `DisplayChain` (`snowkeep-core`) and
//! `Backoff` and `Millis` (`snowkeep-client`).
//!
//! | module | owns |
//! | --- | --- |
//! | [`conn_info`] | what a connection shares with its calls (`ConnInfo`, `ConnState`) |
//! | [`allow`] | the `--allow-cidrs` allow-list layer (PERMISSION_DENIED for other peers) |
//! | [`tls`] | TLS on the gRPC port: the files, their reload, the acceptor new connections take |
//! | [`limits`] | bounds on connections, calls, memory and messages; `Limits`, `LimitError`, the `Weigh` trait |
//!
//! No two of these modules import each other, directly or through others
//! (the server's `tests/layering.rs` checks it): `limits` uses the others,
//! `allow` uses `conn_info`.

pub mod allow;
pub mod conn_info;
pub mod limits;
pub mod tls;
