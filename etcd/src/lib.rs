//! snowkeep-etcd: the etcd store, and the only crate of the workspace that
//! depends on `etcd-client`. It implements snowkeep-core's store traits
//! (`ClaimStore`, `RequesterStore`) and the administration reads and
//! writes: connect, namespace check, claim, fence,
//! keepalive, holder watch, peer registration and release, each one etcd
//! request (or transaction) under a timeout, because a hung etcd member
//! (SIGSTOP, a frozen VM) leaves requests and streams silent rather than
//! failed, and must never hang the claim loop.
//!
//! Failover: etcd-client balances one channel over all endpoints and keeps
//! picking a dead one, so the store keeps **one client per endpoint**. Every
//! request starts on the current endpoint; when that endpoint fails (refused,
//! reset, timed out, or answering without a leader) the request moves on to the
//! next endpoint at once, and so on around the list, trying each endpoint at
//! most once. The position is shared by every user (claim loop, holder watch,
//! Lease API, peer check), so the next request starts on the endpoint that
//! answered. A definite answer from etcd (a failed compare, "lease not found")
//! is not a failure of the endpoint and is returned as it is. Retried requests
//! are safe to repeat: reads, guarded transactions that recognise their own
//! earlier commit, lease grants (an orphan lease expires by itself) and
//! revokes (an already revoked lease counts as revoked). A request that timed
//! out on a hung member may still be applied when that member resumes, after
//! its retry: fence writes therefore also carry the fence key's revision as a
//! guard, so such a late write changes nothing instead of lowering a fence.
//!
//! | module | owns |
//! | --- | --- |
//! | `endpoints` | the failover client: one client per endpoint, TLS and authentication, timeouts, which errors move on; the one single-key read (`get_key`) |
//! | [`access`] | the TLS and authentication settings, and recognising etcd's refusals of them |
//! | `tls_probe` | a TLS connection of our own at start that reads etcd's verdict on this server's certificates |
//! | `start_check` | the access check before the first claim: the TLS probe, then read and write permission on the namespace's keys |
//! | `pool` | reading a namespace's pool at one revision, in pages, and the claim transactions; `pool::round` is one round of a claim, `pool::candidate` one candidate's claim transaction and the floor it gives |
//! | `fence_count` | the counts of fence keys created, per block of 64 machine ids, which tell a never-written fence key from a deleted one |
//! | `session` | the server's own lease: grant and claim, fence writes, keepalive, peer registration, release and revoke |
//! | `watch` | the holder watch of a hold |
//! | `directory` | the peer directory and the capacity reader |
//! | [`keys`] | the key schema and the codecs of the values read back (fences, requester records) |
//! | [`namespace`] | the namespace record: create, confirm a floor, the rollback rule; `namespace::rollback` is the rollback check in etcd and the claims' guard, `namespace::setup` opens the namespace at start |
//! | `instance` | one live process per instance id |
//! | `overlap` | the advice about other namespaces sharing this range |
//! | `requesters` | the Lease API's leases of embedded requesters, and API key quotas; `requesters::grant` is a new grant, `requesters::renewal` a renewal, `requesters::store` the Lease API's calls |
//! | `admin` | the administration service's reads and eviction; `admin::document` is the export document, `admin::export` and `admin::import` write and restore it, `admin::import_checks` refuses an import that could issue an id twice |
//! | `apikeys` | API key records and their watch |
//! | `auth_mode` | the cluster's security mode record and its watch |
//! | `pool_read` | the pool read for a claim: a window of fence-count blocks, or the whole pool, at one revision |
//! | `store_traits` | `snowkeep_core`'s store traits implemented by the types above (`ClusterState` by `admin::StateStore`) |
//! | `restore_record` | the restore record `/snowkeep/v1/restored` that `scripts/etcd-snapshot restore` writes: while it stands, a namespace is created only with an operator's floor |
//! | `witness` | the revision witness: the highest etcd revision seen, which shows a restore from a snapshot |
//!
//! No two of these modules import each other, directly or through others
//! (the workspace's layering test checks it).

/// The etcd client this crate is built on, re-exported for the tests and
/// tools that read etcd directly: no other crate of the workspace depends
/// on `etcd-client` itself.
pub use etcd_client;

pub mod access;
pub mod admin;
pub mod apikeys;
pub mod auth_mode;
mod directory;
mod endpoints;
mod fence_count;
mod instance;
pub mod keys;
pub mod namespace;
pub mod overlap;
mod pool;
mod pool_read;
pub mod requesters;
mod restore_record;
mod session;
mod start_check;
mod store_traits;
mod tls_probe;
mod watch;
pub mod witness;

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper, Txn};
use snowkeep_client::{Layout, MachineId, Millis, SharedClock};

pub use directory::{CapacityReader, PeerDirectory};
use endpoints::Endpoints;
use pool::{claim_ids, ClaimRequest};

use snowkeep_core::claim::{ClaimStore, HolderWatch, LossReason, StoreError};

/// Settings of the etcd store.
#[derive(Debug, Clone)]
pub struct EtcdSettings {
    /// Client URLs, all `http://host:port` or all `https://host:port`.
    pub endpoints: Vec<String>,
    /// TLS and authentication towards etcd (the same for every client).
    pub access: access::EtcdAccess,
    /// The namespace.
    pub namespace: String,
    /// This instance's id (the holder key's value).
    pub instance_id: String,
    /// etcd lease TTL (whole seconds, at least 2).
    pub lease_ttl: Duration,
    /// Machine ids this instance may claim, `[start, end)`.
    pub machine_id_range: Range<u32>,
    /// How many machine ids to hold under the one lease.
    pub machine_ids: u32,
    /// Whether the instance id is stable (`--instance-id` given): its
    /// claims are then recorded under `instance/{instance_id}/`, where a
    /// restart finds by key the machine ids it held or released last.
    pub stable_instance: bool,
    /// How far ahead of its clock a server raises its fences (1.5 outage
    /// budgets, `snowkeep_core::claim::fence_lead`): the farthest any live holder
    /// of ours can be stamping, so the floor assumed for a machine id whose
    /// fence key is missing when the namespace's fence count cannot vouch
    /// that it was never written.
    pub fence_horizon: Duration,
    /// Machine ids whose fence is further ahead of the clock are not claimed.
    pub max_fence_wait: Duration,
    /// Timeout of one etcd request.
    pub request_timeout: Duration,
    /// `host:port` registered under the namespace's peer keys with each
    /// lease, for the peer clock check; `None` registers nothing.
    pub advertise_address: Option<String>,
    /// Create the namespace, or confirm a floor, when connecting.
    pub namespace_setup: namespace::NamespaceSetup,
}

/// The etcd store's own part of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdLease {
    /// The etcd lease the claim's holder keys are bound to.
    pub id: i64,
    /// The store revision at which the last claim transaction committed: the
    /// holder watch starts just after it.
    pub revision: i64,
}

/// A claim of the etcd store.
pub type Claim = snowkeep_core::claim::Claim<EtcdLease>;

/// Machine-id leases kept in etcd.
pub struct EtcdStore {
    endpoints: Endpoints,
    settings: EtcdSettings,
    clock: SharedClock,
    layout: Layout,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// The endpoint position the keepalive stream was opened on.
    keeper_position: usize,
    /// The last leases this process granted itself (see `instance`).
    own_leases: Vec<i64>,
    /// The mod revision of each held fence key as this holder last wrote (or
    /// claimed) it: the guard of its next fence write.
    fence_revisions: HashMap<MachineId, i64>,
    /// The fence values sent for each held machine id since its last
    /// confirmed fence write (answers lost: each may yet commit). Found in
    /// the fence key, such a value is this holder's own write.
    fence_attempts: HashMap<MachineId, Vec<Millis>>,
    /// The machine ids of this process's last claim: the next claim (after
    /// a lost lease, say) reads their blocks, to take back any still held.
    claimed_last: Vec<MachineId>,
    /// Keys the last claim read from etcd (see [`EtcdStore::claim_keys_read`]).
    keys_read: u64,
    /// The holder leases the last claim found, when it was refused for a
    /// full range: the leases [`EtcdStore::holder_lease_end`] asks about.
    full_range_leases: Vec<i64>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Makes one client per endpoint without sending any request
    /// (etcd-client connects on first use). Call `EtcdStore::check_access`
    /// and `EtcdStore::open_namespace` next: they are the first requests.
    /// Errors only for an unusable endpoint URL.
    pub async fn new(
        settings: EtcdSettings,
        layout: Layout,
        clock: SharedClock,
    ) -> Result<Self, StoreError> {
        let endpoints = Endpoints::connect(
            &settings.endpoints,
            settings.request_timeout,
            &settings.access,
        )
        .await?;
        Ok(Self {
            endpoints,
            settings,
            clock,
            layout,
            keeper: None,
            keeper_position: 0,
            own_leases: Vec::new(),
            fence_revisions: HashMap::new(),
            fence_attempts: HashMap::new(),
            claimed_last: Vec::new(),
            keys_read: 0,
            full_range_leases: Vec::new(),
        })
    }

    /// `EtcdStore::new`, then `EtcdStore::check_access` and
    /// `EtcdStore::open_namespace` once: checks that etcd accepts this
    /// server's TLS settings, credentials and permissions, then opens the
    /// namespace as `settings.namespace_setup` says (create it, confirm a
    /// floor, or check it is usable). Errors with
    /// [`StoreError::AccessRefused`],
    /// [`StoreError::NamespaceNotCreated`], [`StoreError::LayoutMismatch`],
    /// [`StoreError::CorruptNamespace`] or [`StoreError::NamespaceRolledBack`],
    /// and with a retryable error when no endpoint answers.
    pub async fn connect(
        settings: EtcdSettings,
        layout: Layout,
        clock: SharedClock,
    ) -> Result<Self, StoreError> {
        let mut store = Self::new(settings, layout, clock).await?;
        store.check_access().await?;
        store.open_namespace().await?;
        Ok(store)
    }

    fn ns(&self) -> &str {
        &self.settings.namespace
    }

    /// Runs one transaction under the request timeout, failing over.
    async fn txn(
        &mut self,
        op: &'static str,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, StoreError> {
        let timeout = self.settings.request_timeout;
        self.endpoints.txn(op, timeout, txn).await
    }
}

impl ClaimStore for EtcdStore {
    type Lease = EtcdLease;

    async fn claim(&mut self) -> Result<Claim, StoreError> {
        EtcdStore::claim(self).await
    }

    async fn advance_fences(&mut self, claim: &Claim, fences: &[Millis]) -> Result<(), StoreError> {
        EtcdStore::advance_fences(self, claim, fences).await
    }

    async fn renew(&mut self, claim: &Claim) -> Result<Instant, StoreError> {
        EtcdStore::renew(self, claim).await
    }

    async fn release(&mut self, claim: &Claim, last_used: &[Millis]) -> Result<(), StoreError> {
        EtcdStore::release(self, claim, last_used).await
    }

    /// Revokes the claim's lease: etcd deletes the holder keys with it and
    /// leaves the fences.
    async fn abandon(&mut self, claim: &Claim) {
        EtcdStore::abandon(self, claim).await
    }

    fn watch_holders(&self, claim: &Claim) -> HolderWatch {
        let task = EtcdStore::watch_holders(self, claim);
        // The watch task panicked: assume the worst.
        Box::pin(async move { task.await.unwrap_or(Ok(LossReason::HolderChanged)) })
    }

    /// The namespace record and the rollback rule, as before a claim.
    async fn check_namespace(&mut self) -> Result<(), StoreError> {
        self.guard_namespace().await.map(|_| ())
    }

    async fn holder_lease_end(&mut self) -> Result<Option<std::time::Duration>, StoreError> {
        EtcdStore::holder_lease_end(self).await
    }

    fn may_claim_others(&self) -> bool {
        true
    }
}
