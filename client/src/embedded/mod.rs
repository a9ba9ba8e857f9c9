//! `EmbeddedGenerator`: generates ids in the application's own process from
//! machine ids leased through the server's Lease API — no network hop per id
//! (the Lease API's client, on the fences of docs/design.md).
//!
//! It runs the same [`Generator`] code as the server. Its lease rules:
//!
//! * **start**: Acquire, retrying every 3 s doubling to 60 s with ±20% jitter
//!   and logging the server's reason (a clock off the server's by more than
//!   its `--client-skew-threshold`, either way, is refused there). An Acquire
//!   refused with PERMISSION_DENIED means this identity already holds machine
//!   ids whose grant (and lease token) never reached us, an earlier attempt's
//!   lost answer: start over once, at once, as a new requester (a new nonce);
//!   the lost grant's machine ids free themselves when its first lease ends.
//!   Fail fast when the grant's layout is invalid, a machine id does not fit
//!   the machine bits, the count differs, the grant is already expired by the
//!   local clock, the local clock is already past a granted fence (ahead of
//!   the server's by more than the lease), or it is further behind the
//!   granted floor than [`EmbeddedConfig::max_floor_wait`]. Every such
//!   failure Releases the grant before returning the error, so nothing stays
//!   held. Otherwise wait for the clock to pass the previous holders' fences,
//!   so the generator issues as soon as it is returned.
//! * **lease token**: the grant's token is kept in memory only and sent with
//!   every Renew, Check and Release; without it nobody can act on this lease.
//! * **renew**: once right after start (proving the renew path early), then at
//!   half the remaining lease; while behind, every `min(10 min, remaining/4)`
//!   but never more often than every 5 s. A transport error or any error
//!   status but PERMISSION_DENIED is retried; a renewal answering *no*
//!   machine ids, or other ones, or refusing the token, stops issuance for
//!   good ([`StopReason`]), and so does a renewal whose fence the local clock
//!   is already past (then the ids are Released).
//! * **deadline**: counted by the monotonic clock from when the request that
//!   granted it was *sent*; past it the generators refuse on their own, and
//!   the renewer stops issuance for good.
//! * **check**: every `check_interval` (30 s) between renewals, ask the server
//!   (`LeaseService.Check`) whether the lease still stands; "lease gone",
//!   "namespace gone" (deleted or created again: etcd lost its state) or
//!   "rolled back" (etcd restored from an older snapshot) stops issuance for
//!   good at once, and so does a Check refusing the token (PERMISSION_DENIED,
//!   as for Renew). No answer changes nothing (outage tolerance).
//! * **shutdown**: block issuance, drain the generators, then Release with the
//!   last timestamp stamped on each machine id (skipped when the lease is
//!   already gone; a failure is logged, never fatal).

mod api;
mod grant;
#[cfg(test)]
mod loop_tests;
mod renewal;
mod requester;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use snowkeep_proto::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Endpoint;
use tracing::{error, info, warn};

use api::LeaseApi;
use grant::{check_grant, floor_wait, past_fence};
use renewal::{check_loop, renew_loop};
pub use requester::Requester;

use crate::backoff::Backoff;
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
    /// The namespace (it must exist: created with `snowkeep-server --create-namespace`).
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
    /// Longest `start` waits for the local clock to pass the granted floor
    /// (the previous holders' fences): a clock behind the server's by about
    /// this much or more fails fast with [`ClientError::ClockBehindFloor`]
    /// (after releasing the grant) instead of blocking silently. 30 s by
    /// default, well above a healthy wait (at most the server's
    /// `--max-fence-wait`, 10 s by default).
    pub max_floor_wait: Duration,
    /// How often to ask the server (`LeaseService.Check`) whether the lease
    /// still stands, between renewals: the longest the generator goes on
    /// issuing after etcd lost the state behind it (30 s by default). Zero
    /// never checks. An unreachable server is no answer: issuing goes on
    /// below the fence.
    pub check_interval: Duration,
    /// The API key sent with every Lease API call (a cluster that requires
    /// API keys needs one with the `lease` permission); `None` sends none.
    pub api_key: Option<crate::ApiKey>,
}

impl EmbeddedConfig {
    /// Defaults for `endpoint` and `namespace`: one machine id, this process
    /// as the requester, with backoff.
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
            max_floor_wait: DEFAULT_MAX_FLOOR_WAIT,
            check_interval: DEFAULT_CHECK_INTERVAL,
            api_key: None,
        }
    }
}

/// Default [`EmbeddedConfig::max_floor_wait`].
pub const DEFAULT_MAX_FLOOR_WAIT: Duration = Duration::from_secs(30);
/// Default [`EmbeddedConfig::check_interval`].
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(30);

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
    layout: Layout,
    client: Arc<dyn LeaseApi>,
    slots: Vec<watch::Sender<Option<Grant>>>,
    generators: Vec<Arc<Generator>>,
    machine_ids: Vec<MachineId>,
    /// The namespace incarnation of the grant (0: the server did not say).
    incarnation: u64,
    stopped: Mutex<Option<StopReason>>,
}

impl Shared {
    /// Withdraws every grant and records `reason` (the first one stays).
    /// Under the `stopped` lock, which [`Shared::publish`] takes too: a
    /// renewal answered after a stop can never publish its grant again.
    fn stop(&self, reason: StopReason) {
        let mut stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        for slot in &self.slots {
            slot.send_replace(None);
        }
        // Runs taken before go no further (Generator::end_runs).
        for g in &self.generators {
            g.end_runs();
        }
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

    async fn call<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(self.config.request_timeout, fut).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(status)) => Err(ClientError::Status(status)),
            Err(_) => Err(ClientError::Status(tonic::Status::deadline_exceeded(
                "no answer from the Lease API in time",
            ))),
        }
    }

    /// How far the local clock is past the earliest fence of `grant`; `None`
    /// while it is below every fence, so ids can be stamped.
    fn past_fence(&self, grant: &pb::LeaseGrant) -> Option<Duration> {
        past_fence(&self.layout, self.clock.unix_ms(), grant)
    }

    /// Withdraws the grants, drains the generators and Releases the machine
    /// ids with the last timestamp stamped on each; returns how many the
    /// server released (0 when the call failed, which is logged).
    async fn release(&self, reason: StopReason) -> u32 {
        self.stop(reason);
        let mut last_used = HashMap::new();
        for g in &self.generators {
            if let Some((machine_id, last)) = g.drain() {
                last_used.insert(u32::from(machine_id.get()), last.get());
            }
        }
        release(
            &*self.client,
            &self.config,
            &self.requester,
            &self.token,
            last_used,
        )
        .await
    }

    /// Publishes `grant` (already checked) with the deadline counted from `sent`;
    /// publishes nothing and returns false once issuance stopped for good (a
    /// Check that found the lease gone while this renewal was in flight).
    fn publish(&self, grant: &pb::LeaseGrant, sent: Instant) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        if stopped.is_some() {
            return false;
        }
        let deadline = sent + Duration::from_millis(grant.expires_in_ms);
        for (slot, g) in self.slots.iter().zip(&grant.machine_ids) {
            slot.send_replace(Some(Grant {
                machine_id: MachineId(g.machine_id as u16),
                floor: Millis(g.floor_ms),
                fence: Millis(g.fence_ms),
                deadline: Some(deadline),
            }));
        }
        // Every id handed out from now on comes under the new grant.
        for g in &self.generators {
            g.end_runs();
        }
        true
    }
}

/// Generates ids in process from machine ids leased through the Lease API.
pub struct EmbeddedGenerator {
    set: Arc<GeneratorSet>,
    shared: Arc<Shared>,
    renewer: JoinHandle<()>,
    checker: JoinHandle<()>,
}

impl std::fmt::Debug for EmbeddedGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedGenerator")
            .field("machine_ids", &self.shared.machine_ids)
            .field("stopped", &self.shared.stopped())
            .finish_non_exhaustive()
    }
}

/// Releases every machine id `requester` holds, with its lease `token`
/// (`last_used_ms` by machine id, empty for a grant never used); returns how
/// many the server released, 0 when the call failed (logged: the lease then
/// ends by itself).
async fn release(
    client: &dyn LeaseApi,
    config: &EmbeddedConfig,
    requester: &Requester,
    token: &str,
    last_used_ms: HashMap<u32, u64>,
) -> u32 {
    let request = pb::ReleaseRequest {
        requester: Some(requester.to_pb()),
        namespace: config.namespace.clone(),
        last_used_ms,
        lease_token: token.to_owned(),
    };
    match tokio::time::timeout(config.request_timeout, client.release(request)).await {
        Ok(Ok(r)) => r.released,
        Ok(Err(status)) => {
            warn!(namespace = %config.namespace, error = %ClientError::Status(status), "Release failed; the machine ids free themselves when the lease expires");
            0
        }
        Err(_) => {
            warn!(namespace = %config.namespace, timeout = ?config.request_timeout, "Release got no answer in time; the machine ids free themselves when the lease expires");
            0
        }
    }
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
        Self::start_on(channel, config, clock).await
    }

    /// [`EmbeddedGenerator::start`] over TLS with `tls` (an `https://`
    /// `config.endpoint`).
    ///
    /// # Errors
    /// As [`EmbeddedGenerator::start`], and [`ClientError::Tls`] for
    /// settings tonic refuses.
    #[cfg(feature = "tls")]
    pub async fn start_with_tls(
        config: EmbeddedConfig,
        clock: SharedClock,
        tls: &crate::tls::ClientTls,
    ) -> Result<Self, ClientError> {
        let endpoint = Endpoint::from_shared(config.endpoint.clone())
            .map_err(|_| ClientError::InvalidEndpoint {
                endpoint: config.endpoint.clone(),
            })?
            .connect_timeout(config.request_timeout);
        let channel = tls.apply(endpoint)?.connect_lazy();
        Self::start_on(channel, config, clock).await
    }

    async fn start_on(
        channel: tonic::transport::Channel,
        config: EmbeddedConfig,
        clock: SharedClock,
    ) -> Result<Self, ClientError> {
        let mut client = pb::lease_service_client::LeaseServiceClient::with_interceptor(
            channel,
            crate::api_key::SendApiKey(config.api_key.clone()),
        );
        let mut backoff =
            Backoff::new(config.acquire_backoff.0, config.acquire_backoff.1).with_jitter(0.2);
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
                // The generator honours time units and every total of bits.
                supports_layout_shapes: true,
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
            let wait = backoff.next_delay();
            warn!(namespace = %config.namespace, error = %err, retry_in = ?wait, "Acquire failed; retrying");
            tokio::time::sleep(wait).await;
        };
        // From here on the server holds machine ids for us: every failure
        // gives them back before it returns.
        let token = grant.lease_token.clone();
        match Self::accept(
            config.clone(),
            requester.clone(),
            clock,
            Arc::new(client.clone()),
            grant,
            sent,
        )
        .await
        {
            Ok(generator) => Ok(generator),
            Err(e) => {
                let released = release(&client, &config, &requester, &token, HashMap::new()).await;
                warn!(namespace = %config.namespace, released, error = %e, "refused the grant and released it");
                Err(e)
            }
        }
    }

    /// Checks a fresh grant, waits for the clock to pass its floor and starts
    /// renewing; the caller releases the grant on failure.
    async fn accept(
        config: EmbeddedConfig,
        requester: Requester,
        clock: SharedClock,
        client: Arc<dyn LeaseApi>,
        grant: pb::LeaseGrant,
        sent: Instant,
    ) -> Result<Self, ClientError> {
        let layout = check_grant(&grant, config.machine_ids)?;
        if let Some(past) = past_fence(&layout, clock.unix_ms(), &grant) {
            return Err(ClientError::ClockPastFence { past });
        }
        let deadline = sent + Duration::from_millis(grant.expires_in_ms);
        let wait = floor_wait(&layout, &*clock, &grant, deadline, config.max_floor_wait)?;
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
            layout,
            client,
            slots,
            generators: generators.clone(),
            machine_ids,
            incarnation: grant.namespace_incarnation,
            stopped: Mutex::new(None),
        });
        shared.publish(&grant, sent);
        // Like a server with NOT_SERVING: hand the generator over only once the
        // clock has passed every previous holder's fence, so the first
        // next_id() issues instead of failing with ClockBehindFloor. The wait
        // is bounded above.
        if !wait.is_zero() {
            info!(namespace = %shared.config.namespace, wait = ?wait, max_floor_wait = ?shared.config.max_floor_wait, "waiting for the clock to pass the claimed machine ids' floor");
            tokio::time::sleep(wait).await;
        }
        info!(namespace = %shared.config.namespace, requester = %shared.requester.tag(), machine_ids = ?shared.machine_ids, "embedded generator leased machine ids");
        let renewer = tokio::spawn(renew_loop(shared.clone(), deadline));
        let checker = tokio::spawn(check_loop(shared.clone()));
        Ok(Self {
            set: GeneratorSet::new(generators),
            shared,
            renewer,
            checker,
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

    /// One id from held machine id `key % N`: [`GeneratorSet::next_id_for`].
    pub async fn next_id_for(&self, key: u64) -> Result<u64, GenerateError> {
        self.set.next_id_for(key).await
    }

    /// One id by thread: [`GeneratorSet::next_id_by_thread`].
    pub async fn next_id_by_thread(&self) -> Result<u64, GenerateError> {
        self.set.next_id_by_thread().await
    }

    /// A worker's handle on held machine id `index % N` ([`GeneratorSet::pin`]);
    /// it stops with the generator, and shutdown's drain covers its ids.
    pub fn pin(&self, index: usize) -> crate::generator::Pinned {
        self.set.pin(index)
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
        self.checker.abort();
        if self.shared.stopped().is_some() {
            // The lease is gone, or the renewer released it already.
            self.shared.stop(StopReason::ShutDown);
            for g in &self.shared.generators {
                g.drain();
            }
            return 0;
        }
        self.shared.release(StopReason::ShutDown).await
    }
}

impl Drop for EmbeddedGenerator {
    fn drop(&mut self) {
        self.renewer.abort();
        self.checker.abort();
    }
}
