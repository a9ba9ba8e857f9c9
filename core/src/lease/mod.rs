//! What the Lease API grants and keeps, as data and pure rules: no gRPC, no
//! store. The server's `lease_api` (the `LeaseService` handler) applies them, and
//! `snowkeep_etcd::requesters` keeps the records; both import this module and
//! it imports neither.
//!
//! | module | owns |
//! | --- | --- |
//! | [`conformance`] | the [`records::RequesterStore`] contract as executable clauses, run on the handler's test double and on etcd |
//! | [`records`] | requester ids, lease tokens, grants, checks, the fence rules, requester descriptions, and the [`records::RequesterStore`] interface a store implements |
//! | [`skew`] | the client clock-skew rule and the book of known requesters' skews |

pub mod conformance;
pub mod records;
pub mod skew;
