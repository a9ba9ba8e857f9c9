//! The Lease API: `snowkeep.v1.LeaseService`, through which applications that
//! embed the generator (`snowkeep_client::EmbeddedGenerator`, here called
//! *requesters*) lease machine ids from a server running on etcd.
//!
//! A requester claims machine ids with the same claim transactions as a
//! server, on an etcd lease of its own whose duration is the Lease API's
//! *lease* (first lease 10 min, renewed 48 h by default). Its fence is the
//! lease's expiry plus [`records::FENCE_MARGIN`], written before the grant is
//! returned; a renewal moves every key onto a new etcd lease at once; a
//! release lowers each fence towards the last timestamp the requester reports.
//! Acquire hands out a lease token once; every later call that acts on the
//! lease must present it.
//!
//! | module | owns |
//! | --- | --- |
//! | `service` | the gRPC handler [`LeaseHandler`]: argument checks, the clock-skew policy applied, the skew book |
//! | `convert` | the Lease API's protobuf conversions and field checks |
//! | [`records`] | requester ids, lease tokens, grants, checks, the fence rules, and the [`records::RequesterStore`] interface a store implements |
//! | [`skew`] | the client clock-skew rule and the book of known requesters' skews |
//! | `config` | [`LeaseApiConfig`] |
//!
//! The store is etcd's: `crate::etcd::requesters` implements
//! [`records::RequesterStore`] with etcd transactions, since only `etcd`
//! touches etcd-client. The single-instance store has no Lease API.

mod config;
pub(crate) mod convert;
pub mod records;
mod service;
pub mod skew;

pub use config::LeaseApiConfig;
pub use service::LeaseHandler;
