//! The Lease API: `snowkeep.v1.LeaseService`, through which applications that
//! embed the generator (`snowkeep_client::EmbeddedGenerator`, here called
//! *requesters*) lease machine ids from a server running on etcd.
//!
//! A requester claims machine ids with the same claim transactions as a
//! server, on an etcd lease of its own whose duration is the Lease API's
//! *lease* (first lease 10 min, renewed 48 h by default). Its fence is the
//! lease's expiry plus [`FENCE_MARGIN`](snowkeep_core::lease::records::FENCE_MARGIN), written before the grant is
//! returned; a renewal moves every key onto a new etcd lease at once; a
//! release lowers each fence towards the last timestamp the requester reports.
//! Acquire hands out a lease token once; every later call that acts on the
//! lease must present it.
//!
//! | module | owns |
//! | --- | --- |
//! | `service` | the gRPC handler [`LeaseHandler`], generic over its `LeaseStore`: argument checks, the clock-skew policy applied, the skew book |
//! | `audited` | the audit wrapper: one audit event per Acquire and Release |
//! | `convert` | the Lease API's protobuf conversions and field checks |
//! | `config` | [`LeaseApiConfig`] |
//!
//! What the Lease API keeps and decides, without gRPC or a store, is
//! `snowkeep_core::lease`: requester ids, lease tokens, grants, the fence rules, the
//! `RequesterStore` interface, the client clock-skew rule. The store is
//! etcd's: `snowkeep_etcd::requesters` implements `RequesterStore` with etcd
//! transactions, since only `etcd` touches etcd-client. The single-instance
//! store has no Lease API.

mod audited;
mod config;
pub(crate) mod convert;
mod service;

pub use config::LeaseApiConfig;
pub use service::LeaseHandler;
