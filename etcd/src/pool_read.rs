//! Reading a namespace's pool for a claim: a **window** of a few fence-count
//! blocks (holder, fence, last-holder and fence-count keys of their machine
//! ids, with the namespace's fence-count root and every requester record),
//! or the whole pool. Both read at one revision, in bounded pages.
//!
//! A window holds whole blocks of 64 machine ids, so a block's count, its
//! fence keys and its held machine ids without a fence key are read exactly
//! as the whole read finds them, and the fence-count rule (docs/design.md,
//! *Fence protocol*) decides a missing fence key the same way. The requester
//! records are read whole: an embedded requester's machine ids are held
//! while its record lives, whichever block they are in.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use rand::Rng;
use snowkeep_client::MachineId;
use tracing::{debug, error};

use super::endpoints::{etcd_error, Endpoints};
use super::fence_count::{Block, Counter};
use super::keys::{self, FenceCountKey, FENCE_COUNT_BLOCK};
use snowkeep_core::claim::candidates::PoolView;
use snowkeep_core::claim::StoreError;
use snowkeep_core::metrics as m;

/// Keys per page of a pool read. A page of holder keys with long instance ids
/// stays far below etcd-client's 4 MiB response limit.
const POOL_PAGE_KEYS: i64 = 1024;
/// Keys of each range in the first, combined read of a pool: five ranges
/// of 512 keys (instance ids of up to 256 bytes, requester records of up to
/// 63 machine ids) stay far below the 4 MiB limit too.
const FIRST_PAGE_KEYS: i64 = 512;
/// Pool reads started over after etcd compacted the revision they read at.
const POOL_READ_ATTEMPTS: usize = 3;
/// Consecutive fence-count blocks of a window, from a random one on, for a
/// claim of one machine id: 128 machine ids. A claim of more reads more.
pub(super) const WINDOW_BLOCKS: usize = 2;

/// A namespace's pool as one read found it.
pub(super) struct Pool {
    /// The machine ids' keys.
    pub(super) view: PoolView,
    /// The namespace's fence-count root.
    pub(super) root: Counter,
    /// The fence-count blocks that have any key, marker, fence or holder,
    /// each with what the fence and holder keys of its machine ids showed.
    pub(super) blocks: BTreeMap<u16, Block>,
    /// The blocks read whole (`None`: every block, the whole pool): only
    /// their machine ids may be claimed from this read.
    pub(super) window: Option<BTreeSet<u16>>,
    /// The etcd lease of each holder key read (0: none), by machine id: a
    /// claim that finds its range full asks about these leases, and reads
    /// no holder key again to find them.
    pub(super) holder_leases: BTreeMap<MachineId, i64>,
    /// Keys the read returned: the read accounting of a claim.
    pub(super) keys_read: u64,
}

impl Pool {
    /// Whether this read saw every key of `machine_id`'s block.
    pub(super) fn covers(&self, machine_id: MachineId) -> bool {
        self.window
            .as_ref()
            .is_none_or(|w| w.contains(&keys::fence_count_block_of(machine_id)))
    }
}

/// The blocks of a window for a claim of `count` machine ids of `range`:
/// [`WINDOW_BLOCKS`] (more for a larger `count`: twice its machine ids)
/// consecutive blocks of the range from a random one on, wrapping around
/// the range's blocks, plus the blocks of `known` in the range (the machine
/// ids this holder holds or released last). `None` when that covers every
/// block of the range anyway, or the range is empty.
pub(super) fn window_blocks(
    range: &Range<u32>,
    count: usize,
    known: &[MachineId],
    rng: &mut impl Rng,
) -> Option<BTreeSet<u16>> {
    if range.is_empty() {
        return None;
    }
    let block_of = |id: u32| u16::try_from(id / u32::from(FENCE_COUNT_BLOCK)).ok();
    let first = block_of(range.start)?;
    let last = block_of(range.end - 1)?;
    let span = usize::from(last - first) + 1;
    let wanted = WINDOW_BLOCKS.max((2 * count).div_ceil(usize::from(FENCE_COUNT_BLOCK)));
    if wanted >= span {
        return None;
    }
    let start = rng.random_range(0..span);
    let mut blocks: BTreeSet<u16> = (0..wanted)
        .filter_map(|i| u16::try_from((start + i) % span).ok())
        .map(|i| first + i)
        .collect();
    blocks.extend(
        known
            .iter()
            .filter(|id| range.contains(&u32::from(id.get())))
            .map(|id| keys::fence_count_block_of(*id)),
    );
    Some(blocks)
}

/// Every block of `range` (`None` for an empty range): the read of a claim
/// that needs the whole pool. Only the range's machine ids can be claimed,
/// so the machine ids of other ranges (other servers', in a namespace
/// shared by ranges) are not read at all; whole blocks, so the fence-count
/// rule works on the same keys as for a window.
pub(super) fn range_blocks(range: &Range<u32>) -> Option<BTreeSet<u16>> {
    if range.is_empty() {
        return None;
    }
    let block_of = |id: u32| u16::try_from(id / u32::from(FENCE_COUNT_BLOCK)).ok();
    Some((block_of(range.start)?..=block_of(range.end - 1)?).collect())
}

/// Reads a namespace's pool: its holder, fence, last-holder, requester
/// record and fence-count keys, at one revision, all of them (`window`
/// `None`) or those of the window's blocks (with the root and every
/// requester record). Never the whole namespace prefix: other keys (peers,
/// tokens, keys of older versions) grow with what anyone sends, and one
/// response past etcd-client's 4 MiB limit would stop every claim. The first
/// page of every range comes in one read-only transaction (one round trip,
/// where sequential reads cost a claim storm a fifth of a second each), the
/// rest in pages of [`POOL_PAGE_KEYS`]; the requester records are bounded
/// too, since only requesters that hold machine ids have one.
pub(super) async fn read_pool(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    window: Option<BTreeSet<u16>>,
) -> Result<Pool, StoreError> {
    let mut attempt = 1;
    loop {
        let ranges = pool_ranges(namespace, window.as_ref());
        match read_ranges(endpoints, timeout, &ranges).await {
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
            Err(e) => return Err(e),
            Ok(read) => return Ok(build_pool(namespace, &ranges, read, window)),
        }
    }
}

/// What a range of a pool read holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Holders,
    Fences,
    Lasts,
    Requesters,
    Counts,
}

/// A key range `[start, end)` of a pool read.
struct KeyRange {
    kind: Kind,
    start: Vec<u8>,
    end: Vec<u8>,
}

/// The ranges of a pool read: whole prefixes, or the window's runs of
/// consecutive blocks (plus the root and the requester records).
fn pool_ranges(namespace: &str, window: Option<&BTreeSet<u16>>) -> Vec<KeyRange> {
    let prefix = |kind, p: String| KeyRange {
        kind,
        end: keys::prefix_end(&p),
        start: p.into_bytes(),
    };
    let requesters = prefix(Kind::Requesters, keys::requester_prefix(namespace));
    let Some(window) = window else {
        return vec![
            prefix(Kind::Holders, keys::holder_prefix(namespace)),
            prefix(Kind::Fences, keys::fence_prefix(namespace)),
            prefix(Kind::Lasts, keys::last_holder_prefix(namespace)),
            requesters,
            prefix(Kind::Counts, keys::fence_count_root(namespace)),
        ];
    };
    let root = keys::fence_count_root(namespace);
    let mut root_end = root.clone().into_bytes();
    root_end.push(0);
    let mut ranges = vec![
        requesters,
        KeyRange {
            kind: Kind::Counts,
            start: root.into_bytes(),
            end: root_end,
        },
    ];
    for run in runs(window) {
        let ids = u32::from(run.start) * u32::from(FENCE_COUNT_BLOCK)
            ..u32::from(run.end) * u32::from(FENCE_COUNT_BLOCK);
        let id_key = |kind, of: fn(&str) -> String| KeyRange {
            kind,
            start: format!("{}{:05}", of(namespace), ids.start).into_bytes(),
            end: format!("{}{:05}", of(namespace), ids.end).into_bytes(),
        };
        ranges.push(id_key(Kind::Holders, keys::holder_prefix));
        ranges.push(id_key(Kind::Fences, keys::fence_prefix));
        ranges.push(id_key(Kind::Lasts, keys::last_holder_prefix));
        ranges.push(KeyRange {
            kind: Kind::Counts,
            start: keys::fence_count_block(namespace, run.start).into_bytes(),
            end: keys::fence_count_block(namespace, run.end).into_bytes(),
        });
    }
    ranges
}

/// The runs of consecutive blocks of `blocks`, each as `[first, last + 1)`.
fn runs(blocks: &BTreeSet<u16>) -> Vec<Range<u16>> {
    let mut runs: Vec<Range<u16>> = Vec::new();
    for &b in blocks {
        match runs.last_mut() {
            Some(run) if run.end == b => run.end = b + 1,
            _ => runs.push(b..b + 1),
        }
    }
    runs
}

/// The key-values of `[from, end)` read in pages of [`POOL_PAGE_KEYS`] at
/// `revision`.
async fn read_range(
    endpoints: &Endpoints,
    timeout: Duration,
    mut from: Vec<u8>,
    end: &[u8],
    revision: i64,
) -> Result<Vec<KeyValue>, StoreError> {
    let mut kvs = Vec::new();
    loop {
        let options = GetOptions::new()
            .with_range(end.to_vec())
            .with_limit(POOL_PAGE_KEYS)
            .with_revision(revision);
        let mut resp = endpoints
            .call("read pool", timeout, |mut c| {
                let (key, options) = (from.clone(), options.clone());
                async move { c.get(key, Some(options)).await }
            })
            .await?;
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

/// The key-values of each of `ranges`, in order, all at one revision: the
/// first [`FIRST_PAGE_KEYS`] of each in one read-only transaction (one round
/// trip, which fixes the revision), the rest of a longer range in pages at
/// that revision.
async fn read_ranges(
    endpoints: &Endpoints,
    timeout: Duration,
    ranges: &[KeyRange],
) -> Result<Vec<Vec<KeyValue>>, StoreError> {
    let spans: Vec<(Vec<u8>, Vec<u8>)> = ranges
        .iter()
        .map(|r| (r.start.clone(), r.end.clone()))
        .collect();
    read_spans(endpoints, timeout, &spans).await
}

/// The key-values under each of `prefixes`, in order, all at one revision,
/// as [`read_ranges`] reads them: the state export's read.
pub(super) async fn read_prefixes(
    endpoints: &Endpoints,
    timeout: Duration,
    prefixes: &[String],
) -> Result<Vec<Vec<KeyValue>>, StoreError> {
    let spans: Vec<(Vec<u8>, Vec<u8>)> = prefixes
        .iter()
        .map(|p| (p.clone().into_bytes(), keys::prefix_end(p)))
        .collect();
    read_spans(endpoints, timeout, &spans).await
}

/// [`read_ranges`] of `[start, end)` spans.
async fn read_spans(
    endpoints: &Endpoints,
    timeout: Duration,
    spans: &[(Vec<u8>, Vec<u8>)],
) -> Result<Vec<Vec<KeyValue>>, StoreError> {
    let gets: Vec<TxnOp> = spans
        .iter()
        .map(|(start, end)| {
            let page = GetOptions::new()
                .with_range(end.clone())
                .with_limit(FIRST_PAGE_KEYS);
            TxnOp::get(start.clone(), Some(page))
        })
        .collect();
    let resp = endpoints
        .txn("read pool", timeout, Txn::new().and_then(gets))
        .await?;
    let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
    let mut read = Vec::with_capacity(spans.len());
    for ((_, end), op) in spans.iter().zip(resp.op_responses()) {
        let TxnOpResponse::Get(mut get) = op else {
            read.push(Vec::new());
            continue;
        };
        let more = get.more();
        let mut kvs = get.take_kvs();
        if let Some(last) = kvs.last().filter(|_| more) {
            let mut from = last.key().to_vec();
            from.push(0);
            kvs.extend(read_range(endpoints, timeout, from, end, revision).await?);
        }
        read.push(kvs);
    }
    Ok(read)
}

/// The pool of the key-values `read` of `ranges`.
fn build_pool(
    namespace: &str,
    ranges: &[KeyRange],
    read: Vec<Vec<KeyValue>>,
    window: Option<BTreeSet<u16>>,
) -> Pool {
    let mut by_kind: BTreeMap<u8, Vec<KeyValue>> = BTreeMap::new();
    let mut keys_read = 0;
    for (range, kvs) in ranges.iter().zip(read) {
        keys_read += kvs.len() as u64;
        by_kind.entry(range.kind as u8).or_default().extend(kvs);
    }
    let mut take = |kind: Kind| by_kind.remove(&(kind as u8)).unwrap_or_default();
    let mut view = PoolView::default();
    let holder_prefix = keys::holder_prefix(namespace);
    let mut holder_leases = BTreeMap::new();
    for kv in take(Kind::Holders) {
        if let Some(id) = keys::machine_id_of(kv.key(), &holder_prefix) {
            view.holders
                .insert(id, String::from_utf8_lossy(kv.value()).into_owned());
            holder_leases.insert(id, kv.lease());
        }
    }
    let present = read_fences(namespace, &mut view, take(Kind::Fences));
    let last_prefix = keys::last_holder_prefix(namespace);
    for kv in take(Kind::Lasts) {
        if let Some(id) = keys::machine_id_of(kv.key(), &last_prefix) {
            view.last_holders
                .insert(id, String::from_utf8_lossy(kv.value()).into_owned());
        }
    }
    read_requesters(namespace, &mut view, take(Kind::Requesters));
    let (root, mut blocks) = read_counts(namespace, take(Kind::Counts));
    for (block, n) in present {
        blocks.entry(block).or_default().present = n;
    }
    for id in view.holders.keys() {
        if !view.fences.contains_key(id) && !view.quarantined.contains(id) {
            blocks
                .entry(keys::fence_count_block_of(*id))
                .or_default()
                .held_without_fence += 1;
        }
    }
    Pool {
        view,
        root,
        blocks,
        window,
        holder_leases,
        keys_read,
    }
}

/// Puts the readable fences of `kvs` into `view` (quarantining the rest);
/// returns the fence keys per fence-count block, by key order, as the claim
/// transaction's range count finds them.
fn read_fences(namespace: &str, view: &mut PoolView, kvs: Vec<KeyValue>) -> BTreeMap<u16, u64> {
    let fence_prefix = keys::fence_prefix(namespace);
    let mut corrupt = 0;
    let mut present: BTreeMap<u16, u64> = BTreeMap::new();
    for kv in kvs {
        if let Some(block) = keys::fence_block_of_key(kv.key(), namespace) {
            *present.entry(block).or_default() += 1;
        }
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
    present
}

/// Marks the machine ids of the requester records `kvs` held in `view`.
fn read_requesters(namespace: &str, view: &mut PoolView, kvs: Vec<KeyValue>) {
    let requester_prefix = keys::requester_prefix(namespace);
    let mut corrupt = 0;
    for kv in kvs {
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
}

/// The fence-count root and blocks of the fence-count keys `kvs`.
fn read_counts(namespace: &str, kvs: Vec<KeyValue>) -> (Counter, BTreeMap<u16, Block>) {
    let mut root = Counter::Absent;
    let mut blocks: BTreeMap<u16, Block> = BTreeMap::new();
    let mut corrupt = 0;
    for kv in kvs {
        let mut counter = || {
            let counter = Counter::decode(Some(kv.value()));
            if let Counter::Unreadable(value) = &counter {
                corrupt += 1;
                let key = String::from_utf8_lossy(kv.key());
                error!(namespace, key = %key, value, "unreadable fence count: a claim of a machine id without a fence key in its block starts one fence lead ahead, and re-bases the block");
            }
            counter
        };
        match keys::fence_count_key(kv.key(), namespace) {
            Some(FenceCountKey::Root) => root = counter(),
            Some(FenceCountKey::Block(b)) => {
                let counter = counter();
                let block = blocks.entry(b).or_default();
                block.own = counter;
                block.own_revision = kv.mod_revision();
            }
            Some(FenceCountKey::Marker(b)) => blocks.entry(b).or_default().markers += 1,
            None => {}
        }
    }
    m::count_corrupt(namespace, m::KeyKind::FenceCount, corrupt);
    (root, blocks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn set(blocks: &[u16]) -> BTreeSet<u16> {
        blocks.iter().copied().collect()
    }

    #[test]
    fn a_window_is_two_blocks_of_the_range_plus_the_known_ids_blocks() {
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..200 {
            let w =
                window_blocks(&(0..4096), 1, &[MachineId(4095), MachineId(70)], &mut rng).unwrap();
            let random: Vec<u16> = w.iter().copied().filter(|b| ![63, 1].contains(b)).collect();
            assert!(w.contains(&63) && w.contains(&1), "{w:?}");
            assert!(random.len() <= 2, "{w:?}");
            // Two consecutive blocks, wrapping from 63 to 0.
            assert!(w.len() >= 2 && w.len() <= 4, "{w:?}");
        }
    }

    #[test]
    fn a_window_wraps_and_stays_inside_the_range() {
        // Range 100..300: blocks 1 to 4.
        let mut seen = BTreeSet::new();
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..200 {
            let w = window_blocks(&(100..300), 1, &[MachineId(4000)], &mut rng).unwrap();
            assert_eq!(w.len(), 2, "{w:?}");
            assert!(w.iter().all(|b| (1..=4).contains(b)), "{w:?}");
            seen.insert(w.into_iter().collect::<Vec<_>>());
        }
        assert_eq!(
            seen,
            [vec![1, 2], vec![2, 3], vec![3, 4], vec![1, 4]]
                .into_iter()
                .collect()
        );
    }

    #[test]
    fn a_range_no_wider_than_the_window_is_read_whole() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(window_blocks(&(0..128), 1, &[], &mut rng), None);
        assert_eq!(window_blocks(&(60..70), 1, &[], &mut rng), None);
        assert_eq!(window_blocks(&(5..5), 1, &[], &mut rng), None);
        // 63 machine ids want 126: still two blocks; 100 want four.
        assert_eq!(
            window_blocks(&(0..4096), 63, &[], &mut rng).unwrap().len(),
            2
        );
        assert_eq!(
            window_blocks(&(0..4096), 100, &[], &mut rng).unwrap().len(),
            4
        );
        assert_eq!(window_blocks(&(0..256), 100, &[], &mut rng), None);
    }

    #[test]
    fn the_whole_read_of_a_range_is_its_blocks_only() {
        assert_eq!(range_blocks(&(0..4096)), Some((0..64).collect()));
        assert_eq!(range_blocks(&(100..110)), Some(set(&[1])));
        assert_eq!(range_blocks(&(100..300)), Some(set(&[1, 2, 3, 4])));
        // The last id of a block, and the first of the next.
        assert_eq!(range_blocks(&(63..65)), Some(set(&[0, 1])));
        assert_eq!(range_blocks(&(5..5)), None);
    }

    #[test]
    fn runs_group_consecutive_blocks() {
        assert_eq!(runs(&set(&[1, 2, 3, 7, 9, 10])), vec![1..4, 7..8, 9..11]);
        assert_eq!(runs(&set(&[])), Vec::<Range<u16>>::new());
    }
}
