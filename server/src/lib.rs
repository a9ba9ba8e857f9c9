//! snowkeep-server: claims snowflake machine ids in etcd (or a
//! single-instance store) and issues ascending 63-bit ids over gRPC.
//!
//! Words: an *etcd lease* is etcd's (keepalive, TTL); a *claim* is a
//! server's hold of machine ids (holder keys on its etcd lease); a *lease* is
//! what the Lease API grants a requester; *embedded* names only the
//! in-process generator applications link and its requesters.
//!
//! The crates below this one: `snowkeep-core` (the claim loop over the
//! `ClaimStore` trait, the Lease API's records and rules, API-key records,
//! namespace names, the metric catalog, the single-instance store) and
//! `snowkeep-etcd` (every etcd implementation of those traits; the only
//! crate that depends on `etcd-client`). This crate is the network side:
//! the gRPC handlers, configuration and start-up. The guards in front of
//! the handlers (limits, the allow-list, TLS) are `snowkeep-guard`'s; its
//! modules are re-exported at the paths below.
//!
//! | module | owns |
//! | --- | --- |
//! | [`config`] | `Args` (flags + `SNOWKEEP_*` env, one group per `--help` heading) → validated `ServerConfig` |
//! | [`run`](mod@run) | wiring and the ordered shutdown |
//! | [`shutdown`] | SIGTERM/SIGINT → cancellation token |
//! | `connect` | connecting a server to etcd: the security mode, the administration handle, the key cache, the namespace, each retried |
//! | `lease_api` | the Lease API (`LeaseService`): its handler, its protobuf conversions, its settings |
//! | [`auth`] | API keys in force: the tower layer, the servers' key cache, the cluster's security mode, revocation of open streams |
//! | `audit` | the audit trail: one event per Lease API and administration change, logged, counted and broadcast |
//! | `service` | gRPC adapters (IdService, InfoService), `StoreAccess` and `Reach` (how a handler reaches its store), status mapping, health, the weight of IdService's calls (`IdWeight`, the `Weigh` the call limits take) |
//! | `admin` | `AdminService`: the cluster's state, its export and import, API keys and the security mode, for snowkeepctl and the status page |
//! | `router` | the gRPC routes: every service of the port under one message-size bound |
//! | [`metrics`] | the Prometheus recorder and the per-call gRPC metrics layer; re-exports the catalog of `snowkeep_core::metrics` |
//! | [`metrics_http`] | the `/metrics` listener, and the HTTP/1.1 loop the status page shares |
//! | [`telemetry`] | logs and traces: `tracing` to stderr, plain or JSON, and OTLP span export |
//! | `conn_info` | re-export of `snowkeep_guard::conn_info`: what a connection shares with its calls |
//! | `limits` | re-export of `snowkeep_guard::limits`: bounds on connections, calls, memory and messages; `Limits` |
//! | [`tls`] | re-export of `snowkeep_guard::tls`: TLS on the gRPC port, the files and their reload |
//! | `allow` | re-export of `snowkeep_guard::allow`: the `--allow-cidrs` allow-list layer |
//! | `peers` | the peer clock check: registering this server, measuring its offset to the others |
//! | `status_page` | the read-only HTML status page (`--admin-listen`) |
//! | `scale` (hidden) | the scale benchmark's claimer (`snowkeep-scale`): the claim loop on the etcd store, built as `run` builds it, without the gRPC server |
//!
//! No two of these modules import each other, directly or through others
//! (`tests/layering.rs` checks it): a module's table row names what it owns,
//! and what it owns sits below every module that uses it.
//!
//! Core flows (docs/design.md: the safety invariant and the claim lifecycle):
//!
//! * **Claim**: grant an etcd lease, rank free machine ids, and take one with a
//!   transaction that creates the holder key bound to the etcd lease and reads the
//!   machine id's fence in the same transaction; that fence is the floor.
//! * **Fence**: wait for the clock to pass the floor, then raise the fence to
//!   now + 1.5 outage budgets with a transaction guarded by the holder key's
//!   etcd lease, and only then publish a grant; while busy, raise it again
//!   once it is one budget or less ahead; while idle, only when a call finds
//!   it reached.
//! * **Renew**: a keepalive every TTL/3, each under its own timeout. A failed
//!   one starts an outage: issuance goes on up to the fences.
//! * **Issue**: the shared `snowkeep_client::Generator` stamps ids inside
//!   (floor, fence].
//! * **Release**: withdraw the grant, drain the generator, lower the fence to
//!   the last timestamp used and delete the holder key in one transaction,
//!   revoke the etcd lease.
//! * **Lease API**: embedded requesters claim machine ids with the same claim
//!   transactions, on an etcd lease of their own as long as their lease;
//!   their fence is the lease's expiry plus a margin, and a renewal moves
//!   every key to a new etcd lease at once.

pub(crate) mod admin;
pub(crate) mod audit;
pub mod auth;
pub mod config;
pub(crate) mod connect;
pub(crate) mod http;
pub(crate) mod lease_api;
pub mod metrics;
pub mod metrics_http;
pub(crate) mod peers;
pub(crate) mod router;
pub mod run;
#[doc(hidden)]
pub mod scale;
pub(crate) mod service;
pub mod shutdown;
pub(crate) mod status_page;
pub mod telemetry;

pub use run::{run, ServeError};

// The guard's modules, at the paths the server's code has always named them
// by (`crate::limits::…`, `crate::tls::…`).
pub use snowkeep_guard::tls;
pub(crate) use snowkeep_guard::{allow, conn_info, limits};
