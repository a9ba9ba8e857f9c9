//! [`ConfigError`]: why flags were refused (exit code 64), each message
//! naming the flag, its variable and the rule.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use snowkeep_client::LayoutError;
use snowkeep_core::namespace::NAMESPACE_RULE;
use thiserror::Error;

use crate::tls::TlsError;

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
    /// A `--floor-layout` that does not parse.
    #[error("invalid --floor-layout (SNOWKEEP_FLOOR_LAYOUT)")]
    FloorLayout(#[source] LayoutError),
    /// A `--floor-after-id` that cannot give a floor: the message says why.
    #[error("{0}")]
    MigrationFloor(String),
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
    /// Bad `--cors-allow-origins` entry.
    #[error("invalid --cors-allow-origins (SNOWKEEP_CORS_ALLOW_ORIGINS) entry {0:?}: use web origins like https://app.example.com or http://127.0.0.1:8080 (scheme, host, optional port; no path), comma-separated, or * for any")]
    CorsOrigin(String),
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
