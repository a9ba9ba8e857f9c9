//! A server's claim of machine ids and its lifecycle (docs/design.md, claim
//! lifecycle): claim → wait past the previous fences → raise the fences →
//! issue while renewing → lose or release.
//!
//! `ClaimManager::run` is one loop over one `ClaimStore` (etcd, or the
//! single-instance file store). An instance holds `N` machine ids under one
//! claim (on etcd, one etcd lease); slot `i` of the claim feeds generator `i`. The loop is the only
//! writer of the generators' [`Grant`](snowkeep_client::Grant) channels:
//!
//! * a grant is published only after the fence it carries is persisted
//!   (design.md, fence protocol rule 2), and only once the clock is past the claim's floors (rule 3);
//! * its deadline is the send time of the last successful renewal + TTL, so the
//!   generator stops by its own monotonic clock even when this loop is stuck;
//! * on loss every grant is withdrawn at once, then the loop re-claims (or exits);
//! * on release the grants are withdrawn, the generators drained, and each
//!   fence lowered to the last timestamp actually stamped (rule 4).

//!
//! The loop is a state machine (`manager`): *claiming* (with backoff) →
//! *holding* a claim, itself *waiting for the floor* and then *issuing*
//! (`hold`: its timers live in one place with one `next_wake`, and each due
//! action is a method) → *lost* (withdraw, then claim again or exit) or
//! *releasing* (withdraw, drain, lower the fences, give the ids back).

pub mod candidates;
pub mod capacity;
mod claiming;
pub mod conformance;
mod error;
mod hold;
mod loss;
mod manager;
mod store;
#[cfg(test)]
mod tests;

pub use error::{AccessProblem, LossReason, StoreError};
pub use manager::{fence_lead, OnLeaseLost};
pub use manager::{ClaimManager, ClaimTiming, Slot};
pub use store::{Capacity, ClaimStore, HolderWatch};
pub use store::{Claim, HeldId};
