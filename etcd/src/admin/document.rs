//! The export document: its types, and the parse that refuses a document
//! naming anything twice or failing the import checks.

use serde::{Deserialize, Serialize};

use super::super::keys;
use super::super::namespace::NamespaceRecord;
use super::import_checks;
use super::{DOCUMENT_FORMAT, DOCUMENT_VERSION};
use snowkeep_core::claim::StoreError;

/// snowkeep's state as one JSON document ([`super::StateStore::export`]).
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
    /// The namespace record as stored (see `super::super::namespace`).
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

/// [`ImportError::Invalid`] naming the first value `items` holds twice.
pub(super) fn repeated<T: Ord + std::fmt::Debug>(
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
    /// timestamp) or key (see `import_checks`), or anything named
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
