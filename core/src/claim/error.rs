//! `StoreError`: what a store (the claim stores, and the Lease API's store
//! of requesters' leases) can answer instead of success: claiming, renewing,
//! fencing or releasing machine ids.

use std::time::Duration;

use snowkeep_client::{Layout, MachineId, Millis};
use thiserror::Error;

/// Why a claim was lost (the `reason` label of `snowkeep_lease_losses_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// etcd answered a keepalive with TTL 0 or "lease not found".
    Expired,
    /// The holder key was deleted or now names another holder.
    HolderChanged,
    /// No renewal succeeded before the local monotonic deadline.
    Deadline,
    /// etcd lost writes (restored from an older snapshot): the namespace is
    /// marked rolled back and nothing is held in it until an operator confirms
    /// a floor.
    RolledBack,
}

impl LossReason {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::Expired => "expired",
            LossReason::HolderChanged => "holder_changed",
            LossReason::Deadline => "deadline",
            LossReason::RolledBack => "rolled_back",
        }
    }
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What etcd refused of the `--etcd-*` settings; each message names the flag
/// or the etcd setting to fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AccessProblem {
    /// The user name or password is wrong.
    #[error("authentication failed: the user or password is wrong; check --etcd-user (SNOWKEEP_ETCD_USER) and the file --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE) names against the etcd user (etcdctl user get)")]
    Authentication,
    /// etcd has authentication enabled and no user was given.
    #[error("etcd has authentication enabled: give --etcd-user and --etcd-password-file (see docs/operations.md#etcd-tls-and-authentication)")]
    AuthenticationRequired,
    /// The user's roles do not cover snowkeep's keys.
    #[error("permission denied: etcd user {user} needs a role with readwrite permission on the key prefix /snowkeep/ (etcdctl role grant-permission ROLE --prefix=true readwrite /snowkeep/, then etcdctl user grant-role USER ROLE)")]
    Permission {
        /// The user etcd checked, and where its name came from.
        user: String,
    },
    /// The member's server certificate is not trusted.
    #[error("its server certificate is not trusted: it must be signed by a CA in --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE) and name the endpoint's host as a DNS or IP subject alternative name")]
    ServerCertificate,
    /// The member wants a client certificate it trusts and refused the one
    /// given.
    #[error("it requires a client certificate signed by a CA it trusts (its --trusted-ca-file) and refused the one in --etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE): check that a CA in that file signed it, that it is valid now, that it allows client authentication (extended key usage clientAuth) and that --etcd-key-file is its key")]
    ClientCertificate,
    /// The member wants a client certificate and none was given.
    #[error("it requires a client certificate signed by a CA it trusts (its --trusted-ca-file) and none was given: give --etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE) and --etcd-key-file (SNOWKEEP_ETCD_KEY_FILE)")]
    ClientCertificateMissing,
    /// The member refused the client certificate, which has expired.
    #[error("it requires a client certificate signed by a CA it trusts (its --trusted-ca-file) and refused the one in --etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE), which has expired (its notAfter is past): renew it, then restart the server")]
    ClientCertificateExpired,
    /// A TLS hello got a plaintext answer.
    #[error("it does not serve TLS on this port: use an http:// endpoint, or the member's https:// client URL")]
    TlsNotServed,
}

/// Errors of a store: of the claim lifecycle, and of the Lease API's calls.
#[derive(Debug, Error)]
pub enum StoreError {
    /// Every machine id of the namespace's range is held.
    #[error("no free machine id in namespace {namespace:?}: all {capacity} machine ids of range {start}..{end} are held")]
    NoFreeMachineId {
        /// The namespace.
        namespace: String,
        /// Machine ids in the range.
        capacity: u32,
        /// Range start (inclusive).
        start: u32,
        /// Range end (exclusive).
        end: u32,
    },
    /// The namespace has no record in etcd (Lease API callers get NOT_FOUND).
    #[error("namespace {namespace:?} does not exist: an operator creates it once with snowkeep-server --create-namespace (see docs/operations.md#creating-a-namespace)")]
    UnknownNamespace {
        /// The namespace.
        namespace: String,
    },
    /// A namespace name that breaks [`crate::namespace::NAMESPACE_RULE`].
    #[error("invalid namespace {namespace:?}: a namespace is {rule}", rule = crate::namespace::NAMESPACE_RULE)]
    InvalidNamespace {
        /// The name given.
        namespace: String,
    },
    /// A server was started on a namespace that has no record in etcd, without
    /// `--create-namespace`.
    #[error("namespace {namespace:?} does not exist in etcd at {endpoints}: if it is new, create it once with --create-namespace-only (or start one server with --create-namespace); if etcd lost its state (wiped or restored from a backup), do not create it again: see docs/operations.md#when-etcd-lost-its-data")]
    NamespaceNotCreated {
        /// The namespace.
        namespace: String,
        /// The etcd endpoints asked, comma-separated.
        endpoints: String,
    },
    /// A creation without a floor (`--create-namespace` alone) on an etcd
    /// that holds a restore record: the namespace may have been created
    /// after the snapshot it was restored from, and have issued ids the
    /// restore lost.
    #[error("namespace {namespace:?} does not exist in etcd at {endpoints}, which was restored from a snapshot ({snapshot}): the namespace may have been created after that snapshot and issued ids the restore lost, so it is not created without a timestamp floor above them. Choose the floor (docs/operations.md#choosing-the-floor) and create it once with --create-namespace --confirm-namespace-floor, like +48h1m: see docs/operations.md#restoring-etcd-from-a-snapshot")]
    NamespaceNeedsFloor {
        /// The namespace.
        namespace: String,
        /// The etcd endpoints asked, comma-separated.
        endpoints: String,
        /// The snapshot the restore record names.
        snapshot: String,
    },
    /// `--floor-after-id` on a namespace that exists with a lower floor: a
    /// migration floor is set only when the namespace is created.
    #[error("namespace {namespace:?} exists with floor {floor}, below the migration floor {wanted} that --floor-after-id asks for: a migration floor is set only when a namespace is created. Create a new namespace for the migration (docs/operations.md#moving-to-a-new-layout)")]
    MigrationFloorNotSet {
        /// The namespace.
        namespace: String,
        /// Its floor, RFC 3339.
        floor: String,
        /// The migration floor asked for, RFC 3339.
        wanted: String,
    },
    /// The namespace record holds a value snowkeep cannot read.
    #[error("unreadable namespace record at {key}: {value:?} ({problem}); repair it with etcdctl put {key} followed by the namespace's layout (like 41/12/10@1767225600000), see docs/operations.md#the-namespace-record")]
    CorruptNamespace {
        /// The record's key, in full.
        key: String,
        /// The value found.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
    /// etcd lost writes, so the namespace refuses every claim until an
    /// operator confirms a floor.
    #[error("namespace {namespace:?} is rolled back since {since}: {reason}. Ids issued before could be issued again, so no machine id is claimed in it until an operator confirms a timestamp floor with snowkeep-server --confirm-namespace-floor: see docs/operations.md#restoring-etcd-from-a-snapshot")]
    NamespaceRolledBack {
        /// The namespace.
        namespace: String,
        /// When it was detected, RFC 3339.
        since: String,
        /// What was detected.
        reason: String,
    },
    /// The namespace's confirmed floor is further ahead than a server waits.
    #[error("namespace {namespace:?} is fenced until {until} (a floor an operator confirmed after etcd lost state, or the migration floor of --floor-after-id), {} from now, more than --max-fence-wait {}: servers claim once the clock is within --max-fence-wait of it (see docs/operations.md#choosing-the-floor and #moving-to-a-new-layout)", humantime::format_duration(*ahead), humantime::format_duration(*max))]
    NamespaceFloorAhead {
        /// The namespace.
        namespace: String,
        /// The floor, RFC 3339.
        until: String,
        /// How far ahead of the clock it is.
        ahead: Duration,
        /// The configured maximum wait.
        max: Duration,
    },
    /// A `--confirm-namespace-floor` that cannot be right.
    #[error("--confirm-namespace-floor {floor} cannot be used: {problem}; the floor must lie after every timestamp any holder may have stamped: see docs/operations.md#choosing-the-floor")]
    BadFloor {
        /// The floor, RFC 3339.
        floor: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A requester that holds machine ids asked for a different number.
    #[error("requester already holds {held} machine ids but asked for {asked}; Release them first or Acquire {held}")]
    CountMismatch {
        /// Machine ids held.
        held: usize,
        /// Machine ids asked for.
        asked: u32,
    },
    /// A call on an embedded requester's lease came without the lease token
    /// its Acquire returned, or with another one. Nothing was changed.
    #[error("permission denied for this requester's lease: {reason}. Send the lease_token that this requester's Acquire returned; a process without it must start over as a new requester (a new nonce). Machine ids whose grant was lost free themselves when their lease ends")]
    TokenRefused {
        /// What was wrong with the token.
        reason: &'static str,
    },
    /// A new Lease API claim would take an API key's holdings over its quota.
    /// Nothing was claimed.
    #[error("key {key_id} holds {held} of its {max} machine ids; asking for {asked} would exceed its quota; release some, or use a key with a larger quota (snowkeepctl key create --max-lease-machine-ids N; a key's quota never changes)")]
    KeyQuotaExceeded {
        /// The key id.
        key_id: String,
        /// Machine ids its requesters hold now.
        held: u32,
        /// Its quota.
        max: u32,
        /// Machine ids asked for.
        asked: u32,
    },
    /// Concurrent Acquires with one API key kept changing its holdings
    /// while this one counted them. Nothing was claimed.
    #[error("API key {key_id}'s holdings changed under {attempts} Acquire attempts in a row (concurrent Acquires with this key); retry")]
    KeyQuotaContended {
        /// The key id.
        key_id: String,
        /// Attempts made.
        attempts: u32,
    },
    /// An eviction revoked the holder's lease this many times and the same
    /// holder still held the machine id each time (it kept moving to new
    /// leases: renewals racing the eviction). What was revoked stays
    /// revoked.
    #[error("machine id {machine_id} of namespace {namespace:?} is still held by the same holder after {attempts} revokes (it renewed onto a new lease each time); run the eviction again")]
    EvictContended {
        /// The namespace.
        namespace: String,
        /// The machine id.
        machine_id: u16,
        /// Revokes made.
        attempts: u32,
    },
    /// The namespace's stored layout differs from the configured one.
    #[error("namespace {namespace:?} has layout {stored} in the store but this instance is configured with {configured}; start it with --layout {stored} or use another namespace")]
    LayoutMismatch {
        /// The namespace.
        namespace: String,
        /// Layout in the store.
        stored: Layout,
        /// Layout configured.
        configured: Layout,
    },
    /// The previous holder's fence is further ahead of the clock than the
    /// largest wait allowed.
    #[error("machine id {machine_id}: fence {fence} is {ahead:?} ahead of the clock, more than --max-fence-wait {max:?}: a crashed holder's fence can be up to 1.5 × --outage-budget ahead (its successor retries until the fence is within the wait); a fence further ahead means a clock (check NTP) or a hand-written key")]
    FenceTooFarAhead {
        /// The machine id.
        machine_id: MachineId,
        /// The fence (layout ms).
        fence: Millis,
        /// How far ahead of the clock it is.
        ahead: Duration,
        /// The configured maximum wait.
        max: Duration,
    },
    /// The clock is earlier than the layout's epoch.
    #[error("clock reads {unix_ms} ms since the Unix epoch, before the layout epoch {epoch_unix_ms}: fix the clock, or give --layout an epoch in the past")]
    ClockBeforeEpoch {
        /// The clock.
        unix_ms: u64,
        /// The epoch.
        epoch_unix_ms: u64,
    },
    /// The clock is past the last timestamp the layout can carry.
    #[error("layout {layout} ran out of timestamps at {ended_unix_ms} ms since the Unix epoch (clock reads {unix_ms}): use more timestamp bits or a later epoch, in a new namespace")]
    LayoutExhausted {
        /// The layout.
        layout: Layout,
        /// When its last timestamp passed, ms since the Unix epoch.
        ended_unix_ms: u64,
        /// The clock.
        unix_ms: u64,
    },
    /// Another live process holds a machine id under our instance id.
    #[error("another live process holds machine id {machine_id} under the same instance id {instance_id:?}: two live processes must never share an --instance-id; give each its own (the pod name, say), or stop the other one first")]
    DuplicateInstance {
        /// The instance id.
        instance_id: String,
        /// The machine id taken.
        machine_id: MachineId,
    },
    /// The claim was lost: its etcd lease ended, or its keys changed under
    /// it. (The message keeps the word of the `snowkeep_lease_losses_total`
    /// metric and the logs operators search for.)
    #[error("machine-id lease lost ({reason})")]
    LeaseLost {
        /// Why.
        reason: LossReason,
    },
    /// An etcd request did not answer in time.
    #[error("etcd request {op} timed out after {after:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The store holds a value snowkeep cannot read.
    #[error("unreadable value at {key}: {value:?}")]
    Corrupt {
        /// The key (or file).
        key: String,
        /// The value found.
        value: String,
    },
    /// Another process holds the single-instance store's state file lock.
    #[error("state file {path} is locked by another snowkeep process; one single-instance server runs per --state-dir and namespace (stop the other one, or give this one its own --state-dir and a --machine-id-range disjoint from every other single-instance server's: servers with overlapping ranges issue equal ids; or run on etcd with --etcd-endpoints, which assigns machine ids)")]
    StateLocked {
        /// The state file.
        path: String,
    },
    /// A request to the store failed without a definite answer (refused,
    /// reset, no leader behind it): retried. The backend's own error is the
    /// source; only that backend looks inside it.
    #[error("{store} request failed")]
    Request {
        /// The store asked: `etcd`.
        store: &'static str,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// etcd refused this server's TLS connection or credentials (a wrong
    /// password, an untrusted certificate, a missing permission). Retried
    /// while a server runs (a rotated password or certificate heals it), but
    /// a server that meets it before its first claim exits (code 64).
    #[error("etcd at {endpoint} refused this server: {problem}")]
    AccessRefused {
        /// The endpoint that refused.
        endpoint: String,
        /// What it refused, with the remedy.
        problem: AccessProblem,
        /// etcd-client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The server's `--auth` disagrees with the cluster's security mode
    /// stored in etcd: the server does not start (exit 64).
    #[error("{problem}")]
    AuthModeMismatch {
        /// The flag, the stored value and the remedy.
        problem: String,
    },
    /// A state file operation failed.
    #[error("state file {path} I/O failed")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    /// True when retrying (with backoff) may succeed; false for conditions an
    /// operator must fix.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::LeaseLost { .. }
            | StoreError::Corrupt { .. }
            | StoreError::Timeout { .. }
            | StoreError::Request { .. }
            | StoreError::AccessRefused { .. }
            | StoreError::Io { .. }
            | StoreError::KeyQuotaContended { .. }
            | StoreError::EvictContended { .. } => true,
            StoreError::NoFreeMachineId { .. }
            | StoreError::KeyQuotaExceeded { .. }
            | StoreError::UnknownNamespace { .. }
            | StoreError::InvalidNamespace { .. }
            | StoreError::CountMismatch { .. }
            | StoreError::TokenRefused { .. }
            | StoreError::LayoutMismatch { .. }
            | StoreError::FenceTooFarAhead { .. }
            | StoreError::ClockBeforeEpoch { .. }
            | StoreError::LayoutExhausted { .. }
            | StoreError::DuplicateInstance { .. }
            | StoreError::StateLocked { .. }
            | StoreError::NamespaceNotCreated { .. }
            | StoreError::NamespaceNeedsFloor { .. }
            | StoreError::MigrationFloorNotSet { .. }
            | StoreError::CorruptNamespace { .. }
            | StoreError::NamespaceRolledBack { .. }
            | StoreError::NamespaceFloorAhead { .. }
            | StoreError::BadFloor { .. }
            | StoreError::AuthModeMismatch { .. } => false,
        }
    }
}
