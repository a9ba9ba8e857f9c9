//! The export: everything under `/snowkeep/v1/` read at one revision and
//! decoded into a [`StateDocument`].

use std::collections::BTreeMap;

use etcd_client::KeyValue;

use super::super::keys::{self, FenceCountKey};
use super::super::namespace::NamespaceRecord;
use super::{
    strip, BlockExport, FenceExport, LastHolderExport, NamespaceExport, RawKey, StateDocument,
    StateStore, DOCUMENT_FORMAT, DOCUMENT_VERSION,
};
use snowkeep_core::claim::StoreError;

impl StateStore {
    /// The state document: every namespace (record, fences, fence counts,
    /// last holders) and every API key, read at one revision.
    pub async fn export(&self) -> Result<StateDocument, StoreError> {
        let root = keys::namespaces_root();
        let prefixes = [root.to_owned(), keys::API_KEYS_ROOT.to_owned()];
        let read = super::super::pool_read::read_prefixes(&self.endpoints, self.timeout, &prefixes)
            .await?;
        let mut by_ns: BTreeMap<String, Vec<&KeyValue>> = BTreeMap::new();
        for kv in &read[0] {
            if let Some(name) = strip(kv.key(), root).and_then(|r| r.split_once('/')) {
                by_ns.entry(name.0.to_owned()).or_default().push(kv);
            }
        }
        let mut namespaces = Vec::new();
        for (name, kvs) in by_ns {
            if let Some(out) = export_namespace(name, kvs)? {
                namespaces.push(out);
            }
        }
        let api_keys = export_api_keys(&read[1])?;
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
}

/// Namespace `name`'s export from its keys `kvs`; `None` when they have no
/// namespace record (nothing a server would accept).
fn export_namespace(
    name: String,
    kvs: Vec<&KeyValue>,
) -> Result<Option<NamespaceExport>, StoreError> {
    let layout_key = keys::layout(&name);
    let Some(record_kv) = kvs.iter().find(|kv| kv.key() == layout_key.as_bytes()) else {
        return Ok(None); // keys without a record: nothing a server would accept
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
    Ok(Some(out))
}

/// The API keys `kvs` verbatim; [`StoreError::Corrupt`] for one that is not
/// UTF-8.
fn export_api_keys(kvs: &[KeyValue]) -> Result<Vec<RawKey>, StoreError> {
    let mut api_keys = Vec::new();
    for kv in kvs {
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
    Ok(api_keys)
}
