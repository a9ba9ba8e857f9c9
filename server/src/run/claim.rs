//! The claim's side of start-up: one generator per machine id, the claim
//! loop's timing, and the claim task on a runtime of its own (see
//! [`lease_runtime`]), which opens or connects to the store and runs the
//! [`ClaimManager`] until released.

use std::sync::{Arc, OnceLock};

use snowkeep_client::{FenceDemand, Generator, GeneratorMetrics, Grant, Layout, SharedClock};
use snowkeep_core::claim::{capacity, ClaimManager, ClaimStore, ClaimTiming, Slot, StoreError};
use snowkeep_core::single_instance::{SingleInstanceCapacity, SingleInstanceStore};
use snowkeep_etcd::{EtcdSettings, PeerDirectory};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{connect_etcd_serving, timing_budget, Serving, Shared};
use crate::auth::BootstrapKey;
use crate::config::ServerConfig;
use crate::metrics as m;

/// The generators' slots, a receiver of each slot's grants (in slot
/// order), and their shared fence demand.
pub(crate) type GeneratorSlots = (
    Vec<Slot>,
    Vec<watch::Receiver<Option<Grant>>>,
    Arc<FenceDemand>,
);

/// Where the claim holds its machine ids.
pub(super) enum Store {
    /// The single-instance store, opened at start (its errors need an
    /// operator).
    SingleInstance(SingleInstanceStore),
    /// etcd, connected to by the claim task, so the server answers
    /// (NOT_SERVING, UNAVAILABLE) while etcd is still coming up instead of
    /// hanging callers.
    Etcd(Box<EtcdSettings>),
}

/// One generator per machine id of `config`, each with the channel the claim
/// loop feeds it grants through (slot `i` feeds generator `i`), and a
/// receiver of each channel, in slot order.
pub(crate) fn generator_slots(config: &ServerConfig, clock: &SharedClock) -> GeneratorSlots {
    let ns = config.namespace.clone();
    let metrics = GeneratorMetrics {
        ids_issued: metrics::Counter::noop(),
        sequence_exhausted: metrics::counter!(m::SEQUENCE_EXHAUSTED_TOTAL, "namespace" => ns),
        backward_waited: metrics::counter!(m::CLOCK_BACKWARD_STEPS_TOTAL, "outcome" => "waited"),
        backward_halted: metrics::counter!(m::CLOCK_BACKWARD_STEPS_TOTAL, "outcome" => "halted"),
    };
    let mut slots = Vec::new();
    let mut grant_rxs = Vec::new();
    let demand = FenceDemand::new();
    for _ in 0..config.machine_ids {
        let (grant, rx) = watch::channel(None);
        grant_rxs.push(rx.clone());
        let generator = Generator::with_demand(
            config.layout,
            clock.clone(),
            rx,
            config.max_backward_wait,
            metrics.clone(),
            demand.clone(),
        );
        slots.push(Slot { grant, generator });
    }
    (slots, grant_rxs, demand)
}

/// The claim loop's timing rules, from `config`.
pub(crate) fn claim_timing(config: &ServerConfig) -> ClaimTiming {
    ClaimTiming {
        lease_ttl: config.lease_ttl,
        outage_budget: timing_budget(config),
        max_fence_wait: config.max_fence_wait,
        on_lease_lost: config.on_lease_lost,
    }
}

/// The claim task: everything it needs besides its store.
pub(super) struct ClaimTask {
    /// Clock, namespace, store access, keys and security mode.
    pub(super) shared: Shared,
    /// The namespace's layout.
    pub(super) layout: Layout,
    /// From [`claim_timing`].
    pub(super) timing: ClaimTiming,
    /// The generators' slots (from [`generator_slots`]).
    pub(super) slots: Vec<Slot>,
    /// A receiver of each slot's grants, in slot order.
    pub(super) grant_rxs: Vec<watch::Receiver<Option<Grant>>>,
    /// The generators' shared fence demand.
    pub(super) demand: Arc<FenceDemand>,
    /// `--wait-for-namespace`.
    pub(super) wait_for_namespace: bool,
    /// `--bootstrap-admin-key-file`, written to etcd at connect.
    pub(super) bootstrap: Option<BootstrapKey>,
    /// Set once etcd is connected, for the peer clock check.
    pub(super) peers: Arc<OnceLock<PeerDirectory>>,
    /// Cancelled when the machine ids may be given back.
    pub(super) release: CancellationToken,
}

impl ClaimTask {
    /// The claim task for `config`, feeding `slots` (from
    /// [`generator_slots`]), holding until `release`.
    pub(super) fn new(
        config: &ServerConfig,
        shared: Shared,
        slots: GeneratorSlots,
        peers: Arc<OnceLock<PeerDirectory>>,
        release: CancellationToken,
    ) -> Self {
        let (slots, grant_rxs, demand) = slots;
        ClaimTask {
            shared,
            layout: config.layout,
            timing: claim_timing(config),
            slots,
            grant_rxs,
            demand,
            wait_for_namespace: config.wait_for_namespace,
            bootstrap: config.auth.bootstrap_admin_key.clone(),
            peers,
            release,
        }
    }

    /// Claims and holds machine ids on `store` until `release` (or a
    /// failure that needs an operator); `Ok` too when shut down before
    /// etcd answered.
    pub(super) async fn run(self, store: Store) -> Result<(), StoreError> {
        match store {
            Store::SingleInstance(local) => self.on_single_instance(local).await,
            Store::Etcd(settings) => self.on_etcd(*settings).await,
        }
    }

    async fn on_single_instance(self, local: SingleInstanceStore) -> Result<(), StoreError> {
        let source = SingleInstanceCapacity::new(&local, self.grant_rxs.clone());
        self.follow_capacity(source);
        self.hold(local).await
    }

    async fn on_etcd(self, settings: EtcdSettings) -> Result<(), StoreError> {
        let shared = &self.shared;
        let Some(store) = connect_etcd_serving(
            settings,
            self.layout,
            shared.clock.clone(),
            &shared.shutdown,
            Some(Serving {
                access: &shared.access,
                keys: (&shared.key_cache, self.bootstrap.clone()),
                mode: &shared.auth_mode,
            }),
            self.wait_for_namespace,
        )
        .await?
        else {
            return Ok(());
        };
        shared.access.connected(&store);
        let _ = self.peers.set(store.peer_directory());
        // Advice only, so it neither delays nor stops the claim.
        tokio::spawn(store.overlap_check().warn_once());
        self.follow_capacity(store.capacity_reader());
        self.hold(store).await
    }

    /// The claim loop on `store`, until `release` or a failure.
    async fn hold<S: ClaimStore>(self, store: S) -> Result<(), StoreError> {
        let (ns, clock) = (self.shared.namespace, self.shared.clock);
        ClaimManager::new(
            store,
            self.layout,
            ns,
            clock,
            self.timing,
            self.slots,
            self.demand,
        )
        .run(self.release)
        .await
    }

    /// The capacity gauges, following the first slot's grant.
    fn follow_capacity(&self, source: impl capacity::CapacitySource + 'static) {
        let grant = self.grant_rxs[0].clone();
        let (ns, shutdown) = (self.shared.namespace.clone(), self.shared.shutdown.clone());
        tokio::spawn(capacity::run(source, ns, grant, shutdown));
    }
}

/// The runtime the claim loop runs on: one worker thread of its own,
/// `snowkeep-lease`, with its own timers and IO. Request work (thousands of
/// streams, each always ready to send) keeps the server runtime's workers
/// and queues busy; a task queued behind it waits its turn there, and a lease
/// loop that waits long enough misses its renewals and fence raises (each
/// etcd request has a quarter of the lease TTL to answer), so issuance stops
/// at a fence nobody raised. A thread of its own is scheduled by the
/// operating system as soon as it wakes, whatever the request load.
pub(super) fn lease_runtime() -> std::io::Result<LeaseRuntime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(4)
        .thread_name("snowkeep-lease")
        .enable_all()
        .build()
        .map(|rt| LeaseRuntime(Some(rt)))
}

/// Owns the lease runtime. Dropped (on any return from [`run`]) it ends the
/// tasks still on it (a holder watch, idle etcd connections) without
/// blocking: a runtime dropped the plain way inside another runtime panics.
pub(super) struct LeaseRuntime(Option<tokio::runtime::Runtime>);

impl LeaseRuntime {
    pub(super) fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.0
            .as_ref()
            .expect("the runtime lives until drop")
            .spawn(future)
    }
}

impl Drop for LeaseRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}
