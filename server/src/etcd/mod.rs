//! The only module that talks to etcd: connect, namespace check, claim, fence,
//! keepalive, holder watch, peer registration and release, each one etcd
//! request (or transaction) under a timeout, because a hung etcd member
//! (SIGSTOP, a frozen VM) leaves requests and streams silent rather than
//! failed, and must never hang the lease loop.
//!
//! Failover: etcd-client balances one channel over all endpoints and keeps
//! picking a dead one, so the store keeps **one client per endpoint**. Every
//! request starts on the current endpoint; when that endpoint fails (refused,
//! reset, timed out, or answering without a leader) the request moves on to the
//! next endpoint at once, and so on around the list, trying each endpoint at
//! most once. The position is shared by every user (lease loop, holder watch,
//! Lease API, peer check), so the next request starts on the endpoint that
//! answered. A definite answer from etcd (a failed compare, "lease not found")
//! is not a failure of the endpoint and is returned as it is. Retried requests
//! are safe to repeat: reads, guarded transactions that recognise their own
//! earlier commit, lease grants (an orphan lease expires by itself) and
//! revokes (an already revoked lease counts as revoked). A request that timed
//! out on a hung member may still be applied when that member resumes, after
//! its retry: fence writes therefore also carry the fence key's revision as a
//! guard, so such a late write changes nothing instead of lowering a fence.

mod instance;
pub mod keys;
pub mod namespace;
pub mod overlap;
pub mod requesters;

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use snowkeep_client::{Layout, MachineId, Millis, SharedClock};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, error, info, warn};

use crate::lease::capacity::CapacitySource;
use crate::lease::claim::{rank_candidates, CandidateKind, PoolView};
use crate::lease::{Capacity, HeldId, HolderWatch, LeaseError, LeaseStore, LossReason};
use crate::metrics as m;

/// Candidates tried per read of the pool before reading it again.
const CANDIDATES_PER_ROUND: usize = 8;
/// Pool reads per claim before giving up on this attempt (the caller retries).
const CLAIM_ROUNDS: usize = 16;
/// Pause before re-opening a failed holder watch.
const WATCH_RETRY: Duration = Duration::from_millis(250);

/// Settings of the etcd store.
#[derive(Debug, Clone)]
pub struct EtcdSettings {
    /// Client URLs, `http://host:port`.
    pub endpoints: Vec<String>,
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
    /// How far ahead of the clock fences are raised; also the floor assumed
    /// for a machine id whose fence key is missing.
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

/// Clients for each endpoint, moving to the next after a failure. Clones
/// share the position, so a dead member learnt by one user (the lease loop,
/// a Lease API call) is skipped by all.
#[derive(Clone)]
struct Endpoints {
    clients: Vec<Client>,
    /// The endpoint URLs, in `clients` order (for logs).
    urls: Arc<[String]>,
    current: Arc<AtomicUsize>,
}

/// True when `e` says the endpoint did not serve the request (refused, reset,
/// timed out, no leader behind it), so another member may; false for a
/// definite answer that every member would give (not found, invalid argument,
/// compacted, permission denied).
fn endpoint_failed(e: &LeaseError) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    if let LeaseError::Timeout { .. } = e {
        return true;
    }
    let Some(e) = etcd_error(e) else {
        return false;
    };
    match e {
        E::GRpcStatus(status) => !matches!(
            status.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::Unimplemented
        ),
        E::LeaseKeepAliveError(msg) => !msg.contains("not found"),
        E::InvalidArgs(_) | E::InvalidUri(_) | E::Utf8Error(_) | E::InvalidMetadataValue(_) => {
            false
        }
        _ => true,
    }
}

/// True when `e` is etcd saying the lease does not exist (any more).
fn lease_not_found(e: &LeaseError) -> bool {
    match etcd_error(e) {
        Some(etcd_client::Error::GRpcStatus(s)) => {
            s.code() == tonic::Code::NotFound && s.message().contains("lease not found")
        }
        Some(etcd_client::Error::LeaseKeepAliveError(msg)) => msg.contains("not found"),
        _ => false,
    }
}

/// The etcd-client error behind `e`, if it is one.
fn etcd_error(e: &LeaseError) -> Option<&etcd_client::Error> {
    match e {
        LeaseError::Store { source, .. } => source.downcast_ref(),
        _ => None,
    }
}

impl From<etcd_client::Error> for LeaseError {
    fn from(e: etcd_client::Error) -> Self {
        LeaseError::Store {
            store: "etcd",
            source: Box::new(e),
        }
    }
}

impl Endpoints {
    /// Makes one lazy client per endpoint URL; no request is sent.
    async fn connect(urls: &[String], timeout: Duration) -> Result<Self, LeaseError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            // HTTP/2 pings: a connection to a hung member fails within
            // 2 s + `timeout` even while only a stream uses it.
            .with_keep_alive(Duration::from_secs(2), timeout);
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            clients.push(
                timed(
                    "connect",
                    timeout,
                    Client::connect([url], Some(options.clone())),
                )
                .await?,
            );
        }
        Ok(Self {
            clients,
            urls: urls.into(),
            current: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The position now (an index modulo the number of endpoints).
    fn position(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    fn client_at(&self, position: usize) -> Client {
        self.clients[position % self.clients.len()].clone()
    }

    fn url_at(&self, position: usize) -> &str {
        &self.urls[position % self.urls.len()]
    }

    /// Moves off the endpoint at `position` after it failed, unless another
    /// user already moved: several users failing on one dead member move the
    /// shared position once, not once each (which could cycle back onto it).
    fn failed_at(&self, position: usize) {
        let _ = self.current.compare_exchange(
            position,
            position.wrapping_add(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Runs one request, each attempt under `after`: on the current endpoint
    /// first, then on each next endpoint while the endpoints fail (at most one
    /// attempt per endpoint, so at most `after` × endpoints in all). Returns
    /// the answer, or a definite error at once, or the last endpoint's error.
    async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        after: Duration,
        f: F,
    ) -> Result<T, LeaseError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_at(op, after, f).await.map(|(answer, _)| answer)
    }

    /// [`Endpoints::call`], also returning the position that answered.
    async fn call_at<T, F, Fut>(
        &self,
        op: &'static str,
        after: Duration,
        mut f: F,
    ) -> Result<(T, usize), LeaseError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let start = self.position();
        let mut failed: Vec<String> = Vec::new();
        let mut last = None;
        for k in 0..self.clients.len() {
            let position = start.wrapping_add(k);
            match timed(op, after, f(self.client_at(position))).await {
                Ok(answer) => {
                    if !failed.is_empty() {
                        warn!(op, failed = ?failed, now_using = self.url_at(position), "etcd endpoint failed; moved on to the next");
                    }
                    return Ok((answer, position));
                }
                Err(e) if endpoint_failed(&e) => {
                    debug!(op, endpoint = self.url_at(position), error = %crate::DisplayChain(&e), "etcd endpoint failed; trying the next");
                    self.failed_at(position);
                    failed.push(format!(
                        "{}: {}",
                        self.url_at(position),
                        crate::DisplayChain(&e)
                    ));
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(LeaseError::Timeout { op, after }))
    }

    /// Runs one transaction, like [`Endpoints::call`]. A retried transaction
    /// may find its own earlier commit: its guard must then fail or hold
    /// harmlessly, and the caller must recognise it.
    async fn txn(
        &self,
        op: &'static str,
        after: Duration,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, LeaseError> {
        self.call(op, after, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Revokes `lease_id`, failing over like [`Endpoints::call`]; a lease
    /// that is already gone (an earlier attempt revoked it, or it expired)
    /// counts as revoked.
    async fn revoke(&self, after: Duration, lease_id: i64) -> Result<(), LeaseError> {
        match self
            .call("lease revoke", after, |mut c| async move {
                c.lease_revoke(lease_id).await
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if lease_not_found(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
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
pub type Claim = crate::lease::Claim<EtcdLease>;

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
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Runs one etcd request under the timeout.
async fn timed<T>(
    op: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LeaseError> {
    match tokio::time::timeout(after, fut).await {
        Ok(r) => r.map_err(LeaseError::from),
        Err(_) => Err(LeaseError::Timeout { op, after }),
    }
}

fn parse_fence(key: &str, value: &[u8]) -> Result<Millis, LeaseError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Millis)
        .ok_or_else(|| LeaseError::Corrupt {
            key: key.to_owned(),
            value: String::from_utf8_lossy(value).into_owned(),
        })
}

/// Keys per page of a pool read. A page of holder keys with long instance ids
/// stays far below etcd-client's 4 MiB response limit.
const POOL_PAGE_KEYS: i64 = 1024;
/// Pool reads started over after etcd compacted the revision they read at.
const POOL_READ_ATTEMPTS: usize = 3;

/// Reads a namespace's pool: its holder, fence, last-holder and requester
/// record keys, at one revision. Never the whole namespace prefix: other keys
/// (peers, tokens, keys of older versions) grow with what anyone sends, and
/// one response past etcd-client's 4 MiB limit would stop every claim. Each
/// range is read in pages of [`POOL_PAGE_KEYS`]; the requester records are
/// bounded too, since only requesters that hold machine ids have one.
async fn read_pool(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
) -> Result<PoolView, LeaseError> {
    let mut attempt = 1;
    loop {
        match read_pool_at_one_revision(endpoints, timeout, namespace).await {
            Err(e)
                if matches!(etcd_error(&e), Some(etcd_client::Error::GRpcStatus(status)) if status.message().contains("compacted"))
                    && attempt < POOL_READ_ATTEMPTS =>
            {
                debug!(
                    namespace,
                    "pool read outlived its revision (compacted); reading again"
                );
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Every key-value under `prefix`, read in pages of [`POOL_PAGE_KEYS`] at
/// `revision`; a `revision` of 0 becomes the first page's, for the reads
/// that follow.
async fn read_range(
    endpoints: &Endpoints,
    timeout: Duration,
    prefix: &str,
    revision: &mut i64,
) -> Result<Vec<etcd_client::KeyValue>, LeaseError> {
    let end = keys::prefix_end(prefix);
    let mut from = prefix.as_bytes().to_vec();
    let mut kvs = Vec::new();
    loop {
        let mut options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(POOL_PAGE_KEYS);
        if *revision > 0 {
            options = options.with_revision(*revision);
        }
        let mut resp = endpoints
            .call("read pool", timeout, |mut c| {
                let (key, options) = (from.clone(), options.clone());
                async move { c.get(key, Some(options)).await }
            })
            .await?;
        if *revision == 0 {
            *revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        }
        let more = resp.more();
        kvs.extend(resp.take_kvs());
        match kvs.last() {
            // The next page starts just after the last key read.
            Some(last) if more => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(kvs),
        }
    }
}

/// One attempt of [`read_pool`]: the first page fixes the revision every
/// later page reads at.
async fn read_pool_at_one_revision(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
) -> Result<PoolView, LeaseError> {
    let mut revision = 0;
    let mut view = PoolView::default();
    let holder_prefix = keys::holder_prefix(namespace);
    for kv in read_range(endpoints, timeout, &holder_prefix, &mut revision).await? {
        if let Some(id) = keys::machine_id_of(kv.key(), &holder_prefix) {
            view.holders
                .insert(id, String::from_utf8_lossy(kv.value()).into_owned());
        }
    }
    let fence_prefix = keys::fence_prefix(namespace);
    let mut corrupt = 0;
    for kv in read_range(endpoints, timeout, &fence_prefix, &mut revision).await? {
        let Some(id) = keys::machine_id_of(kv.key(), &fence_prefix) else {
            continue;
        };
        let key = String::from_utf8_lossy(kv.key());
        match parse_fence(&key, kv.value()) {
            Ok(fence) => {
                view.fences.insert(id, fence);
            }
            Err(e) => {
                corrupt += 1;
                error!(namespace, machine_id = id.get(), key = %key, error = %e, "quarantining a machine id whose fence is unreadable; repair or delete the key only once no holder uses it");
                view.quarantined.insert(id);
            }
        }
    }
    m::count_corrupt(namespace, m::KeyKind::Fence, corrupt);
    let last_prefix = keys::last_holder_prefix(namespace);
    for kv in read_range(endpoints, timeout, &last_prefix, &mut revision).await? {
        if let Some(id) = keys::machine_id_of(kv.key(), &last_prefix) {
            view.last_holders
                .insert(id, String::from_utf8_lossy(kv.value()).into_owned());
        }
    }
    let requester_prefix = keys::requester_prefix(namespace);
    let mut corrupt = 0;
    for kv in read_range(endpoints, timeout, &requester_prefix, &mut revision).await? {
        let Some(requester) = kv.key().strip_prefix(requester_prefix.as_bytes()) else {
            continue;
        };
        // An embedded requester's machine ids are held while its record
        // lives, even if someone deleted their holder (and fence) keys: its
        // fences run a whole lease ahead, far beyond the floor assumed for a
        // missing fence, and it renews too rarely to notice.
        let holder = keys::requester_holder(&String::from_utf8_lossy(requester));
        let key = String::from_utf8_lossy(kv.key());
        match requesters::decode_record(&key, kv.value()) {
            Ok(ids) => {
                for (id, _) in ids {
                    view.holders.entry(id).or_insert_with(|| holder.clone());
                }
            }
            Err(e) => {
                corrupt += 1;
                error!(namespace, key = %key, error = %e, "unreadable requester record; the machine ids it names stay held only while their holder keys live");
            }
        }
    }
    m::count_corrupt(namespace, m::KeyKind::Requester, corrupt);
    Ok(view)
}

/// What to claim: `count` machine ids of `range` in `namespace` for the holder
/// value `holder`, bound to `lease_id`, ranked at layout time `now`.
struct ClaimRequest<'a> {
    namespace: &'a str,
    holder: &'a str,
    range: Range<u32>,
    count: usize,
    lease_id: i64,
    now: Millis,
    /// The floor of a machine id without a fence key. A missing key may be a
    /// deleted one (operator, restored snapshot) under a holder that is still
    /// stamping up to its fence, which is at most a horizon ahead of its clock:
    /// so `now + fence_horizon`, never 0: a new holder stamps only above the
    /// previous holder's fence.
    absent_floor: Millis,
    /// Machine ids whose fence is above this are skipped (`now + max_fence_wait`).
    max_floor: Millis,
    /// Free machine ids to try first, after the ones the holder still holds
    /// (a crashed predecessor's, under the same instance id).
    prefer: &'a [MachineId],
}

impl ClaimRequest<'_> {
    /// `(absent_floor, max_floor)` for a claim at layout time `now`.
    fn floors(now: Millis, fence_horizon: Duration, max_fence_wait: Duration) -> (Millis, Millis) {
        let after = |d: Duration| {
            Millis(
                now.get()
                    .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            )
        };
        (after(fence_horizon), after(max_fence_wait))
    }
}

/// Machine ids claimed by [`claim_ids`].
struct Claimed {
    /// The machine ids with their floors.
    held: Vec<HeldId>,
    /// The highest revision a claim transaction committed at.
    revision: i64,
    /// The fence key's mod revision as each claim read it (0: no key), in
    /// `held` order: the guard of the holder's first fence write.
    fence_revisions: Vec<i64>,
}

/// Claims machine ids one atomic transaction per candidate; each floor is the
/// fence read *inside* the claiming transaction, or after it committed (a
/// fence read before the claim may be stale: the previous holder may still
/// have raised it just before its lease expired). Partial claims are left
/// bound to the lease: the caller revokes it on error.
async fn claim_ids(
    endpoints: &Endpoints,
    timeout: Duration,
    want: ClaimRequest<'_>,
) -> Result<Claimed, LeaseError> {
    let ns = want.namespace;
    let mut held: Vec<HeldId> = Vec::with_capacity(want.count);
    let mut fence_revisions = Vec::with_capacity(want.count);
    let mut revision = 0;
    'rounds: for round in 0..CLAIM_ROUNDS {
        // The namespace record, read each round: a claim commits only while
        // it is unchanged (not marked rolled back since), and every floor is
        // at least the namespace floor an operator confirmed.
        let record = namespace::ClaimGuard::read(endpoints, timeout, ns).await?;
        let absent_floor = want.absent_floor.max(record.floor);
        let view = read_pool(endpoints, timeout, ns).await?;
        let mut too_far = None;
        let mut candidates: Vec<_> = rank_candidates(
            &view,
            want.range.clone(),
            want.holder,
            want.now,
            &mut rand::rng(),
        )
        .into_iter()
        .filter(|c| held.iter().all(|h| h.machine_id != c.machine_id))
        .filter(|c| match view.fences.get(&c.machine_id) {
            Some(&f) if f.max(record.floor) > want.max_floor => {
                too_far.get_or_insert((c.machine_id, f.max(record.floor)));
                false
            }
            None if record.floor > want.max_floor => {
                too_far.get_or_insert((c.machine_id, record.floor));
                false
            }
            _ => true,
        })
        .collect();
        // Stable: the ranking order stays within each group.
        candidates
            .sort_by_key(|c| c.kind != CandidateKind::Own && !want.prefer.contains(&c.machine_id));
        if let (true, Some((machine_id, fence))) = (candidates.is_empty(), too_far) {
            let ahead = Duration::from_millis(fence.get().saturating_sub(want.now.get()));
            let max = Duration::from_millis(want.max_floor.get().saturating_sub(want.now.get()));
            return Err(LeaseError::FenceTooFarAhead {
                machine_id,
                fence,
                ahead,
                max,
            });
        }
        if candidates.is_empty() {
            return Err(LeaseError::NoFreeMachineId {
                namespace: ns.to_owned(),
                capacity: want.range.end - want.range.start,
                start: want.range.start,
                end: want.range.end,
            });
        }
        for candidate in candidates.into_iter().take(CANDIDATES_PER_ROUND) {
            let holder = keys::holder(ns, candidate.machine_id);
            let fence = keys::fence(ns, candidate.machine_id);
            let guard = match candidate.kind {
                CandidateKind::Own => Compare::value(holder.clone(), CompareOp::Equal, want.holder),
                CandidateKind::Free => {
                    Compare::create_revision(holder.clone(), CompareOp::Equal, 0)
                }
            };
            // Both branches answer the fence second. The failure branch also
            // reads the holder key: a transaction retried on another endpoint
            // after its first attempt committed (and the answer was lost)
            // finds the key already ours, under our lease. It reads the
            // namespace record third, to tell a changed record from a lost race.
            let txn = Txn::new()
                .when([guard, record.compare()])
                .and_then([
                    TxnOp::put(
                        holder.clone(),
                        want.holder,
                        Some(PutOptions::new().with_lease(want.lease_id)),
                    ),
                    TxnOp::get(fence.clone(), None),
                ])
                .or_else([
                    TxnOp::get(holder, None),
                    TxnOp::get(fence.clone(), None),
                    TxnOp::get(record.key.clone(), None),
                ]);
            let resp = endpoints.txn("claim txn", timeout, txn).await?;
            // Our lease is this claim's own, and only this transaction puts
            // it on a holder key, guarded by the record: a key already ours is
            // this claim's earlier commit, made while the record was unchanged.
            let already_ours = || match resp.op_responses().first() {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().is_some_and(|kv| {
                    kv.value() == want.holder.as_bytes() && kv.lease() == want.lease_id
                }),
                _ => false,
            };
            if !resp.succeeded() && !already_ours() {
                if record.changed(&resp, 2) {
                    debug!(
                        round,
                        "the namespace record changed during the claim; reading it again"
                    );
                    continue 'rounds;
                }
                debug!(
                    machine_id = candidate.machine_id.get(),
                    round, "claim lost a race, trying the next candidate"
                );
                continue;
            }
            let (floor, fence_revision) = match resp.op_responses().get(1) {
                Some(TxnOpResponse::Get(get)) => match get.kvs().first() {
                    Some(kv) => (
                        parse_fence(&fence, kv.value())?.max(record.floor),
                        kv.mod_revision(),
                    ),
                    None => (absent_floor, 0),
                },
                _ => (absent_floor, 0),
            };
            revision = revision.max(resp.header().map(|h| h.revision()).unwrap_or(0));
            held.push(HeldId {
                machine_id: candidate.machine_id,
                floor,
                fence: floor,
            });
            fence_revisions.push(fence_revision);
            if held.len() == want.count {
                return Ok(Claimed {
                    held,
                    revision,
                    fence_revisions,
                });
            }
        }
    }
    Err(LeaseError::Timeout {
        op: "claim (every candidate was taken concurrently)",
        after: timeout,
    })
}

impl EtcdStore {
    /// Makes one client per endpoint without sending any request
    /// (etcd-client connects on first use). Call [`EtcdStore::open_namespace`]
    /// next: it is the first request. Errors only for an unusable endpoint URL.
    pub async fn new(
        settings: EtcdSettings,
        layout: Layout,
        clock: SharedClock,
    ) -> Result<Self, LeaseError> {
        let endpoints = Endpoints::connect(&settings.endpoints, settings.request_timeout).await?;
        Ok(Self {
            endpoints,
            settings,
            clock,
            layout,
            keeper: None,
            keeper_position: 0,
            own_leases: Vec::new(),
            fence_revisions: HashMap::new(),
        })
    }

    /// [`EtcdStore::new`], then [`EtcdStore::open_namespace`] once: opens the
    /// namespace as `settings.namespace_setup` says (create it, confirm a
    /// floor, or check it is usable). Errors with
    /// [`LeaseError::NamespaceNotCreated`], [`LeaseError::LayoutMismatch`],
    /// [`LeaseError::CorruptNamespace`] or [`LeaseError::NamespaceRolledBack`],
    /// and with a retryable error when no endpoint answers.
    pub async fn connect(
        settings: EtcdSettings,
        layout: Layout,
        clock: SharedClock,
    ) -> Result<Self, LeaseError> {
        let mut store = Self::new(settings, layout, clock).await?;
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
    ) -> Result<etcd_client::TxnResponse, LeaseError> {
        let timeout = self.settings.request_timeout;
        self.endpoints.txn(op, timeout, txn).await
    }

    /// Grants a lease and claims `machine_ids` machine ids for it, with an
    /// atomic transaction per candidate. The fence returned as each floor is
    /// read inside the claiming transaction (or, for a transaction retried on
    /// another endpoint, after its earlier attempt committed), and is at
    /// least the namespace floor. Then registers this server for the peer
    /// clock check, best effort.
    ///
    /// First checks the namespace may be claimed in, and settles holder keys
    /// that name this instance id under another process's lease (see the
    /// `instance` module): a crashed predecessor's machine id is claimed back
    /// once its lease ends, and [`LeaseError::DuplicateInstance`] stops this
    /// process when another live one holds it.
    pub async fn claim(&mut self) -> Result<Claim, LeaseError> {
        // Before granting anything: the namespace may be claimed in.
        self.guard_namespace().await?;
        let prefer = self.settle_own_holders().await?;
        let timeout = self.settings.request_timeout;
        let ttl_secs = i64::try_from(self.settings.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        self.keeper = None;
        let sent = self.clock.now();
        let lease = self
            .endpoints
            .call("lease grant", timeout, |mut c| async move {
                c.lease_grant(ttl_secs, None).await
            })
            .await?;
        let lease_id = lease.id();
        self.remember_lease(lease_id);
        let deadline = sent + Duration::from_secs(u64::try_from(lease.ttl()).unwrap_or(0));
        let claimed = match self.claim_with_lease(lease_id, &prefer).await {
            Err(LeaseError::UnknownNamespace { namespace }) => {
                Err(LeaseError::NamespaceNotCreated {
                    namespace,
                    endpoints: self.settings.endpoints.join(","),
                })
            }
            other => other,
        };
        match claimed {
            Ok(claimed) => {
                self.fence_revisions = claimed
                    .held
                    .iter()
                    .map(|h| h.machine_id)
                    .zip(claimed.fence_revisions)
                    .collect();
                let claim = Claim {
                    held: claimed.held,
                    deadline: Some(deadline),
                    lease: EtcdLease {
                        id: lease_id,
                        revision: claimed.revision,
                    },
                };
                info!(namespace = %self.ns(), machine_ids = ?claim.machine_ids(), lease_id, fence_ms = claim.max_floor().get(), "claimed machine ids");
                self.register_peer(lease_id).await;
                Ok(claim)
            }
            Err(e) => {
                // Revoking also deletes the holder keys claimed so far; best
                // effort, since an unused lease expires by itself anyway.
                let _ = self.endpoints.revoke(timeout, lease_id).await;
                Err(e)
            }
        }
    }

    async fn claim_with_lease(
        &mut self,
        lease_id: i64,
        prefer: &[MachineId],
    ) -> Result<Claimed, LeaseError> {
        let now = self
            .layout
            .to_layout_ms(self.clock.unix_ms())
            .unwrap_or_default();
        let (absent_floor, max_floor) = ClaimRequest::floors(
            now,
            self.settings.fence_horizon,
            self.settings.max_fence_wait,
        );
        let want = ClaimRequest {
            namespace: &self.settings.namespace,
            holder: &self.settings.instance_id,
            range: self.settings.machine_id_range.clone(),
            count: self.settings.machine_ids as usize,
            lease_id,
            now,
            absent_floor,
            max_floor,
            prefer,
        };
        let claimed = claim_ids(&self.endpoints, self.settings.request_timeout, want).await?;
        self.check_no_older_twin(lease_id).await?;
        Ok(claimed)
    }

    /// Raises the fence of every claimed machine id (`fences[i]` for
    /// `claim.held[i]`) in one transaction guarded by our lease still owning
    /// every holder key and by each fence key being as this holder last wrote
    /// it (its mod revision). The second guard keeps a late write out: a fence
    /// write that timed out on a hung member, and was retried on another one,
    /// may still be applied when that member resumes; it then finds the fence
    /// moved on and changes nothing, rather than lowering a fence already in
    /// use. A retried write that finds its own earlier attempt committed
    /// counts as done. [`LeaseError::LeaseLost`] with `HolderChanged` when a
    /// holder key is not ours any more, or a fence key was changed by anyone
    /// else (the caller stops issuing and claims again, reading the fence).
    pub async fn advance_fences(
        &mut self,
        claim: &Claim,
        fences: &[Millis],
    ) -> Result<(), LeaseError> {
        let ns = self.ns().to_owned();
        let lease_id = claim.lease.id;
        let mut guard = self.ownership(claim);
        let mut puts = Vec::with_capacity(claim.held.len());
        let mut reads = Vec::with_capacity(claim.held.len() * 2);
        for (h, f) in claim.held.iter().zip(fences) {
            let key = keys::fence(&ns, h.machine_id);
            if let Some(&revision) = self.fence_revisions.get(&h.machine_id) {
                guard.push(Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                ));
            }
            puts.push(TxnOp::put(key.clone(), f.get().to_string(), None));
            reads.push(TxnOp::get(keys::holder(&ns, h.machine_id), None));
            reads.push(TxnOp::get(key, None));
        }
        let txn = Txn::new().when(guard).and_then(puts).or_else(reads);
        let resp = self.txn("fence txn", txn).await?;
        if resp.succeeded() {
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            for h in &claim.held {
                self.fence_revisions.insert(h.machine_id, revision);
            }
            return Ok(());
        }
        // The guard failed: the reads say whether the holder keys are still
        // ours and whether each fence holds what this write meant to put.
        let found: Vec<Option<etcd_client::KeyValue>> = resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                _ => None,
            })
            .collect();
        let mut revisions = Vec::with_capacity(claim.held.len());
        for (i, (h, f)) in claim.held.iter().zip(fences).enumerate() {
            let holder_ours = found
                .get(2 * i)
                .and_then(Option::as_ref)
                .is_some_and(|kv| kv.lease() == lease_id);
            if !holder_ours {
                return Err(LeaseError::LeaseLost {
                    reason: LossReason::HolderChanged,
                });
            }
            match found.get(2 * i + 1).and_then(Option::as_ref) {
                Some(kv) if kv.value() == f.get().to_string().as_bytes() => {
                    revisions.push((h.machine_id, kv.mod_revision()));
                }
                other => {
                    let now = other.map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
                    warn!(namespace = %ns, machine_id = h.machine_id.get(), fence_now = ?now, fence_written_ms = h.fence.get(), "a fence key changed under its holder, not by it; stopping issuance and claiming again");
                    return Err(LeaseError::LeaseLost {
                        reason: LossReason::HolderChanged,
                    });
                }
            }
        }
        // An earlier attempt of this very write committed; its answer was lost.
        self.fence_revisions.extend(revisions);
        Ok(())
    }

    /// Compares that hold while every holder key of `claim` is bound to its lease.
    fn ownership(&self, claim: &Claim) -> Vec<Compare> {
        let lease_id = claim.lease.id;
        claim
            .held
            .iter()
            .map(|h| {
                Compare::lease(
                    keys::holder(self.ns(), h.machine_id),
                    CompareOp::Equal,
                    lease_id,
                )
            })
            .collect()
    }

    /// Sends one keepalive and waits for its answer, under the request
    /// timeout. Returns the new local deadline: the send time + TTL. A
    /// keepalive stream that fails, ends or stays silent is reopened at once
    /// on the next endpoint, failing over like any request; opening a stream
    /// sends a keepalive too, and its answer says whether the lease still
    /// exists. Errors with [`LeaseError::LeaseLost`] (`Expired`) when etcd
    /// says the lease is gone, and with a retryable error when no endpoint
    /// answers.
    pub async fn renew(&mut self, claim: &Claim) -> Result<Instant, LeaseError> {
        let lease_id = claim.lease.id;
        let timeout = self.settings.request_timeout;
        // The earliest send time of this renewal: the deadline counts from it
        // even when the answer comes from a stream reopened later.
        let sent = self.clock.now();
        if let Some((keeper, stream)) = self.keeper.as_mut() {
            let round_trip = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            let why = match tokio::time::timeout(timeout, round_trip).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    let ttl = Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(0));
                    return Ok(sent + ttl.min(self.settings.lease_ttl));
                }
                Ok(Ok(Some(_))) => {
                    self.keeper = None;
                    return Err(LeaseError::LeaseLost {
                        reason: LossReason::Expired,
                    });
                }
                Ok(Ok(None)) => "the stream ended".to_owned(),
                Ok(Err(e)) => crate::DisplayChain(&e).to_string(),
                Err(_) => format!("no answer within {timeout:?}"),
            };
            warn!(endpoint = self.endpoints.url_at(self.keeper_position), error = %why, "keepalive stream failed; reopening it on the next endpoint");
            self.keeper = None;
            self.endpoints.failed_at(self.keeper_position);
        }
        let opened = self
            .endpoints
            .call_at("keepalive", timeout, |mut c| async move {
                c.lease_keep_alive(lease_id).await
            })
            .await;
        match opened {
            Ok((pair, position)) => {
                self.keeper = Some(pair);
                self.keeper_position = position;
                Ok(sent + self.settings.lease_ttl)
            }
            Err(e) if lease_not_found(&e) => Err(LeaseError::LeaseLost {
                reason: LossReason::Expired,
            }),
            Err(e) => Err(e),
        }
    }

    /// Watches the namespace's holder keys from just after the claim: the
    /// returned task ends with `HolderChanged` when one of the claim's keys is
    /// deleted or rewritten for another holder or lease (an operator's
    /// `etcdctl del`, an expiry seen by etcd). Aborted when dropped.
    pub fn watch_holders(
        &self,
        claim: &Claim,
    ) -> AbortOnDropHandle<Result<LossReason, LeaseError>> {
        let prefix = keys::holder_prefix(self.ns());
        let ours: Vec<MachineId> = claim.held.iter().map(|h| h.machine_id).collect();
        let instance_id = self.settings.instance_id.clone();
        let instance_id_for_log = instance_id.clone();
        let lease_id = claim.lease.id;
        let endpoints = self.endpoints.clone();
        let timeout = self.settings.request_timeout;
        let mut next_revision = claim.lease.revision + 1;
        let is_ours = move |kv: &etcd_client::KeyValue| {
            kv.value() == instance_id.as_bytes() && kv.lease() == lease_id
        };
        AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                let opts = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(next_revision);
                let opened = endpoints
                    .call_at("watch holders", timeout, |mut c| {
                        let (key, opts) = (prefix.clone(), opts.clone());
                        async move { c.watch(key, Some(opts)).await }
                    })
                    .await;
                let (mut stream, position) = match opened {
                    Ok(opened) => opened,
                    Err(e) => {
                        debug!(error = %crate::DisplayChain(&e), "holder watch failed to open on every endpoint; retrying");
                        tokio::time::sleep(WATCH_RETRY).await;
                        continue;
                    }
                };
                // A hung member leaves the stream silent, not failed: after a
                // request timeout without a message, ask for a progress
                // report, which a live member answers at once; no answer
                // within another request timeout counts as a failed endpoint.
                let mut probing = false;
                loop {
                    let message = match tokio::time::timeout(timeout, stream.message()).await {
                        Ok(message) => message,
                        Err(_) if !probing => {
                            probing = true;
                            match stream.request_progress().await {
                                Ok(()) => continue,
                                Err(e) => Err(e),
                            }
                        }
                        Err(_) => {
                            warn!(endpoint = endpoints.url_at(position), silent_for = ?(timeout * 2), "holder watch got no answer; reopening it on the next endpoint");
                            endpoints.failed_at(position);
                            break;
                        }
                    };
                    probing = false;
                    match message {
                        Ok(Some(resp)) if resp.canceled() => {
                            // Compacted past our revision: read the keys instead.
                            let now = endpoints
                                .call("read holders", timeout, |mut c| {
                                    let key = prefix.clone();
                                    async move {
                                        c.get(key, Some(GetOptions::new().with_prefix())).await
                                    }
                                })
                                .await;
                            match now {
                                Ok(get) => {
                                    let intact = ours.iter().all(|id| {
                                        get.kvs().iter().any(|kv| {
                                            keys::machine_id_of(kv.key(), &prefix) == Some(*id)
                                                && is_ours(kv)
                                        })
                                    });
                                    if !intact {
                                        return Ok(LossReason::HolderChanged);
                                    }
                                    next_revision =
                                        get.header().map(|h| h.revision() + 1).unwrap_or(0);
                                }
                                Err(_) => tokio::time::sleep(WATCH_RETRY).await,
                            }
                            break;
                        }
                        Ok(Some(resp)) => {
                            for event in resp.events() {
                                let Some(kv) = event.kv() else { continue };
                                next_revision = next_revision.max(kv.mod_revision() + 1);
                                let Some(id) = keys::machine_id_of(kv.key(), &prefix) else {
                                    continue;
                                };
                                if !ours.contains(&id) {
                                    continue;
                                }
                                if event.event_type() == EventType::Put
                                    && kv.value() == instance_id_for_log.as_bytes()
                                    && kv.lease() != lease_id
                                {
                                    // Our instance id, another lease: a second live
                                    // process with our --instance-id. Stop rather
                                    // than take it back and forth forever.
                                    return Err(LeaseError::DuplicateInstance {
                                        instance_id: instance_id_for_log,
                                        machine_id: id,
                                    });
                                }
                                if event.event_type() != EventType::Put || !is_ours(kv) {
                                    return Ok(LossReason::HolderChanged);
                                }
                            }
                        }
                        Ok(None) | Err(_) => {
                            debug!(
                                endpoint = endpoints.url_at(position),
                                "holder watch stream failed; reopening it on the next endpoint"
                            );
                            endpoints.failed_at(position);
                            tokio::time::sleep(WATCH_RETRY).await;
                            break;
                        }
                    }
                }
            }
        }))
    }

    /// Lowers each fence to its last used timestamp (`last_used[i]` for
    /// `claim.held[i]`), records this instance as each id's last holder and
    /// deletes the holder keys, all in one transaction guarded by our lease,
    /// so a rolling restart waits for nothing; then revokes the lease. Both
    /// fail over like any request; a retried release transaction that finds
    /// its own earlier attempt committed counts as done.
    pub async fn release(&mut self, claim: &Claim, last_used: &[Millis]) -> Result<(), LeaseError> {
        let timeout = self.settings.request_timeout;
        let lease_id = claim.lease.id;
        self.keeper = None;
        let ns = self.ns().to_owned();
        let instance_id = self.settings.instance_id.clone();
        let mut ops = Vec::with_capacity(claim.held.len() * 3);
        let mut reads = Vec::with_capacity(claim.held.len() * 3);
        for (h, last) in claim.held.iter().zip(last_used) {
            ops.push(TxnOp::put(
                keys::fence(&ns, h.machine_id),
                last.get().to_string(),
                None,
            ));
            ops.push(TxnOp::put(
                keys::last_holder(&ns, h.machine_id),
                instance_id.clone(),
                None,
            ));
            ops.push(TxnOp::delete(keys::holder(&ns, h.machine_id), None));
            reads.push(TxnOp::get(keys::fence(&ns, h.machine_id), None));
            reads.push(TxnOp::get(keys::last_holder(&ns, h.machine_id), None));
            reads.push(TxnOp::get(keys::holder(&ns, h.machine_id), None));
        }
        let txn = Txn::new()
            .when(self.ownership(claim))
            .and_then(ops)
            .or_else(reads);
        let resp = self.txn("release txn", txn).await?;
        if !resp.succeeded() {
            let found: Vec<Option<etcd_client::KeyValue>> = resp
                .op_responses()
                .into_iter()
                .map(|r| match r {
                    TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                    _ => None,
                })
                .collect();
            let released_before = last_used.iter().enumerate().all(|(i, last)| {
                let value = |j: usize| {
                    found
                        .get(3 * i + j)
                        .and_then(Option::as_ref)
                        .map(|kv| kv.value())
                };
                value(0) == Some(last.get().to_string().as_bytes())
                    && value(1) == Some(instance_id.as_bytes())
                    && value(2).is_none()
            });
            if !released_before {
                warn!(machine_ids = ?claim.machine_ids(), "holder keys no longer all ours at release; fences left as they are");
            }
        }
        self.endpoints.revoke(timeout, lease_id).await?;
        info!(namespace = %self.ns(), machine_ids = ?claim.machine_ids(), fences_ms = ?last_used, "released machine ids");
        Ok(())
    }

    /// Counts the machine ids of this instance's range that have a holder.
    pub async fn capacity(&mut self) -> Result<Capacity, LeaseError> {
        self.capacity_reader().read().await
    }

    /// Revokes a lease that is no longer used, best effort.
    pub async fn forget(&mut self, claim: &Claim) {
        self.keeper = None;
        let lease_id = claim.lease.id;
        let timeout = self.settings.request_timeout;
        if let Err(e) = self.endpoints.revoke(timeout, lease_id).await {
            debug!(lease_id, error = %e, "could not revoke the lost lease; it expires by itself");
        }
    }

    /// Registers this server as a peer of the namespace (its advertised
    /// address) under `lease_id`, so the key goes when the lease does. Best
    /// effort: the peer clock check is telemetry, never a reason to refuse.
    async fn register_peer(&mut self, lease_id: i64) {
        let Some(address) = self.settings.advertise_address.clone() else {
            return;
        };
        let key = keys::peer(self.ns(), &self.settings.instance_id);
        let put = self
            .endpoints
            .call("register peer", self.settings.request_timeout, |mut c| {
                let (key, address) = (key.clone(), address.clone());
                async move {
                    c.put(key, address, Some(PutOptions::new().with_lease(lease_id)))
                        .await
                }
            })
            .await;
        if let Err(e) = put {
            warn!(namespace = %self.ns(), error = %crate::DisplayChain(&e), "could not register for the peer clock check");
        }
    }

    /// The namespace's peer directory, on its own copy of the endpoint clients.
    pub fn peer_directory(&self) -> PeerDirectory {
        PeerDirectory {
            endpoints: self.endpoints.clone(),
            namespace: self.settings.namespace.clone(),
            instance_id: self.settings.instance_id.clone(),
            timeout: self.settings.request_timeout,
        }
    }

    /// A reader of this store's namespace capacity that can live elsewhere
    /// (the InfoService handler), on its own copy of the endpoint clients.
    pub fn capacity_reader(&self) -> CapacityReader {
        CapacityReader {
            endpoints: self.endpoints.clone(),
            namespace: self.settings.namespace.clone(),
            range: self.settings.machine_id_range.clone(),
            timeout: self.settings.request_timeout,
        }
    }
}

/// Lists the other servers registered under a namespace's peer keys.
#[derive(Clone)]
pub struct PeerDirectory {
    endpoints: Endpoints,
    namespace: String,
    instance_id: String,
    timeout: Duration,
}

impl std::fmt::Debug for PeerDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerDirectory")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl PeerDirectory {
    /// `(instance id, host:port)` of every registered server but this one.
    pub async fn others(&mut self) -> Result<Vec<(String, String)>, LeaseError> {
        let prefix = keys::peer_prefix(&self.namespace);
        let resp = self
            .endpoints
            .call("list peers", self.timeout, |mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let instance = kv.key_str().ok()?.strip_prefix(&prefix)?.to_owned();
                let address = kv.value_str().ok()?.to_owned();
                (instance != self.instance_id).then_some((instance, address))
            })
            .collect())
    }
}

/// Counts the holders of a namespace range with one count-only range read.
#[derive(Clone)]
pub struct CapacityReader {
    endpoints: Endpoints,
    namespace: String,
    range: Range<u32>,
    timeout: Duration,
}

impl std::fmt::Debug for CapacityReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacityReader")
            .field("namespace", &self.namespace)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

impl CapacityReader {
    /// The range `[start, end)` counted.
    pub fn range(&self) -> Range<u32> {
        self.range.clone()
    }

    /// Counts the machine ids of the range that have a holder.
    pub async fn read(&mut self) -> Result<Capacity, LeaseError> {
        let start = keys::holder(
            &self.namespace,
            MachineId(u16::try_from(self.range.start).unwrap_or(u16::MAX)),
        );
        // The end key is exclusive; five-digit padding keeps numeric order.
        let end = format!(
            "{}{:05}",
            keys::holder_prefix(&self.namespace),
            self.range.end
        );
        let resp = self
            .endpoints
            .call("count holders", self.timeout, |mut c| {
                let (start, end) = (start.clone(), end.clone());
                async move {
                    c.get(
                        start,
                        Some(GetOptions::new().with_range(end).with_count_only()),
                    )
                    .await
                }
            })
            .await?;
        let total = self.range.end - self.range.start;
        let held = u32::try_from(resp.count()).unwrap_or(u32::MAX).min(total);
        Ok(Capacity { total, held })
    }
}

impl CapacitySource for CapacityReader {
    async fn read(&mut self) -> Result<Capacity, LeaseError> {
        CapacityReader::read(self).await
    }
}

impl LeaseStore for EtcdStore {
    type Lease = EtcdLease;

    async fn claim(&mut self) -> Result<Claim, LeaseError> {
        EtcdStore::claim(self).await
    }

    async fn advance_fences(&mut self, claim: &Claim, fences: &[Millis]) -> Result<(), LeaseError> {
        EtcdStore::advance_fences(self, claim, fences).await
    }

    async fn renew(&mut self, claim: &Claim) -> Result<Instant, LeaseError> {
        EtcdStore::renew(self, claim).await
    }

    async fn release(&mut self, claim: &Claim, last_used: &[Millis]) -> Result<(), LeaseError> {
        EtcdStore::release(self, claim, last_used).await
    }

    /// Revokes the claim's lease: etcd deletes the holder keys with it and
    /// leaves the fences.
    async fn abandon(&mut self, claim: &Claim) {
        self.forget(claim).await
    }

    fn watch_holders(&self, claim: &Claim) -> HolderWatch {
        let task = EtcdStore::watch_holders(self, claim);
        // The watch task panicked: assume the worst.
        Box::pin(async move { task.await.unwrap_or(Ok(LossReason::HolderChanged)) })
    }

    /// The namespace record and the rollback rule, as before a claim.
    async fn check_namespace(&mut self) -> Result<(), LeaseError> {
        self.guard_namespace().await.map(|_| ())
    }

    fn may_claim_others(&self) -> bool {
        true
    }
}
