//! What the administration service (the server's `admin::state`) reads and writes
//! in etcd: the inventory of namespaces, machine ids and Lease API
//! requesters, eviction, and the export and import of snowkeep's state.
//! Every value is decoded with the codecs of [`super::keys`],
//! `super::namespace` and `super::fence_count`, never by hand.
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

mod document;
mod evict;
mod export;
mod import;
mod import_checks;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{Layout, Millis, SharedClock};

use super::endpoints::Endpoints;
use super::keys;
use super::namespace::{self, NamespaceRecord};
use super::EtcdStore;
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
    /// This deployment's `--machine-id-range`; `None` when it is the whole
    /// of the server's own layout (the default), which for another
    /// namespace means the whole of that namespace's layout.
    range: Option<Range<u32>>,
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
            range: Some(self.settings.machine_id_range.clone())
                .filter(|r| *r != (0..self.layout.machine_id_count())),
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
        self.clock.layout_ms(layout)
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

    /// This deployment's range cut to the machine ids of `layout`: all of
    /// them when the server claims its whole own layout (a namespace of 64
    /// machine ids answering for one of 4,096 must not cut it to 64).
    fn range_in(&self, layout: &Layout) -> Range<u32> {
        let count = layout.machine_id_count();
        match &self.range {
            None => 0..count,
            Some(r) => r.start.min(count)..r.end.min(count),
        }
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
}

pub use document::{
    BlockExport, FenceExport, ImportError, Imported, LastHolderExport, NamespaceExport, RawKey,
    StateDocument,
};

#[cfg(test)]
mod tests;
