//! The machine-id lease lifecycle (docs/design.md, lease lifecycle): claim → wait past the previous
//! fences → raise the fences → issue while renewing → lose or release.
//!
//! [`LeaseManager::run`] is one loop over one [`LeaseStore`] (etcd, or the
//! embedded single-instance file store). An instance holds `N` machine ids under one
//! lease; slot `i` of the claim feeds generator `i`. The loop is the only
//! writer of the generators' [`Grant`] channels:
//!
//! * a grant is published only after the fence it carries is persisted
//!   (design.md, fence protocol rule 2), and only once the clock is past the claim's floors (rule 3);
//! * its deadline is the send time of the last successful renewal + TTL, so the
//!   generator stops by its own monotonic clock even when this loop is stuck;
//! * on loss every grant is withdrawn at once, then the loop re-claims (or exits);
//! * on release the grants are withdrawn, the generators drained, and each
//!   fence lowered to the last timestamp actually stamped (rule 4).

pub mod capacity;
pub mod claim;
mod error;
pub mod skew;
mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use snowkeep_client::{Generator, Grant, Layout, Millis, SharedClock};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use error::{LeaseError, LossReason};
pub use store::{Capacity, Claim, HeldId, HolderWatch, LeaseStore};

use crate::metrics as m;

/// What to do when a lease is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLeaseLost {
    /// Stop issuing, then claim again (machine ids, possibly the same ones).
    Reclaim,
    /// Stop issuing and exit with code 1.
    Exit,
}

/// Timing rules of the lease loop.
#[derive(Debug, Clone)]
pub struct LeaseTiming {
    /// The etcd lease TTL; renewals are sent every TTL/3.
    pub lease_ttl: Duration,
    /// How far ahead of the clock the fences are raised.
    pub fence_horizon: Duration,
    /// The longest wait for the clock to pass a claimed id's previous fence.
    pub max_fence_wait: Duration,
    /// On loss: re-claim or exit.
    pub on_lease_lost: OnLeaseLost,
}

/// Delay before retrying a failed claim: 100 ms doubling to 2 s.
const CLAIM_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));
/// Retry delay after a failed renewal or fence advance.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(250);
/// Gauges are refreshed at least this often.
const GAUGE_REFRESH: Duration = Duration::from_millis(500);

/// A generator and the channel that feeds it grants: one per held machine id.
pub struct Slot {
    /// Publishes the grant.
    pub grant: watch::Sender<Option<Grant>>,
    /// The generator stamping under it (drained at release).
    pub generator: Arc<Generator>,
}

/// Drives one lease over N machine ids and publishes the generators' grants.
pub struct LeaseManager<S> {
    store: S,
    layout: Layout,
    namespace: String,
    clock: SharedClock,
    timing: LeaseTiming,
    slots: Vec<Slot>,
}

enum Held {
    Released,
    Lost(LossReason),
    Fatal(LeaseError),
}

impl<S: LeaseStore> LeaseManager<S> {
    /// Creates a manager; nothing happens until [`LeaseManager::run`]. The
    /// store claims exactly `slots.len()` machine ids.
    pub fn new(
        store: S,
        layout: Layout,
        namespace: String,
        clock: SharedClock,
        timing: LeaseTiming,
        slots: Vec<Slot>,
    ) -> Self {
        Self {
            store,
            layout,
            namespace,
            clock,
            timing,
            slots,
        }
    }

    fn now_ms(&self) -> Millis {
        self.layout
            .to_layout_ms(self.clock.unix_ms())
            .unwrap_or_default()
    }

    /// Claims, issues and renews until `release` is cancelled, then drains and
    /// releases. Returns an error for conditions that need an operator (no free
    /// machine id, fence too far ahead, lease lost with `--on-lease-lost exit`).
    pub async fn run(mut self, release: CancellationToken) -> Result<(), LeaseError> {
        let mut backoff = CLAIM_BACKOFF.0;
        // Before the first claim, a full pool or far fences are an operator's
        // problem (exit); after a loss, others may release, so keep trying.
        let mut held_before = false;
        loop {
            let claimed = tokio::select! {
                _ = release.cancelled() => return Ok(()),
                r = self.store.claim() => r,
            };
            let claim = match claimed {
                Ok(c) => c,
                Err(e)
                    if e.is_retryable()
                        || (held_before
                            && matches!(
                                e,
                                LeaseError::NoFreeMachineId { .. }
                                    | LeaseError::FenceTooFarAhead { .. }
                                    // Until an operator fixes the namespace:
                                    // NOT_SERVING, the reason logged each retry.
                                    | LeaseError::NamespaceNotCreated { .. }
                                    | LeaseError::CorruptNamespace { .. }
                                    | LeaseError::NamespaceRolledBack { .. }
                                    | LeaseError::NamespaceFloorAhead { .. }
                            )) =>
                {
                    warn!(namespace = %self.namespace, error = %crate::DisplayChain(&e), retry_in = ?backoff, "claim failed");
                    tokio::select! {
                        _ = release.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(CLAIM_BACKOFF.1);
                    continue;
                }
                Err(e) => return Err(e),
            };
            debug_assert_eq!(claim.held.len(), self.slots.len());
            backoff = CLAIM_BACKOFF.0;
            held_before = true;
            let now = self.now_ms();
            if let Some(h) = claim.held.iter().max_by_key(|h| h.floor) {
                let ahead = Duration::from_millis(h.floor.get().saturating_sub(now.get()));
                if ahead > self.timing.max_fence_wait {
                    let err = LeaseError::FenceTooFarAhead {
                        machine_id: h.machine_id,
                        fence: h.floor,
                        ahead,
                        max: self.timing.max_fence_wait,
                    };
                    if !self.store.may_claim_others() {
                        // The store has only these ids: nothing else to try.
                        return Err(err);
                    }
                    // etcd skips such ids when ranking; this one's fence moved
                    // after the ranking read. Give it back untouched (revoking
                    // frees the keys, leaves the fence and records no last
                    // holder) and claim again.
                    warn!(error = %crate::DisplayChain(&err), "claimed machine id is fenced too far ahead; claiming again");
                    self.store.abandon(&claim).await;
                    continue;
                }
            }
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
                (claim, Held::Lost(reason)) => {
                    self.withdraw();
                    metrics::counter!(m::LEASE_LOSSES_TOTAL, "reason" => reason.as_str())
                        .increment(1);
                    error!(namespace = %self.namespace, machine_ids = ?claim.machine_ids(), %reason, "machine-id lease lost; issuance stopped");
                    if matches!(
                        reason,
                        LossReason::HolderChanged | LossReason::Revoked | LossReason::RolledBack
                    ) {
                        self.store.abandon(&claim).await;
                    }
                    if self.timing.on_lease_lost == OnLeaseLost::Exit {
                        return Err(LeaseError::LeaseLost { reason });
                    }
                }
            }
        }
    }

    /// Holds one claim: waits past its floors, keeps the fences ahead of the
    /// clock and the lease renewed, until it is lost or release is asked for.
    async fn hold(
        &mut self,
        mut claim: Claim<S::Lease>,
        release: &CancellationToken,
    ) -> (Claim<S::Lease>, Held) {
        let renew_every = self.timing.lease_ttl / 3;
        let start = self.clock.now();
        let mut next_renew = start + renew_every;
        let mut fence_due = start;
        let mut published = false;
        let mut waited_since: Option<Instant> = None;
        let mut next_namespace_check = start + renew_every;
        let mut namespace_trouble = false;
        let mut holder_watch = self.store.watch_holders(&claim);
        loop {
            let now = self.clock.now();
            if claim.deadline.is_some_and(|d| now >= d) {
                return (claim, Held::Lost(LossReason::Deadline));
            }
            if claim.deadline.is_some() && now >= next_renew {
                let sent = self.clock.now();
                match self.store.renew(&claim).await {
                    Ok(deadline) => {
                        let took = self.clock.now().saturating_duration_since(sent);
                        metrics::counter!(m::LEASE_RENEWALS_TOTAL, "result" => "ok").increment(1);
                        metrics::histogram!(m::LEASE_RENEWAL_DURATION_SECONDS)
                            .record(took.as_secs_f64());
                        claim.deadline = Some(deadline);
                        next_renew = sent + renew_every;
                        if published {
                            self.publish(&claim);
                        }
                    }
                    Err(LeaseError::LeaseLost { reason }) => return (claim, Held::Lost(reason)),
                    Err(e) => {
                        next_renew =
                            self.retry_after(m::LEASE_RENEWALS_TOTAL, "lease renewal", &claim, &e)
                    }
                }
                continue;
            }
            if now >= fence_due {
                let now_ms = self.now_ms();
                let floor = claim.max_floor();
                if now_ms <= floor {
                    // design.md, fence protocol rule 3: wait for the clock to pass the previous fences.
                    let wait = Duration::from_millis(floor.get() - now_ms.get() + 1);
                    if waited_since.is_none() {
                        waited_since = Some(now);
                        metrics::counter!(m::FENCE_WAITS_TOTAL).increment(1);
                        info!(namespace = %self.namespace, machine_ids = ?claim.machine_ids(), fence_ms = floor.get(), wait = ?wait, "waiting for the clock to pass the claimed machine ids' floor (the previous holder's fence, or one fence horizon for a never-used id)");
                    }
                    fence_due = now + wait;
                } else {
                    let horizon_ms =
                        u64::try_from(self.timing.fence_horizon.as_millis()).unwrap_or(u64::MAX);
                    let target = Millis(now_ms.get().saturating_add(horizon_ms));
                    // Never lower a fence while holding it (a clock stepped back).
                    let fences: Vec<Millis> =
                        claim.held.iter().map(|h| target.max(h.fence)).collect();
                    match self.store.advance_fences(&claim, &fences).await {
                        Ok(()) => {
                            metrics::counter!(m::FENCE_ADVANCES_TOTAL, "result" => "ok")
                                .increment(1);
                            for (h, f) in claim.held.iter_mut().zip(&fences) {
                                h.fence = *f;
                            }
                            if let Some(since) = waited_since.take() {
                                metrics::histogram!(m::FENCE_WAIT_DURATION_SECONDS).record(
                                    self.clock
                                        .now()
                                        .saturating_duration_since(since)
                                        .as_secs_f64(),
                                );
                            }
                            if !published {
                                info!(namespace = %self.namespace, machine_ids = ?claim.machine_ids(), fence_ms = target.get(), "issuing");
                            }
                            published = true;
                            self.publish(&claim);
                            fence_due = self.clock.now() + self.timing.fence_horizon / 2;
                        }
                        Err(LeaseError::LeaseLost { reason }) => {
                            return (claim, Held::Lost(reason))
                        }
                        Err(e) => {
                            fence_due = self.retry_after(
                                m::FENCE_ADVANCES_TOTAL,
                                "fence advance",
                                &claim,
                                &e,
                            )
                        }
                    }
                }
                continue;
            }
            if now >= next_namespace_check {
                next_namespace_check = now + renew_every;
                match self.store.check_namespace().await {
                    Ok(()) => namespace_trouble = false,
                    Err(LeaseError::NamespaceRolledBack { .. }) => {
                        return (claim, Held::Lost(LossReason::RolledBack))
                    }
                    Err(e @ LeaseError::LayoutMismatch { .. }) => return (claim, Held::Fatal(e)),
                    // The record missing or unreadable while our holder keys
                    // and fences stand: the claim is still ours and safe, so
                    // keep issuing under it (a wipe takes the holder keys and
                    // the lease too, which stops issuance at once); a new claim
                    // waits for an operator.
                    Err(
                        e @ (LeaseError::NamespaceNotCreated { .. }
                        | LeaseError::CorruptNamespace { .. }),
                    ) => {
                        if !namespace_trouble {
                            error!(namespace = %self.namespace, machine_ids = ?claim.machine_ids(), error = %crate::DisplayChain(&e), "the namespace record is gone or unreadable; issuing on under the machine ids held, but no new claim until an operator repairs it");
                        }
                        namespace_trouble = true;
                    }
                    // etcd unreachable or slow: outage tolerance, as for renewals.
                    Err(e) => {
                        debug!(namespace = %self.namespace, error = %crate::DisplayChain(&e), "namespace check failed; retrying at the next one")
                    }
                }
                continue;
            }
            self.publish_gauges(published.then_some(&claim));
            let mut wake = fence_due.min(now + GAUGE_REFRESH).min(next_namespace_check);
            if claim.deadline.is_some() {
                wake = wake.min(next_renew);
            }
            if let Some(d) = claim.deadline {
                wake = wake.min(d);
            }
            tokio::select! {
                _ = release.cancelled() => return (claim, Held::Released),
                outcome = &mut holder_watch => {
                    return match outcome {
                        Ok(reason) => (claim, Held::Lost(reason)),
                        Err(e) => (claim, Held::Fatal(e)),
                    };
                }
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
            }
        }
    }

    /// Counts (`metric{result="error"}`) and logs a failed store request the
    /// loop retries; returns when to retry it.
    fn retry_after(
        &self,
        metric: &'static str,
        op: &'static str,
        claim: &Claim<S::Lease>,
        e: &LeaseError,
    ) -> Instant {
        metrics::counter!(metric, "result" => "error").increment(1);
        warn!(namespace = %self.namespace, machine_ids = ?claim.machine_ids(), op, error = %crate::DisplayChain(e), "store request failed; retrying");
        self.clock.now() + RETRY_AFTER_FAILURE
    }

    fn publish(&self, claim: &Claim<S::Lease>) {
        for (slot, h) in self.slots.iter().zip(&claim.held) {
            slot.grant.send_replace(Some(Grant {
                machine_id: h.machine_id,
                floor: h.floor,
                fence: h.fence,
                deadline: claim.deadline,
            }));
        }
    }

    fn withdraw(&self) {
        for slot in &self.slots {
            slot.grant.send_replace(None);
        }
        self.publish_gauges(None);
    }

    fn publish_gauges(&self, claim: Option<&Claim<S::Lease>>) {
        let ns = self.namespace.clone();
        let (held, remaining, headroom) = match claim {
            Some(c) => {
                let remaining = c
                    .deadline
                    .map(|d| d.saturating_duration_since(self.clock.now()).as_secs_f64())
                    .unwrap_or(0.0);
                let min_fence = c.held.iter().map(|h| h.fence).min().unwrap_or_default();
                let headroom = (min_fence.get() as f64 - self.now_ms().get() as f64) / 1000.0;
                (c.held.len() as f64, remaining, headroom)
            }
            None => (0.0, 0.0, 0.0),
        };
        metrics::gauge!(m::MACHINE_IDS_HELD, "namespace" => ns.clone()).set(held);
        metrics::gauge!(m::LEASE_REMAINING_SECONDS).set(remaining);
        metrics::gauge!(m::FENCE_HEADROOM_SECONDS, "namespace" => ns).set(headroom);
    }

    /// Withdraws the grants, drains the generators and releases the claim with
    /// each fence lowered to the last timestamp stamped. Failures are logged only.
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
