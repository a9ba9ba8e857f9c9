//! The restore record: the key `/snowkeep/v1/restored`, which
//! `scripts/etcd-snapshot restore` writes into the marked snapshot (the
//! snapshot's sha256 and revision, one `name value` line each).
//!
//! Marking sets every namespace record the snapshot holds to `rolled-back`.
//! A namespace created after the snapshot has no record in it to mark: after
//! the restore it does not exist, and creating it again with every fence at
//! 0 would issue ids it issued before. So while the restore record is there,
//! a namespace is created only with an operator's floor
//! (`--create-namespace --confirm-namespace-floor`), the way a namespace is
//! created again after a wipe. Nothing deletes the record but an operator.

use std::time::Duration;

use etcd_client::{Compare, CompareOp};

use super::endpoints::Endpoints;
use super::keys;
use snowkeep_core::claim::StoreError;

/// The guard of a creation without a floor: etcd holds no restore record.
pub(super) fn absent() -> Compare {
    Compare::version(keys::RESTORED, CompareOp::Equal, 0)
}

/// The snapshot a restore record names, for a message: `sha256 S, revision
/// N` with what it holds of both; the value quoted when it holds neither.
pub fn describe(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    let field = |name: &str| {
        text.lines()
            .filter_map(|l| l.trim().split_once(' '))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    match (field("sha256"), field("revision")) {
        (None, None) => format!("restore record {:?}", keys::quoted(value)),
        (sha, revision) => format!(
            "sha256 {}, revision {}",
            sha.as_deref().unwrap_or("?"),
            revision.as_deref().unwrap_or("?")
        ),
    }
}

/// Refuses to create `namespace` without a floor when etcd holds a restore
/// record ([`StoreError::NamespaceNeedsFloor`]); `Ok(())` when it holds none.
pub(super) async fn refuse_creation_without_floor(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    endpoint_list: String,
) -> Result<(), StoreError> {
    let (kv, _) = endpoints
        .get_key("read restore record", timeout, keys::RESTORED)
        .await?;
    match kv {
        None => Ok(()),
        Some(kv) => Err(StoreError::NamespaceNeedsFloor {
            namespace: namespace.to_owned(),
            endpoints: endpoint_list,
            snapshot: describe(kv.value()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn the_record_names_the_snapshot_or_is_quoted() {
        assert_eq!(
            describe(b"sha256 91638758759077a1\nrevision 4\n"),
            "sha256 91638758759077a1, revision 4"
        );
        assert_eq!(describe(b"revision 4\n"), "sha256 ?, revision 4");
        assert_eq!(describe(b"yes"), "restore record \"yes\"");
    }
}
