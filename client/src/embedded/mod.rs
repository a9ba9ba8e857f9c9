//! `EmbeddedGenerator`: generates ids in the application's own process from
//! machine ids leased through the server's Lease API — no network hop per id
//! (spec/002's client library, on DESIGN §2's fences).
//!
//! It runs the same [`Generator`] code as the server. Its lease rules:
//!
//! * **start**: Acquire, retrying every 3 s doubling to 60 s with ±20% jitter
//!   and logging the server's reason. An Acquire refused with
//!   PERMISSION_DENIED means this identity already holds machine ids whose
//!   grant (and lease token) never reached us, an earlier attempt's lost
//!   answer: start over once, at once, as a new requester (a new nonce); the
//!   lost grant's machine ids free themselves when its first lease ends.
//!   Fail fast when the grant's layout is invalid, a machine id does not fit
//!   the machine bits, the count differs, or the grant is already expired by
//!   the local clock; then wait for the clock to pass the previous holders'
//!   fences (at most the server's `--max-fence-wait`), so the generator
//!   issues as soon as it is returned.
//! * **lease token**: the grant's token is kept in memory only and sent with
//!   every Renew and Release; without it nobody can act on this lease.
//! * **renew**: once right after start (proving the renew path early), then at
//!   half the remaining lease; while behind, every `min(10 min, remaining/4)`
//!   but never more often than every 5 s. A transport error or any error
//!   status but PERMISSION_DENIED is retried; a renewal answering *no*
//!   machine ids, or other ones, or refusing the token, stops issuance for
//!   good ([`StopReason`]).
//! * **deadline**: counted by the monotonic clock from when the request that
//!   granted it was *sent*; past it the generators refuse on their own, and
//!   the renewer stops issuance for good.
//! * **shutdown**: block issuance, drain the generators, then Release with the
//!   last timestamp stamped on each machine id (skipped when the lease is
//!   already gone; a failure is logged, never fatal).

mod requester;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use snowkeep_proto::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};
use tracing::{error, info, warn};

pub use requester::Requester;

use crate::clock::SharedClock;
use crate::error::{ClientError, GenerateError, StopReason};
use crate::generator::{
    Generator, GeneratorMetrics, GeneratorSet, Grant, DEFAULT_MAX_BACKWARD_WAIT,
};
use crate::layout::{Layout, MachineId, Millis};

/// Settings of an embedded generator.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// A snowkeep server running on etcd, `http://host:port`.
    pub endpoint: String,
    /// The namespace (it must exist: a server has run with it).
    pub namespace: String,
    /// Machine ids to hold (1 to 63); each adds 2^sequence_bits ids per ms.
    pub machine_ids: u32,
    /// Who this process is; [`Requester::current`] by default.
    pub requester: Requester,
    /// Largest backwards clock step waited out.
    pub max_backward_wait: Duration,
    /// First and largest delay between Acquire attempts (3 s, 60 s).
    pub acquire_backoff: (Duration, Duration),
    /// Acquire attempts before `start` gives up; `None` retries until it succeeds.
    pub acquire_attempts: Option<u32>,
    /// Timeout of one Lease API call.
    pub request_timeout: Duration,
    /// Send the local clock with Acquire/Renew so the server checks skew.
    pub send_client_time: bool,
}

impl EmbeddedConfig {
    /// Defaults for `endpoint` and `namespace`: one machine id, this process
    /// as the requester, spec/002's backoff.
    pub fn new(endpoint: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            namespace: namespace.into(),
            machine_ids: 1,
            requester: Requester::current(),
            max_backward_wait: DEFAULT_MAX_BACKWARD_WAIT,
            acquire_backoff: (Duration::from_secs(3), Duration::from_secs(60)),
            acquire_attempts: None,
            request_timeout: Duration::from_secs(10),
            send_client_time: true,
        }
    }
}

/// Renewal delays: never more often than this while behind ...
const MIN_RETRY: Duration = Duration::from_secs(5);
/// ... and never less often than this.
const MAX_RETRY: Duration = Duration::from_secs(600);

/// State shared by the generator handle and its renewer task.
struct Shared {
    config: EmbeddedConfig,
    /// The identity the lease is held under: the configured one, or the one
    /// with a fresh nonce that start switched to.
    requester: Requester,
    /// The grant's lease token, 64 hex digits; never logged.
    token: String,
    clock: SharedClock,
    client: pb::lease_service_client::LeaseServiceClient<Channel>,
    slots: Vec<watch::Sender<Option<Grant>>>,
    generators: Vec<Arc<Generator>>,
    machine_ids: Vec<MachineId>,
    stopped: Mutex<Option<StopReason>>,
}

impl Shared {
    fn stop(&self, reason: StopReason) {
        for slot in &self.slots {
            slot.send_replace(None);
        }
        let mut stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        if stopped.is_none() {
            *stopped = Some(reason);
            if reason != StopReason::ShutDown {
                error!(namespace = %self.config.namespace, %reason, "embedded generator stopped issuing");
            }
        }
    }

    fn stopped(&self) -> Option<StopReason> {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn client_time(&self) -> Option<u64> {
        self.config.send_client_time.then(|| self.clock.unix_ms())
    }

    /// A Release of the lease with the last timestamps `last_used_ms`.
    fn release_request(&self, last_used_ms: HashMap<u32, u64>) -> pb::ReleaseRequest {
        pb::ReleaseRequest {
            requester: Some(self.requester.to_pb()),
            namespace: self.config.namespace.clone(),
            last_used_ms,
            lease_token: self.token.clone(),
        }
    }

    async fn call<T>(
        &self,
        fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(self.config.request_timeout, fut).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(ClientError::Status(status)),
            Err(_) => Err(ClientError::Status(tonic::Status::deadline_exceeded(
                "no answer from the Lease API in time",
            ))),
        }
    }

    /// Publishes `grant` (already checked) with the deadline counted from `sent`.
    fn publish(&self, grant: &pb::LeaseGrant, sent: Instant) {
        let deadline = sent + Duration::from_millis(grant.expires_in_ms);
        for (slot, g) in self.slots.iter().zip(&grant.machine_ids) {
            slot.send_replace(Some(Grant {
                machine_id: MachineId(g.machine_id as u16),
                floor: Millis(g.floor_ms),
                fence: Millis(g.fence_ms),
                deadline: Some(deadline),
            }));
        }
    }
}

/// Generates ids in process from machine ids leased through the Lease API.
pub struct EmbeddedGenerator {
    set: Arc<GeneratorSet>,
    shared: Arc<Shared>,
    renewer: JoinHandle<()>,
}

impl std::fmt::Debug for EmbeddedGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedGenerator")
            .field("machine_ids", &self.shared.machine_ids)
            .field("stopped", &self.shared.stopped())
            .finish_non_exhaustive()
    }
}

/// Checks a grant against what was asked (spec/002's fail-fast rules) and
/// returns its layout.
fn check_grant(grant: &pb::LeaseGrant, asked: u32) -> Result<Layout, ClientError> {
    let l = grant
        .layout
        .ok_or(ClientError::BadLayout(crate::layout::LayoutError::Parse {
            text: "missing".into(),
        }))?;
    let bits = |b: u32| u8::try_from(b).unwrap_or(u8::MAX);
    let layout = Layout::new(
        bits(l.timestamp_bits),
        bits(l.machine_bits),
        bits(l.sequence_bits),
        l.epoch_unix_ms,
    )
    .map_err(ClientError::BadLayout)?;
    if grant.machine_ids.len() != asked as usize {
        return Err(ClientError::GrantCount {
            asked,
            granted: grant.machine_ids.len(),
        });
    }
    for g in &grant.machine_ids {
        if g.machine_id >= layout.machine_id_count() {
            return Err(ClientError::MachineIdOutOfRange {
                machine_id: g.machine_id,
                machine_bits: layout.machine_bits(),
            });
        }
    }
    if grant.expires_in_ms == 0 {
        return Err(ClientError::GrantExpired);
    }
    Ok(layout)
}

/// `base` ± `jitter` (a fraction), at random.
fn jittered(base: Duration, jitter: f64) -> Duration {
    base.mul_f64(1.0 + rand::rng().random_range(-jitter..=jitter))
}

impl EmbeddedGenerator {
    /// Acquires machine ids (retrying per the config) and starts renewing.
    pub async fn start(config: EmbeddedConfig, clock: SharedClock) -> Result<Self, ClientError> {
        let channel = Endpoint::from_shared(config.endpoint.clone())
            .map_err(|_| ClientError::InvalidEndpoint {
                endpoint: config.endpoint.clone(),
            })?
            .connect_timeout(config.request_timeout)
            .connect_lazy();
        let mut client = pb::lease_service_client::LeaseServiceClient::new(channel);
        let mut delay = config.acquire_backoff.0;
        let mut attempt = 0u32;
        let mut requester = config.requester.clone();
        let mut switched = false;
        let (grant, sent) = loop {
            attempt += 1;
            let sent = clock.now();
            let request = pb::AcquireRequest {
                requester: Some(requester.to_pb()),
                namespace: config.namespace.clone(),
                count: config.machine_ids,
                client_time_unix_ms: config.send_client_time.then(|| clock.unix_ms()),
                lease_token: String::new(),
            };
            let answer =
                tokio::time::timeout(config.request_timeout, client.acquire(request)).await;
            let err = match answer {
                Ok(Ok(r)) => break (r.into_inner(), sent),
                Ok(Err(status)) => ClientError::Status(status),
                Err(_) => ClientError::Status(tonic::Status::deadline_exceeded(
                    "no answer to Acquire in time",
                )),
            };
            if !switched
                && matches!(&err, ClientError::Status(s) if s.code() == tonic::Code::PermissionDenied)
            {
                // This identity holds machine ids we have no token for: a
                // grant whose answer was lost (or a second generator given
                // the same identity). Start over as a new requester.
                switched = true;
                attempt -= 1;
                requester = requester.renewed_nonce();
                warn!(namespace = %config.namespace, requester = %requester.tag(), "this requester identity already holds machine ids without our lease token (an earlier Acquire answer was lost?); acquiring as a new requester. The lost grant's machine ids free themselves when its first lease ends");
                continue;
            }
            if !err.is_retryable() || config.acquire_attempts.is_some_and(|n| attempt >= n) {
                return Err(err);
            }
            let wait = jittered(delay, 0.2);
            warn!(namespace = %config.namespace, error = %err, retry_in = ?wait, "Acquire failed; retrying");
            tokio::time::sleep(wait).await;
            delay = (delay * 2).min(config.acquire_backoff.1);
        };
        let layout = check_grant(&grant, config.machine_ids)?;
        let mut slots = Vec::new();
        let mut generators = Vec::new();
        for _ in 0..config.machine_ids {
            let (tx, rx) = watch::channel(None);
            generators.push(Generator::new(
                layout,
                clock.clone(),
                rx,
                config.max_backward_wait,
                GeneratorMetrics::default(),
            ));
            slots.push(tx);
        }
        let machine_ids = grant
            .machine_ids
            .iter()
            .map(|g| MachineId(g.machine_id as u16))
            .collect();
        let shared = Arc::new(Shared {
            config,
            requester,
            token: grant.lease_token.clone(),
            clock,
            client,
            slots,
            generators: generators.clone(),
            machine_ids,
            stopped: Mutex::new(None),
        });
        shared.publish(&grant, sent);
        // Like a server with NOT_SERVING: hand the generator over only once the
        // clock has passed every previous holder's fence (DESIGN §2.3), so the
        // first next_id() issues instead of failing with ClockBehindFence.
        let max_floor = grant
            .machine_ids
            .iter()
            .map(|m| m.floor_ms)
            .max()
            .unwrap_or(0);
        let now = layout
            .to_layout_ms(shared.clock.unix_ms())
            .unwrap_or_default();
        if now.get() <= max_floor {
            let wait = Duration::from_millis(max_floor - now.get() + 1);
            let deadline = sent + Duration::from_millis(grant.expires_in_ms);
            if shared.clock.now() + wait >= deadline {
                // Waiting would outlive the lease: give the ids back untouched.
                shared.stop(StopReason::ShutDown);
                let request = shared.release_request(HashMap::new());
                let mut client = shared.client.clone();
                if let Err(e) = shared.call(client.release(request)).await {
                    warn!(error = %e, "Release after refusing the grant failed; the lease expires by itself");
                }
                return Err(ClientError::ClockBehindFloor { wait });
            }
            info!(namespace = %shared.config.namespace, wait = ?wait, "waiting for the clock to pass the claimed machine ids' floor");
            tokio::time::sleep(wait).await;
        }
        info!(namespace = %shared.config.namespace, requester = %shared.requester.tag(), machine_ids = ?shared.machine_ids, "embedded generator leased machine ids");
        let deadline = sent + Duration::from_millis(grant.expires_in_ms);
        let renewer = tokio::spawn(renew_loop(shared.clone(), deadline));
        Ok(Self {
            set: GeneratorSet::new(generators),
            shared,
            renewer,
        })
    }

    /// One id.
    pub async fn next_id(&self) -> Result<u64, GenerateError> {
        self.set.next_id().await
    }

    /// `n` strictly ascending ids, spread over the held machine ids.
    pub async fn next_ids(&self, n: u64) -> Result<Vec<u64>, GenerateError> {
        self.set.next_ids(n).await
    }

    /// True while ids can be issued now.
    pub fn is_ready(&self) -> bool {
        self.shared.stopped().is_none() && self.set.is_ready()
    }

    /// Why issuance stopped for good, if it did.
    pub fn stopped(&self) -> Option<StopReason> {
        self.shared.stopped()
    }

    /// The machine ids held.
    pub fn machine_ids(&self) -> &[MachineId] {
        &self.shared.machine_ids
    }

    /// The identity the machine ids are held under: the configured one, or
    /// the same with a fresh nonce when start had to begin again (see the
    /// module docs).
    pub fn requester(&self) -> &Requester {
        &self.shared.requester
    }

    /// The layout ids are stamped with.
    pub fn layout(&self) -> Layout {
        self.set.layout()
    }

    /// Blocks issuance, drains, and releases the machine ids with the last
    /// timestamp stamped on each (skipped when the lease is already gone).
    /// Returns how many machine ids the server released.
    pub async fn shutdown(self) -> u32 {
        self.renewer.abort();
        let already = self.shared.stopped();
        self.shared.stop(StopReason::ShutDown);
        let mut last_used = HashMap::new();
        for g in &self.shared.generators {
            if let Some((machine_id, last)) = g.drain() {
                last_used.insert(u32::from(machine_id.get()), last.get());
            }
        }
        if already.is_some() {
            return 0;
        }
        let request = self.shared.release_request(last_used);
        let mut client = self.shared.client.clone();
        match self.shared.call(client.release(request)).await {
            Ok(r) => r.released,
            Err(e) => {
                warn!(error = %e, "Release failed; the machine ids free themselves when the lease expires");
                0
            }
        }
    }
}

impl Drop for EmbeddedGenerator {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// Renews until issuance stops: immediately, then at half the remaining
/// lease, retrying every `min(10 min, remaining/4)` (at least 5 s) while behind.
async fn renew_loop(shared: Arc<Shared>, mut deadline: Instant) {
    let mut next = shared.clock.now();
    loop {
        let wake = next.min(deadline);
        tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
        if shared.clock.now() >= deadline {
            shared.stop(StopReason::Expired);
            return;
        }
        let sent = shared.clock.now();
        let request = pb::RenewRequest {
            requester: Some(shared.requester.to_pb()),
            namespace: shared.config.namespace.clone(),
            client_time_unix_ms: shared.client_time(),
            lease_token: shared.token.clone(),
        };
        let mut client = shared.client.clone();
        match shared.call(client.renew(request)).await {
            Ok(grant) if grant.machine_ids.is_empty() => {
                shared.stop(StopReason::LeaseGone);
                return;
            }
            Ok(grant) => {
                let renewed: Vec<MachineId> = grant
                    .machine_ids
                    .iter()
                    .map(|g| MachineId(g.machine_id as u16))
                    .collect();
                if renewed != shared.machine_ids {
                    shared.stop(StopReason::MachineIdsChanged {
                        held: shared.machine_ids.len(),
                        renewed: renewed.len(),
                    });
                    return;
                }
                if grant.expires_in_ms == 0 {
                    shared.stop(StopReason::Expired);
                    return;
                }
                shared.publish(&grant, sent);
                deadline = sent + Duration::from_millis(grant.expires_in_ms);
                next = sent + (deadline - sent) / 2;
            }
            Err(ClientError::Status(s)) if s.code() == tonic::Code::PermissionDenied => {
                shared.stop(StopReason::TokenRefused);
                return;
            }
            Err(e) => {
                let remaining = deadline.saturating_duration_since(shared.clock.now());
                let retry = (remaining / 4).clamp(MIN_RETRY, MAX_RETRY);
                warn!(namespace = %shared.config.namespace, error = %e, retry_in = ?retry, remaining = ?remaining, "Renew failed; retrying");
                next = shared.clock.now() + retry;
            }
        }
    }
}
