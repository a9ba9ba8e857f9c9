//! Reading a namespace's pool (holder, fence, last-holder and requester
//! record keys, in pages, at one revision) and claiming machine ids from it,
//! one guarded transaction per candidate. Shared by the server's own claims
//! and the Lease API's.

use std::ops::Range;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{MachineId, Millis};
use tracing::{debug, error};

use super::endpoints::{etcd_error, Endpoints};
use super::{keys, namespace};
use crate::claim::candidates::{rank_candidates, CandidateKind, PoolView};
use crate::claim::{HeldId, StoreError};
use crate::metrics as m;

/// Candidates tried per read of the pool before reading it again.
const CANDIDATES_PER_ROUND: usize = 8;
/// Pool reads per claim before giving up on this attempt (the caller retries).
const CLAIM_ROUNDS: usize = 16;

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
pub(super) async fn read_pool(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
) -> Result<PoolView, StoreError> {
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
) -> Result<Vec<etcd_client::KeyValue>, StoreError> {
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
) -> Result<PoolView, StoreError> {
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
        match keys::decode_fence(&key, kv.value()) {
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
        match keys::decode_record(&key, kv.value()) {
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
pub(super) struct ClaimRequest<'a> {
    pub(super) namespace: &'a str,
    pub(super) holder: &'a str,
    pub(super) range: Range<u32>,
    pub(super) count: usize,
    pub(super) lease_id: i64,
    pub(super) now: Millis,
    /// The floor of a machine id without a fence key. A missing key may be a
    /// deleted one (operator, restored snapshot) under a holder that is still
    /// stamping up to its fence, which is at most a horizon ahead of its clock:
    /// so `now + fence_horizon`, never 0: a new holder stamps only above the
    /// previous holder's fence.
    pub(super) absent_floor: Millis,
    /// Machine ids whose fence is above this are skipped (`now + max_fence_wait`).
    pub(super) max_floor: Millis,
    /// Free machine ids to try first, after the ones the holder still holds
    /// (a crashed predecessor's, under the same instance id).
    pub(super) prefer: &'a [MachineId],
}

impl ClaimRequest<'_> {
    /// `(absent_floor, max_floor)` for a claim at layout time `now`.
    pub(super) fn floors(
        now: Millis,
        fence_horizon: Duration,
        max_fence_wait: Duration,
    ) -> (Millis, Millis) {
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
pub(super) struct Claimed {
    /// The machine ids with their floors.
    pub(super) held: Vec<HeldId>,
    /// The highest revision a claim transaction committed at.
    pub(super) revision: i64,
    /// The fence key's mod revision as each claim read it (0: no key), in
    /// `held` order: the guard of the holder's first fence write.
    pub(super) fence_revisions: Vec<i64>,
}

/// Claims machine ids one atomic transaction per candidate; each floor is the
/// fence read *inside* the claiming transaction, or after it committed (a
/// fence read before the claim may be stale: the previous holder may still
/// have raised it just before its lease expired). Partial claims are left
/// bound to the lease: the caller revokes it on error.
pub(super) async fn claim_ids(
    endpoints: &Endpoints,
    timeout: Duration,
    want: ClaimRequest<'_>,
) -> Result<Claimed, StoreError> {
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
            return Err(StoreError::FenceTooFarAhead {
                machine_id,
                fence,
                ahead,
                max,
            });
        }
        if candidates.is_empty() {
            return Err(StoreError::NoFreeMachineId {
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
                        keys::decode_fence(&fence, kv.value())?.max(record.floor),
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
    Err(StoreError::Timeout {
        op: "claim (every candidate was taken concurrently)",
        after: timeout,
    })
}
