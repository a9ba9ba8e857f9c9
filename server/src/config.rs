//! Configuration: `Args` (clap: flags, each also `SNOWKEEP_<FLAG>`) is parsed,
//! then validated into the plain [`ServerConfig`] the library takes. Tests build
//! `ServerConfig` directly or parse with `Args::try_parse_from`.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use snowkeep_client::{Layout, LayoutError};
use thiserror::Error;

use crate::auth::{AuthConfig, AuthMode, BootstrapKey};
use crate::lease_api::LeaseApiConfig;
use crate::tls::{TlsError, TlsSettings};
use ipnet::IpNet;
use snowkeep_core::claim::OnLeaseLost;
use snowkeep_core::namespace::{is_valid_namespace, NAMESPACE_RULE};
use snowkeep_etcd::access::{ClientIdentity, EtcdAccess, EtcdCredentials, EtcdTls};
use snowkeep_etcd::namespace::{FloorSpec, NamespaceSetup};

/// `--on-lease-lost`: the flag's values, for clap; the claim loop takes
/// [`OnLeaseLost`] (snowkeep-core knows nothing of clap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LeaseLostArg {
    /// Stop issuing, then claim again (machine ids, possibly the same ones).
    Reclaim,
    /// Stop issuing and exit with code 1.
    Exit,
}

impl From<LeaseLostArg> for OnLeaseLost {
    fn from(arg: LeaseLostArg) -> Self {
        match arg {
            LeaseLostArg::Reclaim => OnLeaseLost::Reclaim,
            LeaseLostArg::Exit => OnLeaseLost::Exit,
        }
    }
}

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
    /// etcd client URLs (comma-separated), `http://host:port` (or `host:port`)
    /// or, for TLS, `https://host:port` (all of one scheme), e.g.
    /// http://127.0.0.1:2379. Without it the server runs on the
    /// single-instance store.
    #[arg(long, env = "SNOWKEEP_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// CA bundle (PEM) that signs the etcd members' server certificates: the
    /// only roots trusted for https:// endpoints, and required with them (for
    /// a public CA, give the system bundle, e.g.
    /// /etc/ssl/certs/ca-certificates.crt). Read at start.
    #[arg(long, env = "SNOWKEEP_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM, leaf first) presented to etcd, for etcd's
    /// --client-cert-auth; needs --etcd-key-file. Read at start.
    #[arg(long, env = "SNOWKEEP_ETCD_CERT_FILE")]
    pub etcd_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert-file. Read at start.
    #[arg(long, env = "SNOWKEEP_ETCD_KEY_FILE")]
    pub etcd_key_file: Option<PathBuf>,
    /// etcd user, when etcd's authentication is enabled; needs
    /// --etcd-password-file.
    #[arg(long, env = "SNOWKEEP_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password (one trailing newline is
    /// ignored). The password is taken only from a file, never from the
    /// command line, and never logged. Read at start.
    #[arg(long, env = "SNOWKEEP_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// gRPC listen address.
    #[arg(long, env = "SNOWKEEP_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Prometheus metrics listen address (GET /metrics).
    #[arg(long, env = "SNOWKEEP_METRICS_LISTEN", default_value = DEFAULT_METRICS_LISTEN)]
    pub metrics_listen: SocketAddr,
    /// Status page listen address (HTTP, GET /): a read-only page of the
    /// cluster's namespaces, machine ids, Lease API requesters, this
    /// server's state and recent audit events. Off unless given; a port
    /// alone (e.g. 9465) listens on 127.0.0.1 only; give a whole address
    /// (e.g. 0.0.0.0:9465) when the page must be reached from other hosts.
    /// With --auth on it needs an API key with the admin permission. Needs
    /// --etcd-endpoints.
    #[arg(long, env = "SNOWKEEP_ADMIN_LISTEN", value_parser = parse_admin_listen)]
    pub admin_listen: Option<SocketAddr>,
    /// Namespace: an isolated pool of machine ids with one layout; 1-64
    /// characters of A-Z a-z 0-9 . _ -, starting with a letter or a digit.
    #[arg(long, env = "SNOWKEEP_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// etcd lease TTL, whole seconds, at least 2s (e.g. 10s).
    #[arg(long, env = "SNOWKEEP_LEASE_TTL", default_value = DEFAULT_LEASE_TTL, value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
    /// Instance id. Setting it marks a stable instance that gets its machine id
    /// back after a restart; default host:pid:random-suffix.
    #[arg(long, env = "SNOWKEEP_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Directory of the single-instance store's state file (used without --etcd-endpoints).
    #[arg(long, env = "SNOWKEEP_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Machine ids this instance holds under its one lease; a unary batch larger
    /// than one millisecond's sequence is spread across them.
    #[arg(long, env = "SNOWKEEP_MACHINE_IDS", default_value_t = 1)]
    pub machine_ids: u32,
    /// Machine ids this deployment may claim, START..END (END exclusive), so
    /// deployments with separate etcd clusters own disjoint ranges; default all.
    /// The single-instance store holds the first --machine-ids of it (5..6 means
    /// machine id 5).
    #[arg(long, env = "SNOWKEEP_MACHINE_ID_RANGE")]
    pub machine_id_range: Option<String>,
    /// Id layout TIMESTAMP/MACHINE/SEQUENCE bits (sum 63), optional @EPOCH_UNIX_MS.
    #[arg(long, env = "SNOWKEEP_LAYOUT", default_value = DEFAULT_LAYOUT)]
    pub layout: String,
    /// How long a server keeps issuing while etcd is stalled or unreachable
    /// (e.g. 60s): a busy server keeps its fences at least this far ahead of
    /// its clock, raising them to 1.5 budgets ahead once per half budget. A
    /// crashed holder's machine ids are skipped by new claimers (or waited
    /// out) for up to 1.5 budgets. etcd store only.
    #[arg(long, env = "SNOWKEEP_OUTAGE_BUDGET", default_value = DEFAULT_OUTAGE_BUDGET, value_parser = humantime::parse_duration)]
    pub outage_budget: Duration,
    /// Longest wait for the clock to pass a claimed machine id's previous fence;
    /// a fence further ahead is refused.
    #[arg(long, env = "SNOWKEEP_MAX_FENCE_WAIT", default_value = DEFAULT_MAX_FENCE_WAIT, value_parser = humantime::parse_duration)]
    pub max_fence_wait: Duration,
    /// Largest backwards wall-clock step that is waited out; a larger one stops
    /// issuance (UNAVAILABLE) until the clock catches up.
    #[arg(long, env = "SNOWKEEP_MAX_BACKWARD_WAIT", default_value = DEFAULT_MAX_BACKWARD_WAIT, value_parser = humantime::parse_duration)]
    pub max_backward_wait: Duration,
    /// Bound on draining in-flight requests on SIGTERM/SIGINT before release.
    #[arg(long, env = "SNOWKEEP_SHUTDOWN_GRACE_PERIOD", default_value = DEFAULT_SHUTDOWN_GRACE_PERIOD, value_parser = humantime::parse_duration)]
    pub shutdown_grace_period: Duration,
    /// Lease API: the lease an embedded requester gets from Acquire (1m to 20m).
    #[arg(long, env = "SNOWKEEP_FIRST_LEASE_DURATION", default_value = DEFAULT_FIRST_LEASE_DURATION, value_parser = humantime::parse_duration)]
    pub first_lease_duration: Duration,
    /// Lease API: the lease a Renew extends to (5s to 30 days; renewals come
    /// at half of it).
    #[arg(long, env = "SNOWKEEP_RENEWED_LEASE_DURATION", default_value = DEFAULT_RENEWED_LEASE_DURATION, value_parser = humantime::parse_duration)]
    pub renewed_lease_duration: Duration,
    /// Lease API: Acquire is refused when the client's clock is behind or
    /// ahead of the server's by more than this (0 never refuses); half of it
    /// logs a warning.
    #[arg(long, env = "SNOWKEEP_CLIENT_SKEW_THRESHOLD", default_value = DEFAULT_CLIENT_SKEW_THRESHOLD, value_parser = humantime::parse_duration)]
    pub client_skew_threshold: Duration,
    /// On a lost lease: re-claim (default) or exit with code 1.
    #[arg(long, env = "SNOWKEEP_ON_LEASE_LOST", value_enum, default_value_t = LeaseLostArg::Reclaim)]
    pub on_lease_lost: LeaseLostArg,
    /// Log format.
    #[arg(long, env = "SNOWKEEP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// `host:port` where peer servers reach this server's gRPC port, registered
    /// in etcd for the peer clock check. Default: --listen, or HOSTNAME:PORT
    /// when --listen is a wildcard address (on Kubernetes, set it to
    /// `$(POD_IP):50051`).
    #[arg(long, env = "SNOWKEEP_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// How often to measure the clock offset to every peer server of the
    /// namespace (NTP-style, through InfoService.GetInfo); 0s turns it off.
    #[arg(long, env = "SNOWKEEP_PEER_SKEW_INTERVAL", default_value = DEFAULT_PEER_SKEW_INTERVAL, value_parser = humantime::parse_duration)]
    pub peer_skew_interval: Duration,
    /// Peer clock offset above which a warning is logged.
    #[arg(long, env = "SNOWKEEP_PEER_SKEW_WARN", default_value = DEFAULT_PEER_SKEW_WARN, value_parser = humantime::parse_duration)]
    pub peer_skew_warn: Duration,
    /// With TLS on the gRPC port: PEM CA certificates that sign the peers'
    /// server certificates, so the peer clock check calls peers over TLS
    /// (presenting this server's own certificate, for peers that require
    /// client certificates). Without it the check is off under TLS.
    #[arg(long, env = "SNOWKEEP_PEER_TLS_CA_FILE")]
    pub peer_tls_ca_file: Option<PathBuf>,
    /// The name peers' certificates carry, checked instead of the advertised
    /// address (peers are called by address, which certificates rarely
    /// name), e.g. the Service's DNS name.
    #[arg(long, env = "SNOWKEEP_PEER_TLS_SERVER_NAME")]
    pub peer_tls_server_name: Option<String>,
    /// OTLP/gRPC collector to export traces to, e.g. `http://otel-collector:4317`;
    /// no trace export without it.
    #[arg(long, env = "SNOWKEEP_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Create the namespace in etcd if it does not exist (no-op when it exists
    /// with the same layout). Use it once, for a new namespace: never leave it
    /// on every replica, or a wiped etcd is silently re-created.
    #[arg(long, env = "SNOWKEEP_CREATE_NAMESPACE")]
    pub create_namespace: bool,
    /// Create the namespace as --create-namespace does, then exit 0 without
    /// serving (an init step).
    #[arg(long, env = "SNOWKEEP_CREATE_NAMESPACE_ONLY")]
    pub create_namespace_only: bool,
    /// Wait for the namespace's record when it does not exist yet (logging
    /// each retry, NOT_SERVING meanwhile, the administration service
    /// answering) instead of exiting 64: for a restore (`snowkeepctl import`
    /// creates it) or a deployment whose creation job may run later.
    #[arg(long, env = "SNOWKEEP_WAIT_FOR_NAMESPACE")]
    pub wait_for_namespace: bool,
    /// One-shot, after etcd lost writes: every claim in the namespace starts
    /// above this floor (+DURATION like +48h1m, or an RFC 3339 UTC time),
    /// every holder starts over, the namespace is usable again; then exit 0.
    /// See docs/operations.md.
    #[arg(long, env = "SNOWKEEP_CONFIRM_NAMESPACE_FLOOR", value_parser = parse_floor)]
    pub confirm_namespace_floor: Option<FloorSpec>,
    /// Most open client connections to the gRPC port; a connection beyond it
    /// is closed at once.
    #[arg(long, env = "SNOWKEEP_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: u32,
    /// Most open connections to the gRPC port from one source IP address; a
    /// connection beyond it is closed at once. 0 turns the per-peer cap off
    /// (for clients that all come through one NAT or proxy address).
    #[arg(long, env = "SNOWKEEP_MAX_CONNECTIONS_PER_PEER", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    pub max_connections_per_peer: u32,
    /// A connection on which a call's response message (for a stream, the
    /// message being sent) has waited this long without being fully taken
    /// by the client is closed, freeing its calls' slots and memory; 0s
    /// never closes one. Range 1s to 1h.
    #[arg(long, env = "SNOWKEEP_STREAM_SEND_TIMEOUT", default_value = DEFAULT_STREAM_SEND_TIMEOUT, value_parser = humantime::parse_duration)]
    pub stream_send_timeout: Duration,
    /// Most concurrent HTTP/2 streams (calls) one connection may open
    /// (SETTINGS_MAX_CONCURRENT_STREAMS); clients queue the rest.
    #[arg(long, env = "SNOWKEEP_HTTP2_MAX_CONCURRENT_STREAMS", default_value_t = DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS)]
    pub http2_max_concurrent_streams: u32,
    /// Most unary calls in progress on the whole server; more get
    /// RESOURCE_EXHAUSTED. A call lasts until its response has left the process.
    #[arg(long, env = "SNOWKEEP_MAX_CONCURRENT_CALLS", default_value_t = DEFAULT_MAX_CONCURRENT_CALLS)]
    pub max_concurrent_calls: u32,
    /// Most streaming calls (StreamIds, health Watch, reflection) open on the
    /// whole server; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "SNOWKEEP_MAX_OPEN_STREAMS", default_value_t = DEFAULT_MAX_OPEN_STREAMS)]
    pub max_open_streams: u32,
    /// Most calls made without an API key under `--auth on` (health Check,
    /// GetInfo without a key) in progress at once, in a pool of their own:
    /// they never take a slot or memory from calls with a key.
    #[arg(long, env = "SNOWKEEP_MAX_KEYLESS_CALLS", default_value_t = DEFAULT_MAX_KEYLESS_CALLS)]
    pub max_keyless_calls: u32,
    /// Most streams opened without an API key under `--auth on` (health
    /// Watch, reflection), in a pool of their own.
    #[arg(long, env = "SNOWKEEP_MAX_KEYLESS_STREAMS", default_value_t = DEFAULT_MAX_KEYLESS_STREAMS)]
    pub max_keyless_streams: u32,
    /// Most keyless unary calls, and most keyless streams, one remote IP
    /// address may have in progress under `--auth on`: one peer cannot take
    /// the keyless pools that probes and peers' clock checks need.
    #[arg(long, env = "SNOWKEEP_MAX_KEYLESS_CALLS_PER_PEER", default_value_t = DEFAULT_MAX_KEYLESS_CALLS_PER_PEER)]
    pub max_keyless_calls_per_peer: u32,
    /// Most unary calls one API key may have in progress on this server;
    /// more get RESOURCE_EXHAUSTED, so one key cannot take every slot.
    #[arg(long, env = "SNOWKEEP_MAX_CALLS_PER_KEY", default_value_t = DEFAULT_MAX_CALLS_PER_KEY)]
    pub max_calls_per_key: u32,
    /// Most streams one API key may have open on this server.
    #[arg(long, env = "SNOWKEEP_MAX_STREAMS_PER_KEY", default_value_t = DEFAULT_MAX_STREAMS_PER_KEY)]
    pub max_streams_per_key: u32,
    /// A call whose request message has not fully arrived this long after
    /// its headers is ended with DEADLINE_EXCEEDED, freeing its slot.
    /// Range 100ms to 10m.
    #[arg(long, env = "SNOWKEEP_REQUEST_TIMEOUT", default_value = DEFAULT_REQUEST_TIMEOUT, value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Memory that calls in progress may reserve for their requests and the
    /// responses not yet sent (bytes, or with KiB/MiB/GiB); a quarter is kept
    /// for unary calls, the rest for streams. A call that finds no room gets
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "SNOWKEEP_MAX_CALL_MEMORY", default_value = DEFAULT_MAX_CALL_MEMORY, value_parser = parse_size)]
    pub max_call_memory: u64,
    /// Largest request message accepted (bytes, or with KiB/MiB); larger ones
    /// get RESOURCE_EXHAUSTED.
    #[arg(long, env = "SNOWKEEP_MAX_RECV_MESSAGE_SIZE", default_value = DEFAULT_MAX_RECV_MESSAGE_SIZE, value_parser = parse_size)]
    pub max_recv_message_size: u64,
    /// Largest response message sent (bytes, or with KiB/MiB); a call whose
    /// response would be larger gets RESOURCE_EXHAUSTED. 100,000 ids take
    /// 800,004 bytes.
    #[arg(long, env = "SNOWKEEP_MAX_SEND_MESSAGE_SIZE", default_value = DEFAULT_MAX_SEND_MESSAGE_SIZE, value_parser = parse_size)]
    pub max_send_message_size: u64,
    /// Largest HTTP/2 header list of a request (bytes, or with KiB).
    #[arg(long, env = "SNOWKEEP_HTTP2_MAX_HEADER_LIST_SIZE", default_value = DEFAULT_HTTP2_MAX_HEADER_LIST_SIZE, value_parser = parse_size)]
    pub http2_max_header_list_size: u64,
    /// How often the server pings each client over HTTP/2; 0s turns pings off.
    #[arg(long, env = "SNOWKEEP_HTTP2_KEEPALIVE_INTERVAL", default_value = DEFAULT_HTTP2_KEEPALIVE_INTERVAL, value_parser = humantime::parse_duration)]
    pub http2_keepalive_interval: Duration,
    /// A connection whose client does not answer a ping within this is closed.
    #[arg(long, env = "SNOWKEEP_HTTP2_KEEPALIVE_TIMEOUT", default_value = DEFAULT_HTTP2_KEEPALIVE_TIMEOUT, value_parser = humantime::parse_duration)]
    pub http2_keepalive_timeout: Duration,
    /// A connection with no call in progress whose client has sent nothing
    /// (not even a ping answer) for this long is closed; clients that answer
    /// the keepalive pings stay connected.
    #[arg(long, env = "SNOWKEEP_IDLE_TIMEOUT", default_value = DEFAULT_IDLE_TIMEOUT, value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// TCP keepalive idle time on accepted connections; 0s turns it off.
    #[arg(long, env = "SNOWKEEP_TCP_KEEPALIVE", default_value = DEFAULT_TCP_KEEPALIVE, value_parser = humantime::parse_duration)]
    pub tcp_keepalive: Duration,
    /// PEM certificate chain (leaf first) to serve the gRPC port over TLS
    /// with; needs --tls-key-file. Re-read every --tls-reload-interval.
    #[arg(long, env = "SNOWKEEP_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "SNOWKEEP_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates: with it every client must present a certificate
    /// signed by one of them (mTLS), or its TLS handshake fails.
    #[arg(long, env = "SNOWKEEP_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// How often the TLS files are re-read; changed, valid files serve the
    /// connections accepted from then on (100ms to 1h).
    #[arg(long, env = "SNOWKEEP_TLS_RELOAD_INTERVAL", default_value = DEFAULT_TLS_RELOAD_INTERVAL, value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,
    /// Client networks allowed to call the gRPC port, comma-separated CIDR
    /// ranges (10.0.0.0/8,127.0.0.1/32; a bare address is one host); calls
    /// from elsewhere get PERMISSION_DENIED. Empty allows every address.
    #[arg(long, env = "SNOWKEEP_ALLOW_CIDRS", value_delimiter = ',')]
    pub allow_cidrs: Vec<String>,
    /// API keys, whose mode is the cluster's (kept in etcd): not given, the
    /// server follows the cluster. `on` sets the cluster's mode to on when
    /// it was never set, and refuses to start (exit 64) when an admin turned
    /// it off; `off` refuses to start when the cluster's mode is on. While
    /// on, every call but health and reflection sends `authorization:
    /// Bearer <id>.<secret>`.
    #[arg(long, env = "SNOWKEEP_AUTH", value_enum)]
    pub auth: Option<AuthMode>,
    /// A file holding an API key `<id>.<secret>` (first line): at start the
    /// server writes it to etcd as an admin key unless a key with that id
    /// exists (which is left as it is). The way to the first admin key,
    /// e.g. from a Kubernetes Secret.
    #[arg(long, env = "SNOWKEEP_BOOTSTRAP_ADMIN_KEY_FILE")]
    pub bootstrap_admin_key_file: Option<PathBuf>,
}

/// Default period of re-reading the TLS files.
pub const DEFAULT_TLS_RELOAD_INTERVAL: &str = "5s";

fn parse_floor(text: &str) -> Result<FloorSpec, String> {
    text.parse()
}

/// `--admin-listen`: `HOST:PORT`, or a port alone, which binds the loopback
/// address 127.0.0.1 so the page stays on the host unless an address says
/// otherwise.
fn parse_admin_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)));
    }
    text.parse().map_err(|_| {
        format!("{text:?} is neither HOST:PORT (e.g. 127.0.0.1:9465, [::1]:9465) nor a port (e.g. 9465, which listens on 127.0.0.1)")
    })
}

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

/// Settings of the peer clock check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSkewConfig {
    /// `host:port` registered for peers to call.
    pub advertise_address: String,
    /// Period of the check; zero turns it off.
    pub interval: Duration,
    /// Offset that logs a warning.
    pub warn: Duration,
    /// TLS towards peers (`--peer-tls-ca-file`); `None`: plaintext, which
    /// only works while the gRPC port serves plaintext.
    pub tls: Option<PeerTls>,
}

/// How the peer clock check reaches peers that serve TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTls {
    /// `--peer-tls-ca-file`: the CA bundle peers' certificates chain to.
    pub ca_file: PathBuf,
    /// `--peer-tls-server-name`: the name checked in their certificates.
    pub server_name: Option<String>,
    /// This server's own certificate and key (`--tls-cert-file`,
    /// `--tls-key-file`), presented to peers that require one; read again
    /// for every new peer connection, so a rotated pair is used.
    pub identity: (PathBuf, PathBuf),
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

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

/// Invalid configuration (exit code 64).
#[derive(Debug, Error)]
pub enum ConfigError {
    /// Bad layout.
    #[error("invalid --layout (SNOWKEEP_LAYOUT)")]
    Layout(#[from] LayoutError),
    /// Bad namespace (see [`NAMESPACE_RULE`]).
    #[error("invalid --namespace (SNOWKEEP_NAMESPACE) {0:?}: a namespace is {NAMESPACE_RULE}")]
    Namespace(String),
    /// Bad TTL.
    #[error("invalid --lease-ttl (SNOWKEEP_LEASE_TTL) {}: use whole seconds, at least 2s", humantime::format_duration(*.0))]
    LeaseTtl(Duration),
    /// A duration outside its bounds.
    #[error("invalid {flag} {}: use at most {}", humantime::format_duration(*value), humantime::format_duration(*max))]
    TooLong {
        /// The flag and its variable.
        flag: &'static str,
        /// Given.
        value: Duration,
        /// Largest allowed.
        max: Duration,
    },
    /// A duration outside its range.
    #[error("invalid {flag} {}: use {} to {}", humantime::format_duration(*value), humantime::format_duration(*min), humantime::format_duration(*max))]
    OutOfRange {
        /// The flag and its variable.
        flag: &'static str,
        /// Given.
        value: Duration,
        /// Smallest allowed.
        min: Duration,
        /// Largest allowed.
        max: Duration,
    },
    /// Bad outage budget.
    #[error("invalid --outage-budget (SNOWKEEP_OUTAGE_BUDGET) {}: use at least 1s", humantime::format_duration(*.0))]
    OutageBudget(Duration),
    /// Bad instance id.
    #[error("invalid --instance-id (SNOWKEEP_INSTANCE_ID) {0:?}: use 1-256 printable characters, no '/'")]
    InstanceId(String),
    /// Bad machine id range.
    #[error("invalid --machine-id-range (SNOWKEEP_MACHINE_ID_RANGE) {text:?}: use START..END with START < END <= {max} (2^machine_bits of the layout)")]
    MachineIdRange {
        /// Given.
        text: String,
        /// Largest END allowed.
        max: u32,
    },
    /// Bad machine id count.
    #[error("invalid --machine-ids (SNOWKEEP_MACHINE_IDS) {got}: use 1 to {max} (the machine ids of --machine-id-range, at most 42)")]
    MachineIds {
        /// Given.
        got: u32,
        /// Largest allowed.
        max: u32,
    },
    /// A count or size outside its range.
    #[error("invalid {flag} {value}: use {min} to {max}")]
    LimitOutOfRange {
        /// The flag and its variable.
        flag: &'static str,
        /// Given.
        value: u64,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// Bad etcd endpoint.
    #[error("invalid --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) entry {entry:?}: {problem}")]
    Endpoint {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        problem: EndpointProblem,
    },
    /// A namespace flag without etcd, or an incomplete one-shot.
    #[error("{0}")]
    NamespaceSetup(&'static str),
    /// etcd TLS or authentication flags that do not fit together.
    #[error("{0}")]
    EtcdAccess(&'static str),
    /// A file named by an etcd TLS or authentication flag cannot be used.
    #[error("cannot use {flag} {}: {problem}", path.display())]
    EtcdFile {
        /// The flag and its variable.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong: unreadable (with the OS error), empty, or not PEM
        /// of the kind wanted.
        problem: String,
    },
    /// TLS flags that do not go together.
    #[error("{0}")]
    TlsFlags(&'static str),
    /// A TLS file that cannot serve.
    #[error("invalid TLS files")]
    Tls(#[from] TlsError),
    /// Bad allow-list entry.
    #[error("invalid --allow-cidrs (SNOWKEEP_ALLOW_CIDRS) entry {0:?}: use CIDR ranges like 10.0.0.0/8 or fd00::/8 (or a single address), comma-separated")]
    AllowCidr(String),
    /// `--auth on` or a bootstrap key without etcd.
    #[error("{0}")]
    AuthNeedsEtcd(&'static str),
    /// `--admin-listen` that cannot serve the status page.
    #[error("invalid --admin-listen (SNOWKEEP_ADMIN_LISTEN) {address}: {problem}")]
    AdminListen {
        /// The address given.
        address: SocketAddr,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The bootstrap admin key file cannot be read or holds no key.
    #[error(
        "invalid --bootstrap-admin-key-file (SNOWKEEP_BOOTSTRAP_ADMIN_KEY_FILE) {path}: {problem}"
    )]
    BootstrapKey {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the key).
        problem: String,
    },
}

/// What is wrong with an `--etcd-endpoints` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum EndpointProblem {
    /// Nothing between two commas (or the whole value is empty).
    #[error("the entry is empty (a doubled or trailing comma?); give etcd client URLs as http://host:port, comma-separated")]
    Empty,
    /// Another scheme than `http://` or `https://`.
    #[error("only http:// and https:// client URLs are supported; use http://host:port or https://host:port")]
    Scheme,
    /// Not `host:port` with a port in 1-65535 and nothing after it.
    #[error("not an etcd client URL; use http://host:port, https://host:port (or host:port): a host, a port from 1 to 65535, no user, path or query")]
    Malformed,
}

impl TryFrom<Args> for ServerConfig {
    type Error = ConfigError;

    fn try_from(args: Args) -> Result<Self, ConfigError> {
        let layout: Layout = args.layout.parse()?;
        if !is_valid_namespace(&args.namespace) {
            return Err(ConfigError::Namespace(args.namespace));
        }
        if args.lease_ttl < Duration::from_secs(2) || args.lease_ttl.subsec_nanos() != 0 {
            return Err(ConfigError::LeaseTtl(args.lease_ttl));
        }
        if args.outage_budget < Duration::from_secs(1) {
            return Err(ConfigError::OutageBudget(args.outage_budget));
        }
        let hour = Duration::from_secs(3600);
        for (flag, value, max) in [
            ("--lease-ttl (SNOWKEEP_LEASE_TTL)", args.lease_ttl, hour),
            (
                "--outage-budget (SNOWKEEP_OUTAGE_BUDGET)",
                args.outage_budget,
                hour,
            ),
            (
                "--max-fence-wait (SNOWKEEP_MAX_FENCE_WAIT)",
                args.max_fence_wait,
                hour,
            ),
            (
                "--max-backward-wait (SNOWKEEP_MAX_BACKWARD_WAIT)",
                args.max_backward_wait,
                Duration::from_secs(10),
            ),
            (
                "--shutdown-grace-period (SNOWKEEP_SHUTDOWN_GRACE_PERIOD)",
                args.shutdown_grace_period,
                hour,
            ),
        ] {
            if value > max {
                return Err(ConfigError::TooLong { flag, value, max });
            }
        }
        let minute = Duration::from_secs(60);
        if !(minute..=minute * 20).contains(&args.first_lease_duration) {
            return Err(ConfigError::OutOfRange {
                flag: "--first-lease-duration (SNOWKEEP_FIRST_LEASE_DURATION)",
                value: args.first_lease_duration,
                min: minute,
                max: minute * 20,
            });
        }
        let (min_renew, max_renew) = (Duration::from_secs(5), Duration::from_secs(30 * 86_400));
        if !(min_renew..=max_renew).contains(&args.renewed_lease_duration) {
            return Err(ConfigError::OutOfRange {
                flag: "--renewed-lease-duration (SNOWKEEP_RENEWED_LEASE_DURATION)",
                value: args.renewed_lease_duration,
                min: min_renew,
                max: max_renew,
            });
        }
        let limits = limits_from(&args)?;
        let tls = tls_from(&args)?;
        let peer_tls = match (&tls, &args.peer_tls_ca_file) {
            (_, None) if args.peer_tls_server_name.is_some() => {
                return Err(ConfigError::TlsFlags("--peer-tls-server-name (SNOWKEEP_PEER_TLS_SERVER_NAME) needs --peer-tls-ca-file"));
            }
            (_, None) => None,
            (None, Some(_)) => {
                return Err(ConfigError::TlsFlags("--peer-tls-ca-file (SNOWKEEP_PEER_TLS_CA_FILE) is for peers that serve TLS: add --tls-cert-file and --tls-key-file, or drop it"));
            }
            (Some(t), Some(ca)) => Some(PeerTls {
                ca_file: ca.clone(),
                server_name: args.peer_tls_server_name.clone(),
                identity: (t.cert_file.clone(), t.key_file.clone()),
            }),
        };
        let allow_cidrs = allow_cidrs_from(&args.allow_cidrs)?;
        let stable_instance = args.instance_id.is_some();
        let instance_id = match args.instance_id.clone() {
            // No '/': embedded requesters' holder values start with
            // "requester/", so they can never equal an instance id.
            Some(id)
                if !id.is_empty()
                    && id.len() <= 256
                    && !id.chars().any(|c| c.is_control() || c == '/') =>
            {
                id
            }
            Some(id) => return Err(ConfigError::InstanceId(id)),
            None => default_instance_id(),
        };
        let store = if args.etcd_endpoints.is_empty() {
            StoreConfig::SingleInstance {
                state_dir: args.state_dir.clone(),
            }
        } else {
            StoreConfig::Etcd {
                endpoints: args
                    .etcd_endpoints
                    .iter()
                    .map(|e| {
                        parse_endpoint(e).map_err(|problem| ConfigError::Endpoint {
                            entry: e.clone(),
                            problem,
                        })
                    })
                    .collect::<Result<_, _>>()?,
            }
        };
        let etcd_access = etcd_access_from(&args, &store)?;
        let namespace_setup = NamespaceSetup {
            create: args.create_namespace || args.create_namespace_only,
            confirm_floor: args.confirm_namespace_floor,
        };
        if matches!(store, StoreConfig::SingleInstance { .. })
            && (namespace_setup.create || namespace_setup.confirm_floor.is_some())
        {
            return Err(ConfigError::NamespaceSetup("--create-namespace, --create-namespace-only and --confirm-namespace-floor apply to namespaces in etcd: add --etcd-endpoints (the single-instance store creates its state file by itself)"));
        }
        let bootstrap_admin_key = match &args.bootstrap_admin_key_file {
            None => None,
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|e| ConfigError::BootstrapKey {
                        path: path.clone(),
                        problem: e.to_string(),
                    })?;
                Some(
                    BootstrapKey::parse(&text).map_err(|e| ConfigError::BootstrapKey {
                        path: path.clone(),
                        problem: format!("{e}; the file's first line is the key, e.g. k0123456789ab.<64 hex digits>"),
                    })?,
                )
            }
        };
        if matches!(store, StoreConfig::SingleInstance { .. })
            && (args.auth == Some(AuthMode::On) || bootstrap_admin_key.is_some())
        {
            return Err(ConfigError::AuthNeedsEtcd("--auth on and --bootstrap-admin-key-file need etcd, where API keys are kept: add --etcd-endpoints (the single-instance store serves without authentication; keep its port private)"));
        }
        if let Some(address) = args.admin_listen {
            let problem = if matches!(store, StoreConfig::SingleInstance { .. }) {
                Some("the status page shows a cluster's state, which is kept in etcd: add --etcd-endpoints (the single-instance store has no status page)")
            } else if address.port() != 0
                && (address == args.listen || address == args.metrics_listen)
            {
                Some("the status page needs an address of its own, not the one of --listen or --metrics-listen")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(ConfigError::AdminListen { address, problem });
            }
        }
        let setup_only = args.create_namespace_only || namespace_setup.confirm_floor.is_some();
        let machine_id_range = match args.machine_id_range {
            None => 0..layout.machine_id_count(),
            Some(text) => parse_range(&text, layout.machine_id_count()).ok_or(
                ConfigError::MachineIdRange {
                    text,
                    max: layout.machine_id_count(),
                },
            )?,
        };
        let max_ids = (machine_id_range.end - machine_id_range.start).min(MAX_MACHINE_IDS);
        if args.machine_ids == 0 || args.machine_ids > max_ids {
            return Err(ConfigError::MachineIds {
                got: args.machine_ids,
                max: max_ids,
            });
        }
        Ok(ServerConfig {
            etcd_access,
            limits,
            tls,
            allow_cidrs,
            store,
            namespace: args.namespace,
            machine_ids: args.machine_ids,
            machine_id_range,
            layout,
            instance_id,
            stable_instance,
            lease_ttl: args.lease_ttl,
            outage_budget: args.outage_budget,
            max_fence_wait: args.max_fence_wait,
            max_backward_wait: args.max_backward_wait,
            shutdown_grace_period: args.shutdown_grace_period,
            on_lease_lost: args.on_lease_lost.into(),
            lease_api: LeaseApiConfig {
                first_lease: args.first_lease_duration,
                renewed_lease: args.renewed_lease_duration,
                skew_threshold: args.client_skew_threshold,
            },
            peer_skew: PeerSkewConfig {
                advertise_address: args
                    .advertise_address
                    .unwrap_or_else(|| advertise_default(args.listen)),
                interval: args.peer_skew_interval,
                warn: args.peer_skew_warn,
                tls: peer_tls,
            },
            namespace_setup,
            wait_for_namespace: args.wait_for_namespace,
            setup_only,
            auth: AuthConfig {
                mode: args.auth,
                bootstrap_admin_key,
            },
            admin_listen: args.admin_listen,
        })
    }
}

/// Checks the etcd TLS and authentication flags against the endpoints,
/// reads the files they name and builds [`EtcdAccess`].
///
/// Decided here: `https://` endpoints need `--etcd-ca-file` (the system
/// roots are never trusted implicitly; a public CA's users give the system
/// bundle as the file), the endpoints are all `http://` or all `https://`,
/// and TLS files with `http://` endpoints are refused rather than ignored.
fn etcd_access_from(args: &Args, store: &StoreConfig) -> Result<EtcdAccess, ConfigError> {
    let given = args.etcd_ca_file.is_some()
        || args.etcd_cert_file.is_some()
        || args.etcd_key_file.is_some()
        || args.etcd_user.is_some()
        || args.etcd_password_file.is_some();
    let StoreConfig::Etcd { endpoints } = store else {
        return match given {
            true => Err(ConfigError::EtcdAccess("--etcd-ca-file, --etcd-cert-file, --etcd-key-file, --etcd-user and --etcd-password-file apply to etcd: add --etcd-endpoints")),
            false => Ok(EtcdAccess::default()),
        };
    };
    let https = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if https != 0 && https != endpoints.len() {
        return Err(ConfigError::EtcdAccess("--etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) mixes http:// and https:// client URLs: an etcd cluster serves its clients either with TLS or without, so give every endpoint the same scheme"));
    }
    if args.etcd_cert_file.is_some() != args.etcd_key_file.is_some() {
        return Err(ConfigError::EtcdAccess("--etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE) and --etcd-key-file (SNOWKEEP_ETCD_KEY_FILE) come together: give both (a client certificate and its private key, PEM) or neither"));
    }
    if args.etcd_user.is_some() != args.etcd_password_file.is_some() {
        return Err(ConfigError::EtcdAccess("--etcd-user (SNOWKEEP_ETCD_USER) and --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE) come together: give both or neither"));
    }
    let tls = if https == 0 {
        if args.etcd_ca_file.is_some() || args.etcd_cert_file.is_some() {
            return Err(ConfigError::EtcdAccess("--etcd-ca-file, --etcd-cert-file and --etcd-key-file are for TLS to etcd, but every --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) URL is plaintext http://: give the members' https:// client URLs, or drop the TLS flags"));
        }
        None
    } else {
        let Some(ca_file) = &args.etcd_ca_file else {
            return Err(ConfigError::EtcdAccess("https:// etcd endpoints need --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE), the CA bundle (PEM) that signs the etcd members' server certificates; for certificates from a public CA give the system bundle, e.g. /etc/ssl/certs/ca-certificates.crt"));
        };
        const CA: &str = "--etcd-ca-file (SNOWKEEP_ETCD_CA_FILE)";
        const CERT: &str = "--etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE)";
        const KEY: &str = "--etcd-key-file (SNOWKEEP_ETCD_KEY_FILE)";
        let ca_pem = read_certificates(CA, ca_file)?;
        let client_identity = match (&args.etcd_cert_file, &args.etcd_key_file) {
            (Some(cert), Some(key)) => Some(ClientIdentity {
                cert_pem: read_certificates(CERT, cert)?,
                key_pem: read_private_key(KEY, key)?,
            }),
            _ => None,
        };
        Some(EtcdTls {
            ca_pem,
            client_identity,
        })
    };
    let credentials = match (&args.etcd_user, &args.etcd_password_file) {
        (Some(user), Some(file)) => {
            if user.is_empty() || user.chars().any(char::is_control) {
                return Err(ConfigError::EtcdAccess("--etcd-user (SNOWKEEP_ETCD_USER) is empty or holds control characters: give the etcd user's name"));
            }
            Some(EtcdCredentials {
                user: user.clone(),
                password: read_password(file)?,
            })
        }
        _ => None,
    };
    Ok(EtcdAccess { tls, credentials })
}

/// [`ConfigError::EtcdFile`] for `flag`'s file `path`.
fn file_error(
    flag: &'static str,
    path: &std::path::Path,
    problem: impl Into<String>,
) -> ConfigError {
    ConfigError::EtcdFile {
        flag,
        path: path.to_owned(),
        problem: problem.into(),
    }
}

/// Reads `path` for `flag`; an unreadable file names the OS error.
fn read_file(flag: &'static str, path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    let bytes =
        std::fs::read(path).map_err(|e| file_error(flag, path, format!("cannot read it ({e})")))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(file_error(flag, path, "the file is empty"));
    }
    Ok(bytes)
}

/// Reads a PEM file that must hold at least one certificate, and no
/// malformed PEM section.
fn read_certificates(flag: &'static str, path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    let bytes = read_file(flag, path)?;
    // The gRPC port's own check of a certificate file, worded for etcd.
    crate::tls::certificates(flag, path, &bytes).map_err(|e| match e {
        TlsError::Malformed { detail, .. } => {
            file_error(flag, path, format!("not a readable PEM file ({detail})"))
        }
        _ => file_error(
            flag,
            path,
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
        ),
    })?;
    Ok(bytes)
}

/// Reads a PEM file that must hold a private key.
fn read_private_key(flag: &'static str, path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    let bytes = read_file(flag, path)?;
    // The message never quotes the file: it holds a key.
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| {
        file_error(
            flag,
            path,
            "no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
        )
    })?;
    Ok(bytes)
}

/// Reads the etcd password: the file's text without one trailing newline.
fn read_password(path: &std::path::Path) -> Result<String, ConfigError> {
    const FLAG: &str = "--etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE)";
    let bytes = read_file(FLAG, path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| file_error(FLAG, path, "the password is not UTF-8 text"))?;
    let password = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    Ok(password.to_owned())
}

/// Checks the TLS flags and reads the files once, so a server never starts
/// with TLS it cannot serve.
fn tls_from(args: &Args) -> Result<Option<TlsSettings>, ConfigError> {
    let (cert_file, key_file) = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        (None, None) if args.tls_client_ca_file.is_some() => {
            return Err(ConfigError::TlsFlags("--tls-client-ca-file (SNOWKEEP_TLS_CLIENT_CA_FILE) needs TLS: add --tls-cert-file and --tls-key-file"));
        }
        (None, None) => return Ok(None),
        (Some(_), None) => {
            return Err(ConfigError::TlsFlags("--tls-cert-file (SNOWKEEP_TLS_CERT_FILE) needs --tls-key-file (SNOWKEEP_TLS_KEY_FILE): give both, or neither to serve plaintext"));
        }
        (None, Some(_)) => {
            return Err(ConfigError::TlsFlags("--tls-key-file (SNOWKEEP_TLS_KEY_FILE) needs --tls-cert-file (SNOWKEEP_TLS_CERT_FILE): give both, or neither to serve plaintext"));
        }
    };
    let (min, max) = (Duration::from_millis(100), Duration::from_secs(3600));
    if !(min..=max).contains(&args.tls_reload_interval) {
        return Err(ConfigError::OutOfRange {
            flag: "--tls-reload-interval (SNOWKEEP_TLS_RELOAD_INTERVAL)",
            value: args.tls_reload_interval,
            min,
            max,
        });
    }
    let settings = TlsSettings {
        cert_file,
        key_file,
        client_ca_file: args.tls_client_ca_file.clone(),
        reload_interval: args.tls_reload_interval,
    };
    crate::tls::check(&settings)?;
    Ok(Some(settings))
}

/// Parses `--allow-cidrs`: CIDR ranges or single addresses; empty entries
/// are skipped (an empty list allows every address).
fn allow_cidrs_from(entries: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    entries
        .iter()
        .map(|e| e.trim())
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.parse::<IpNet>()
                .or_else(|_| e.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| ConfigError::AllowCidr(e.to_owned()))
        })
        .collect()
}

/// Checks the limit flags and builds [`Limits`].
fn limits_from(args: &Args) -> Result<Limits, ConfigError> {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    for (flag, value, min, max) in [
        (
            "--max-connections (SNOWKEEP_MAX_CONNECTIONS)",
            u64::from(args.max_connections),
            1,
            1_000_000,
        ),
        (
            "--max-connections-per-peer (SNOWKEEP_MAX_CONNECTIONS_PER_PEER)",
            u64::from(args.max_connections_per_peer),
            0,
            1_000_000,
        ),
        (
            "--http2-max-concurrent-streams (SNOWKEEP_HTTP2_MAX_CONCURRENT_STREAMS)",
            u64::from(args.http2_max_concurrent_streams),
            1,
            100_000,
        ),
        (
            "--max-concurrent-calls (SNOWKEEP_MAX_CONCURRENT_CALLS)",
            u64::from(args.max_concurrent_calls),
            1,
            1_000_000,
        ),
        (
            "--max-open-streams (SNOWKEEP_MAX_OPEN_STREAMS)",
            u64::from(args.max_open_streams),
            1,
            1_000_000,
        ),
        (
            "--max-keyless-calls (SNOWKEEP_MAX_KEYLESS_CALLS)",
            u64::from(args.max_keyless_calls),
            1,
            1_000_000,
        ),
        (
            "--max-keyless-calls-per-peer (SNOWKEEP_MAX_KEYLESS_CALLS_PER_PEER)",
            u64::from(args.max_keyless_calls_per_peer),
            1,
            1_000_000,
        ),
        (
            "--max-keyless-streams (SNOWKEEP_MAX_KEYLESS_STREAMS)",
            u64::from(args.max_keyless_streams),
            1,
            1_000_000,
        ),
        (
            "--max-calls-per-key (SNOWKEEP_MAX_CALLS_PER_KEY)",
            u64::from(args.max_calls_per_key),
            1,
            1_000_000,
        ),
        (
            "--max-streams-per-key (SNOWKEEP_MAX_STREAMS_PER_KEY)",
            u64::from(args.max_streams_per_key),
            1,
            1_000_000,
        ),
        (
            "--max-call-memory (SNOWKEEP_MAX_CALL_MEMORY)",
            args.max_call_memory,
            4 * MIB,
            64 * GIB,
        ),
        (
            "--max-recv-message-size (SNOWKEEP_MAX_RECV_MESSAGE_SIZE)",
            args.max_recv_message_size,
            KIB,
            64 * MIB,
        ),
        (
            "--max-send-message-size (SNOWKEEP_MAX_SEND_MESSAGE_SIZE)",
            args.max_send_message_size,
            KIB,
            64 * MIB,
        ),
        (
            "--http2-max-header-list-size (SNOWKEEP_HTTP2_MAX_HEADER_LIST_SIZE)",
            args.http2_max_header_list_size,
            KIB,
            MIB,
        ),
    ] {
        if !(min..=max).contains(&value) {
            return Err(ConfigError::LimitOutOfRange {
                flag,
                value,
                min,
                max,
            });
        }
    }
    let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
    for (flag, value, min) in [
        (
            "--http2-keepalive-timeout (SNOWKEEP_HTTP2_KEEPALIVE_TIMEOUT)",
            args.http2_keepalive_timeout,
            second,
        ),
        (
            "--idle-timeout (SNOWKEEP_IDLE_TIMEOUT)",
            args.idle_timeout,
            Duration::from_millis(100),
        ),
    ] {
        if !(min..=hour).contains(&value) {
            return Err(ConfigError::OutOfRange {
                flag,
                value,
                min,
                max: hour,
            });
        }
    }
    let (min, max) = (Duration::from_millis(100), Duration::from_secs(600));
    if !(min..=max).contains(&args.request_timeout) {
        return Err(ConfigError::OutOfRange {
            flag: "--request-timeout (SNOWKEEP_REQUEST_TIMEOUT)",
            value: args.request_timeout,
            min,
            max,
        });
    }
    for (flag, value) in [
        (
            "--http2-keepalive-interval (SNOWKEEP_HTTP2_KEEPALIVE_INTERVAL)",
            args.http2_keepalive_interval,
        ),
        (
            "--tcp-keepalive (SNOWKEEP_TCP_KEEPALIVE)",
            args.tcp_keepalive,
        ),
        (
            "--stream-send-timeout (SNOWKEEP_STREAM_SEND_TIMEOUT)",
            args.stream_send_timeout,
        ),
    ] {
        if !value.is_zero() && !(second..=hour).contains(&value) {
            return Err(ConfigError::OutOfRange {
                flag,
                value,
                min: second,
                max: hour,
            });
        }
    }
    let off_if_zero = |d: Duration| (!d.is_zero()).then_some(d);
    // The ranges above keep every value within usize and u32.
    let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok(Limits {
        max_connections: usize_of(args.max_connections.into()),
        max_connections_per_peer: (args.max_connections_per_peer > 0)
            .then(|| usize_of(args.max_connections_per_peer.into())),
        stream_send_timeout: off_if_zero(args.stream_send_timeout),
        http2_max_concurrent_streams: args.http2_max_concurrent_streams,
        max_concurrent_calls: usize_of(args.max_concurrent_calls.into()),
        max_open_streams: usize_of(args.max_open_streams.into()),
        max_keyless_calls: usize_of(args.max_keyless_calls.into()),
        max_keyless_streams: usize_of(args.max_keyless_streams.into()),
        max_keyless_calls_per_peer: usize_of(args.max_keyless_calls_per_peer.into()),
        max_calls_per_key: usize_of(args.max_calls_per_key.into()),
        max_streams_per_key: usize_of(args.max_streams_per_key.into()),
        request_timeout: args.request_timeout,
        max_call_memory: usize_of(args.max_call_memory),
        max_recv_message_size: usize_of(args.max_recv_message_size),
        max_send_message_size: usize_of(args.max_send_message_size),
        http2_max_header_list_size: u32::try_from(args.http2_max_header_list_size)
            .unwrap_or(u32::MAX),
        http2_keepalive_interval: off_if_zero(args.http2_keepalive_interval),
        http2_keepalive_timeout: args.http2_keepalive_timeout,
        idle_timeout: args.idle_timeout,
        tcp_keepalive: off_if_zero(args.tcp_keepalive),
    })
}

/// Checks one `--etcd-endpoints` entry and returns the client URL to use,
/// `http://host:port` or `https://host:port` (a bare `host:port` gets
/// `http://`, as etcdctl does).
fn parse_endpoint(entry: &str) -> Result<String, EndpointProblem> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err(EndpointProblem::Empty);
    }
    let (scheme, rest) = match entry.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => ("http", rest),
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => ("https", rest),
        Some(_) => return Err(EndpointProblem::Scheme),
        None => ("http", entry),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let authority: http::uri::Authority = rest.parse().map_err(|_| EndpointProblem::Malformed)?;
    let well_formed = authority.as_str() == rest
        && !rest.contains(['@', '/', '?', '#'])
        && !authority.host().is_empty()
        && authority.port_u16().is_some_and(|p| p != 0);
    if !well_formed {
        return Err(EndpointProblem::Malformed);
    }
    Ok(format!("{scheme}://{authority}"))
}

/// Parses `START..END` with `START < END <= max`.
fn parse_range(text: &str, max: u32) -> Option<Range<u32>> {
    let (start, end) = text.split_once("..")?;
    let (start, end): (u32, u32) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    (start < end && end <= max).then_some(start..end)
}

/// The address peers use when none is configured: `listen` itself, or this
/// host's name with its port when `listen` is a wildcard address.
fn advertise_default(listen: SocketAddr) -> String {
    if listen.ip().is_unspecified() {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        format!("{host}:{}", listen.port())
    } else {
        listen.to_string()
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
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<ServerConfig, ConfigError> {
        let mut argv = vec!["snowkeep-server"];
        argv.extend_from_slice(extra);
        ServerConfig::try_from(Args::try_parse_from(argv).expect("args parse"))
    }

    #[test]
    fn defaults_run_the_single_instance_store_on_the_reference_layout() {
        let c = parse(&[]).unwrap();
        assert_eq!(
            c.store,
            StoreConfig::SingleInstance {
                state_dir: "snowkeep-state".into()
            }
        );
        assert_eq!(c.layout, Layout::default());
        assert_eq!(c.namespace, "default");
        assert_eq!(c.lease_ttl, Duration::from_secs(10));
        assert_eq!(c.machine_id_range, 0..4096);
        assert!(!c.stable_instance);
        assert_eq!(c.instance_id.split(':').count(), 3);
    }

    #[test]
    fn endpoints_split_on_commas_and_mark_the_etcd_store() {
        let c = parse(&[
            "--etcd-endpoints",
            "http://a:1,http://b:2",
            "--instance-id",
            "pod-0",
        ])
        .unwrap();
        assert_eq!(
            c.store,
            StoreConfig::Etcd {
                endpoints: vec!["http://a:1".into(), "http://b:2".into()]
            }
        );
        assert!(c.stable_instance);
        assert_eq!(c.instance_id, "pod-0");
    }

    #[test]
    fn rejects_bad_values_with_their_own_errors() {
        assert!(matches!(
            parse(&["--layout", "41/12/11"]),
            Err(ConfigError::Layout(_))
        ));
        assert!(matches!(
            parse(&["--namespace", "a/b"]),
            Err(ConfigError::Namespace(_))
        ));
        assert!(matches!(
            parse(&["--lease-ttl", "1500ms"]),
            Err(ConfigError::LeaseTtl(_))
        ));
        assert!(matches!(
            parse(&["--machine-ids", "0"]),
            Err(ConfigError::MachineIds { got: 0, max: 42 })
        ));
        assert!(matches!(
            parse(&["--machine-ids", "3", "--machine-id-range", "0..2"]),
            Err(ConfigError::MachineIds { got: 3, max: 2 })
        ));
        assert!(matches!(
            parse(&["--outage-budget", "500ms"]),
            Err(ConfigError::OutageBudget(d)) if d == Duration::from_millis(500)
        ));
        assert!(matches!(
            parse(&["--outage-budget", "61m"]),
            Err(ConfigError::TooLong { max, .. }) if max == Duration::from_secs(3600)
        ));
        assert!(matches!(
            parse(&["--lease-ttl", "2h"]),
            Err(ConfigError::TooLong { max, .. }) if max == Duration::from_secs(3600)
        ));
        for bad in ["0..4097", "5..5", "9..3", "1-2", "..4"] {
            assert!(
                matches!(
                    parse(&["--machine-id-range", bad]),
                    Err(ConfigError::MachineIdRange { max: 4096, .. })
                ),
                "{bad} must be refused"
            );
        }
    }

    #[test]
    fn namespace_setup_flags_need_etcd_and_a_floor_makes_a_one_shot() {
        let etcd = ["--etcd-endpoints", "http://a:1"];
        let c = parse(&etcd).unwrap();
        assert_eq!(c.namespace_setup, NamespaceSetup::default());
        assert!(!c.setup_only);
        let c = parse(&[etcd[0], etcd[1], "--create-namespace"]).unwrap();
        assert!(c.namespace_setup.create && !c.setup_only);
        let c = parse(&[etcd[0], etcd[1], "--create-namespace-only"]).unwrap();
        assert!(c.namespace_setup.create && c.setup_only);
        let c = parse(&[etcd[0], etcd[1], "--confirm-namespace-floor", "+48h1m"]).unwrap();
        assert_eq!(
            c.namespace_setup.confirm_floor,
            Some(FloorSpec::After(Duration::from_secs(48 * 3600 + 60)))
        );
        assert!(!c.namespace_setup.create && c.setup_only);
        for flag in ["--create-namespace", "--create-namespace-only"] {
            let err = parse(&[flag]).unwrap_err().to_string();
            assert!(err.starts_with("--create-namespace, --create-namespace-only and --confirm-namespace-floor apply to namespaces in etcd: add --etcd-endpoints"), "{err}");
        }
        let bad = Args::try_parse_from(["snowkeep-server", "--confirm-namespace-floor", "48h"])
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("use +DURATION (like +48h1m) or an RFC 3339 UTC time"),
            "{bad}"
        );
    }

    #[test]
    fn limits_default_to_the_documented_values() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.limits.max_connections, 256);
        assert_eq!(c.limits.http2_max_concurrent_streams, 64);
        assert_eq!(c.limits.max_concurrent_calls, 256);
        assert_eq!(c.limits.max_open_streams, 128);
        assert_eq!(c.limits.max_keyless_calls, 32);
        assert_eq!(c.limits.max_keyless_streams, 16);
        assert_eq!(c.limits.max_keyless_calls_per_peer, 8);
        assert_eq!(c.limits.max_calls_per_key, 64);
        assert_eq!(c.limits.max_streams_per_key, 32);
        assert_eq!(c.limits.request_timeout, Duration::from_secs(5));
        assert_eq!(c.limits.max_call_memory, 64 << 20);
        assert_eq!(c.limits.max_recv_message_size, 16 << 10);
        assert_eq!(c.limits.max_send_message_size, 1 << 20);
        assert_eq!(c.limits.http2_max_header_list_size, 16 << 10);
        assert_eq!(
            c.limits.http2_keepalive_interval,
            Some(Duration::from_secs(20))
        );
        assert_eq!(c.limits.http2_keepalive_timeout, Duration::from_secs(10));
        assert_eq!(c.limits.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.limits.tcp_keepalive, Some(Duration::from_secs(60)));
        assert_eq!(c.limits.max_connections_per_peer, Some(64));
        assert_eq!(c.limits.stream_send_timeout, Some(Duration::from_secs(30)));
    }

    #[test]
    fn the_per_peer_cap_and_the_send_timeout_turn_off_at_zero() {
        let c = parse(&[
            "--max-connections-per-peer",
            "0",
            "--stream-send-timeout",
            "0s",
        ])
        .unwrap();
        assert_eq!(c.limits.max_connections_per_peer, None);
        assert_eq!(c.limits.stream_send_timeout, None);
        let c = parse(&[
            "--max-connections-per-peer",
            "3",
            "--stream-send-timeout",
            "2s",
        ])
        .unwrap();
        assert_eq!(c.limits.max_connections_per_peer, Some(3));
        assert_eq!(c.limits.stream_send_timeout, Some(Duration::from_secs(2)));
        assert!(matches!(
            parse(&["--stream-send-timeout", "10ms"]),
            Err(ConfigError::OutOfRange { .. })
        ));
    }

    #[test]
    fn limits_parse_sizes_and_turn_keepalives_off_at_zero() {
        let c = parse(&[
            "--max-call-memory",
            "8MiB",
            "--max-recv-message-size",
            "2048",
            "--max-send-message-size",
            "64KiB",
            "--http2-keepalive-interval",
            "0s",
            "--tcp-keepalive",
            "0s",
            "--idle-timeout",
            "500ms",
        ])
        .unwrap();
        assert_eq!(c.limits.max_call_memory, 8 << 20);
        assert_eq!(c.limits.max_recv_message_size, 2048);
        assert_eq!(c.limits.max_send_message_size, 64 << 10);
        assert_eq!(c.limits.http2_keepalive_interval, None);
        assert_eq!(c.limits.tcp_keepalive, None);
        assert_eq!(c.limits.idle_timeout, Duration::from_millis(500));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size(" 12 "), Ok(12));
        for bad in ["", "MiB", "12MB", "1.5MiB", "-1", "99999999999GiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn limits_out_of_range_are_refused_naming_the_flag() {
        let err = parse(&["--max-open-streams", "0"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid --max-open-streams (SNOWKEEP_MAX_OPEN_STREAMS) 0: use 1 to 1000000"
        );
        assert!(matches!(
            parse(&["--max-call-memory", "1MiB"]),
            Err(ConfigError::LimitOutOfRange { min, .. }) if min == 4 << 20
        ));
        assert!(matches!(
            parse(&["--max-recv-message-size", "100"]),
            Err(ConfigError::LimitOutOfRange { min: 1024, .. })
        ));
        assert!(matches!(
            parse(&["--http2-keepalive-interval", "10ms"]),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse(&["--idle-timeout", "0s"]),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(Args::try_parse_from(["snowkeep-server", "--max-call-memory", "lots"]).is_err());
        assert_eq!(
            parse(&["--max-calls-per-key", "0"])
                .unwrap_err()
                .to_string(),
            "invalid --max-calls-per-key (SNOWKEEP_MAX_CALLS_PER_KEY) 0: use 1 to 1000000"
        );
        assert_eq!(
            parse(&["--max-keyless-streams", "0"])
                .unwrap_err()
                .to_string(),
            "invalid --max-keyless-streams (SNOWKEEP_MAX_KEYLESS_STREAMS) 0: use 1 to 1000000"
        );
        assert!(matches!(
            parse(&["--request-timeout", "50ms"]),
            Err(ConfigError::OutOfRange {
                flag: "--request-timeout (SNOWKEEP_REQUEST_TIMEOUT)",
                ..
            })
        ));
        assert!(matches!(
            parse(&["--request-timeout", "11m"]),
            Err(ConfigError::OutOfRange { .. })
        ));
    }

    #[test]
    fn a_machine_id_range_is_half_open_and_bounded_by_the_layout() {
        let c = parse(&["--machine-id-range", "2048..4096"]).unwrap();
        assert_eq!(c.machine_id_range, 2048..4096);
        let c = parse(&["--machine-id-range", "0..2", "--layout", "52/1/10"]).unwrap();
        assert_eq!(c.machine_id_range, 0..2);
        assert!(matches!(
            parse(&["--machine-id-range", "0..3", "--layout", "52/1/10"]),
            Err(ConfigError::MachineIdRange { max: 2, .. })
        ));
    }

    fn endpoint_problem(value: &str) -> Option<EndpointProblem> {
        match parse(&["--etcd-endpoints", value]) {
            Err(ConfigError::Endpoint { problem, .. }) => Some(problem),
            Err(e) => panic!("{value:?}: unexpected {e}"),
            Ok(_) => None,
        }
    }

    #[test]
    fn every_etcd_endpoint_is_checked_once_here() {
        use EndpointProblem::*;
        for (value, problem) in [
            ("unix:///run/etcd.sock", Scheme),
            ("ftp://etcd:2379", Scheme),
            ("https://etcd:2379/v3", Malformed),
            ("grpc://etcd:2379", Scheme),
            ("", Empty),
            ("http://a:1,,http://b:2", Empty),
            ("http://a:1,", Empty),
            ("garbage", Malformed),
            ("http://", Malformed),
            ("http://etcd", Malformed),
            ("http://etcd:0", Malformed),
            ("http://etcd:65536", Malformed),
            ("http://etcd:2379/v3", Malformed),
            ("http://user:pw@etcd:2379", Malformed),
            ("http://etcd:2379?x=1", Malformed),
            ("http://:2379", Malformed),
            ("etcd :2379", Malformed),
        ] {
            assert_eq!(endpoint_problem(value), Some(problem), "{value:?}");
        }
        let c = parse(&[
            "--etcd-endpoints",
            "localhost:2379,http://10.0.0.1:2379/, http://[::1]:2380",
        ])
        .unwrap();
        assert_eq!(
            c.store,
            StoreConfig::Etcd {
                endpoints: vec![
                    "http://localhost:2379".into(),
                    "http://10.0.0.1:2379".into(),
                    "http://[::1]:2380".into()
                ]
            }
        );
    }

    #[test]
    fn an_endpoint_error_names_the_entry_and_the_remedy() {
        let e = parse(&["--etcd-endpoints", "grpc://etcd:2379"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) entry \"grpc://etcd:2379\": only http:// and https:// client URLs are supported; use http://host:port or https://host:port"
        );
    }

    /// A CA certificate, a client certificate and key, and a password
    /// file, in a temp dir.
    struct EtcdFiles {
        dir: tempfile::TempDir,
    }

    impl EtcdFiles {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let ca = ca_params.self_signed(&ca_key).unwrap();
            let issuer = rcgen::Issuer::new(ca_params, ca_key);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec!["snowkeep".to_string()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            let write =
                |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
            write("ca.pem", &ca.pem());
            write("client.pem", &cert.pem());
            write("client.key", &key.serialize_pem());
            write("password", "s3cret-pw\n");
            write("empty", "\n");
            write("garbage", "not pem at all");
            Self { dir }
        }

        fn path(&self, name: &str) -> String {
            self.dir.path().join(name).to_str().unwrap().to_owned()
        }
    }

    #[test]
    fn tls_and_credentials_flags_build_the_etcd_access() {
        let f = EtcdFiles::new();
        let c = parse(&[
            "--etcd-endpoints",
            "https://a:1,HTTPS://b:2",
            "--etcd-ca-file",
            &f.path("ca.pem"),
            "--etcd-cert-file",
            &f.path("client.pem"),
            "--etcd-key-file",
            &f.path("client.key"),
            "--etcd-user",
            "snowkeep",
            "--etcd-password-file",
            &f.path("password"),
        ])
        .unwrap();
        assert_eq!(
            c.store,
            StoreConfig::Etcd {
                endpoints: vec!["https://a:1".into(), "https://b:2".into()]
            }
        );
        let tls = c.etcd_access.tls.as_ref().unwrap();
        assert!(tls.ca_pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
        assert!(tls.client_identity.is_some());
        let creds = c.etcd_access.credentials.as_ref().unwrap();
        assert_eq!(
            (creds.user.as_str(), creds.password.as_str()),
            ("snowkeep", "s3cret-pw")
        );
        assert!(!format!("{c:?}").contains("s3cret-pw"));
        // Credentials without TLS, and neither.
        let c = parse(&[
            "--etcd-endpoints",
            "http://a:1",
            "--etcd-user",
            "snowkeep",
            "--etcd-password-file",
            &f.path("password"),
        ])
        .unwrap();
        assert!(c.etcd_access.tls.is_none() && c.etcd_access.credentials.is_some());
        assert_eq!(
            parse(&["--etcd-endpoints", "http://a:1"])
                .unwrap()
                .etcd_access,
            EtcdAccess::default()
        );
    }

    #[test]
    fn etcd_access_flags_that_do_not_fit_are_refused_with_the_rule() {
        let f = EtcdFiles::new();
        let (ca, cert, key, pw) = (
            f.path("ca.pem"),
            f.path("client.pem"),
            f.path("client.key"),
            f.path("password"),
        );
        let refused = |args: &[&str], want: &str| {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        };
        refused(
            &[
                "--etcd-endpoints",
                "http://a:1,https://b:2",
                "--etcd-ca-file",
                &ca,
            ],
            "mixes http:// and https://",
        );
        refused(
            &["--etcd-endpoints", "https://a:1"],
            "https:// etcd endpoints need --etcd-ca-file",
        );
        refused(
            &["--etcd-endpoints", "http://a:1", "--etcd-ca-file", &ca],
            "every --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) URL is plaintext http://",
        );
        refused(
            &[
                "--etcd-endpoints",
                "https://a:1",
                "--etcd-ca-file",
                &ca,
                "--etcd-cert-file",
                &cert,
            ],
            "come together: give both (a client certificate",
        );
        refused(
            &[
                "--etcd-endpoints",
                "https://a:1",
                "--etcd-ca-file",
                &ca,
                "--etcd-key-file",
                &key,
            ],
            "come together: give both (a client certificate",
        );
        refused(&["--etcd-endpoints", "http://a:1", "--etcd-user", "u"], "--etcd-user (SNOWKEEP_ETCD_USER) and --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE) come together");
        refused(
            &[
                "--etcd-endpoints",
                "http://a:1",
                "--etcd-password-file",
                &pw,
            ],
            "come together: give both or neither",
        );
        refused(
            &["--etcd-user", "u", "--etcd-password-file", &pw],
            "apply to etcd: add --etcd-endpoints",
        );
        refused(
            &[
                "--etcd-endpoints",
                "https://a:1",
                "--etcd-ca-file",
                &f.path("missing.pem"),
            ],
            "cannot use --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE)",
        );
        refused(
            &[
                "--etcd-endpoints",
                "https://a:1",
                "--etcd-ca-file",
                &f.path("missing.pem"),
            ],
            "cannot read it (No such file or directory",
        );
        refused(
            &[
                "--etcd-endpoints",
                "https://a:1",
                "--etcd-ca-file",
                &f.path("garbage"),
            ],
            "no PEM certificate",
        );
        refused(
            &["--etcd-endpoints", "https://a:1", "--etcd-ca-file", &key],
            "no PEM certificate",
        );
        refused(
            &[
                "--etcd-endpoints",
                "https://a:1",
                "--etcd-ca-file",
                &ca,
                "--etcd-cert-file",
                &cert,
                "--etcd-key-file",
                &cert,
            ],
            "--etcd-key-file (SNOWKEEP_ETCD_KEY_FILE)",
        );
        refused(
            &[
                "--etcd-endpoints",
                "https://a:1",
                "--etcd-ca-file",
                &ca,
                "--etcd-cert-file",
                &cert,
                "--etcd-key-file",
                &cert,
            ],
            "no PEM private key",
        );
        refused(
            &[
                "--etcd-endpoints",
                "http://a:1",
                "--etcd-user",
                "u",
                "--etcd-password-file",
                &f.path("empty"),
            ],
            "the file is empty",
        );
        refused(
            &[
                "--etcd-endpoints",
                "http://a:1",
                "--etcd-user",
                "",
                "--etcd-password-file",
                &pw,
            ],
            "give the etcd user's name",
        );
        // A key's problem never quotes the file.
        let err = parse(&[
            "--etcd-endpoints",
            "https://a:1",
            "--etcd-ca-file",
            &ca,
            "--etcd-cert-file",
            &cert,
            "--etcd-key-file",
            &cert,
        ])
        .unwrap_err()
        .to_string();
        assert!(!err.contains("BEGIN"), "{err}");
    }

    #[test]
    fn tls_flags_go_in_pairs_and_allow_cidrs_parse() {
        let err = |args: &[&str]| parse(args).unwrap_err().to_string();
        assert_eq!(err(&["--tls-cert-file", "/nonexistent"]), "--tls-cert-file (SNOWKEEP_TLS_CERT_FILE) needs --tls-key-file (SNOWKEEP_TLS_KEY_FILE): give both, or neither to serve plaintext");
        assert_eq!(err(&["--tls-key-file", "/nonexistent"]), "--tls-key-file (SNOWKEEP_TLS_KEY_FILE) needs --tls-cert-file (SNOWKEEP_TLS_CERT_FILE): give both, or neither to serve plaintext");
        assert_eq!(
            err(&["--tls-client-ca-file", "/nonexistent"]),
            "--tls-client-ca-file (SNOWKEEP_TLS_CLIENT_CA_FILE) needs TLS: add --tls-cert-file and --tls-key-file"
        );
        assert!(matches!(
            parse(&[
                "--tls-cert-file",
                "/nonexistent/c",
                "--tls-key-file",
                "/nonexistent/k"
            ]),
            Err(ConfigError::Tls(TlsError::Read {
                flag: "--tls-cert-file",
                ..
            }))
        ));
        let c = parse(&[]).unwrap();
        assert!(c.tls.is_none() && c.allow_cidrs.is_empty());
        let c = parse(&["--allow-cidrs", "10.0.0.0/8, 127.0.0.1,fd00::/8,"]).unwrap();
        let want: Vec<IpNet> = ["10.0.0.0/8", "127.0.0.1/32", "fd00::/8"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(c.allow_cidrs, want);
        assert_eq!(
            err(&["--allow-cidrs", "10.0.0.0/8,10.0.0.0/33"]),
            "invalid --allow-cidrs (SNOWKEEP_ALLOW_CIDRS) entry \"10.0.0.0/33\": use CIDR ranges like 10.0.0.0/8 or fd00::/8 (or a single address), comma-separated"
        );
    }

    #[test]
    fn namespaces_follow_one_rule() {
        for good in [
            "default",
            "a",
            "Orders",
            "orders.v2",
            "a_b-c",
            "0",
            &"x".repeat(64),
        ] {
            assert!(is_valid_namespace(good), "{good:?}");
            let flag = format!("--namespace={good}");
            assert_eq!(parse(&[&flag]).unwrap().namespace, good);
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "-x",
            "_x",
            "a/b",
            "/",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(!is_valid_namespace(bad), "{bad:?}");
            let flag = format!("--namespace={bad}");
            assert!(
                matches!(parse(&[&flag]), Err(ConfigError::Namespace(n)) if n == bad),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse(&["--namespace", ".."]).unwrap_err().to_string(),
            "invalid --namespace (SNOWKEEP_NAMESPACE) \"..\": a namespace is 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or a digit (so never \".\" or \"..\", and no \"/\")"
        );
    }

    #[test]
    fn the_status_page_is_off_by_default_and_needs_etcd_and_its_own_address() {
        let etcd = ["--etcd-endpoints", "http://127.0.0.1:2379"];
        assert_eq!(parse(&etcd).unwrap().admin_listen, None);
        let on = parse(&[&etcd[..], &["--admin-listen", "127.0.0.1:9465"]].concat()).unwrap();
        assert_eq!(on.admin_listen, Some("127.0.0.1:9465".parse().unwrap()));
        // A port alone stays on the loopback address.
        let port = parse(&[&etcd[..], &["--admin-listen", "9465"]].concat()).unwrap();
        assert_eq!(port.admin_listen, Some("127.0.0.1:9465".parse().unwrap()));
        let v6 = parse(&[&etcd[..], &["--admin-listen", "[::1]:9465"]].concat()).unwrap();
        assert_eq!(v6.admin_listen, Some("[::1]:9465".parse().unwrap()));
        let bad = Args::try_parse_from(["snowkeep-server", "--admin-listen", "localhost:x"])
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("\"localhost:x\" is neither HOST:PORT (e.g. 127.0.0.1:9465, [::1]:9465) nor a port (e.g. 9465, which listens on 127.0.0.1)"),
            "{bad}"
        );
        // Any address is allowed when given.
        let wide = parse(&[&etcd[..], &["--admin-listen", "0.0.0.0:9465"]].concat()).unwrap();
        assert_eq!(wide.admin_listen, Some("0.0.0.0:9465".parse().unwrap()));
        assert_eq!(
            parse(&["--admin-listen", "127.0.0.1:9465"]).unwrap_err().to_string(),
            "invalid --admin-listen (SNOWKEEP_ADMIN_LISTEN) 127.0.0.1:9465: the status page shows a cluster's state, which is kept in etcd: add --etcd-endpoints (the single-instance store has no status page)"
        );
        for taken in [DEFAULT_LISTEN, DEFAULT_METRICS_LISTEN] {
            assert_eq!(
                parse(&[&etcd[..], &["--admin-listen", taken]].concat())
                    .unwrap_err()
                    .to_string(),
                format!("invalid --admin-listen (SNOWKEEP_ADMIN_LISTEN) {taken}: the status page needs an address of its own, not the one of --listen or --metrics-listen")
            );
        }
    }
}
