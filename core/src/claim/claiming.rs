//! The claiming state of the claim loop ([`super::manager`]): its retry
//! backoff, the bounded wait for a full range whose holders' etcd lease is
//! ending, and how long a claimed machine id's previous fence is waited for
//! (docs/design.md, *Claim lifecycle*).

use std::time::{Duration, Instant};

use snowkeep_client::{Backoff, Millis, SharedClock};
use tracing::warn;

use super::{Claim, ClaimStore, StoreError};

/// The claiming state: the backoff of the next retry, and whether a claim
/// ever succeeded (after one, a full pool or a namespace waiting for an
/// operator is retried instead of ending the loop: others may release).
pub(super) struct Claiming {
    /// The delay before the next retry.
    pub(super) backoff: Backoff,
    /// A claim succeeded before.
    pub(super) held_before: bool,
    /// Until when a full range waits for a holder's ending etcd lease (set
    /// at the first refusal the store could answer for, never moved).
    pub(super) lease_end_deadline: Option<Instant>,
    /// Until when a full range whose holders' leases the store could not
    /// tell about is claimed again (set at the first unanswered question,
    /// never moved): as long as an answered wait could last, then the
    /// refusal stands (an etcd that never answers, a role that may not ask).
    pub(super) unanswered_deadline: Option<Instant>,
}

impl Claiming {
    /// Nothing claimed yet, retrying with `backoff`.
    pub(super) fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            held_before: false,
            lease_end_deadline: None,
            unanswered_deadline: None,
        }
    }

    /// True while a range found full (`e`) waits for an etcd lease of its
    /// holders that is ending (a frozen or crashed holder's): from the first
    /// refusal `store` can answer for up to that lease's end plus
    /// [`LEASE_END_SLACK`]. After that the refusal is the operator's problem
    /// again, and so it is at once when no holder's lease ends within a
    /// fence lead. A store that cannot tell (etcd did not answer) is asked
    /// again at the next refusal, for up to `bound` (one fence lead, the
    /// longest an answered wait lasts) from the first unanswered question.
    pub(super) async fn waits_for_lease_end<S: ClaimStore>(
        &mut self,
        e: &StoreError,
        store: &mut S,
        clock: &SharedClock,
        bound: Duration,
    ) -> bool {
        if !matches!(e, StoreError::NoFreeMachineId { .. }) {
            return false;
        }
        if self.lease_end_deadline.is_none() {
            match store.holder_lease_end().await {
                Ok(Some(left)) => {
                    self.lease_end_deadline = Some(clock.now() + left + LEASE_END_SLACK);
                }
                Ok(None) => return false,
                Err(why) => {
                    let until = *self.unanswered_deadline.get_or_insert(clock.now() + bound);
                    let again = clock.now() < until;
                    warn!(error = %crate::DisplayChain(&why), claiming_again = again, "the range is full and the store could not tell how soon its holders' etcd leases end");
                    return again;
                }
            }
        }
        self.lease_end_deadline.is_some_and(|d| clock.now() < d)
    }
}

/// Wait past an ending holder lease's remaining TTL (whole seconds, and
/// etcd expires leases on a 500 ms tick) before giving up on a full range.
const LEASE_END_SLACK: Duration = Duration::from_secs(2);

/// The machine id of `claim` whose previous fence stands furthest beyond
/// its wait at layout time `now`, as [`StoreError::FenceTooFarAhead`]: a
/// claim holding an id of [`Claim::own_fences`] waits up to `own_wait` for
/// every id it holds, any other claim up to `max_fence_wait`. The whole
/// claim, not only its own ids: giving a claim back revokes the etcd lease
/// that holds all its ids, the instance's own ones with them, and the
/// instance would not find them as its own again. `None` when every floor
/// is within the wait.
pub(super) fn fenced_too_far<L>(
    claim: &Claim<L>,
    now: Millis,
    max_fence_wait: Duration,
    own_wait: Duration,
) -> Option<StoreError> {
    let holds_own = claim
        .held
        .iter()
        .any(|h| claim.own_fences.contains(&h.machine_id));
    let max = if holds_own {
        own_wait.max(max_fence_wait)
    } else {
        max_fence_wait
    };
    claim
        .held
        .iter()
        .filter_map(|h| {
            let ahead = Duration::from_millis(h.floor.get().saturating_sub(now.get()));
            (ahead > max).then(|| (ahead - max, h, ahead, max))
        })
        .max_by_key(|(beyond, ..)| *beyond)
        .map(|(_, h, ahead, max)| StoreError::FenceTooFarAhead {
            machine_id: h.machine_id,
            fence: h.floor,
            ahead,
            max,
        })
}

/// Whether a refused claim is retried with backoff (before the waits for an
/// ending lease or a holder's fence are weighed): what may heal
/// ([`StoreError::is_retryable`]), except etcd refusing this server's
/// credentials or permissions at its first claim, which is configuration to
/// fix (exit 64) as at connect; and once this instance has held machine ids,
/// also what an operator may fix while the server stays NOT_SERVING (the
/// reason logged each retry), or others may free by releasing.
pub(super) fn retried(e: &StoreError, held_before: bool) -> bool {
    let refused_at_start = !held_before && matches!(e, StoreError::AccessRefused { .. });
    (e.is_retryable() && !refused_at_start)
        || (held_before
            && matches!(
                e,
                StoreError::NoFreeMachineId { .. }
                    | StoreError::FenceTooFarAhead { .. }
                    | StoreError::NamespaceNotCreated { .. }
                    | StoreError::CorruptNamespace { .. }
                    | StoreError::NamespaceRolledBack { .. }
                    | StoreError::NamespaceFloorAhead { .. }
            ))
}
