//! The machine-id lease lifecycle (DESIGN §3): claim → wait past the previous
//! fence → raise the fence → issue while renewing → lose or release.
//!
//! [`LeaseManager::run`] is one loop over one [`Store`] (etcd, or the embedded
//! single-instance file store). It is the only writer of the generator's
//! [`Grant`] channel:
//!
//! * a grant is published only after the fence it carries is persisted
//!   (DESIGN §2.2), and only once the clock is past the claim's floor (§2.3);
//! * its deadline is the send time of the last successful renewal + TTL, so the
//!   generator stops by its own monotonic clock even when this loop is stuck;
//! * on loss the grant is withdrawn at once, then the loop re-claims (or exits);
//! * on release the grant is withdrawn, the generator drained, and the fence
//!   lowered to the last timestamp actually stamped (§2.4).

pub mod claim;
mod error;

use std::sync::Arc;
use std::time::{Duration, Instant};

use snowkeep_client::{Generator, Grant, Layout, MachineId, Millis, SharedClock};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, error, info, warn};

pub use error::{LeaseError, LossReason};

use crate::etcd::EtcdStore;
use crate::local::LocalStore;
use crate::metrics as m;

/// A claimed machine id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The machine id.
    pub machine_id: MachineId,
    /// The previous holder's fence, read after the claim committed: stamped
    /// timestamps must be above it.
    pub floor: Millis,
    /// The fence persisted now (starts at `floor`).
    pub fence: Millis,
    /// The etcd lease; `None` for the embedded store.
    pub lease_id: Option<i64>,
    /// Local lease deadline (monotonic); `None` for the embedded store.
    pub deadline: Option<Instant>,
    /// The store revision at which the claim committed (etcd); 0 otherwise.
    pub revision: i64,
}

/// Machine ids of a namespace (or of this instance's range of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Machine ids in the range.
    pub total: u32,
    /// Machine ids with a holder.
    pub held: u32,
}

impl Capacity {
    /// Machine ids without a holder.
    pub fn free(&self) -> u32 {
        self.total.saturating_sub(self.held)
    }
}

/// Where leases are kept.
#[derive(Debug)]
pub enum Store {
    /// etcd: leases with keepalive, fences in keys.
    Etcd(Box<EtcdStore>),
    /// The embedded single-instance store: a state file.
    Local(LocalStore),
}

impl Store {
    /// The store's name for logs and InfoService: `etcd` or `embedded`.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Etcd(_) => "etcd",
            Store::Local(_) => "embedded",
        }
    }

    async fn claim(&mut self) -> Result<Claim, LeaseError> {
        match self {
            Store::Etcd(s) => s.claim().await,
            Store::Local(s) => Ok(s.claim()),
        }
    }

    async fn advance_fence(&mut self, claim: &Claim, fence: Millis) -> Result<(), LeaseError> {
        match self {
            Store::Etcd(s) => s.advance_fence(claim, fence).await,
            Store::Local(s) => s.write_fence(fence),
        }
    }

    /// Renews the lease; the new deadline, `None` when the store has none.
    async fn renew(&mut self, claim: &Claim) -> Result<Option<Instant>, LeaseError> {
        match self {
            Store::Etcd(s) => s.renew(claim).await.map(Some),
            Store::Local(_) => Ok(None),
        }
    }

    async fn release(&mut self, claim: &Claim, last_used: Millis) -> Result<(), LeaseError> {
        match self {
            Store::Etcd(s) => s.release(claim, last_used).await,
            Store::Local(s) => s.write_fence(last_used),
        }
    }

    async fn forget(&mut self, claim: &Claim) {
        if let Store::Etcd(s) = self {
            s.forget(claim).await;
        }
    }

    /// A task that ends when the claim's holder key changes under us; the
    /// embedded store has no such key, so its task never ends.
    fn watch_holder(&self, claim: &Claim) -> AbortOnDropHandle<LossReason> {
        match self {
            Store::Etcd(s) => s.watch_holder(claim),
            Store::Local(_) => AbortOnDropHandle::new(tokio::spawn(std::future::pending())),
        }
    }

    async fn capacity(&mut self, holding: bool) -> Result<Capacity, LeaseError> {
        match self {
            Store::Etcd(s) => s.capacity().await,
            Store::Local(_) => Ok(Capacity {
                total: 1,
                held: u32::from(holding),
            }),
        }
    }
}

/// What to do when a lease is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLeaseLost {
    /// Stop issuing, then claim again (a machine id, possibly the same one).
    Reclaim,
    /// Stop issuing and exit with code 1.
    Exit,
}

/// Timing rules of the lease loop.
#[derive(Debug, Clone)]
pub struct LeaseTiming {
    /// The etcd lease TTL; renewals are sent every TTL/3.
    pub lease_ttl: Duration,
    /// How far ahead of the clock the fence is raised.
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
/// Namespace capacity is read from the store this often.
const CAPACITY_REFRESH: Duration = Duration::from_secs(5);

/// Drives one machine-id lease and publishes the generator's grant.
pub struct LeaseManager {
    store: Store,
    layout: Layout,
    namespace: String,
    clock: SharedClock,
    timing: LeaseTiming,
    grant: watch::Sender<Option<Grant>>,
    generator: Arc<Generator>,
}

enum Held {
    Released,
    Lost(LossReason),
}

impl LeaseManager {
    /// Creates a manager; nothing happens until [`LeaseManager::run`].
    pub fn new(
        store: Store,
        layout: Layout,
        namespace: String,
        clock: SharedClock,
        timing: LeaseTiming,
        grant: watch::Sender<Option<Grant>>,
        generator: Arc<Generator>,
    ) -> Self {
        Self {
            store,
            layout,
            namespace,
            clock,
            timing,
            grant,
            generator,
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
        loop {
            let claimed = tokio::select! {
                _ = release.cancelled() => return Ok(()),
                r = self.store.claim() => r,
            };
            let claim = match claimed {
                Ok(c) => c,
                Err(e) if e.is_retryable() => {
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
            backoff = CLAIM_BACKOFF.0;
            let ahead = claim.floor.get().saturating_sub(self.now_ms().get());
            if Duration::from_millis(ahead) > self.timing.max_fence_wait {
                let err = LeaseError::FenceTooFarAhead {
                    machine_id: claim.machine_id,
                    fence: claim.floor,
                    ahead: Duration::from_millis(ahead),
                    max: self.timing.max_fence_wait,
                };
                // Give the id back untouched (its fence stays where it was).
                if let Err(e) = self.store.release(&claim, claim.floor).await {
                    warn!(error = %crate::DisplayChain(&e), "could not release the machine id after refusing it");
                }
                return Err(err);
            }
            match self.hold(claim, &release).await {
                (claim, Held::Released) => {
                    self.release(claim).await;
                    return Ok(());
                }
                (claim, Held::Lost(reason)) => {
                    self.grant.send_replace(None);
                    self.publish_gauges(None);
                    metrics::counter!(m::LEASE_LOSSES_TOTAL, "reason" => reason.as_str())
                        .increment(1);
                    error!(namespace = %self.namespace, machine_id = claim.machine_id.get(), %reason, "machine-id lease lost; issuance stopped");
                    if matches!(reason, LossReason::HolderChanged | LossReason::Revoked) {
                        self.store.forget(&claim).await;
                    }
                    if self.timing.on_lease_lost == OnLeaseLost::Exit {
                        return Err(LeaseError::LeaseLost { reason });
                    }
                }
            }
        }
    }

    /// Holds one claim: waits past its floor, keeps the fence ahead of the
    /// clock and the lease renewed, until it is lost or release is asked for.
    async fn hold(&mut self, mut claim: Claim, release: &CancellationToken) -> (Claim, Held) {
        let renew_every = self.timing.lease_ttl / 3;
        let start = self.clock.now();
        let mut next_renew = start + renew_every;
        let mut fence_due = start;
        let mut published = false;
        let mut waited_since: Option<Instant> = None;
        let mut next_capacity = start;
        let mut holder_watch = self.store.watch_holder(&claim);
        loop {
            let now = self.clock.now();
            if claim.deadline.is_some_and(|d| now >= d) {
                return (claim, Held::Lost(LossReason::Deadline));
            }
            if claim.lease_id.is_some() && now >= next_renew {
                let sent = self.clock.now();
                match self.store.renew(&claim).await {
                    Ok(deadline) => {
                        let took = self.clock.now().saturating_duration_since(sent);
                        metrics::counter!(m::LEASE_RENEWALS_TOTAL, "result" => "ok").increment(1);
                        metrics::histogram!(m::LEASE_RENEWAL_DURATION_SECONDS)
                            .record(took.as_secs_f64());
                        claim.deadline = deadline;
                        next_renew = sent + renew_every;
                        if published {
                            self.publish(&claim);
                        }
                    }
                    Err(LeaseError::LeaseLost { reason }) => return (claim, Held::Lost(reason)),
                    Err(e) => {
                        metrics::counter!(m::LEASE_RENEWALS_TOTAL, "result" => "error")
                            .increment(1);
                        warn!(namespace = %self.namespace, machine_id = claim.machine_id.get(), error = %crate::DisplayChain(&e), "lease renewal failed");
                        next_renew = self.clock.now() + RETRY_AFTER_FAILURE;
                    }
                }
                continue;
            }
            if now >= fence_due {
                let now_ms = self.now_ms();
                if now_ms <= claim.floor {
                    // DESIGN §2.3: wait for the clock to pass the previous fence.
                    let wait = Duration::from_millis(claim.floor.get() - now_ms.get() + 1);
                    if waited_since.is_none() {
                        waited_since = Some(now);
                        metrics::counter!(m::FENCE_WAITS_TOTAL).increment(1);
                        info!(namespace = %self.namespace, machine_id = claim.machine_id.get(), fence_ms = claim.floor.get(), wait = ?wait, "waiting for the clock to pass the previous holder's fence");
                    }
                    fence_due = now + wait;
                } else {
                    let horizon_ms =
                        u64::try_from(self.timing.fence_horizon.as_millis()).unwrap_or(u64::MAX);
                    let target = Millis(now_ms.get().saturating_add(horizon_ms)).max(claim.fence);
                    match self.store.advance_fence(&claim, target).await {
                        Ok(()) => {
                            metrics::counter!(m::FENCE_ADVANCES_TOTAL, "result" => "ok")
                                .increment(1);
                            claim.fence = target;
                            if let Some(since) = waited_since.take() {
                                metrics::histogram!(m::FENCE_WAIT_DURATION_SECONDS).record(
                                    self.clock
                                        .now()
                                        .saturating_duration_since(since)
                                        .as_secs_f64(),
                                );
                            }
                            if !published {
                                info!(namespace = %self.namespace, machine_id = claim.machine_id.get(), fence_ms = target.get(), "issuing");
                            }
                            published = true;
                            self.publish(&claim);
                            fence_due = self.clock.now() + self.timing.fence_horizon / 2;
                        }
                        Err(LeaseError::LeaseLost { reason }) => {
                            return (claim, Held::Lost(reason))
                        }
                        Err(e) => {
                            metrics::counter!(m::FENCE_ADVANCES_TOTAL, "result" => "error")
                                .increment(1);
                            warn!(namespace = %self.namespace, machine_id = claim.machine_id.get(), error = %crate::DisplayChain(&e), "fence advance failed");
                            fence_due = self.clock.now() + RETRY_AFTER_FAILURE;
                        }
                    }
                }
                continue;
            }
            if now >= next_capacity {
                next_capacity = now + CAPACITY_REFRESH;
                match self.store.capacity(published).await {
                    Ok(c) => {
                        let ns = self.namespace.clone();
                        metrics::gauge!(m::NAMESPACE_MACHINE_IDS, "namespace" => ns.clone(), "state" => "held")
                            .set(f64::from(c.held));
                        metrics::gauge!(m::NAMESPACE_MACHINE_IDS, "namespace" => ns, "state" => "free")
                            .set(f64::from(c.free()));
                    }
                    Err(e) => debug!(error = %crate::DisplayChain(&e), "capacity read failed"),
                }
                continue;
            }
            self.publish_gauges(published.then_some(&claim));
            let mut wake = fence_due.min(now + GAUGE_REFRESH).min(next_capacity);
            if claim.lease_id.is_some() {
                wake = wake.min(next_renew);
            }
            if let Some(d) = claim.deadline {
                wake = wake.min(d);
            }
            tokio::select! {
                _ = release.cancelled() => return (claim, Held::Released),
                reason = &mut holder_watch => {
                    let reason = reason.unwrap_or(LossReason::HolderChanged);
                    return (claim, Held::Lost(reason));
                }
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
            }
        }
    }

    fn publish(&self, claim: &Claim) {
        self.grant.send_replace(Some(Grant {
            machine_id: claim.machine_id,
            floor: claim.floor,
            fence: claim.fence,
            deadline: claim.deadline,
        }));
    }

    fn publish_gauges(&self, claim: Option<&Claim>) {
        let ns = self.namespace.clone();
        let (held, remaining, headroom) = match claim {
            Some(c) => {
                let remaining = c
                    .deadline
                    .map(|d| d.saturating_duration_since(self.clock.now()).as_secs_f64())
                    .unwrap_or(0.0);
                let headroom = (c.fence.get() as f64 - self.now_ms().get() as f64) / 1000.0;
                (1.0, remaining, headroom)
            }
            None => (0.0, 0.0, 0.0),
        };
        metrics::gauge!(m::MACHINE_IDS_HELD, "namespace" => ns.clone()).set(held);
        metrics::gauge!(m::LEASE_REMAINING_SECONDS).set(remaining);
        metrics::gauge!(m::FENCE_HEADROOM_SECONDS, "namespace" => ns).set(headroom);
    }

    /// Withdraws the grant, drains the generator and releases the claim with the
    /// fence lowered to the last timestamp stamped. Failures are logged only.
    async fn release(&mut self, claim: Claim) {
        self.grant.send_replace(None);
        self.publish_gauges(None);
        let last_used = match self.generator.drain() {
            Some((machine_id, last)) if machine_id == claim.machine_id => last.max(claim.floor),
            _ => claim.floor,
        };
        debug_assert!(last_used <= claim.fence.max(claim.floor));
        if let Err(e) = self.store.release(&claim, last_used).await {
            warn!(namespace = %self.namespace, machine_id = claim.machine_id.get(), error = %crate::DisplayChain(&e), "release failed; the machine id frees itself when its lease expires");
        }
    }
}
