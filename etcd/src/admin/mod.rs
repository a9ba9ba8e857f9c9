//! What the administration service (the server's `admin::state`) reads and writes
//! in etcd: the inventory of namespaces, machine ids and Lease API
//! requesters, eviction, and the export and import of snowkeep's state.
//! Every value is decoded with the codecs of [`super::keys`],
//! [`super::namespace`] and [`super::fence_count`], never by hand.
//!
//! **Eviction** revokes the etcd lease a holder key is bound to. etcd deletes
//! every key of that lease (all the holder's machine ids; a requester's
//! record, token and description too) and leaves the fences. A server holder
//! sees its holder keys go through its watch and stops issuing at once; one
//! cut off from etcd stamps on at most up to the fence it persisted, and can
//! no longer raise it (fence writes are guarded by the holder key). Every
//! later holder reads that fence inside its claim transaction and stamps
//! above it, so no two holders share a timestamp: the successor waits until
//! its clock passes the fence.
//!
//! **Export** reads everything under `/snowkeep/v1/` at one revision, in
//! pages as the claims' pool read does, so no etcd answer outgrows the etcd
//! client's 4 MiB.
//! **Import** writes each fence as the higher of the exported one and the
//! importing server's clock plus the lead (the farthest a holder may stamp
//! ahead of its clock after the export: 1.5 outage budgets for servers, or
//! more when asked), gives every fence key it creates a creation marker so
//! the fence counts still vouch, raises the counts' `absent_floor_ms` to the
//! same floor (machine ids without a fence key), and writes each namespace
//! record last, with a new incarnation and the target etcd's own revision gap
//! acknowledged, so the servers accept it as not rolled back.

mod import_checks;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use snowkeep_client::{Layout, MachineId, Millis, SharedClock};

use super::endpoints::Endpoints;
use super::fence_count::{CountBase, Counter};
use super::keys::{self, FenceCountKey};
use super::namespace::{self, NamespaceRecord};
use super::EtcdStore;
use snowkeep_core::api_key::KeyRecord;
use snowkeep_core::claim::{Capacity, StoreError};
use snowkeep_core::lease::records::RequesterAbout;

/// The `format` field of an export document.
pub const DOCUMENT_FORMAT: &str = "snowkeep-state";
/// The export document version this server writes and reads.
pub const DOCUMENT_VERSION: u32 = 1;

/// Puts per import transaction (etcd's `--max-txn-ops` is 128 by default;
/// a fence and its marker are two).
const IMPORT_BATCH: usize = 50;
/// How often the import re-reads a key that changed under it before it
/// gives up with ABORTED (only with `replace`, where holders are live).
const IMPORT_ATTEMPTS: u32 = 16;

/// The administration service's access to etcd, on its own copy of the
/// endpoint clients.
#[derive(Clone)]
pub struct StateStore {
    endpoints: Endpoints,
    clock: SharedClock,
    timeout: Duration,
    range: Range<u32>,
    fence_lead: Duration,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore").finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// The administration service's access to this store's etcd.
    pub fn state_store(&self) -> StateStore {
        StateStore {
            endpoints: self.endpoints.clone(),
            clock: self.clock.clone(),
            timeout: self.settings.request_timeout,
            range: self.settings.machine_id_range.clone(),
            fence_lead: self.settings.fence_horizon,
        }
    }
}

/// One namespace as listed.
#[derive(Debug, Clone)]
pub struct NamespaceInfo {
    /// The name.
    pub name: String,
    /// The layout.
    pub layout: Layout,
    /// Held machine ids of the range.
    pub capacity: Capacity,
    /// This deployment's range cut to the layout.
    pub range: Range<u32>,
}

/// One machine id with a holder or a fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineIdRow {
    /// The machine id.
    pub machine_id: u16,
    /// The holder as shown: an instance id, or `requester:<tag>`; empty when free.
    pub holder: String,
    /// The fence, layout ms (0: none).
    pub fence: Millis,
    /// Fence minus the clock, ms.
    pub fence_ahead_ms: i64,
    /// Seconds left on the holder's lease (0: free).
    pub lease_remaining_s: i64,
    /// Seconds since the holder's lease was last renewed (0: free).
    pub lease_renewed_ago_s: i64,
}

/// One Lease API requester.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequesterRow {
    /// The first 12 hex digits of its id, as logs and audit events name it.
    pub tag: String,
    /// Its description, when one is stored.
    pub about: RequesterAbout,
    /// Machine ids it holds.
    pub machine_ids: Vec<u16>,
    /// Seconds left on its lease.
    pub lease_remaining_s: i64,
}

/// What an eviction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evicted {
    /// The holder as shown in [`MachineIdRow::holder`].
    pub holder: String,
    /// Every machine id of the revoked lease.
    pub machine_ids: Vec<u16>,
    /// The highest fence of those, minus the clock, ms (0 when behind).
    pub successor_wait_ms: u64,
}

/// How a holder key's value shows: a server's instance id as it is, an
/// embedded requester (`requester/<sha256>`) as `requester:<first 12 hex>`.
fn shown_holder(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    match text.strip_prefix("requester/") {
        Some(hash) => format!("requester:{}", hash.get(..12).unwrap_or(hash)),
        None => text.into_owned(),
    }
}

/// The API key `key` holds, without the prefix.
fn strip<'a>(key: &'a [u8], prefix: &str) -> Option<&'a str> {
    std::str::from_utf8(key.strip_prefix(prefix.as_bytes())?).ok()
}

fn ms_between(a: Millis, b: Millis) -> i64 {
    let a = i64::try_from(a.get()).unwrap_or(i64::MAX);
    let b = i64::try_from(b.get()).unwrap_or(i64::MAX);
    a.saturating_sub(b)
}

impl StateStore {
    fn now(&self, layout: &Layout) -> Millis {
        layout
            .to_layout_ms(self.clock.unix_ms())
            .unwrap_or_default()
    }

    async fn get_prefix(
        &self,
        op: &'static str,
        prefix: String,
        keys_only: bool,
    ) -> Result<Vec<KeyValue>, StoreError> {
        let resp = self
            .endpoints
            .call(op, self.timeout, |mut c| {
                let prefix = prefix.clone();
                let mut options = GetOptions::new().with_prefix();
                if keys_only {
                    options = options.with_keys_only();
                }
                async move { c.get(prefix, Some(options)).await }
            })
            .await?;
        Ok(resp.kvs().to_vec())
    }

    /// Reads several prefixes in one transaction, so at one revision.
    async fn get_prefixes(
        &self,
        op: &'static str,
        prefixes: &[String],
    ) -> Result<Vec<Vec<KeyValue>>, StoreError> {
        let gets: Vec<TxnOp> = prefixes
            .iter()
            .map(|p| TxnOp::get(p.clone(), Some(GetOptions::new().with_prefix())))
            .collect();
        let resp = self
            .endpoints
            .txn(op, self.timeout, Txn::new().and_then(gets))
            .await?;
        Ok(resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().to_vec(),
                _ => Vec::new(),
            })
            .collect())
    }

    /// Seconds left on `lease` (0 when gone or unknown).
    async fn ttl(&self, lease: i64) -> Result<i64, StoreError> {
        Ok(self.lease_times(lease).await?.0)
    }

    /// Seconds left on `lease` and seconds since it was last renewed (its
    /// granted TTL minus what is left: a keepalive resets it); `(0, 0)` when
    /// gone or unknown.
    async fn lease_times(&self, lease: i64) -> Result<(i64, i64), StoreError> {
        if lease == 0 {
            return Ok((0, 0));
        }
        let resp = self
            .endpoints
            .call("lease ttl", self.timeout, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        let left = resp.ttl();
        if left <= 0 {
            return Ok((0, 0));
        }
        Ok((left, (resp.granted_ttl() - left).max(0)))
    }

    /// The namespace's record; [`StoreError::UnknownNamespace`] when absent.
    pub async fn record(&self, ns: &str) -> Result<NamespaceRecord, StoreError> {
        match namespace::read(&self.endpoints, self.timeout, ns).await? {
            Some((record, _)) => Ok(record),
            None => Err(StoreError::UnknownNamespace {
                namespace: ns.to_owned(),
            }),
        }
    }

    /// This deployment's range cut to the machine ids of `layout`.
    fn range_in(&self, layout: &Layout) -> Range<u32> {
        let count = layout.machine_id_count();
        self.range.start.min(count)..self.range.end.min(count)
    }

    /// The capacity of `ns`'s machine ids in this deployment's range.
    pub async fn capacity(
        &self,
        ns: &str,
        layout: &Layout,
    ) -> Result<(Capacity, Range<u32>), StoreError> {
        let range = self.range_in(layout);
        let mut reader = super::CapacityReader {
            endpoints: self.endpoints.clone(),
            namespace: ns.to_owned(),
            range: range.clone(),
            timeout: self.timeout,
        };
        Ok((reader.read().await?, range))
    }

    /// Every namespace with a record, by name.
    pub async fn namespaces(&self) -> Result<Vec<NamespaceInfo>, StoreError> {
        let root = keys::namespaces_root();
        let names: BTreeSet<String> = self
            .get_prefix("list namespaces", root.to_owned(), true)
            .await?
            .iter()
            .filter_map(|kv| {
                let rest = strip(kv.key(), root)?;
                let name = rest.strip_suffix("/layout")?;
                (!name.contains('/')).then(|| name.to_owned())
            })
            .collect();
        let mut out = Vec::new();
        for name in names {
            let record = match self.record(&name).await {
                Ok(r) => r,
                Err(StoreError::UnknownNamespace { .. }) => continue, // deleted meanwhile
                Err(e) => return Err(e),
            };
            let (capacity, range) = self.capacity(&name, &record.layout).await?;
            out.push(NamespaceInfo {
                name,
                layout: record.layout,
                capacity,
                range,
            });
        }
        Ok(out)
    }

    /// The machine ids of `ns` with a holder or a fence, ascending.
    pub async fn machine_ids(&self, ns: &str) -> Result<Vec<MachineIdRow>, StoreError> {
        let record = self.record(ns).await?;
        let (holder_prefix, fence_prefix) = (keys::holder_prefix(ns), keys::fence_prefix(ns));
        let read = self
            .get_prefixes(
                "list machine ids",
                &[holder_prefix.clone(), fence_prefix.clone()],
            )
            .await?;
        let mut rows: BTreeMap<u16, (String, i64, Millis)> = BTreeMap::new();
        for kv in &read[0] {
            if let Some(id) = keys::machine_id_of(kv.key(), &holder_prefix) {
                rows.entry(id.get()).or_default().0 = shown_holder(kv.value());
                rows.entry(id.get()).or_default().1 = kv.lease();
            }
        }
        for kv in &read[1] {
            if let Some(id) = keys::machine_id_of(kv.key(), &fence_prefix) {
                let key = keys::fence(ns, id);
                // An unreadable fence shows as 0; the claim path reports it.
                let fence = keys::decode_fence(&key, kv.value()).unwrap_or_default();
                rows.entry(id.get()).or_default().2 = fence;
            }
        }
        let now = self.now(&record.layout);
        let mut ttls: HashMap<i64, (i64, i64)> = HashMap::new();
        let mut out = Vec::with_capacity(rows.len());
        for (machine_id, (holder, lease, fence)) in rows {
            let (lease_remaining_s, lease_renewed_ago_s) = match ttls.get(&lease) {
                Some(&t) => t,
                None => {
                    let t = self.lease_times(lease).await?;
                    ttls.insert(lease, t);
                    t
                }
            };
            out.push(MachineIdRow {
                machine_id,
                holder,
                fence,
                fence_ahead_ms: if fence.get() == 0 {
                    0
                } else {
                    ms_between(fence, now)
                },
                lease_remaining_s,
                lease_renewed_ago_s,
            });
        }
        Ok(out)
    }

    /// The Lease API requesters of `ns` that hold machine ids.
    pub async fn requesters(&self, ns: &str) -> Result<Vec<RequesterRow>, StoreError> {
        self.record(ns).await?;
        let (record_prefix, about_prefix) = (keys::requester_prefix(ns), keys::about_prefix(ns));
        let read = self
            .get_prefixes(
                "list requesters",
                &[record_prefix.clone(), about_prefix.clone()],
            )
            .await?;
        let abouts: HashMap<&str, RequesterAbout> = read[1]
            .iter()
            .filter_map(|kv| {
                let hash = strip(kv.key(), &about_prefix)?;
                Some((hash, serde_json::from_slice(kv.value()).ok()?))
            })
            .collect();
        let mut out = Vec::new();
        for kv in &read[0] {
            let Some(hash) = strip(kv.key(), &record_prefix) else {
                continue;
            };
            let key = keys::requester(ns, hash);
            let machine_ids = keys::decode_record(&key, kv.value())
                .map(|ids| ids.into_iter().map(|(id, _)| id.get()).collect())
                .unwrap_or_default();
            out.push(RequesterRow {
                tag: hash.get(..12).unwrap_or(hash).to_owned(),
                about: abouts.get(hash).cloned().unwrap_or_default(),
                machine_ids,
                lease_remaining_s: self.ttl(kv.lease()).await?,
            });
        }
        Ok(out)
    }

    /// Takes `machine_id` of `ns` from its holder by revoking the holder's
    /// lease; `Ok(None)` when nobody holds it (or the namespace has no
    /// record: [`StoreError::UnknownNamespace`]).
    pub async fn evict(&self, ns: &str, machine_id: u16) -> Result<Option<Evicted>, StoreError> {
        let record = self.record(ns).await?;
        let holder_prefix = keys::holder_prefix(ns);
        let fence_prefix = keys::fence_prefix(ns);
        let read = self
            .get_prefixes(
                "read holders",
                &[holder_prefix.clone(), fence_prefix.clone()],
            )
            .await?;
        let Some(held) = read[0].iter().find(|kv| {
            keys::machine_id_of(kv.key(), &holder_prefix) == Some(MachineId(machine_id))
        }) else {
            return Ok(None);
        };
        let lease = held.lease();
        let holder = shown_holder(held.value());
        let machine_ids: Vec<u16> = if lease == 0 {
            vec![machine_id]
        } else {
            read[0]
                .iter()
                .filter(|kv| kv.lease() == lease)
                .filter_map(|kv| keys::machine_id_of(kv.key(), &holder_prefix))
                .map(|id| id.get())
                .collect()
        };
        let highest = read[1]
            .iter()
            .filter_map(|kv| {
                let id = keys::machine_id_of(kv.key(), &fence_prefix)?;
                machine_ids.contains(&id.get()).then_some(())?;
                keys::decode_fence("", kv.value()).ok()
            })
            .max()
            .unwrap_or_default();
        if lease == 0 {
            // A holder key without a lease (written by hand): delete it alone,
            // if it is still the one read.
            let key = keys::holder(ns, MachineId(machine_id));
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    held.mod_revision(),
                )])
                .and_then([TxnOp::delete(key, None)]);
            self.endpoints
                .txn("evict holder", self.timeout, txn)
                .await?;
        } else {
            self.endpoints.revoke(self.timeout, lease).await?;
        }
        let wait = ms_between(highest, self.now(&record.layout)).max(0);
        Ok(Some(Evicted {
            holder,
            machine_ids,
            successor_wait_ms: u64::try_from(wait).unwrap_or(0),
        }))
    }
}

/// snowkeep's state as one JSON document ([`StateStore::export`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateDocument {
    /// Always [`DOCUMENT_FORMAT`].
    pub format: String,
    /// [`DOCUMENT_VERSION`].
    pub version: u32,
    /// When it was exported, ms since the Unix epoch (the exporting server's clock).
    pub exported_unix_ms: u64,
    /// The same, RFC 3339.
    pub exported_at: String,
    /// Every namespace with a record, by name.
    pub namespaces: Vec<NamespaceExport>,
    /// Every key under `/snowkeep/v1/apikeys/`, values verbatim.
    pub api_keys: Vec<RawKey>,
}

/// One namespace of a [`StateDocument`]: what rebuilds it (holders and
/// leases are live state, not exported).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceExport {
    /// The namespace name.
    pub name: String,
    /// The namespace record as stored (see `super::namespace`).
    pub record: String,
    /// Its layout, `T/M/S@EPOCH` (for people; the record is authoritative).
    pub layout: String,
    /// Every fence key: machine id and fence (layout ms).
    pub fences: Vec<FenceExport>,
    /// The fence-count root's value (`None`: no root, a namespace of an older version).
    pub fence_count_root: Option<String>,
    /// Each fence-count block with an own key or creation markers.
    pub fence_count_blocks: Vec<BlockExport>,
    /// Last clean holder of each machine id that has one.
    pub last_holders: Vec<LastHolderExport>,
    /// Lease API requesters holding machine ids at the export (informational:
    /// their fences run their whole lease ahead).
    pub requesters: u32,
}

/// One fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceExport {
    /// The machine id.
    pub machine_id: u16,
    /// The fence, layout ms.
    pub fence_ms: u64,
}

/// One fence-count block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockExport {
    /// The block (machine ids `64 × block` to `64 × block + 63`).
    pub block: u16,
    /// Its own key's value, when it was re-based.
    pub value: Option<String>,
    /// Its creation markers.
    pub markers: u64,
}

/// The last clean holder of a machine id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LastHolderExport {
    /// The machine id.
    pub machine_id: u16,
    /// The instance id that released it last.
    pub instance_id: String,
}

/// A key and its value, verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    /// The full etcd key.
    pub key: String,
    /// Its value.
    pub value: String,
}

/// What an import wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Imported {
    /// Namespaces restored.
    pub namespaces: u32,
    /// Fence keys written (created or raised).
    pub fences: u32,
    /// API keys written.
    pub keys: u32,
    /// The lead used, ms.
    pub lead_ms: u64,
}

/// Why an import was refused before it wrote anything.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The document is not one this version reads.
    #[error("{0}")]
    Invalid(String),
    /// etcd already holds snowkeep state (and `replace` was not given), or
    /// a namespace's stored layout differs from the document's.
    #[error("{0}")]
    Conflict(String),
    /// Holders kept changing a key the import must raise (with `replace`):
    /// nothing is lowered, but not everything is raised yet; run it again.
    #[error("{0}")]
    Contended(String),
    /// etcd failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The document's key record `document` with what the stored one
/// `stored` tightens: revoked if either is, the earlier expiry (0 is never).
/// An unreadable stored value does not tighten anything.
fn tightened(document: &str, stored: &[u8]) -> String {
    let (Ok(mut record), Ok(stored)) = (
        serde_json::from_str::<KeyRecord>(document),
        serde_json::from_slice::<KeyRecord>(stored),
    ) else {
        return document.to_owned();
    };
    record.revoked |= stored.revoked;
    record.expires_unix_ms = match (record.expires_unix_ms, stored.expires_unix_ms) {
        (0, e) | (e, 0) => e,
        (a, b) => a.min(b),
    };
    serde_json::to_string(&record).unwrap_or_else(|_| document.to_owned())
}

/// True when two key records are the same key: the same id and secret hash.
fn same_secret(document: &str, stored: &[u8]) -> bool {
    match (
        serde_json::from_str::<KeyRecord>(document),
        serde_json::from_slice::<KeyRecord>(stored),
    ) {
        (Ok(a), Ok(b)) => a.id == b.id && a.secret_sha256 == b.secret_sha256,
        _ => false,
    }
}

/// [`ImportError::Invalid`] naming the first value `items` holds twice.
fn repeated<T: Ord + std::fmt::Debug>(
    what: &str,
    items: impl Iterator<Item = T>,
) -> Result<(), ImportError> {
    let mut seen = std::collections::BTreeSet::new();
    for item in items {
        if seen.contains(&item) {
            return Err(ImportError::Invalid(format!(
                "the document names {what} {item:?} twice: an export names each once; fix or re-export the document"
            )));
        }
        seen.insert(item);
    }
    Ok(())
}

impl StateDocument {
    /// Parses and checks a document: INVALID ([`ImportError::Invalid`]) with
    /// the parse error's line and column, an unknown format or version, a bad
    /// namespace name, record, fence (outside the layout, or above its last
    /// timestamp) or key (see [`import_checks`]), or anything named
    /// twice.
    pub fn parse(text: &str) -> Result<Self, ImportError> {
        let doc: StateDocument = serde_json::from_str(text).map_err(|e| {
            ImportError::Invalid(format!(
                "the document is not a snowkeep export: {e} (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        if doc.format != DOCUMENT_FORMAT || doc.version != DOCUMENT_VERSION {
            return Err(ImportError::Invalid(format!(
                "unknown document format {:?} version {}: this server reads {DOCUMENT_FORMAT:?} version {DOCUMENT_VERSION}",
                doc.format, doc.version
            )));
        }
        // Nothing may be named twice: two entries for one machine id (or
        // namespace, block, key) would leave which one wins to the order
        // of the document, and a lower fence winning could repeat ids.
        repeated("namespace", doc.namespaces.iter().map(|n| n.name.clone()))?;
        repeated("API key", doc.api_keys.iter().map(|k| k.key.clone()))?;
        for ns in &doc.namespaces {
            let within = |what: &str| format!("namespace {:?}: {what}", ns.name);
            repeated(
                &within("fence of machine id"),
                ns.fences.iter().map(|f| f.machine_id),
            )?;
            repeated(
                &within("fence-count block"),
                ns.fence_count_blocks.iter().map(|b| b.block),
            )?;
            repeated(
                &within("last holder of machine id"),
                ns.last_holders.iter().map(|l| l.machine_id),
            )?;
        }
        for ns in &doc.namespaces {
            if !snowkeep_core::namespace::is_valid_namespace(&ns.name) {
                return Err(ImportError::Invalid(format!(
                    "namespace {:?}: a namespace is {}",
                    ns.name,
                    snowkeep_core::namespace::NAMESPACE_RULE
                )));
            }
            let record = NamespaceRecord::parse(&keys::layout(&ns.name), ns.record.as_bytes())
                .map_err(|e| ImportError::Invalid(e.to_string()))?;
            if let Some(f) = ns
                .fences
                .iter()
                .find(|f| u32::from(f.machine_id) >= record.layout.machine_id_count())
            {
                return Err(ImportError::Invalid(format!(
                    "namespace {:?}: machine id {} is outside its layout {}",
                    ns.name, f.machine_id, record.layout
                )));
            }
            import_checks::check_fences(ns, &record.layout)?;
        }
        for k in &doc.api_keys {
            import_checks::check_api_key(k)?;
        }
        Ok(doc)
    }
}

impl StateStore {
    /// The state document: every namespace (record, fences, fence counts,
    /// last holders) and every API key, read at one revision.
    pub async fn export(&self) -> Result<StateDocument, StoreError> {
        let root = keys::namespaces_root();
        let prefixes = [root.to_owned(), keys::API_KEYS_ROOT.to_owned()];
        let read =
            super::pool_read::read_prefixes(&self.endpoints, self.timeout, &prefixes).await?;
        let mut by_ns: BTreeMap<String, Vec<&KeyValue>> = BTreeMap::new();
        for kv in &read[0] {
            if let Some(name) = strip(kv.key(), root).and_then(|r| r.split_once('/')) {
                by_ns.entry(name.0.to_owned()).or_default().push(kv);
            }
        }
        let mut namespaces = Vec::new();
        for (name, kvs) in by_ns {
            let layout_key = keys::layout(&name);
            let Some(record_kv) = kvs.iter().find(|kv| kv.key() == layout_key.as_bytes()) else {
                continue; // keys without a record: nothing a server would accept
            };
            let record = NamespaceRecord::parse(&layout_key, record_kv.value())?;
            let (fence_prefix, last_prefix, requester_prefix) = (
                keys::fence_prefix(&name),
                keys::last_holder_prefix(&name),
                keys::requester_prefix(&name),
            );
            let mut out = NamespaceExport {
                name: name.clone(),
                record: String::from_utf8_lossy(record_kv.value()).into_owned(),
                layout: record.layout.to_string(),
                fences: Vec::new(),
                fence_count_root: None,
                fence_count_blocks: Vec::new(),
                last_holders: Vec::new(),
                requesters: 0,
            };
            let mut blocks: BTreeMap<u16, BlockExport> = BTreeMap::new();
            for kv in kvs {
                if let Some(id) = keys::machine_id_of(kv.key(), &fence_prefix) {
                    let key = keys::fence(&name, id);
                    out.fences.push(FenceExport {
                        machine_id: id.get(),
                        fence_ms: keys::decode_fence(&key, kv.value())?.get(),
                    });
                } else if let Some(id) = keys::machine_id_of(kv.key(), &last_prefix) {
                    out.last_holders.push(LastHolderExport {
                        machine_id: id.get(),
                        instance_id: String::from_utf8_lossy(kv.value()).into_owned(),
                    });
                } else if kv.key().starts_with(requester_prefix.as_bytes()) {
                    out.requesters += 1;
                } else if let Some(k) = keys::fence_count_key(kv.key(), &name) {
                    let value = String::from_utf8_lossy(kv.value()).into_owned();
                    let entry = |b: u16, blocks: &mut BTreeMap<u16, BlockExport>| {
                        blocks.entry(b).or_insert(BlockExport {
                            block: b,
                            value: None,
                            markers: 0,
                        });
                    };
                    match k {
                        FenceCountKey::Root => out.fence_count_root = Some(value),
                        FenceCountKey::Block(b) => {
                            entry(b, &mut blocks);
                            if let Some(e) = blocks.get_mut(&b) {
                                e.value = Some(value);
                            }
                        }
                        FenceCountKey::Marker(b) => {
                            entry(b, &mut blocks);
                            if let Some(e) = blocks.get_mut(&b) {
                                e.markers += 1;
                            }
                        }
                    }
                }
            }
            out.fence_count_blocks = blocks.into_values().collect();
            namespaces.push(out);
        }
        let mut api_keys = Vec::new();
        for kv in &read[1] {
            let (Ok(key), Ok(value)) = (kv.key_str(), kv.value_str()) else {
                return Err(StoreError::Corrupt {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    value: keys::quoted(kv.value()),
                });
            };
            api_keys.push(RawKey {
                key: key.to_owned(),
                value: value.to_owned(),
            });
        }
        let unix_ms = self.clock.unix_ms();
        Ok(StateDocument {
            format: DOCUMENT_FORMAT.to_owned(),
            version: DOCUMENT_VERSION,
            exported_unix_ms: unix_ms,
            exported_at: snowkeep_core::text::rfc3339(unix_ms),
            namespaces,
            api_keys,
        })
    }

    /// Restores `doc`. Without `replace`, etcd must hold no namespace key
    /// and none of the document's API keys with another value
    /// ([`ImportError::Conflict`] otherwise). Each fence becomes the higher
    /// of the document's, the stored one (with `replace`) and the clock plus
    /// `lead` (at least this server's fence lead, 1.5 outage budgets: the
    /// farthest a server holder stamps ahead of its clock); see the module
    /// documentation.
    pub async fn import(
        &self,
        doc: &StateDocument,
        replace: bool,
        lead: Duration,
    ) -> Result<Imported, ImportError> {
        let lead = lead.max(self.fence_lead);
        if !replace {
            let held = self
                .get_prefix("check empty", keys::namespaces_root().to_owned(), true)
                .await?;
            if !held.is_empty() {
                return Err(ImportError::Conflict(format!(
                    "etcd already holds snowkeep state ({} keys under {}): import into an etcd without snowkeep state, or pass replace (--replace) to raise its fences to the document's",
                    held.len(),
                    keys::namespaces_root()
                )));
            }
            let stored = self
                .get_prefix("check api keys", keys::API_KEYS_ROOT.to_owned(), false)
                .await?;
            for k in &doc.api_keys {
                if let Some(kv) = stored.iter().find(|kv| kv.key() == k.key.as_bytes()) {
                    // The same key (id and secret), e.g. the bootstrap admin
                    // key the restoring servers wrote at start, is merged
                    // (only ever tightened); another key under the id is not.
                    if !same_secret(&k.value, kv.value()) {
                        return Err(ImportError::Conflict(format!(
                            "API key {} already exists in etcd with another secret: pass replace (--replace) to overwrite it",
                            k.key
                        )));
                    }
                }
            }
        }
        let lead_ms = u64::try_from(lead.as_millis()).unwrap_or(u64::MAX);
        // Every layout must agree, and hold the lead, before anything is written.
        for ns in &doc.namespaces {
            let record = NamespaceRecord::parse(&keys::layout(&ns.name), ns.record.as_bytes())
                .map_err(|e| ImportError::Invalid(e.to_string()))?;
            let now = self.now(&record.layout);
            import_checks::check_lead(&ns.name, &record.layout, now, lead_ms)?;
            if let Some((stored, _)) =
                namespace::read(&self.endpoints, self.timeout, &ns.name).await?
            {
                if stored.layout != record.layout {
                    return Err(ImportError::Conflict(format!(
                        "namespace {:?} is stored with layout {} but the document has {}: a namespace's layout never changes",
                        ns.name, stored.layout, record.layout
                    )));
                }
            }
        }
        let mut done = Imported {
            lead_ms,
            ..Imported::default()
        };
        for ns in &doc.namespaces {
            done.fences += self.import_namespace(ns, lead).await?;
            done.namespaces += 1;
        }
        for k in &doc.api_keys {
            self.import_key(k).await?;
            done.keys += 1;
        }
        Ok(done)
    }

    /// Writes one API key of a document. A stored key of the same id keeps
    /// what only tightens it: an import never un-revokes a key nor moves
    /// its expiry later (restoring an old backup must not revive a key
    /// revoked since), whatever else the document says of it.
    async fn import_key(&self, k: &RawKey) -> Result<(), ImportError> {
        for _attempt in 0..IMPORT_ATTEMPTS {
            let current = self
                .get_prefix("read api key", k.key.clone(), false)
                .await?;
            let (value, guard) = match current.first() {
                None => (
                    k.value.clone(),
                    Compare::version(k.key.clone(), CompareOp::Equal, 0),
                ),
                Some(kv) => (
                    tightened(&k.value, kv.value()),
                    Compare::mod_revision(k.key.clone(), CompareOp::Equal, kv.mod_revision()),
                ),
            };
            let txn = Txn::new()
                .when([guard])
                .and_then([TxnOp::put(k.key.clone(), value, None)]);
            if self
                .endpoints
                .txn("import api key", self.timeout, txn)
                .await?
                .succeeded()
            {
                return Ok(());
            }
        }
        Err(ImportError::Contended(format!(
            "API key {} kept changing under the import ({IMPORT_ATTEMPTS} attempts): run the import again",
            k.key
        )))
    }

    /// Restores one namespace (see [`StateStore::import`]); returns the
    /// fence keys written.
    async fn import_namespace(
        &self,
        ns: &NamespaceExport,
        lead: Duration,
    ) -> Result<u32, ImportError> {
        let name = &ns.name;
        let layout_key = keys::layout(name);
        let exported = NamespaceRecord::parse(&layout_key, ns.record.as_bytes())
            .map_err(|e| ImportError::Invalid(e.to_string()))?;
        let layout = exported.layout;
        let lead_ms = u64::try_from(lead.as_millis()).unwrap_or(u64::MAX);
        let floor = Millis(self.now(&layout).get().saturating_add(lead_ms));
        let wanted: BTreeMap<u16, Millis> = ns
            .fences
            .iter()
            .map(|f| (f.machine_id, Millis(f.fence_ms).max(floor)))
            .collect();
        let mut written = 0;
        // Fences, in batches, each guarded by the key as read, only raised;
        // a key created gets its creation marker.
        let wanted: Vec<(u16, Millis)> = wanted.into_iter().collect();
        let contended = |what: &str| {
            ImportError::Contended(format!(
                "namespace {name:?}: {what} kept changing under the import ({IMPORT_ATTEMPTS} attempts); nothing was lowered, but not everything is raised yet: run the import again"
            ))
        };
        for chunk in wanted.chunks(IMPORT_BATCH) {
            let mut raised = false;
            for _attempt in 0..IMPORT_ATTEMPTS {
                let gets: Vec<TxnOp> = chunk
                    .iter()
                    .map(|&(id, _)| TxnOp::get(keys::fence(name, MachineId(id)), None))
                    .collect();
                let resp = self
                    .endpoints
                    .txn("read fences", self.timeout, Txn::new().and_then(gets))
                    .await?;
                let current: Vec<Option<(Millis, i64)>> = resp
                    .op_responses()
                    .into_iter()
                    .zip(chunk)
                    .map(|(r, &(id, _))| match r {
                        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| {
                            let key = keys::fence(name, MachineId(id));
                            // An unreadable fence is overwritten with the floor.
                            let f = keys::decode_fence(&key, kv.value()).unwrap_or_default();
                            (f, kv.mod_revision())
                        }),
                        _ => None,
                    })
                    .collect();
                let (mut guard, mut ops) = (Vec::new(), Vec::new());
                for (&(id, want), cur) in chunk.iter().zip(&current) {
                    let key = keys::fence(name, MachineId(id));
                    match cur {
                        Some((have, _)) if *have >= want => {}
                        Some((_, rev)) => {
                            guard.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev));
                            ops.push(TxnOp::put(key, want.get().to_string(), None));
                        }
                        None => {
                            guard.push(Compare::version(key.clone(), CompareOp::Equal, 0));
                            ops.push(TxnOp::put(key, want.get().to_string(), None));
                            let block = keys::fence_count_block_of(MachineId(id));
                            ops.push(TxnOp::put(keys::fence_count_marker(name, block), "", None));
                        }
                    }
                }
                if ops.is_empty() {
                    raised = true;
                    break;
                }
                let n = guard.len();
                let resp = self
                    .endpoints
                    .txn(
                        "import fences",
                        self.timeout,
                        Txn::new().when(guard).and_then(ops),
                    )
                    .await?;
                if resp.succeeded() {
                    written += u32::try_from(n).unwrap_or(u32::MAX);
                    raised = true;
                    break;
                }
                // A holder raised one meanwhile (replace): read again.
            }
            if !raised {
                return Err(contended("a fence"));
            }
        }
        // The counts: the root (created when absent, with nothing else under
        // the namespace but what this import wrote) and every block key get
        // an absent floor of at least `floor`; blocks keep their base.
        let root_key = keys::fence_count_root(name);
        let mut counts: Vec<String> = vec![root_key.clone()];
        counts.extend(
            ns.fence_count_blocks
                .iter()
                .filter(|b| b.value.is_some())
                .map(|b| keys::fence_count_block(name, b.block)),
        );
        let stored = namespace::read(&self.endpoints, self.timeout, name).await?;
        for key in counts {
            let mut settled = false;
            for _attempt in 0..IMPORT_ATTEMPTS {
                let resp = self
                    .endpoints
                    .call("read fence count", self.timeout, |mut c| {
                        let key = key.clone();
                        async move { c.get(key, None).await }
                    })
                    .await?;
                let (current, rev) = match resp.kvs().first() {
                    Some(kv) => (Counter::decode(Some(kv.value())), kv.mod_revision()),
                    None => (Counter::Absent, 0),
                };
                let new = match (&current, stored.is_some()) {
                    (Counter::Read(c), _) => CountBase {
                        base: c.base,
                        absent_floor: c.absent_floor.max(floor),
                    },
                    // A namespace created here: every fence key it has got a
                    // marker above, so base 0 counts them all.
                    (Counter::Absent, false) => CountBase {
                        base: 0,
                        absent_floor: floor,
                    },
                    // An existing namespace without this count (or an
                    // unreadable one): it does not vouch; leave it so.
                    _ => {
                        settled = true;
                        break;
                    }
                };
                let guard = if rev == 0 {
                    Compare::version(key.clone(), CompareOp::Equal, 0)
                } else {
                    Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
                };
                let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                    key.clone(),
                    new.encode(),
                    None,
                )]);
                if self
                    .endpoints
                    .txn("import fence count", self.timeout, txn)
                    .await?
                    .succeeded()
                {
                    settled = true;
                    break;
                }
            }
            if !settled {
                return Err(contended("a fence count"));
            }
        }
        // Last holders (only into a namespace created here).
        if stored.is_none() {
            for chunk in ns.last_holders.chunks(IMPORT_BATCH) {
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|l| {
                        TxnOp::put(
                            keys::last_holder(name, MachineId(l.machine_id)),
                            l.instance_id.clone(),
                            None,
                        )
                    })
                    .collect();
                self.endpoints
                    .txn(
                        "import last holders",
                        self.timeout,
                        Txn::new().and_then(ops),
                    )
                    .await?;
            }
        }
        // The record, last: a server waiting for the namespace starts only
        // on the whole of it.
        for attempt in 1..=IMPORT_ATTEMPTS {
            let current = namespace::read(&self.endpoints, self.timeout, name).await?;
            let (record, guard) = match current {
                None => {
                    let gap = namespace::progress(&self.endpoints, self.timeout)
                        .await?
                        .gap();
                    // A new incarnation (grants of the old etcd are void) and
                    // this etcd's own gap, so it is not taken for restored.
                    let record = NamespaceRecord {
                        state: exported.state.clone(),
                        floor: exported.floor,
                        confirmed_at: exported.confirmed_at.clone(),
                        ..NamespaceRecord::new(layout, gap)
                    };
                    (
                        record,
                        Compare::version(layout_key.clone(), CompareOp::Equal, 0),
                    )
                }
                Some((stored, rev)) => {
                    if stored.floor >= exported.floor {
                        break;
                    }
                    let record = NamespaceRecord {
                        floor: exported.floor,
                        ..stored.with_incarnation()
                    };
                    (
                        record,
                        Compare::mod_revision(layout_key.clone(), CompareOp::Equal, rev),
                    )
                }
            };
            let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                layout_key.clone(),
                record.encode(),
                None,
            )]);
            if self
                .endpoints
                .txn("import namespace record", self.timeout, txn)
                .await?
                .succeeded()
            {
                break;
            }
            if attempt == IMPORT_ATTEMPTS {
                return Err(contended("the namespace record"));
            }
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(revoked: bool, expires_unix_ms: u64) -> String {
        format!(
            r#"{{"id":"k1","expires_unix_ms":{expires_unix_ms},"revoked":{revoked},"permissions":["ids"],"secret_sha256":"{}"}}"#,
            "ab".repeat(32)
        )
    }

    fn read(value: &str) -> (bool, u64) {
        let r: KeyRecord = serde_json::from_str(value).unwrap();
        (r.revoked, r.expires_unix_ms)
    }

    #[test]
    fn an_imported_key_is_never_loosened_by_the_document() {
        // Revoked since the export: stays revoked.
        assert_eq!(
            read(&tightened(&record(false, 0), record(true, 0).as_bytes())),
            (true, 0)
        );
        // Expired earlier since the export: keeps the earlier expiry.
        assert_eq!(
            read(&tightened(&record(false, 0), record(false, 5).as_bytes())),
            (false, 5)
        );
        assert_eq!(
            read(&tightened(&record(false, 9), record(false, 5).as_bytes())),
            (false, 5)
        );
        // The document tightens too.
        assert_eq!(
            read(&tightened(&record(true, 3), record(false, 5).as_bytes())),
            (true, 3)
        );
        // An unreadable stored value tightens nothing.
        assert_eq!(tightened(&record(false, 7), b"garbage"), record(false, 7));
    }

    #[test]
    fn a_document_naming_anything_twice_is_invalid() {
        assert!(repeated("x", [1, 2, 3].into_iter()).is_ok());
        let e = repeated("fence of machine id", [4u16, 5, 4].into_iter()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the document names fence of machine id 4 twice: an export names each once; fix or re-export the document"
        );
    }
}
