//! Configuration: `Args` (clap: flags, each also `SNOWKEEP_<FLAG>`) is parsed,
//! then validated into the plain [`ServerConfig`] the library takes. Tests build
//! `ServerConfig` directly or parse with `Args::try_parse_from`.
//!
//! `Args` is made of one group of flags per concern, each its own `--help`
//! heading and module, each checked into the settings of the code that uses
//! it; [`ServerConfig::try_from`] only assembles them:
//!
//! | module | group | checked into |
//! | --- | --- | --- |
//! | `store` | [`StoreArgs`]: etcd endpoints, TLS and user; state directory | [`StoreConfig`], `snowkeep_etcd`'s [`EtcdAccess`] |
//! | `etcd_files` | reading the etcd TLS and password files | PEM bytes, the password |
//! | `listen` | [`ListenArgs`]: addresses, gRPC TLS, allow-list | [`TlsSettings`], allowed networks |
//! | `namespace` | [`NamespaceArgs`]: namespace, layout, instance id, machine ids, one-shots | [`Layout`], [`NamespaceSetup`] |
//! | `timing` | [`TimingArgs`]: lease TTL, outage budget, waits, drain, loss policy | checked durations, [`OnLeaseLost`] |
//! | `lease_api` | [`LeaseApiArgs`]: embedded requesters' leases | `LeaseApiConfig` |
//! | `peers` | [`PeerArgs`]: advertised address, peer clock check | [`PeerSkewConfig`] |
//! | `auth` | [`AuthArgs`]: cluster mode, bootstrap admin key | [`AuthConfig`] |
//! | `limits` | [`LimitArgs`]: connections, calls, memory, HTTP/2 | [`Limits`] |
//! | `telemetry` | [`TelemetryArgs`]: log format, OTLP export | read by `main` |
//! | `error` | [`ConfigError`] (exit code 64), [`EndpointProblem`] | |

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ipnet::IpNet;
use snowkeep_client::Layout;
use snowkeep_core::claim::OnLeaseLost;
use snowkeep_etcd::access::EtcdAccess;
use snowkeep_etcd::namespace::NamespaceSetup;

use crate::auth::AuthConfig;
use crate::lease_api::LeaseApiConfig;
use crate::tls::TlsSettings;

mod auth;
mod error;
mod etcd_files;
mod lease_api;
mod limits;
mod listen;
mod migration;
mod namespace;
mod peers;
mod store;
mod telemetry;
mod timing;

pub use auth::AuthArgs;
pub use error::{ConfigError, EndpointProblem};
pub use lease_api::LeaseApiArgs;
pub use limits::LimitArgs;
pub use listen::{CorsOrigins, ListenArgs};
pub use namespace::NamespaceArgs;
pub use peers::{PeerArgs, PeerSkewConfig, PeerTls};
pub use store::StoreArgs;
pub use telemetry::{LogFormat, TelemetryArgs};
pub use timing::{LeaseLostArg, TimingArgs};

/// Default gRPC listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default metrics listen address.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// Default namespace.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Default etcd lease TTL.
pub const DEFAULT_LEASE_TTL: &str = "10s";
/// Default single-instance-store state directory.
pub const DEFAULT_STATE_DIR: &str = "snowkeep-state";
/// Default layout (the Korean reference's 41/12/10 with the 2026-01-01 epoch).
pub const DEFAULT_LAYOUT: &str = "41/12/10@1767225600000";
/// Default outage budget: how long a server keeps issuing with etcd
/// unreachable (its fences run between one and 1.5 budgets ahead of its clock
/// while it issues).
pub const DEFAULT_OUTAGE_BUDGET: &str = "60s";
/// Default longest wait for the clock to pass a previous holder's fence.
pub const DEFAULT_MAX_FENCE_WAIT: &str = "10s";
/// Default largest backwards clock step that is waited out.
pub const DEFAULT_MAX_BACKWARD_WAIT: &str = "100ms";
/// Default bound on draining in-flight requests at shutdown.
pub const DEFAULT_SHUTDOWN_GRACE_PERIOD: &str = "10s";

/// Most machine ids one instance holds. The release transaction writes three
/// keys per machine id and etcd allows 128 operations per transaction
/// (`--max-txn-ops` default), so 42.
pub const MAX_MACHINE_IDS: u32 = 42;

/// Default first lease of an embedded requester (10 min).
pub const DEFAULT_FIRST_LEASE_DURATION: &str = "10m";
/// Default renewed lease of an embedded requester (48 h).
pub const DEFAULT_RENEWED_LEASE_DURATION: &str = "48h";
/// Default client clock-skew threshold (10 min).
pub const DEFAULT_CLIENT_SKEW_THRESHOLD: &str = "10m";

/// snowkeep-server: leases snowflake machine ids and issues ascending 63-bit ids over gRPC.
#[derive(Debug, Clone, Parser)]
#[command(name = "snowkeep-server", version, about)]
pub struct Args {
    /// Where machine-id leases are kept, and how etcd is reached.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Where the server listens, and who may call its gRPC port.
    #[command(flatten)]
    pub listening: ListenArgs,
    /// Namespace, layout, instance id and machine ids.
    #[command(flatten)]
    pub namespace: NamespaceArgs,
    /// Claim timing.
    #[command(flatten)]
    pub timing: TimingArgs,
    /// Lease API.
    #[command(flatten)]
    pub lease_api: LeaseApiArgs,
    /// Peer clock check.
    #[command(flatten)]
    pub peers: PeerArgs,
    /// API keys.
    #[command(flatten)]
    pub auth: AuthArgs,
    /// Limits.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Logs and traces.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// Default period of re-reading the TLS files.
pub const DEFAULT_TLS_RELOAD_INTERVAL: &str = "5s";

// The limit flags' defaults and their size parser live with `Limits` in
// `crate::limits::settings` (their `Default` is `Limits::default()`); named
// here too, beside the flags that take them.
pub use crate::limits::settings::{
    parse_size, Limits, DEFAULT_HTTP2_KEEPALIVE_INTERVAL, DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
    DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS, DEFAULT_HTTP2_MAX_HEADER_LIST_SIZE, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CALLS_PER_KEY, DEFAULT_MAX_CALL_MEMORY, DEFAULT_MAX_CONCURRENT_CALLS,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_PEER, DEFAULT_MAX_KEYLESS_CALLS,
    DEFAULT_MAX_KEYLESS_CALLS_PER_PEER, DEFAULT_MAX_KEYLESS_STREAMS, DEFAULT_MAX_OPEN_STREAMS,
    DEFAULT_MAX_RECV_MESSAGE_SIZE, DEFAULT_MAX_SEND_MESSAGE_SIZE, DEFAULT_MAX_STREAMS_PER_KEY,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_STREAM_SEND_TIMEOUT, DEFAULT_TCP_KEEPALIVE,
};

/// Default period of the peer clock check.
pub const DEFAULT_PEER_SKEW_INTERVAL: &str = "30s";
/// Default peer offset that logs a warning (the SnowkeepPeerClockSkew alert's
/// threshold too).
pub const DEFAULT_PEER_SKEW_WARN: &str = "500ms";

/// Where machine-id leases are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// etcd at these client URLs.
    Etcd {
        /// Client URLs.
        endpoints: Vec<String>,
    },
    /// The single-instance store in this directory.
    SingleInstance {
        /// State directory.
        state_dir: PathBuf,
    },
}

/// The validated server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Lease store.
    pub store: StoreConfig,
    /// Namespace.
    pub namespace: String,
    /// Layout.
    pub layout: Layout,
    /// Instance id.
    pub instance_id: String,
    /// True when the instance id was given explicitly (stable instance).
    pub stable_instance: bool,
    /// etcd lease TTL (whole seconds).
    pub lease_ttl: Duration,
    /// Machine ids this instance may claim, `[start, end)`.
    pub machine_id_range: Range<u32>,
    /// Machine ids held under the one lease (at least 1, at most the range).
    pub machine_ids: u32,
    /// Outage budget (etcd store).
    pub outage_budget: Duration,
    /// Longest fence wait.
    pub max_fence_wait: Duration,
    /// Largest backwards step waited out.
    pub max_backward_wait: Duration,
    /// Drain bound at shutdown.
    pub shutdown_grace_period: Duration,
    /// Loss policy.
    pub on_lease_lost: OnLeaseLost,
    /// Lease API durations and skew threshold.
    pub lease_api: LeaseApiConfig,
    /// Peer registration and clock check.
    pub peer_skew: PeerSkewConfig,
    /// Namespace creation or floor confirmation at connect (etcd only).
    pub namespace_setup: NamespaceSetup,
    /// Wait for a namespace without a record instead of exiting (`--wait-for-namespace`).
    pub wait_for_namespace: bool,
    /// Exit after [`ServerConfig::namespace_setup`] instead of serving.
    pub setup_only: bool,
    /// Bounds on connections, calls and messages.
    pub limits: Limits,
    /// TLS and authentication towards etcd (etcd store only).
    pub etcd_access: EtcdAccess,
    /// TLS on the gRPC port; `None` serves plaintext (h2c).
    pub tls: Option<TlsSettings>,
    /// Client networks allowed to call; empty allows every address.
    pub allow_cidrs: Vec<IpNet>,
    /// Web origins allowed to call from a browser (CORS).
    pub cors_allow_origins: CorsOrigins,
    /// API keys.
    pub auth: AuthConfig,
    /// Where the status page listens (`--admin-listen`); `None`: no page.
    pub admin_listen: Option<SocketAddr>,
}

impl ServerConfig {
    /// How far ahead of its clock a server raises its fences: 1.5 outage
    /// budgets, so a busy server that raises once its fence is less than one
    /// budget ahead raises at most once per half budget. Also the farthest
    /// ahead any live server's fence can be, so the floor assumed for a
    /// fence key that may have been deleted under a live holder.
    pub fn fence_lead(&self) -> Duration {
        snowkeep_core::claim::fence_lead(self.outage_budget)
    }
}

impl TryFrom<Args> for ServerConfig {
    type Error = ConfigError;

    /// Checks each group in turn (the first refusal wins, so the order is
    /// part of the behaviour) and assembles the result.
    fn try_from(args: Args) -> Result<Self, ConfigError> {
        let Args {
            store,
            listening,
            namespace,
            timing,
            lease_api,
            peers,
            auth,
            limits,
            telemetry: _,
        } = args;
        let layout = namespace.layout()?;
        namespace.check_name()?;
        timing.check()?;
        let lease_api = LeaseApiConfig::try_from(&lease_api)?;
        let limits = Limits::try_from(&limits)?;
        let tls = listening.tls()?;
        let peer_skew = peers.skew_config(tls.as_ref(), listening.listen)?;
        let allow_cidrs = listening.allow_cidrs()?;
        let cors_allow_origins = listening.cors_allow_origins()?;
        let (instance_id, stable_instance) = namespace.instance()?;
        let store_config = store.store()?;
        let etcd_access = store.etcd_access(&store_config)?;
        let now = snowkeep_client::Clock::unix_ms(&snowkeep_client::SystemClock);
        let namespace_setup =
            namespace.setup(&store_config, &layout, now, timing.max_fence_wait)?;
        let auth = auth.config(&store_config)?;
        listening.check_admin_listen(&store_config)?;
        let (machine_id_range, machine_ids) = namespace.machine_ids(&layout)?;
        Ok(ServerConfig {
            store: store_config,
            setup_only: namespace.setup_only(),
            namespace: namespace.namespace,
            layout,
            instance_id,
            stable_instance,
            lease_ttl: timing.lease_ttl,
            machine_id_range,
            machine_ids,
            outage_budget: timing.outage_budget,
            max_fence_wait: timing.max_fence_wait,
            max_backward_wait: timing.max_backward_wait,
            shutdown_grace_period: timing.shutdown_grace_period,
            on_lease_lost: timing.on_lease_lost.into(),
            lease_api,
            peer_skew,
            namespace_setup,
            wait_for_namespace: namespace.wait_for_namespace,
            limits,
            etcd_access,
            tls,
            allow_cidrs,
            cors_allow_origins,
            auth,
            admin_listen: listening.admin_listen,
        })
    }
}

/// `host:pid:random-suffix` (a random suffix keeps two containers that
/// both run as PID 1 on one host address apart).
pub fn default_instance_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!(
        "{host}:{}:{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

#[cfg(test)]
mod tests;
