//! The only module that talks to etcd: connect, layout check, claim, fence,
//! keepalive, holder watch and release, each one etcd request (or transaction)
//! under a timeout, because a hung etcd must never hang the lease loop
//! (ECOSYSTEM-NOTES §5: a SIGSTOPped etcd leaves streams silent, not failed).
//!
//! Failover: etcd-client balances one channel over all endpoints and keeps
//! picking a dead one, so the store keeps **one client per endpoint** and moves
//! to the next endpoint after any failed request. The lease loop retries, so a
//! dead member costs one retry, not a lost lease.

mod instance;
pub mod keys;
pub mod namespace;
pub mod overlap;
pub mod requesters;

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

use crate::lease::claim::{rank_candidates, CandidateKind, PoolView};
use crate::lease::{Capacity, Claim, HeldId, LeaseError, LossReason};
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

/// Clients for each endpoint, rotating to the next after a failure. Clones
/// share the position, so a dead member learnt by one user (the lease loop,
/// a Lease API call) is skipped by all.
#[derive(Clone)]
struct Endpoints {
    clients: Vec<Client>,
    current: Arc<AtomicUsize>,
}

impl Endpoints {
    /// The position now (an index modulo the number of endpoints).
    fn position(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    fn client_at(&self, position: usize) -> Client {
        self.clients[position % self.clients.len()].clone()
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

    /// Runs one request on the current endpoint under `after`; on failure
    /// the next request goes to the next endpoint.
    async fn call<T, F, Fut>(
        &mut self,
        op: &'static str,
        after: Duration,
        f: F,
    ) -> Result<T, LeaseError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let position = self.position();
        let result = timed(op, after, f(self.client_at(position))).await;
        if result.is_err() {
            self.failed_at(position);
        }
        result
    }
    /// Runs one transaction under `after`, like [`Endpoints::call`].
    async fn txn(
        &mut self,
        op: &'static str,
        after: Duration,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, LeaseError> {
        self.call(op, after, |mut c| async move { c.txn(txn).await })
            .await
    }
}

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
    endpoints: &mut Endpoints,
    timeout: Duration,
    namespace: &str,
) -> Result<PoolView, LeaseError> {
    let mut attempt = 1;
    loop {
        match read_pool_at_one_revision(endpoints, timeout, namespace).await {
            Err(LeaseError::Etcd(etcd_client::Error::GRpcStatus(status)))
                if status.message().contains("compacted") && attempt < POOL_READ_ATTEMPTS =>
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
    endpoints: &mut Endpoints,
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
        let key = from.clone();
        let mut resp = endpoints
            .call("read pool", timeout, |mut c| async move {
                c.get(key, Some(options)).await
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
    endpoints: &mut Endpoints,
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
    /// so `now + fence_horizon`, never 0 (DESIGN §2.3).
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

/// Claims machine ids one atomic transaction per candidate; each floor is the
/// fence read *inside* the claiming transaction (DESIGN §2.3). Returns the ids
/// and the highest revision a claim committed at. Partial claims are left
/// bound to the lease: the caller revokes it on error.
async fn claim_ids(
    endpoints: &mut Endpoints,
    timeout: Duration,
    want: ClaimRequest<'_>,
) -> Result<(Vec<HeldId>, i64), LeaseError> {
    let ns = want.namespace;
    let mut held: Vec<HeldId> = Vec::with_capacity(want.count);
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
            let txn = Txn::new()
                .when([guard, record.compare()])
                .and_then([
                    TxnOp::put(
                        holder,
                        want.holder,
                        Some(PutOptions::new().with_lease(want.lease_id)),
                    ),
                    TxnOp::get(fence.clone(), None),
                ])
                .or_else([TxnOp::get(record.key.clone(), None)]);
            let resp = endpoints.txn("claim txn", timeout, txn).await?;
            if !resp.succeeded() && record.changed(&resp) {
                debug!(
                    round,
                    "the namespace record changed during the claim; reading it again"
                );
                continue 'rounds;
            }
            if !resp.succeeded() {
                debug!(
                    machine_id = candidate.machine_id.get(),
                    round, "claim lost a race, trying the next candidate"
                );
                continue;
            }
            let floor = match resp.op_responses().get(1) {
                Some(TxnOpResponse::Get(get)) => match get.kvs().first() {
                    Some(kv) => parse_fence(&fence, kv.value())?.max(record.floor),
                    None => absent_floor,
                },
                _ => absent_floor,
            };
            revision = revision.max(resp.header().map(|h| h.revision()).unwrap_or(0));
            held.push(HeldId {
                machine_id: candidate.machine_id,
                floor,
                fence: floor,
            });
            if held.len() == want.count {
                return Ok((held, revision));
            }
        }
    }
    Err(LeaseError::Timeout {
        op: "claim (every candidate was taken concurrently)",
        after: timeout,
    })
}

impl EtcdStore {
    /// Connects (lazily: etcd-client connects on first use) and opens the
    /// namespace as `settings.namespace_setup` says (create it, confirm a
    /// floor, or check it is usable): errors with
    /// [`LeaseError::NamespaceNotCreated`], [`LeaseError::LayoutMismatch`],
    /// [`LeaseError::CorruptNamespace`] or [`LeaseError::NamespaceRolledBack`].
    pub async fn connect(
        settings: EtcdSettings,
        layout: Layout,
        clock: SharedClock,
    ) -> Result<Self, LeaseError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(settings.request_timeout)
            .with_keep_alive(Duration::from_secs(2), settings.request_timeout);
        let mut clients = Vec::with_capacity(settings.endpoints.len());
        for endpoint in &settings.endpoints {
            clients.push(
                timed(
                    "connect",
                    settings.request_timeout,
                    Client::connect([endpoint], Some(options.clone())),
                )
                .await?,
            );
        }
        let mut store = Self {
            endpoints: Endpoints {
                clients,
                current: Arc::new(AtomicUsize::new(0)),
            },
            settings,
            clock,
            layout,
            keeper: None,
            keeper_position: 0,
            own_leases: Vec::new(),
        };
        store.open_namespace().await?;
        Ok(store)
    }

    fn ns(&self) -> &str {
        &self.settings.namespace
    }

    /// Runs one transaction under the request timeout on the current endpoint.
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
    /// read *inside* the claiming transaction (DESIGN §2.3).
    ///
    /// First settles holder keys that name this instance id under another
    /// process's lease (see the `instance` module): a crashed predecessor's
    /// machine id is claimed back once its lease ends, and
    /// [`LeaseError::DuplicateInstance`] stops this process when another live
    /// one holds it.
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
            Ok((held, revision)) => {
                let claim = Claim {
                    held,
                    lease_id: Some(lease_id),
                    deadline: Some(deadline),
                    revision,
                };
                info!(namespace = %self.ns(), machine_ids = ?claim.machine_ids(), lease_id, fence_ms = claim.max_floor().get(), "claimed machine ids");
                self.register_peer(lease_id).await;
                Ok(claim)
            }
            Err(e) => {
                // Revoking also deletes the holder keys claimed so far; best
                // effort, since an unused lease expires by itself anyway.
                let _ = self
                    .endpoints
                    .call("lease revoke", timeout, |mut c| async move {
                        c.lease_revoke(lease_id).await
                    })
                    .await;
                Err(e)
            }
        }
    }

    async fn claim_with_lease(
        &mut self,
        lease_id: i64,
        prefer: &[MachineId],
    ) -> Result<(Vec<HeldId>, i64), LeaseError> {
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
        let claimed = claim_ids(&mut self.endpoints, self.settings.request_timeout, want).await?;
        self.check_no_older_twin(lease_id).await?;
        Ok(claimed)
    }

    /// Raises the fence of every claimed machine id (`fences[i]` for
    /// `claim.held[i]`) in one transaction guarded by our lease still owning
    /// every holder key. [`LeaseError::LeaseLost`] with `HolderChanged` when
    /// one is not ours any more.
    pub async fn advance_fences(
        &mut self,
        claim: &Claim,
        fences: &[Millis],
    ) -> Result<(), LeaseError> {
        let ns = self.ns().to_owned();
        let txn = Txn::new().when(self.ownership(claim)).and_then(
            claim
                .held
                .iter()
                .zip(fences)
                .map(|(h, f)| TxnOp::put(keys::fence(&ns, h.machine_id), f.get().to_string(), None))
                .collect::<Vec<_>>(),
        );
        let resp = self.txn("fence txn", txn).await?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(LeaseError::LeaseLost {
                reason: LossReason::HolderChanged,
            })
        }
    }

    /// Compares that hold while every holder key of `claim` is bound to its lease.
    fn ownership(&self, claim: &Claim) -> Vec<Compare> {
        let lease_id = claim.lease_id.unwrap_or(0);
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

    /// Sends one keepalive and waits for its answer under the request timeout.
    /// Returns the new local deadline: send time + TTL.
    pub async fn renew(&mut self, claim: &Claim) -> Result<Instant, LeaseError> {
        let lease_id = claim.lease_id.unwrap_or(0);
        let timeout = self.settings.request_timeout;
        let sent = self.clock.now();
        let ttl = match self.keeper.as_mut() {
            None => {
                // Opening the stream sends the first keepalive and reads its answer.
                self.keeper_position = self.endpoints.position();
                let opened = self
                    .endpoints
                    .call("keepalive", timeout, |mut c| async move {
                        c.lease_keep_alive(lease_id).await
                    })
                    .await;
                match opened {
                    Ok(pair) => {
                        self.keeper = Some(pair);
                        self.settings.lease_ttl
                    }
                    Err(LeaseError::Etcd(etcd_client::Error::LeaseKeepAliveError(msg)))
                        if msg.contains("not found") =>
                    {
                        return Err(LeaseError::LeaseLost {
                            reason: LossReason::Expired,
                        })
                    }
                    Err(e) => return Err(e),
                }
            }
            Some((keeper, stream)) => {
                let round_trip = async {
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                let answer = tokio::time::timeout(timeout, round_trip).await;
                if !matches!(answer, Ok(Ok(Some(_)))) {
                    // Reopen on the next endpoint; the reopening answers whether
                    // the lease still exists.
                    self.keeper = None;
                    self.endpoints.failed_at(self.keeper_position);
                }
                match answer {
                    Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                        Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(0))
                    }
                    Ok(Ok(Some(_))) => {
                        self.keeper = None;
                        return Err(LeaseError::LeaseLost {
                            reason: LossReason::Expired,
                        });
                    }
                    Ok(Ok(None)) => {
                        // etcd ended the stream deliberately (a dead member
                        // shows up as a transport error instead, and is retried).
                        return Err(LeaseError::LeaseLost {
                            reason: LossReason::Revoked,
                        });
                    }
                    Ok(Err(e)) => return Err(e.into()),
                    Err(_) => {
                        return Err(LeaseError::Timeout {
                            op: "keepalive",
                            after: timeout,
                        })
                    }
                }
            }
        };
        Ok(sent + ttl.min(self.settings.lease_ttl))
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
        let lease_id = claim.lease_id.unwrap_or(0);
        let mut endpoints = self.endpoints.clone();
        let timeout = self.settings.request_timeout;
        let mut next_revision = claim.revision + 1;
        let is_ours = move |kv: &etcd_client::KeyValue| {
            kv.value() == instance_id.as_bytes() && kv.lease() == lease_id
        };
        AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                let opts = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(next_revision);
                let key = prefix.clone();
                let position = endpoints.position();
                let opened = endpoints
                    .call("watch holders", timeout, |mut c| async move {
                        c.watch(key, Some(opts)).await
                    })
                    .await;
                let mut stream = match opened {
                    Ok(s) => s,
                    Err(e) => {
                        debug!(error = %e, "holder watch failed to open; retrying");
                        tokio::time::sleep(WATCH_RETRY).await;
                        continue;
                    }
                };
                loop {
                    match stream.message().await {
                        Ok(Some(resp)) if resp.canceled() => {
                            // Compacted past our revision: read the keys instead.
                            let key = prefix.clone();
                            let now = endpoints
                                .call("read holders", timeout, |mut c| async move {
                                    c.get(key, Some(GetOptions::new().with_prefix())).await
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
    /// deletes the holder keys, all in one transaction guarded by our lease
    /// (DESIGN §2.4); then revokes the lease.
    pub async fn release(&mut self, claim: &Claim, last_used: &[Millis]) -> Result<(), LeaseError> {
        let timeout = self.settings.request_timeout;
        let lease_id = claim.lease_id.unwrap_or(0);
        self.keeper = None;
        let ns = self.ns().to_owned();
        let mut ops = Vec::with_capacity(claim.held.len() * 3);
        for (h, last) in claim.held.iter().zip(last_used) {
            ops.push(TxnOp::put(
                keys::fence(&ns, h.machine_id),
                last.get().to_string(),
                None,
            ));
            ops.push(TxnOp::put(
                keys::last_holder(&ns, h.machine_id),
                self.settings.instance_id.clone(),
                None,
            ));
            ops.push(TxnOp::delete(keys::holder(&ns, h.machine_id), None));
        }
        let txn = Txn::new().when(self.ownership(claim)).and_then(ops);
        let resp = self.txn("release txn", txn).await?;
        if !resp.succeeded() {
            warn!(machine_ids = ?claim.machine_ids(), "holder keys no longer all ours at release; fences left as they are");
        }
        self.endpoints
            .call("lease revoke", timeout, |mut c| async move {
                c.lease_revoke(lease_id).await
            })
            .await?;
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
        if let Some(lease_id) = claim.lease_id {
            let timeout = self.settings.request_timeout;
            if let Err(e) = self
                .endpoints
                .call("lease revoke", timeout, |mut c| async move {
                    c.lease_revoke(lease_id).await
                })
                .await
            {
                debug!(lease_id, error = %e, "could not revoke the lost lease; it expires by itself");
            }
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
            .call("count holders", self.timeout, |mut c| async move {
                c.get(
                    start,
                    Some(GetOptions::new().with_range(end).with_count_only()),
                )
                .await
            })
            .await?;
        let total = self.range.end - self.range.start;
        let held = u32::try_from(resp.count()).unwrap_or(u32::MAX).min(total);
        Ok(Capacity { total, held })
    }
}
