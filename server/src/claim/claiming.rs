//! The claiming state of the claim loop ([`super::manager`]): its retry
//! backoff, and the bounded wait for a full range whose holders' etcd lease
//! is ending (docs/design.md, *Claim lifecycle*).

use std::time::{Duration, Instant};

use snowkeep_client::Backoff;

use super::StoreError;

/// The claiming state: the backoff of the next retry, and whether a claim
/// ever succeeded (after one, a full pool or a namespace waiting for an
/// operator is retried instead of ending the loop: others may release).
pub(super) struct Claiming {
    /// The delay before the next retry.
    pub(super) backoff: Backoff,
    /// A claim succeeded before.
    pub(super) held_before: bool,
    /// Until when a full range waits for a holder's ending etcd lease (set
    /// at the first such refusal, never moved).
    pub(super) lease_end_deadline: Option<Instant>,
}

impl Claiming {
    /// Nothing claimed yet, retrying with `backoff`.
    pub(super) fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            held_before: false,
            lease_end_deadline: None,
        }
    }

    /// True while a range found full waits for an etcd lease of its holders
    /// that is ending (a frozen or crashed holder's): from the first such
    /// refusal up to that lease's end plus [`LEASE_END_SLACK`]. After that
    /// the refusal is the operator's problem again.
    pub(super) fn waits_for_lease_end(&mut self, e: &StoreError, now: Instant) -> bool {
        let StoreError::NoFreeMachineId {
            ending_within: Some(left),
            ..
        } = e
        else {
            return false;
        };
        now < *self
            .lease_end_deadline
            .get_or_insert(now + *left + LEASE_END_SLACK)
    }
}

/// Wait past an ending holder lease's remaining TTL (whole seconds, and
/// etcd expires leases on a 500 ms tick) before giving up on a full range.
const LEASE_END_SLACK: Duration = Duration::from_secs(2);
