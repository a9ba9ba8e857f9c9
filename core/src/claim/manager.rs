//! [`ClaimManager`]: the claim loop as a state machine over a [`ClaimStore`].
//!
//! ```text
//!            ┌──────────── lost (reclaim) ────────────┐
//!            v                                        │
//!   claiming ──> holding: waiting for the floor ──> issuing ──> releasing
//!      │                │                            │
//!      └─ fatal         └──────── lost (exit) / fatal ┘
//! ```
//!
//! *Claiming* retries with backoff what may heal; *holding* runs the due
//! actions of [`Hold`] (renew, fence, namespace check) and otherwise sleeps
//! until the next wake, the holder watch, or release; *lost* withdraws every
//! grant at once; *releasing* withdraws, drains, lowers each fence to the
//! last timestamp stamped and gives the machine ids back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use snowkeep_client::{Backoff, FenceDemand, Generator, Grant, Layout, Millis, SharedClock};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::claiming::{fenced_too_far, retried, Claiming};
use super::hold::{Due, Held, Hold, Phase};
use super::{Claim, ClaimStore, LossReason, StoreError};
use crate::metrics as m;

/// What to do when a lease is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLeaseLost {
    /// Stop issuing, then claim again (machine ids, possibly the same ones).
    Reclaim,
    /// Stop issuing and exit with code 1.
    Exit,
}

/// Timing rules of the claim loop.
#[derive(Debug, Clone)]
pub struct ClaimTiming {
    /// The etcd lease TTL; renewals are sent every TTL/3.
    pub lease_ttl: Duration,
    /// How long issuance goes on with the store unreachable: every issuing
    /// holder, busy or idle, keeps its fences at least this far ahead of its
    /// clock, raising them to 1.5 budgets ahead ([`fence_lead`])
    /// once they are less.
    pub outage_budget: Duration,
    /// The longest wait for the clock to pass a claimed id's previous fence.
    pub max_fence_wait: Duration,
    /// On loss: re-claim or exit.
    pub on_lease_lost: OnLeaseLost,
}

/// How far ahead of its clock a holder raises its fences: 1.5 ×
/// `outage_budget`, so a busy holder that raises once its fence is less than
/// one budget ahead raises at most once per half budget. Also the farthest
/// ahead any live holder's fence can be.
pub fn fence_lead(outage_budget: Duration) -> Duration {
    outage_budget + outage_budget / 2
}

/// Delay before retrying a failed claim: 100 ms doubling to 2 s.
const CLAIM_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));
/// Retry delay after a failed renewal or fence advance.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(250);
/// Claims in a row given back for a fence too far ahead (within what a
/// holder could have set) before the loop stops trying other machine ids and
/// waits for the fence instead: when every machine id is fenced ahead (after
/// an import or a confirmed floor raised them all), claiming on would only
/// write a fence key for each machine id of the namespace.
const MAX_FAR_ABANDONS: u32 = 3;

/// A generator and the channel that feeds it grants: one per held machine id.
pub struct Slot {
    /// Publishes the grant.
    pub grant: watch::Sender<Option<Grant>>,
    /// The generator stamping under it (drained at release).
    pub generator: Arc<Generator>,
}

/// Drives one lease over N machine ids and publishes the generators' grants.
pub struct ClaimManager<S> {
    store: S,
    layout: Layout,
    namespace: String,
    clock: SharedClock,
    timing: ClaimTiming,
    slots: Vec<Slot>,
    /// Raise requests from callers that found a fence reached.
    demand: Arc<FenceDemand>,
}

impl<S: ClaimStore> ClaimManager<S> {
    /// Creates a manager; nothing happens until [`ClaimManager::run`]. The
    /// store claims exactly `slots.len()` machine ids.
    pub fn new(
        store: S,
        layout: Layout,
        namespace: String,
        clock: SharedClock,
        timing: ClaimTiming,
        slots: Vec<Slot>,
        demand: Arc<FenceDemand>,
    ) -> Self {
        Self {
            store,
            layout,
            namespace,
            clock,
            timing,
            slots,
            demand,
        }
    }

    fn now_ms(&self) -> Millis {
        self.clock.layout_ms(&self.layout)
    }

    /// Claims, issues and renews until `release` is cancelled, then drains and
    /// releases. Returns an error for conditions that need an operator (no free
    /// machine id, fence too far ahead, lease lost with `--on-lease-lost exit`).
    pub async fn run(mut self, release: CancellationToken) -> Result<(), StoreError> {
        let mut claiming = Claiming::new(Backoff::new(CLAIM_BACKOFF.0, CLAIM_BACKOFF.1));
        loop {
            let Some(claim) = self.claim(&mut claiming, &release).await? else {
                return Ok(());
            };
            match self.hold(claim, &release).await {
                (claim, Held::Released) => {
                    self.release(claim).await;
                    return Ok(());
                }
                (claim, Held::Fatal(e)) => {
                    self.withdraw();
                    self.store.abandon(&claim).await;
                    return Err(e);
                }
                (claim, Held::Lost(reason)) => self.lost(claim, reason).await?,
            }
        }
    }

    /// Claiming: claims until a claim the loop can hold comes back (`None`
    /// when release comes first), retrying what may heal with backoff.
    async fn claim(
        &mut self,
        state: &mut Claiming,
        release: &CancellationToken,
    ) -> Result<Option<Claim<S::Lease>>, StoreError> {
        // Consecutive claims given back for a fence too far ahead, and the
        // lowest of those fences.
        let mut far = (0u32, Millis(u64::MAX));
        loop {
            let claimed = tokio::select! {
                _ = release.cancelled() => return Ok(None),
                r = self.store.claim() => r,
            };
            let claim = match claimed {
                Ok(c) => c,
                Err(e) => {
                    let retry = retried(&e, state.held_before)
                        || self.a_holders_fence(&e)
                        || tokio::select! {
                            _ = release.cancelled() => return Ok(None),
                            w = state.waits_for_lease_end(&e, &mut self.store, &self.clock, fence_lead(self.timing.outage_budget)) => w,
                        };
                    if !retry {
                        return Err(e);
                    }
                    let wait = state.backoff.next_delay();
                    warn!(namespace = %self.namespace, error = %crate::DisplayChain(&e), retry_in = ?wait, "claim failed");
                    tokio::select! {
                        _ = release.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
            };
            debug_assert_eq!(claim.held.len(), self.slots.len());
            state.backoff.reset();
            state.held_before = true;
            state.lease_end_deadline = None;
            state.unanswered_deadline = None;
            // A claim holding one of its own ids (a stable instance back from
            // a crash) waits for all its fences up to one fence lead; any
            // other claim up to --max-fence-wait.
            let own_wait = fence_lead(self.timing.outage_budget);
            if let Some(err) =
                fenced_too_far(&claim, self.now_ms(), self.timing.max_fence_wait, own_wait)
            {
                if !self.store.may_claim_others() {
                    // The store has only these ids: nothing else to try.
                    return Err(err);
                }
                if !self.give_back(&claim, &err, &mut far, release).await {
                    return Ok(None);
                }
                continue;
            }
            return Ok(Some(claim));
        }
    }

    /// Gives back `claim`, one of whose machine ids is fenced too far ahead
    /// (`err`): etcd skips such ids when ranking, so this one's fence moved
    /// after the ranking read. Revoking frees the keys, leaves the fence and
    /// records no last holder. After [`MAX_FAR_ABANDONS`] such claims in a
    /// row (`far`: their count and lowest fence), waits until the lowest is
    /// within `--max-fence-wait` instead of claiming more (NOT_SERVING
    /// meanwhile). False when release came first.
    async fn give_back(
        &mut self,
        claim: &Claim<S::Lease>,
        err: &StoreError,
        far: &mut (u32, Millis),
        release: &CancellationToken,
    ) -> bool {
        let StoreError::FenceTooFarAhead { fence, .. } = err else {
            return true;
        };
        warn!(error = %crate::DisplayChain(err), "claimed machine id is fenced too far ahead; claiming again");
        self.store.abandon(claim).await;
        *far = (far.0 + 1, far.1.min(*fence));
        if far.0 < MAX_FAR_ABANDONS || !self.a_holders_fence(err) {
            return true;
        }
        let until = far
            .1
            .get()
            .saturating_sub(Millis::of(self.timing.max_fence_wait).get());
        let wait = Duration::from_millis(until.saturating_sub(self.now_ms().get()));
        warn!(namespace = %self.namespace, claims = far.0, wait = ?wait, "every machine id claimed in a row is fenced too far ahead (as after an import or a confirmed floor): waiting for the fence instead of claiming more");
        *far = (0, Millis(u64::MAX));
        tokio::select! {
            _ = release.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }

    /// True for a fence too far ahead to wait for now that a holder of this
    /// namespace could have set: at most one fence lead (1.5 outage budgets)
    /// plus `--max-fence-wait` ahead, as a crashed busy holder's (or the
    /// conservative floor of a missing fence key) is. It passes within that
    /// time, so the claim is retried (NOT_SERVING meanwhile) instead of
    /// ending the process: a narrow `--machine-id-range` restarted after a
    /// crash waits. A fence further ahead is a clock or an operator's doing.
    fn a_holders_fence(&self, e: &StoreError) -> bool {
        let StoreError::FenceTooFarAhead { ahead, .. } = e else {
            return false;
        };
        *ahead <= fence_lead(self.timing.outage_budget) + self.timing.max_fence_wait
    }

    /// Holding: waits past the claim's floors, keeps the fences ahead of the
    /// clock and the lease renewed, until it is lost or release is asked for.
    async fn hold(
        &mut self,
        claim: Claim<S::Lease>,
        release: &CancellationToken,
    ) -> (Claim<S::Lease>, Held) {
        let mut hold = Hold::new(claim, self.clock.now(), self.timing.lease_ttl / 3);
        let mut holder_watch = self.store.watch_holders(&hold.claim);
        loop {
            let now = self.clock.now();
            // Each turn, not only when idle: during an outage every turn runs
            // a store request that fails only after its timeouts (seconds),
            // and the remaining-budget gauge must count down meanwhile.
            self.publish_gauges(Some(&hold));
            let ended = match hold.due(now) {
                Some(Due::Renew) => self.renew(&mut hold).await,
                Some(Due::Fence) => self.fence(&mut hold, now).await,
                Some(Due::NamespaceCheck) => self.check_namespace(&mut hold, now).await,
                None => {
                    let wake = hold.timers.next_wake(now);
                    tokio::select! {
                        _ = release.cancelled() => Some(Held::Released),
                        outcome = &mut holder_watch => Some(match outcome {
                            Ok(reason) => Held::Lost(reason),
                            Err(e) => Held::Fatal(e),
                        }),
                        // Only while issuing: before, the first raise is
                        // already on its way.
                        _ = self.demand.requested(), if hold.phase == Phase::Issuing => {
                            hold.timers.fence = now;
                            None
                        }
                        _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => None,
                    }
                }
            };
            self.demand.set_raisable(hold.raisable());
            if let Some(ended) = ended {
                return (hold.claim, ended);
            }
        }
    }

    /// Due action: renews the lease; the deadline moves to the send time +
    /// TTL. A renewal that fails starts (or continues) an outage: issuance
    /// goes on below the persisted fences, the lease deadline passing or not
    /// (the lease decides who may raise a fence and when a dead holder's
    /// machine id may be claimed, not how long a holder stamps below its own
    /// fence), until the store answers or says the claim is gone.
    async fn renew(&mut self, hold: &mut Hold<S::Lease>) -> Option<Held> {
        let sent = self.clock.now();
        match self.store.renew(&hold.claim).await {
            Ok(deadline) => {
                let took = self.clock.now().saturating_duration_since(sent);
                metrics::counter!(m::LEASE_RENEWALS_TOTAL, "result" => "ok").increment(1);
                metrics::histogram!(m::LEASE_RENEWAL_DURATION_SECONDS).record(took.as_secs_f64());
                hold.claim.deadline = Some(deadline);
                hold.timers.renew = Some(sent + hold.renew_every);
                if hold.outage_since.is_some() {
                    info!(namespace = %self.namespace, machine_ids = ?hold.claim.machine_ids(), "the store answers again; the outage is over");
                }
                hold.store_answered();
                None
            }
            Err(StoreError::LeaseLost { reason }) => Some(Held::Lost(reason)),
            Err(e) => {
                let now = self.clock.now();
                hold.store_failed(now);
                if !hold.past_deadline && hold.claim.deadline.is_some_and(|d| now >= d) {
                    hold.past_deadline = true;
                    let left = self.fence_headroom(&hold.claim);
                    warn!(namespace = %self.namespace, machine_ids = ?hold.claim.machine_ids(), issuing_for_s = left, "the etcd lease deadline passed without a renewal; issuing on below the persisted fences until they are reached (the outage budget), since a new holder of these machine ids starts above them");
                }
                hold.timers.renew = Some(self.retry_after(
                    m::LEASE_RENEWALS_TOTAL,
                    "lease renewal",
                    &hold.claim,
                    &e,
                ));
                None
            }
        }
    }

    /// Due action: waits on while the clock is not past the floors; else
    /// raises the fences when they need it, and otherwise says when to look
    /// again. They need it whenever the lowest fence is one outage budget or
    /// less ahead, busy or idle (design.md, *Outage budget*): every issuing
    /// holder keeps at least one budget of issuance in hand, at one write per
    /// half budget for all its machine ids. The first grant is published
    /// after such a write, or at once when the claim itself persisted every
    /// fence more than a budget ahead (a never-used machine id's fence key,
    /// created at the value a first raise would write): a grant's fence is
    /// always one the store holds.
    async fn fence(&mut self, hold: &mut Hold<S::Lease>, now: Instant) -> Option<Held> {
        let now_ms = self.now_ms();
        let floor = hold.claim.max_floor();
        if now_ms < self.layout.first_stamp_after(floor) {
            self.wait_for_floor(hold, now, now_ms, floor);
            return None;
        }
        let budget_ms = Millis::of(self.timing.outage_budget).get();
        let ahead = hold.claim.min_fence().get().saturating_sub(now_ms.get());
        let first = hold.phase == Phase::WaitingForFloor;
        // Only fences the claim itself persisted above every floor (the etcd
        // store's created fence keys) stand for a first raise.
        let claimed_ahead = hold.claim.held.iter().all(|h| h.fence > h.floor);
        if ahead <= budget_ms || (first && !claimed_ahead) {
            return self.raise_fences(hold, now_ms).await;
        }
        if first {
            self.fences_persisted(hold);
            return None;
        }
        hold.timers.fence = now + Duration::from_millis(ahead - budget_ms);
        None
    }

    /// Seconds from the clock to the lowest fence of `claim` (0 once reached).
    fn fence_headroom(&self, claim: &Claim<S::Lease>) -> f64 {
        let ahead = claim.min_fence().get().saturating_sub(self.now_ms().get());
        ahead as f64 / 1000.0
    }

    /// The clock is not past the floor's tick (design.md, fence protocol
    /// rule 3): wake again when the first stamp above it may be made.
    fn wait_for_floor(
        &self,
        hold: &mut Hold<S::Lease>,
        now: Instant,
        now_ms: Millis,
        floor: Millis,
    ) {
        let first = self.layout.first_stamp_after(floor);
        let wait = Duration::from_millis(first.get().saturating_sub(now_ms.get()));
        if hold.floor_wait_since.is_none() {
            hold.floor_wait_since = Some(now);
            metrics::counter!(m::FENCE_WAITS_TOTAL).increment(1);
            info!(namespace = %self.namespace, machine_ids = ?hold.claim.machine_ids(), fence_ms = floor.get(), wait = ?wait, "waiting for the clock to pass the claimed machine ids' floor (the previous holder's fence, or the namespace floor for a never-used id)");
        }
        hold.timers.fence = now + wait;
    }

    /// Persists every fence 1.5 outage budgets ahead of the clock (never
    /// lower than it is) in one store request, and only then publishes the
    /// grants carrying them.
    async fn raise_fences(&mut self, hold: &mut Hold<S::Lease>, now_ms: Millis) -> Option<Held> {
        let lead_ms = Millis::of(fence_lead(self.timing.outage_budget)).get();
        let target = Millis(now_ms.get().saturating_add(lead_ms));
        // Never lower a fence while holding it (a clock stepped back).
        let fences: Vec<Millis> = hold
            .claim
            .held
            .iter()
            .map(|h| target.max(h.fence))
            .collect();
        match self.store.advance_fences(&hold.claim, &fences).await {
            Ok(()) => {
                metrics::counter!(m::FENCE_ADVANCES_TOTAL, "result" => "ok").increment(1);
                hold.store_answered();
                for (h, f) in hold.claim.held.iter_mut().zip(&fences) {
                    h.fence = *f;
                }
                self.fences_persisted(hold);
                None
            }
            Err(StoreError::LeaseLost { reason }) => Some(Held::Lost(reason)),
            Err(e) => {
                hold.store_failed(self.clock.now());
                hold.timers.fence =
                    self.retry_after(m::FENCE_ADVANCES_TOTAL, "fence advance", &hold.claim, &e);
                None
            }
        }
    }

    /// The store holds the claim's fences as `hold` records them: publishes
    /// the grants carrying them (the first ones too, ending a floor wait),
    /// and looks again once the lowest is one outage budget ahead.
    fn fences_persisted(&self, hold: &mut Hold<S::Lease>) {
        let lowest = hold.claim.min_fence();
        let now = self.clock.now();
        if let Some(since) = hold.floor_wait_since.take() {
            metrics::histogram!(m::FENCE_WAIT_DURATION_SECONDS)
                .record(now.saturating_duration_since(since).as_secs_f64());
        }
        if hold.phase == Phase::WaitingForFloor {
            info!(namespace = %self.namespace, machine_ids = ?hold.claim.machine_ids(), fence_ms = lowest.get(), "issuing");
            hold.phase = Phase::Issuing;
        }
        self.publish(&hold.claim);
        let ahead = lowest.get().saturating_sub(self.now_ms().get());
        let budget_ms = Millis::of(self.timing.outage_budget).get();
        hold.timers.fence = now + Duration::from_millis(ahead.saturating_sub(budget_ms));
    }

    /// Due action: re-checks the namespace. Rolled back ends the hold as a
    /// loss, a layout mismatch as fatal; anything else issues on.
    async fn check_namespace(&mut self, hold: &mut Hold<S::Lease>, now: Instant) -> Option<Held> {
        hold.timers.namespace_check = now + hold.renew_every;
        match self.store.check_namespace().await {
            Ok(()) => hold.namespace_trouble = false,
            Err(StoreError::NamespaceRolledBack { .. }) => {
                return Some(Held::Lost(LossReason::RolledBack))
            }
            Err(e @ StoreError::LayoutMismatch { .. }) => return Some(Held::Fatal(e)),
            // The record missing or unreadable while our holder keys and
            // fences stand: the claim is still ours and safe, so keep issuing
            // under it (a wipe takes the holder keys and the lease too, which
            // stops issuance at once); a new claim waits for an operator.
            Err(
                e @ (StoreError::NamespaceNotCreated { .. } | StoreError::CorruptNamespace { .. }),
            ) => {
                if !hold.namespace_trouble {
                    error!(namespace = %self.namespace, machine_ids = ?hold.claim.machine_ids(), error = %crate::DisplayChain(&e), "the namespace record is gone or unreadable; issuing on under the machine ids held, but no new claim until an operator repairs it");
                }
                hold.namespace_trouble = true;
            }
            // The store unreachable or slow: outage tolerance, as for renewals.
            Err(e) => {
                debug!(namespace = %self.namespace, error = %crate::DisplayChain(&e), "namespace check failed; retrying at the next one")
            }
        }
        None
    }

    /// Lost: withdraws every grant at once, counts and logs the loss, gives
    /// up a claim the store still binds, then claims again or (with
    /// `--on-lease-lost exit`) ends with [`StoreError::LeaseLost`].
    async fn lost(&mut self, claim: Claim<S::Lease>, reason: LossReason) -> Result<(), StoreError> {
        self.withdraw();
        metrics::counter!(m::LEASE_LOSSES_TOTAL, "reason" => reason.as_str()).increment(1);
        super::loss::log_loss(
            &self.namespace,
            &claim.machine_ids(),
            reason,
            self.timing.on_lease_lost,
        );
        if matches!(reason, LossReason::HolderChanged | LossReason::RolledBack) {
            self.store.abandon(&claim).await;
        }
        match self.timing.on_lease_lost {
            OnLeaseLost::Exit => Err(StoreError::LeaseLost { reason }),
            OnLeaseLost::Reclaim => Ok(()),
        }
    }

    /// Counts (`metric{result="error"}`) and logs a failed store request the
    /// loop retries; returns when to retry it.
    fn retry_after(
        &self,
        metric: &'static str,
        op: &'static str,
        claim: &Claim<S::Lease>,
        e: &StoreError,
    ) -> Instant {
        metrics::counter!(metric, "result" => "error").increment(1);
        warn!(namespace = %self.namespace, machine_ids = ?claim.machine_ids(), op, error = %crate::DisplayChain(e), "store request failed; retrying");
        self.clock.now() + RETRY_AFTER_FAILURE
    }

    /// Publishes each slot's grant. No deadline: the fence alone bounds
    /// issuance (stamps above it are refused), so it outlives a lease that
    /// could not be renewed.
    fn publish(&self, claim: &Claim<S::Lease>) {
        for (slot, h) in self.slots.iter().zip(&claim.held) {
            slot.grant.send_replace(Some(Grant {
                machine_id: h.machine_id,
                floor: h.floor,
                fence: h.fence,
                deadline: None,
            }));
        }
    }

    fn withdraw(&self) {
        self.demand.set_raisable(false);
        for slot in &self.slots {
            slot.grant.send_replace(None);
        }
        self.publish_gauges(None);
    }

    /// The hold's gauges; `None` (or a hold not issuing) zeroes them.
    fn publish_gauges(&self, hold: Option<&Hold<S::Lease>>) {
        let ns = self.namespace.clone();
        let budget = self.timing.outage_budget.as_secs_f64();
        let (held, remaining, headroom, budget_left) = match hold.and_then(|h| h.issuing()) {
            Some(c) => {
                let remaining = c
                    .deadline
                    .map(|d| d.saturating_duration_since(self.clock.now()).as_secs_f64())
                    .unwrap_or(0.0);
                let min_fence = c.min_fence();
                let headroom = (min_fence.get() as f64 - self.now_ms().get() as f64) / 1000.0;
                // What an outage starting now would leave: the way to
                // the lowest fence, whether or not the store answers.
                let budget_left = self.fence_headroom(c);
                (c.held.len() as f64, remaining, headroom, budget_left)
            }
            None => (0.0, 0.0, 0.0, 0.0),
        };
        metrics::gauge!(m::MACHINE_IDS_HELD, "namespace" => ns.clone()).set(held);
        metrics::gauge!(m::LEASE_REMAINING_SECONDS).set(remaining);
        metrics::gauge!(m::FENCE_HEADROOM_SECONDS, "namespace" => ns.clone()).set(headroom);
        metrics::gauge!(m::OUTAGE_BUDGET_SECONDS, "namespace" => ns.clone()).set(budget);
        metrics::gauge!(m::OUTAGE_BUDGET_REMAINING_SECONDS, "namespace" => ns).set(budget_left);
    }

    /// Releasing: withdraws the grants, drains the generators and releases
    /// the claim with each fence lowered to the last timestamp stamped.
    /// Failures are logged only.
    async fn release(&mut self, claim: Claim<S::Lease>) {
        self.withdraw();
        let last_used: Vec<Millis> = self
            .slots
            .iter()
            .zip(&claim.held)
            .map(|(slot, h)| match slot.generator.drain() {
                Some((machine_id, last)) if machine_id == h.machine_id => last.max(h.floor),
                _ => h.floor,
            })
            .collect();
        if let Err(e) = self.store.release(&claim, &last_used).await {
            warn!(namespace = %self.namespace, machine_ids = ?claim.machine_ids(), error = %crate::DisplayChain(&e), "release failed; the machine ids free themselves when the lease expires");
        }
    }
}
