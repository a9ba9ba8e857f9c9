//! Wiring: store → lease manager → generator → gRPC services, and the ordered
//! shutdown: health NOT_SERVING → stop accepting → streams end → drain
//! in-flight requests (bounded) → release. A machine id is released only
//! after the calls that could stamp ids under it are done.
//!
//! The gRPC server runs under `crate::limits`: connections come through a
//! `Listener` (backoff on accept errors, a connection cap, silent
//! connections closed), calls through `CallLimits` (slots and memory per
//! pool), and tonic's builder sets the HTTP/2 bounds.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use snowkeep_client::{
    FenceDemand, Generator, GeneratorMetrics, GeneratorSet, Grant, SharedClock, SystemClock,
};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::admin::{keys::KeyAdmin, state::StateAdmin, AdminHandler};
use crate::config::{ServerConfig, StoreConfig};
pub(crate) use crate::connect::{connect_etcd, connect_etcd_serving, Serving};
use crate::lease_api::LeaseHandler;
use crate::limits::calls::CallLimits;
use crate::limits::conn::{Listener, ListenerLimits};
use crate::limits::wire::WireStatusLayer;
use crate::limits::Limits;
use crate::metrics as m;
use crate::router::router;
use crate::service::{health, id::IdHandler, info::InfoHandler, StoreAccess};
use snowkeep_core::claim::{capacity, ClaimManager, ClaimTiming, Slot, StoreError};
use snowkeep_core::namespace::is_valid_namespace;
use snowkeep_core::single_instance::{SingleInstanceCapacity, SingleInstanceStore};
use snowkeep_etcd::EtcdSettings;

/// Bound on the release at shutdown (release txn + lease revoke).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the server stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The claim lifecycle failed in a way that needs an operator.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The gRPC server failed.
    #[error("gRPC server failed")]
    Transport(#[from] tonic::transport::Error),
    /// Reflection could not be built from the descriptor sets.
    #[error("server reflection setup failed")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The status page's address (`--admin-listen`) cannot be bound.
    #[error("cannot bind the status page's listener (--admin-listen) {address}")]
    AdminListen {
        /// The address.
        address: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A background task panicked.
    #[error("a background task panicked")]
    Panic(#[from] tokio::task::JoinError),
    /// The lease loop's own runtime (a thread) could not be started.
    #[error("cannot start the lease loop's runtime")]
    LeaseRuntime(#[source] std::io::Error),
    /// The TLS files cannot serve (they were checked at start and changed
    /// since, or `ServerConfig` was built without the check).
    #[error("cannot serve TLS on the gRPC port")]
    Tls(#[from] crate::tls::TlsError),
}

impl ServeError {
    /// True when the error is a configuration problem (exit code 64).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ServeError::Tls(_)
                | ServeError::Store(
                    StoreError::LayoutMismatch { .. }
                        | StoreError::ClockBeforeEpoch { .. }
                        | StoreError::LayoutExhausted { .. }
                        | StoreError::InvalidNamespace { .. }
                        | StoreError::DuplicateInstance { .. }
                        | StoreError::NamespaceNotCreated { .. }
                        | StoreError::NamespaceNeedsFloor { .. }
                        | StoreError::CorruptNamespace { .. }
                        | StoreError::BadFloor { .. }
                        | StoreError::AccessRefused { .. }
                        | StoreError::AuthModeMismatch { .. }
                )
        )
    }
}

/// HTTP/2 receive windows (stream and connection), at least the largest
/// request message: requests are small, and a connection can then hold at
/// most this many bytes of request data the server has not read yet.
fn receive_window(limits: &Limits) -> u32 {
    u32::try_from(limits.max_recv_message_size + 5)
        .unwrap_or(u32::MAX)
        .max(65_535)
}

/// etcd request timeout for a lease TTL: a quarter of it, within [200 ms, 2 s].
fn request_timeout(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// The machine ids the single-instance store holds: the first `--machine-ids` of
/// `--machine-id-range`, `[start, end)`.
fn single_instance_range(config: &ServerConfig) -> std::ops::Range<u32> {
    let start = config.machine_id_range.start;
    start
        ..start
            .saturating_add(config.machine_ids)
            .min(config.machine_id_range.end)
}

/// [`single_instance_range`] as machine ids (config keeps them below 2^16).
fn single_instance_machine_ids(config: &ServerConfig) -> Vec<snowkeep_client::MachineId> {
    single_instance_range(config)
        .filter_map(|id| u16::try_from(id).ok())
        .map(snowkeep_client::MachineId)
        .collect()
}

/// The single-instance store's outage budget. It has no outage to ride out
/// (its store is a local file), and its successor is always itself: after a
/// crash it waits out its own fences, which run at most 1.5 budgets (3 s)
/// ahead.
pub const SINGLE_INSTANCE_OUTAGE_BUDGET: Duration = Duration::from_secs(2);

/// The outage budget the claim loop runs with: `--outage-budget` on etcd,
/// [`SINGLE_INSTANCE_OUTAGE_BUDGET`] on the single-instance store.
fn timing_budget(config: &ServerConfig) -> Duration {
    match config.store {
        StoreConfig::Etcd { .. } => config.outage_budget,
        StoreConfig::SingleInstance { .. } => SINGLE_INSTANCE_OUTAGE_BUDGET,
    }
}

/// The etcd store's settings for `config`.
pub(crate) fn etcd_settings(config: &ServerConfig, endpoints: &[String]) -> EtcdSettings {
    EtcdSettings {
        endpoints: endpoints.to_vec(),
        access: config.etcd_access.clone(),
        namespace: config.namespace.clone(),
        instance_id: config.instance_id.clone(),
        lease_ttl: config.lease_ttl,
        machine_id_range: config.machine_id_range.clone(),
        machine_ids: config.machine_ids,
        stable_instance: config.stable_instance,
        fence_horizon: config.fence_lead(),
        max_fence_wait: config.max_fence_wait,
        request_timeout: request_timeout(config.lease_ttl),
        advertise_address: (!config.peer_skew.interval.is_zero())
            .then(|| config.peer_skew.advertise_address.clone()),
        namespace_setup: config.namespace_setup.clone(),
    }
}

/// The one-shot modes (`--create-namespace-only`, `--confirm-namespace-floor`):
/// connects to etcd (waiting for it, like a server), creates the namespace or
/// confirms its floor as `config.namespace_setup` says, and returns without
/// claiming or serving anything. `Ok(true)` when done, `Ok(false)` when
/// `shutdown` came first (or the store is not etcd, which config refuses).
///
/// Errors as [`run`] for the namespace: [`StoreError::NamespaceNotCreated`],
/// [`StoreError::LayoutMismatch`], [`StoreError::CorruptNamespace`],
/// [`StoreError::NamespaceRolledBack`] (creating only), [`StoreError::BadFloor`].
pub async fn setup_namespace(
    config: ServerConfig,
    shutdown: CancellationToken,
) -> Result<bool, ServeError> {
    let StoreConfig::Etcd { endpoints } = &config.store else {
        return Ok(false);
    };
    let settings = etcd_settings(&config, endpoints);
    info!(namespace = %config.namespace, endpoints = ?endpoints, create = config.namespace_setup.create, confirm_floor = ?config.namespace_setup.confirm_floor, "setting up the namespace, then exiting");
    let connected = connect_etcd(settings, config.layout, SystemClock::shared(), &shutdown).await?;
    Ok(connected.is_some())
}

/// One generator per machine id of `config`, each with the channel the claim
/// loop feeds it grants through (slot `i` feeds generator `i`), and a
/// receiver of each channel, in slot order.
pub(crate) fn generator_slots(
    config: &ServerConfig,
    clock: &SharedClock,
) -> (
    Vec<Slot>,
    Vec<watch::Receiver<Option<Grant>>>,
    Arc<FenceDemand>,
) {
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

/// Runs the server on `listener` until `shutdown` is cancelled (or the lease
/// lifecycle fails), then drains and releases.
pub async fn run(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    // Checked here too, for every store: `ServerConfig` can be built without
    // the flags' validation, and the name becomes etcd keys and file names.
    if !is_valid_namespace(&config.namespace) {
        return Err(StoreError::InvalidNamespace {
            namespace: config.namespace,
        }
        .into());
    }
    let clock = SystemClock::shared();
    let unix_ms = clock.unix_ms();
    match config.layout.to_layout_ms(unix_ms) {
        None => {
            return Err(StoreError::ClockBeforeEpoch {
                unix_ms,
                epoch_unix_ms: config.layout.epoch_unix_ms(),
            }
            .into())
        }
        Some(now) if now > config.layout.max_timestamp() => {
            return Err(StoreError::LayoutExhausted {
                layout: config.layout,
                ended_unix_ms: config.layout.to_unix_ms(config.layout.max_timestamp()),
                unix_ms,
            }
            .into())
        }
        Some(_) => {}
    }
    // Before anything is claimed: a server that cannot serve TLS must not
    // hold machine ids.
    let tls = config
        .tls
        .as_ref()
        .map(crate::tls::ServerTls::load)
        .transpose()?;
    // Bound before anything is claimed, like the gRPC port.
    let admin_listener = match config.admin_listen {
        Some(address) => Some(
            TcpListener::bind(address)
                .await
                .map_err(|source| ServeError::AdminListen { address, source })?,
        ),
        None => None,
    };
    // The single-instance store opens now (its errors need an operator). etcd is
    // connected by the lease task, so the server answers (NOT_SERVING,
    // UNAVAILABLE) while etcd is still coming up instead of hanging callers.
    let (local, etcd_settings) = match &config.store {
        StoreConfig::Etcd { endpoints } => (None, Some(etcd_settings(&config, endpoints))),
        StoreConfig::SingleInstance { state_dir } => {
            let local = SingleInstanceStore::open(
                state_dir,
                &config.namespace,
                config.layout,
                &single_instance_machine_ids(&config),
            )?;
            let range = single_instance_range(&config);
            warn!(state_file = %local.path().display(), machine_ids = ?range, "running on the single-instance store with machine ids {}..{}: every other snowkeep-server issuing ids of this namespace must hold machine ids outside them (on the single-instance store, its own disjoint --machine-id-range), or ids will collide; use --etcd-endpoints to have machine ids assigned", range.start, range.end);
            (Some(local), None)
        }
    };
    let (store_kind, access) = match &etcd_settings {
        Some(_) => ("etcd", StoreAccess::etcd()),
        None => (
            "single-instance",
            StoreAccess::SingleInstance {
                machine_ids: single_instance_range(&config),
            },
        ),
    };
    if std::process::id() == 1 && !config.stable_instance && etcd_settings.is_some() {
        warn!("running as PID 1 with a generated instance id: every restart claims a fresh machine id and the old one is freed only when its lease expires, so crash loops can drain the pool; set --instance-id (e.g. the pod name) to get the same machine id back");
    }
    let listen = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(
        version = env!("CARGO_PKG_VERSION"),
        store = store_kind,
        namespace = %config.namespace,
        instance_id = %config.instance_id,
        layout = %config.layout,
        lease_ttl = ?config.lease_ttl,
        outage_budget = ?timing_budget(&config),
        etcd_access = etcd_settings.as_ref().map(|_| tracing::field::display(&config.etcd_access)),
        listen = %listen,
        auth = ?config.auth.mode,
        "snowkeep-server starting"
    );

    let ns = config.namespace.clone();
    let key_cache = crate::auth::KeyCache::new();
    let auth_mode = match &etcd_settings {
        Some(_) => crate::auth::ClusterAuth::on_etcd(config.auth.mode),
        None => crate::auth::ClusterAuth::off(),
    };
    let (slots, grant_rxs, demand) = generator_slots(&config, &clock);
    let grant_rx = grant_rxs
        .first()
        .cloned()
        .expect("config guarantees at least one machine id");
    let generators = GeneratorSet::new(slots.iter().map(|s| s.generator.clone()).collect());
    let timing = claim_timing(&config);

    let tracker = TaskTracker::new();
    let release = CancellationToken::new();
    let peers = Arc::new(OnceLock::new());
    let peer_clocks = crate::peers::PeerClocks::default();
    let mut peer_skew = config.peer_skew.clone();
    if config.tls.is_some() && peer_skew.tls.is_none() && !peer_skew.interval.is_zero() {
        info!("the peer clock check (--peer-skew-interval) is off while the gRPC port serves TLS without --peer-tls-ca-file: give the CA that signs the peers' certificates (and --peer-tls-server-name, the name they carry) to check peers' clocks over TLS");
        peer_skew.interval = Duration::ZERO;
    }
    let peer_check = !peer_skew.interval.is_zero();
    tracker.spawn(crate::peers::run(
        peer_skew,
        ns.clone(),
        peers.clone(),
        clock.clone(),
        peer_clocks.clone(),
        shutdown.clone(),
    ));
    // The lease loop gets a runtime of its own (see `lease_runtime`); the
    // etcd clients are made inside it, so their connection tasks and the
    // holder watch run there too, never queued behind request work.
    let lease_runtime = lease_runtime().map_err(ServeError::LeaseRuntime)?;
    let mut lease_task = {
        let (clock, ns, layout) = (clock.clone(), ns.clone(), config.layout);
        let wait_for_namespace = config.wait_for_namespace;
        let (shutdown, release, access) = (shutdown.clone(), release.clone(), access.clone());
        let (key_cache, bootstrap) = (key_cache.clone(), config.auth.bootstrap_admin_key.clone());
        let auth_mode = auth_mode.clone();
        lease_runtime.spawn(async move {
            // The capacity gauges follow the first slot's grant.
            let grant = grant_rxs[0].clone();
            match (local, etcd_settings) {
                (Some(local), _) => {
                    let source = SingleInstanceCapacity::new(&local, grant_rxs);
                    tokio::spawn(capacity::run(source, ns.clone(), grant, shutdown.clone()));
                    ClaimManager::new(local, layout, ns, clock, timing, slots, demand)
                        .run(release)
                        .await
                }
                (None, Some(settings)) => {
                    let Some(store) = connect_etcd_serving(
                        settings,
                        layout,
                        clock.clone(),
                        &shutdown,
                        Some(Serving {
                            access: &access,
                            keys: (&key_cache, bootstrap),
                            mode: &auth_mode,
                        }),
                        wait_for_namespace,
                    )
                    .await?
                    else {
                        return Ok(());
                    };
                    access.connected(&store);
                    let _ = peers.set(store.peer_directory());
                    // Advice only, so it neither delays nor stops the claim.
                    tokio::spawn(store.overlap_check().warn_once());
                    let source = store.capacity_reader();
                    tokio::spawn(capacity::run(source, ns.clone(), grant, shutdown.clone()));
                    ClaimManager::new(store, layout, ns, clock, timing, slots, demand)
                        .run(release)
                        .await
                }
                (None, None) => unreachable!("one of the two stores is configured"),
            }
        })
    };
    let info = InfoHandler::new(
        generators.clone(),
        clock.clone(),
        ns.clone(),
        config.instance_id.clone(),
        store_kind,
        access.clone(),
    );
    let admin = AdminHandler::new(
        StateAdmin::new(access.clone(), clock.clone())
            .with_max_send_message_size(config.limits.max_send_message_size),
        KeyAdmin::new(
            access.clone(),
            key_cache.clone(),
            auth_mode.clone(),
            clock.clone(),
        ),
    );
    if let Some(listener) = admin_listener {
        let address = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        info!(address = %address, auth = ?config.auth.mode, "serving the status page (--admin-listen)");
        let sources = crate::status_page::StatusSources {
            admin: admin.clone(),
            info: info.clone(),
            generators: generators.clone(),
            peers: peer_clocks,
            peer_check,
            peer_warn: config.peer_skew.warn,
            audit: crate::status_page::AuditRing::follow(shutdown.clone()),
            clock: clock.clone(),
            instance_id: config.instance_id.clone(),
            namespace: ns.clone(),
            auth: auth_mode.clone(),
            keys: key_cache.clone(),
        };
        tracker.spawn(crate::status_page::serve(
            listener,
            sources,
            crate::allow::AllowList::new(config.allow_cidrs.clone()),
            config.limits.idle_timeout,
            shutdown.clone(),
        ));
    }
    let (routes, reporter) = router(
        IdHandler::new(
            generators.clone(),
            ns.clone(),
            clock.clone(),
            shutdown.clone(),
        ),
        info,
        LeaseHandler::new(access.clone(), config.lease_api, clock.clone()),
        admin,
        &config.limits,
    )?;
    tracker.spawn(health::follow_issuance(
        reporter,
        grant_rx,
        generators,
        ns,
        shutdown.clone(),
    ));
    let limits = &config.limits;
    if let Some(soft) = crate::limits::conn::open_file_limit() {
        // Connections outside the allow-list, and the status page's, only
        // exist when those are configured.
        let disallowed = match config.allow_cidrs.is_empty() {
            true => 0,
            false => crate::limits::conn::DISALLOWED_MAX_CONNECTIONS,
        };
        let status_page = match config.admin_listen {
            None => 0,
            Some(_) => crate::status_page::MAX_CONNECTIONS,
        };
        let needed = (limits.max_connections
            + crate::metrics_http::MAX_CONNECTIONS
            + disallowed
            + status_page) as u64
            + crate::limits::conn::OWN_DESCRIPTORS;
        if needed > soft {
            warn!(
                open_file_limit = soft,
                max_connections = limits.max_connections,
                metrics_connections = crate::metrics_http::MAX_CONNECTIONS,
                disallowed_connections = disallowed,
                status_page_connections = status_page,
                own_descriptors = crate::limits::conn::OWN_DESCRIPTORS,
                "--max-connections leaves too few file descriptors under the open-file limit: clients can exhaust those the server needs for etcd and its state; raise the limit (ulimit -n, LimitNOFILE) or lower --max-connections"
            );
        }
    }
    let call_limits = CallLimits::new(limits);
    let listener = Listener::new(
        listener,
        ListenerLimits {
            name: "gRPC",
            max_connections: limits.max_connections,
            max_connections_flag: "--max-connections",
            max_connections_per_peer: limits.max_connections_per_peer,
            send_timeout: limits.stream_send_timeout,
            idle_timeout: limits.idle_timeout,
            handshake_timeout: crate::limits::conn::HANDSHAKE_TIMEOUT,
            tcp_keepalive: limits.tcp_keepalive,
        },
        shutdown.clone(),
    )
    .with_allow_list(crate::allow::AllowList::new(config.allow_cidrs.clone()));
    let listener = match (tls, &config.tls) {
        (Some((tls, reloader)), Some(settings)) => {
            info!(cert_file = %settings.cert_file.display(), client_ca_file = ?settings.client_ca_file, reload_interval = ?settings.reload_interval, "serving gRPC over TLS");
            tracker.spawn(reloader.run(shutdown.clone()));
            listener.with_tls(tls)
        }
        _ => listener,
    };
    if !config.allow_cidrs.is_empty() {
        info!(allow_cidrs = ?config.allow_cidrs, disallowed_max_connections = crate::limits::conn::DISALLOWED_MAX_CONNECTIONS, "calls from other peer addresses get PERMISSION_DENIED, on connections of their own small budget that close soon");
    }
    let open_connections = listener.open_connections();
    let window = receive_window(limits);
    let mut server = tracker.spawn(
        tonic::transport::Server::builder()
            // tonic leaves these unset, which hyper reads as "no limit".
            .max_concurrent_streams(limits.http2_max_concurrent_streams)
            .http2_max_header_list_size(limits.http2_max_header_list_size)
            .http2_keepalive_interval(limits.http2_keepalive_interval)
            .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout))
            .initial_stream_window_size(window)
            .initial_connection_window_size(window)
            .http2_adaptive_window(Some(false))
            // One span per call, named after the method (exported over OTLP
            // with --otlp-endpoint).
            .trace_fn(|req| {
                let path = req.uri().path();
                // DEBUG: off for the logs by default (no cost per call),
                // on for the OTLP layer, whose filter lets it through.
                tracing::debug_span!(
                    "grpc",
                    otel.name = path,
                    rpc.system = "grpc",
                    rpc.method = path
                )
            })
            // Outermost first: metrics see the final code of every call,
            // shed ones included.
            .layer(crate::metrics::grpc_layer::GrpcMetricsLayer::new())
            // Before anything that holds resources for a call.
            .layer(crate::allow::AllowList::new(config.allow_cidrs.clone()))
            // Inside metrics (which count its refusals by code), before the
            // call limits: a call without a valid key takes no call slot.
            .layer(crate::auth::AuthLayer::new(
                auth_mode,
                key_cache,
                clock.clone(),
                config.namespace.clone(),
            ))
            .layer(call_limits.layer())
            .layer(WireStatusLayer)
            .add_routes(routes)
            .serve_with_incoming_shutdown(listener.incoming(), shutdown.clone().cancelled_owned()),
    );
    tracker.close();

    let mut lease_result = None;
    let mut server_result = None;
    // Biased: when a signal cancels `shutdown` and the server, told by the
    // same token, has already finished draining, this is still a shutdown
    // (and is logged as a drain), not a server that stopped by itself.
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {}
        r = &mut lease_task => { lease_result = Some(r); shutdown.cancel(); }
        r = &mut server => { server_result = Some(r); shutdown.cancel(); }
    }
    // Health is NOT_SERVING and the listener closed; wait for in-flight calls.
    let server_result = match server_result {
        Some(r) => r,
        None => match tokio::time::timeout(config.shutdown_grace_period, &mut server).await {
            Ok(r) => {
                info!("in-flight requests drained gracefully");
                r
            }
            Err(_) => {
                let (calls, connections) = (call_limits.in_progress(), open_connections.get());
                if calls > 0 {
                    warn!(grace_period = ?config.shutdown_grace_period, calls, connections, "drain timed out; aborting the calls still in progress");
                } else {
                    info!(grace_period = ?config.shutdown_grace_period, connections, "no call in progress; closing the connections whose clients did not answer the HTTP/2 shutdown");
                }
                server.abort();
                Ok(Ok(()))
            }
        },
    };
    // Only now may the machine id be given back: every call that could
    // stamp ids under it is done.
    release.cancel();
    let lease_result = match lease_result {
        Some(r) => r,
        None => match tokio::time::timeout(RELEASE_TIMEOUT, &mut lease_task).await {
            Ok(r) => r,
            Err(_) => {
                error!("release did not finish in time; the machine id frees itself when its lease expires");
                Ok(Ok(()))
            }
        },
    };
    lease_result??;
    server_result??;
    Ok(())
}

/// The runtime the lease loop runs on: one worker thread of its own,
/// `snowkeep-lease`, with its own timers and IO. Request work (thousands of
/// streams, each always ready to send) keeps the server runtime's workers
/// and queues busy; a task queued behind it waits its turn there, and a lease
/// loop that waits long enough misses its renewals and fence raises (each
/// etcd request has a quarter of the lease TTL to answer), so issuance stops
/// at a fence nobody raised. A thread of its own is scheduled by the
/// operating system as soon as it wakes, whatever the request load.
fn lease_runtime() -> std::io::Result<LeaseRuntime> {
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
struct LeaseRuntime(Option<tokio::runtime::Runtime>);

impl LeaseRuntime {
    fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
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
