//! The import: API keys, then each namespace's fences, fence counts, last
//! holders and finally its record (see the module documentation of `admin`).

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{MachineId, Millis};

use super::super::fence_count::{CountBase, Counter};
use super::super::keys;
use super::super::namespace::{self, NamespaceRecord};
use super::import_checks;
use super::{
    ImportError, Imported, NamespaceExport, RawKey, StateDocument, StateStore, IMPORT_ATTEMPTS,
    IMPORT_BATCH,
};
use snowkeep_core::api_key::KeyRecord;

/// The document's key record `document` with what the stored one
/// `stored` tightens: revoked if either is, the earlier expiry (0 is never).
/// An unreadable stored value does not tighten anything.
pub(super) fn tightened(document: &str, stored: &[u8]) -> String {
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
pub(super) fn same_secret(document: &str, stored: &[u8]) -> bool {
    match (
        serde_json::from_str::<KeyRecord>(document),
        serde_json::from_slice::<KeyRecord>(stored),
    ) {
        (Ok(a), Ok(b)) => a.id == b.id && a.secret_sha256 == b.secret_sha256,
        _ => false,
    }
}

impl StateStore {
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
        let lead_ms = Millis::of(lead).get();
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
        let lead_ms = Millis::of(lead).get();
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
        for chunk in wanted.chunks(IMPORT_BATCH) {
            match self.import_fences(name, chunk).await? {
                Some(n) => written += n,
                None => return Err(contended(name, "a fence")),
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
            if !self.import_count(&key, stored.is_some(), floor).await? {
                return Err(contended(name, "a fence count"));
            }
        }
        // Last holders (only into a namespace created here).
        if stored.is_none() {
            self.import_last_holders(ns).await?;
        }
        // The record, last: a server waiting for the namespace starts only
        // on the whole of it.
        self.import_record(name, &exported).await?;
        Ok(written)
    }

    /// Raises the fences of one batch `chunk` of namespace `name` to the
    /// wanted ones, reading them again when one changed meanwhile: the fence
    /// keys written, or `None` when they kept changing.
    async fn import_fences(
        &self,
        name: &str,
        chunk: &[(u16, Millis)],
    ) -> Result<Option<u32>, ImportError> {
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
            let (guard, ops) = fence_raises(name, chunk, &current);
            if ops.is_empty() {
                return Ok(Some(0));
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
                return Ok(Some(u32::try_from(n).unwrap_or(u32::MAX)));
            }
            // A holder raised one meanwhile (replace): read again.
        }
        Ok(None)
    }

    /// Gives the fence count at `key` an absent floor of at least `floor`
    /// (creates it when absent in a namespace created here, `!stored`),
    /// guarded by the key as read: `false` when it kept changing.
    async fn import_count(
        &self,
        key: &str,
        stored: bool,
        floor: Millis,
    ) -> Result<bool, ImportError> {
        let key = key.to_owned();
        for _attempt in 0..IMPORT_ATTEMPTS {
            let (kv, _) = self
                .endpoints
                .get_key("read fence count", self.timeout, &key)
                .await?;
            let (current, rev) = match kv {
                Some(kv) => (Counter::decode(Some(kv.value())), kv.mod_revision()),
                None => (Counter::Absent, 0),
            };
            let new = match (&current, stored) {
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
                _ => return Ok(true),
            };
            let guard = if rev == 0 {
                Compare::version(key.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
            };
            let txn =
                Txn::new()
                    .when([guard])
                    .and_then([TxnOp::put(key.clone(), new.encode(), None)]);
            if self
                .endpoints
                .txn("import fence count", self.timeout, txn)
                .await?
                .succeeded()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Writes `ns`'s last holders, in batches.
    async fn import_last_holders(&self, ns: &NamespaceExport) -> Result<(), ImportError> {
        for chunk in ns.last_holders.chunks(IMPORT_BATCH) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|l| {
                    TxnOp::put(
                        keys::last_holder(&ns.name, MachineId(l.machine_id)),
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
        Ok(())
    }

    /// Writes namespace `name`'s record from the `exported` one: a new
    /// record with a new incarnation and this etcd's own gap when there is
    /// none, else the stored one with the exported floor when that is higher
    /// (and a new incarnation), guarded by the record as read.
    async fn import_record(
        &self,
        name: &str,
        exported: &NamespaceRecord,
    ) -> Result<(), ImportError> {
        let layout_key = keys::layout(name);
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
                        ..NamespaceRecord::new(exported.layout, gap)
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
                return Err(contended(name, "the namespace record"));
            }
        }
        Ok(())
    }
}

/// The fence writes of one import batch `chunk` of namespace `name`, given
/// the `current` fences (value and mod revision) as read: each fence below
/// the wanted one is raised, guarded by its mod revision; a missing one is
/// created, guarded by its absence, with its creation marker.
fn fence_raises(
    name: &str,
    chunk: &[(u16, Millis)],
    current: &[Option<(Millis, i64)>],
) -> (Vec<Compare>, Vec<TxnOp>) {
    let (mut guard, mut ops) = (Vec::new(), Vec::new());
    for (&(id, want), cur) in chunk.iter().zip(current) {
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
    (guard, ops)
}

/// [`ImportError::Contended`] for namespace `name`: `what` kept changing.
fn contended(name: &str, what: &str) -> ImportError {
    ImportError::Contended(format!(
        "namespace {name:?}: {what} kept changing under the import ({IMPORT_ATTEMPTS} attempts); nothing was lowered, but not everything is raised yet: run the import again"
    ))
}
