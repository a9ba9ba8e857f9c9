//! The state of one hold: the claim, its phase and its timers. Pure (no
//! store, no metrics): [`super::manager`] asks [`Hold::due`] what to do at a
//! monotonic instant, does it, and sleeps until [`Timers::next_wake`].

use std::time::{Duration, Instant};

use super::{Claim, LossReason, StoreError};

/// Gauges are refreshed at least this often.
pub(super) const GAUGE_REFRESH: Duration = Duration::from_millis(500);

/// Where a hold is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Claimed, nothing published: the clock is not yet past the claim's
    /// floors (the previous holders' fences), or the first fence write has
    /// not succeeded yet.
    WaitingForFloor,
    /// The fences were persisted ahead of the clock and the grants published;
    /// issuance goes on up to them, whether or not the store answers.
    Issuing,
}

/// How a hold ended.
#[derive(Debug)]
pub(super) enum Held {
    /// Release was asked for: withdraw, drain, lower the fences, give back.
    Released,
    /// The store said the claim is gone: withdraw at once.
    Lost(LossReason),
    /// A condition that needs an operator: withdraw and stop.
    Fatal(StoreError),
}

/// An action that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// Renew the lease.
    Renew,
    /// Check the floor, and raise the fences if they need it.
    Fence,
    /// Re-check the namespace.
    NamespaceCheck,
}

/// When each action of a hold is next due (monotonic instants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Timers {
    /// The next renewal; `None` for a claim without deadline.
    pub renew: Option<Instant>,
    /// The next floor check or fence write.
    pub fence: Instant,
    /// The next namespace check.
    pub namespace_check: Instant,
}

impl Timers {
    /// The timers of a hold that starts at `start`, renewing every `renew_every`.
    fn new(start: Instant, renew_every: Duration, renews: bool) -> Self {
        Self {
            renew: renews.then_some(start + renew_every),
            fence: start,
            namespace_check: start + renew_every,
        }
    }

    /// When the loop must wake next, at `now`: the earliest timer, and at
    /// least every [`GAUGE_REFRESH`] to refresh the gauges. (The lease
    /// deadline is no reason to wake: issuance outlives it, up to the fences.)
    pub fn next_wake(&self, now: Instant) -> Instant {
        [
            Some(self.fence),
            Some(self.namespace_check),
            Some(now + GAUGE_REFRESH),
            self.renew,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now)
    }
}

/// One claim being held.
#[derive(Debug)]
pub(super) struct Hold<L> {
    /// The claim, its fences as last persisted.
    pub claim: Claim<L>,
    /// Where the hold is.
    pub phase: Phase,
    /// When each action is due.
    pub timers: Timers,
    /// When the current wait for the clock to pass the floor began (also a
    /// clock stepped back below it while issuing); `None` while not waiting.
    pub floor_wait_since: Option<Instant>,
    /// The namespace record was found missing or unreadable (logged once).
    pub namespace_trouble: bool,
    /// The interval between renewals and between namespace checks.
    pub renew_every: Duration,
    /// Since when store requests have failed with none succeeding (an
    /// outage); `None` while the store answers.
    pub outage_since: Option<Instant>,
    /// The lease deadline passed during this outage (logged once).
    pub past_deadline: bool,
}

impl<L> Hold<L> {
    /// A hold of `claim` from `start`, renewing every `renew_every` when the
    /// claim has a deadline.
    pub fn new(claim: Claim<L>, start: Instant, renew_every: Duration) -> Self {
        let renews = claim.deadline.is_some();
        Self {
            claim,
            phase: Phase::WaitingForFloor,
            timers: Timers::new(start, renew_every, renews),
            floor_wait_since: None,
            namespace_trouble: false,
            renew_every,
            outage_since: None,
            past_deadline: false,
        }
    }

    /// The action due at `now`, most urgent first; `None` when nothing is.
    pub fn due(&self, now: Instant) -> Option<Due> {
        if self.timers.renew.is_some_and(|t| now >= t) {
            Some(Due::Renew)
        } else if now >= self.timers.fence {
            Some(Due::Fence)
        } else if now >= self.timers.namespace_check {
            Some(Due::NamespaceCheck)
        } else {
            None
        }
    }

    /// The claim while its grants are published.
    pub fn issuing(&self) -> Option<&Claim<L>> {
        (self.phase == Phase::Issuing).then_some(&self.claim)
    }

    /// True when a fence raise asked for now would be acted on: issuing,
    /// and the store answering.
    pub fn raisable(&self) -> bool {
        self.phase == Phase::Issuing && self.outage_since.is_none()
    }

    /// A store request failed at `now`: an outage starts (or goes on).
    pub fn store_failed(&mut self, now: Instant) {
        self.outage_since.get_or_insert(now);
    }

    /// A store request succeeded: any outage is over.
    pub fn store_answered(&mut self) {
        self.outage_since = None;
        self.past_deadline = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::HeldId;
    use snowkeep_client::{MachineId, Millis};

    fn claim(deadline: Option<Instant>) -> Claim {
        Claim {
            held: vec![HeldId {
                machine_id: MachineId(1),
                floor: Millis(10),
                fence: Millis(10),
            }],
            deadline,
            lease: (),
            own_fences: Vec::new(),
        }
    }

    #[test]
    fn actions_come_due_most_urgent_first_and_the_wake_is_the_earliest_timer() {
        let t0 = snowkeep_client::Clock::now(&snowkeep_client::SystemClock);
        let s = Duration::from_secs(1);
        let mut hold = Hold::new(claim(Some(t0 + 3 * s)), t0, s);
        assert_eq!(hold.due(t0), Some(Due::Fence));
        hold.timers.fence = t0 + 2 * s;
        assert_eq!(hold.due(t0), None);
        assert_eq!(hold.timers.next_wake(t0), t0 + GAUGE_REFRESH);
        let later = t0 + s;
        // Renewal and namespace check are both due at 1 s: renewal first.
        assert_eq!(hold.due(later), Some(Due::Renew));
        hold.timers.renew = Some(t0 + 4 * s);
        assert_eq!(hold.due(later), Some(Due::NamespaceCheck));
        hold.timers.namespace_check = t0 + 10 * s;
        assert_eq!(hold.timers.next_wake(later), later + GAUGE_REFRESH);
        // The lease deadline (3 s) is no action of its own: issuance outlives
        // it up to the fences, and the renewal goes on being retried.
        hold.timers.fence = t0 + 5 * s;
        assert_eq!(hold.due(t0 + 3 * s), None);
        assert_eq!(
            hold.timers.next_wake(t0 + 3 * s),
            t0 + 3 * s + GAUGE_REFRESH
        );
        assert_eq!(hold.due(t0 + 4 * s), Some(Due::Renew));
    }

    #[test]
    fn a_claim_without_deadline_never_renews() {
        let t0 = snowkeep_client::Clock::now(&snowkeep_client::SystemClock);
        let hold = Hold::new(claim(None), t0, Duration::from_secs(1));
        assert_eq!(hold.timers.renew, None);
        assert_eq!(hold.due(t0 + Duration::from_secs(3600)), Some(Due::Fence));
    }
}
