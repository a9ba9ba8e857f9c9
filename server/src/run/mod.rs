//! Wiring: store → lease manager → generator → gRPC services, and the ordered
//! shutdown: health NOT_SERVING → stop accepting → streams end → drain
//! in-flight requests (bounded) → release. A machine id is released only
//! after the calls that could stamp ids under it are done.
//!
//! The gRPC server runs under `crate::limits`: connections come through a
//! `Listener` (backoff on accept errors, a connection cap, silent
//! connections closed), calls through `CallLimits` (slots and memory per
//! pool), and tonic's builder sets the HTTP/2 bounds.
//!
//! | module | owns |
//! | --- | --- |
//! | `claim` | the generators' slots, the claim loop's timing, the claim task on its own runtime |
//! | `grpc` | the status page, the gRPC listener, tonic's server and its layers |
//! | `drain` | waiting for the stop, draining calls (bounded), then the release |

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use snowkeep_client::{GeneratorSet, Grant, SharedClock, SystemClock};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::Routes;
use tracing::{info, warn};

use crate::admin::{keys::KeyAdmin, state::StateAdmin, AdminHandler};
use crate::auth::{ClusterAuth, KeyCache};
use crate::config::{ServerConfig, StoreConfig};
pub(crate) use crate::connect::{connect_etcd, connect_etcd_serving, Serving};
use crate::lease_api::LeaseHandler;
use crate::limits::calls::CallLimits;
use crate::peers::PeerClocks;
use crate::router::router;
use crate::service::{health, id::IdHandler, info::InfoHandler, StoreAccess};
use snowkeep_core::claim::StoreError;
use snowkeep_core::namespace::is_valid_namespace;
use snowkeep_core::single_instance::SingleInstanceStore;
use snowkeep_etcd::EtcdSettings;

mod claim;
mod drain;
mod grpc;

pub(crate) use claim::{claim_timing, generator_slots};
use claim::{ClaimTask, Store};
use drain::Running;
use grpc::StatusPage;

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
    /// The HTTP/JSON routes could not be read from the descriptors built
    /// into this binary (a build defect, never a user's).
    #[error("the HTTP/JSON routes cannot be served: {0}")]
    HttpRoutes(String),
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
    /// The claim loop's own runtime (a thread) could not be started.
    #[error("cannot start the claim loop's runtime")]
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
                        | StoreError::MigrationFloorNotSet { .. }
                        | StoreError::CorruptNamespace { .. }
                        | StoreError::BadFloor { .. }
                        | StoreError::AccessRefused { .. }
                        | StoreError::AuthModeMismatch { .. }
                )
        )
    }
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

/// The handles the claim task and the services share: clock, namespace,
/// store access, API keys and the cluster's security mode, and the
/// shutdown token.
#[derive(Clone)]
pub(super) struct Shared {
    /// The clock every part reads.
    pub(super) clock: SharedClock,
    /// `--namespace`.
    pub(super) namespace: String,
    /// The store as the services reach it (etcd once connected).
    pub(super) access: StoreAccess,
    /// API keys, filled from etcd.
    pub(super) key_cache: KeyCache,
    /// The cluster's security mode as this server follows it.
    pub(super) auth_mode: ClusterAuth,
    /// Cancelled on SIGTERM/SIGINT or when the claim or the server stops.
    pub(super) shutdown: CancellationToken,
}

/// Runs the server on `listener` until `shutdown` is cancelled (or the lease
/// lifecycle fails), then drains and releases.
pub async fn run(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let clock = SystemClock::shared();
    check_namespace_and_clock(&config, &clock)?;
    // The namespace's layout is this one (the store refuses a mismatch).
    crate::metrics::watch_layout(&config.namespace, &config.layout, &*clock);
    // Before anything is claimed: a server that cannot serve TLS must not
    // hold machine ids.
    let tls = config
        .tls
        .as_ref()
        .map(crate::tls::ServerTls::load)
        .transpose()?;
    // Bound before anything is claimed, like the gRPC port.
    let status_listener = bind_status_page(&config).await?;
    let store = open_store(&config)?;
    log_start(&config, &store, &listener);
    let shared = shared_handles(&config, &store, clock, shutdown.clone());
    let (slots, grant_rxs, demand) = generator_slots(&config, &shared.clock);
    // Health follows every slot's grant.
    let grant_watch = grant_rxs.clone();
    let generators = GeneratorSet::new(slots.iter().map(|s| s.generator.clone()).collect());
    let tracker = TaskTracker::new();
    let (peers, peer_clocks) = (Arc::new(OnceLock::new()), PeerClocks::default());
    let peer_check = start_peer_check(&config, &shared, &tracker, peers.clone(), &peer_clocks);
    // The claim loop gets a runtime of its own (see `lease_runtime`); the
    // etcd clients are made inside it, so their connection tasks and the
    // holder watch run there too, never queued behind request work.
    let lease_runtime = claim::lease_runtime().map_err(ServeError::LeaseRuntime)?;
    let release = CancellationToken::new();
    let slots = (slots, grant_rxs, demand);
    let claim = ClaimTask::new(&config, shared.clone(), slots, peers, release.clone());
    let lease_task = lease_runtime.spawn(claim.run(store));
    let status_page = status_listener.map(|l| (l, peer_clocks, peer_check));
    let routes = services(
        &config,
        &shared,
        generators,
        grant_watch,
        status_page,
        &tracker,
    )?;
    grpc::warn_if_few_descriptors(&config);
    let call_limits = CallLimits::new(&config.limits, Arc::new(crate::service::weight::IdWeight));
    let listener = grpc::grpc_listener(&config, listener, tls, &tracker, &shutdown);
    let open_connections = listener.open_connections();
    let serve = grpc::serve_grpc(&config, shared, listener, &call_limits, routes)
        .map_err(ServeError::HttpRoutes)?;
    let server = tracker.spawn(serve);
    tracker.close();
    let running = Running {
        lease_task,
        server,
        release,
        call_limits,
        open_connections,
    };
    running.stop(&shutdown, config.shutdown_grace_period).await
}

/// Refuses to start with a namespace that breaks the rule (checked here
/// too, for every store: `ServerConfig` can be built without the flags'
/// validation, and the name becomes etcd keys and file names), or with a
/// clock outside the layout's time span.
fn check_namespace_and_clock(config: &ServerConfig, clock: &SharedClock) -> Result<(), StoreError> {
    if !is_valid_namespace(&config.namespace) {
        return Err(StoreError::InvalidNamespace {
            namespace: config.namespace.clone(),
        });
    }
    let unix_ms = clock.unix_ms();
    match config.layout.to_layout_ms(unix_ms) {
        None => Err(StoreError::ClockBeforeEpoch {
            unix_ms,
            epoch_unix_ms: config.layout.epoch_unix_ms(),
        }),
        Some(now) if now > config.layout.max_timestamp() => Err(StoreError::LayoutExhausted {
            layout: config.layout,
            ended_unix_ms: config.layout.to_unix_ms(config.layout.max_timestamp()),
            unix_ms,
        }),
        Some(_) => Ok(()),
    }
}

/// Binds the status page's listener (`--admin-listen`), if configured.
async fn bind_status_page(config: &ServerConfig) -> Result<Option<TcpListener>, ServeError> {
    let Some(address) = config.admin_listen else {
        return Ok(None);
    };
    TcpListener::bind(address)
        .await
        .map(Some)
        .map_err(|source| ServeError::AdminListen { address, source })
}

/// Opens the single-instance store now (its errors need an operator), or
/// keeps the etcd settings for the claim task, which connects.
fn open_store(config: &ServerConfig) -> Result<Store, StoreError> {
    let state_dir = match &config.store {
        StoreConfig::Etcd { endpoints } => {
            return Ok(Store::Etcd(Box::new(etcd_settings(config, endpoints))))
        }
        StoreConfig::SingleInstance { state_dir } => state_dir,
    };
    let local = SingleInstanceStore::open(
        state_dir,
        &config.namespace,
        config.layout,
        &single_instance_machine_ids(config),
    )?;
    let range = single_instance_range(config);
    warn!(state_file = %local.path().display(), machine_ids = ?range, "running on the single-instance store with machine ids {}..{}: every other snowkeep-server issuing ids of this namespace must hold machine ids outside them (on the single-instance store, its own disjoint --machine-id-range), or ids will collide; use --etcd-endpoints to have machine ids assigned", range.start, range.end);
    Ok(Store::SingleInstance(local))
}

/// Which store this is, as `GetInfo` and the start-up line name it.
fn store_kind(config: &ServerConfig) -> &'static str {
    match config.store {
        StoreConfig::Etcd { .. } => "etcd",
        StoreConfig::SingleInstance { .. } => "single-instance",
    }
}

/// The start-up line, and the warning for a generated instance id as PID 1.
fn log_start(config: &ServerConfig, store: &Store, listener: &TcpListener) {
    let etcd = matches!(store, Store::Etcd(_));
    if std::process::id() == 1 && !config.stable_instance && etcd {
        warn!("running as PID 1 with a generated instance id: every restart claims a fresh machine id and the old one is freed only when its lease expires, so crash loops can drain the pool; set --instance-id (e.g. the pod name) to get the same machine id back");
    }
    let listen = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(
        version = env!("CARGO_PKG_VERSION"),
        store = store_kind(config),
        namespace = %config.namespace,
        instance_id = %config.instance_id,
        layout = %config.layout,
        lease_ttl = ?config.lease_ttl,
        outage_budget = ?timing_budget(config),
        etcd_access = etcd.then(|| tracing::field::display(&config.etcd_access)),
        listen = %listen,
        auth = ?config.auth.mode,
        "snowkeep-server starting"
    );
}

/// The handles shared by the claim task and the services, for `store`.
fn shared_handles(
    config: &ServerConfig,
    store: &Store,
    clock: SharedClock,
    shutdown: CancellationToken,
) -> Shared {
    let (access, auth_mode) = match store {
        Store::Etcd(_) => (StoreAccess::etcd(), ClusterAuth::on_etcd(config.auth.mode)),
        Store::SingleInstance(_) => (
            StoreAccess::SingleInstance {
                machine_ids: single_instance_range(config),
            },
            ClusterAuth::off(),
        ),
    };
    Shared {
        clock,
        namespace: config.namespace.clone(),
        access,
        key_cache: KeyCache::new(),
        auth_mode,
        shutdown,
    }
}

/// Starts the peer clock check on `tracker`; it stays off while the gRPC
/// port serves TLS without `--peer-tls-ca-file`. True when it runs.
fn start_peer_check(
    config: &ServerConfig,
    shared: &Shared,
    tracker: &TaskTracker,
    peers: Arc<OnceLock<snowkeep_etcd::PeerDirectory>>,
    peer_clocks: &PeerClocks,
) -> bool {
    let mut peer_skew = config.peer_skew.clone();
    if config.tls.is_some() && peer_skew.tls.is_none() && !peer_skew.interval.is_zero() {
        info!("the peer clock check (--peer-skew-interval) is off while the gRPC port serves TLS without --peer-tls-ca-file: give the CA that signs the peers' certificates (and --peer-tls-server-name, the name they carry) to check peers' clocks over TLS");
        peer_skew.interval = Duration::ZERO;
    }
    let peer_check = !peer_skew.interval.is_zero();
    tracker.spawn(crate::peers::run(
        peer_skew,
        shared.namespace.clone(),
        peers,
        shared.clock.clone(),
        peer_clocks.clone(),
        shared.shutdown.clone(),
    ));
    peer_check
}

/// The InfoService and administration handlers, which the status page
/// shows too.
fn handlers(
    config: &ServerConfig,
    shared: &Shared,
    generators: &Arc<GeneratorSet>,
) -> (InfoHandler, AdminHandler) {
    let info = InfoHandler::new(
        generators.clone(),
        shared.clock.clone(),
        shared.namespace.clone(),
        config.instance_id.clone(),
        store_kind(config),
        shared.access.clone(),
    );
    let admin = AdminHandler::new(
        StateAdmin::new(shared.access.clone(), shared.clock.clone())
            .with_max_send_message_size(config.limits.max_send_message_size),
        KeyAdmin::new(
            shared.access.clone(),
            shared.key_cache.clone(),
            shared.auth_mode.clone(),
            shared.clock.clone(),
        ),
    );
    (info, admin)
}

/// The gRPC services' routes, and the status page (`--admin-listen`, with
/// the peer clock check's results) showing the same handlers; health
/// follows issuance from here on.
fn services(
    config: &ServerConfig,
    shared: &Shared,
    generators: Arc<GeneratorSet>,
    grant_watch: Vec<watch::Receiver<Option<Grant>>>,
    status_page: Option<(TcpListener, PeerClocks, bool)>,
    tracker: &TaskTracker,
) -> Result<Routes, ServeError> {
    let (info, admin) = handlers(config, shared, &generators);
    if let Some((listener, peers, peer_check)) = status_page {
        let page = StatusPage {
            admin: admin.clone(),
            info: info.clone(),
            generators: generators.clone(),
            peers,
            peer_check,
        };
        grpc::serve_status_page(config, shared, listener, page, tracker);
    }
    let (clock, ns, shutdown) = (&shared.clock, &shared.namespace, &shared.shutdown);
    let id = IdHandler::new(
        generators.clone(),
        ns.clone(),
        clock.clone(),
        shutdown.clone(),
    );
    let lease = LeaseHandler::new(shared.access.clone(), config.lease_api, clock.clone());
    let (routes, reporter) = router(id, info, lease, admin, &config.limits)?;
    tracker.spawn(health::follow_issuance(
        reporter,
        grant_watch,
        generators,
        ns.clone(),
        shutdown.clone(),
    ));
    Ok(routes)
}
