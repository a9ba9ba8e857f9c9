//! The rollback check in etcd: reading the record and the store's progress,
//! marking a restore found, and the guard of every claim.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use snowkeep_client::Millis;
use tracing::{error, warn};

use super::super::{keys, Endpoints};
use super::{restored, NamespaceRecord, NamespaceState, StoreProgress, RUNBOOK_RESTORE};
use snowkeep_core::claim::StoreError;
use snowkeep_core::text::rfc3339;

/// Reads the record: `None` when the key is absent; with its mod revision.
pub(crate) async fn read(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
) -> Result<Option<(NamespaceRecord, i64)>, StoreError> {
    Ok(read_at(endpoints, timeout, namespace).await?.0)
}

/// [`read`], with the header revision of the (linearizable) answer.
async fn read_at(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
) -> Result<(Option<(NamespaceRecord, i64)>, i64), StoreError> {
    let key = keys::layout(namespace);
    let (kv, revision) = endpoints
        .get_key("read namespace record", timeout, &key)
        .await?;
    let found = match kv {
        None => None,
        Some(kv) => Some((NamespaceRecord::parse(&key, kv.value())?, kv.mod_revision())),
    };
    Ok((found, revision))
}

/// Reads revision and applied index from the member the next request goes to.
pub(crate) async fn progress(
    endpoints: &Endpoints,
    timeout: Duration,
) -> Result<StoreProgress, StoreError> {
    let status = endpoints
        .call("status", timeout, |mut c| async move { c.status().await })
        .await?;
    let applied = status.raft_applied_index();
    Ok(StoreProgress {
        revision: status.header().map(|h| h.revision()).unwrap_or(0),
        applied_index: if applied > 0 {
            applied
        } else {
            status.raft_index()
        },
    })
}

/// Writes state `rolled-back` (when the record is still the one read at
/// `mod_revision`) and returns the refusal to report.
async fn mark_rolled_back(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    mut record: NamespaceRecord,
    mod_revision: i64,
    reason: String,
    unix_ms: u64,
) -> StoreError {
    let key = keys::layout(namespace);
    let at = rfc3339(unix_ms);
    error!(namespace, reason = %reason, runbook = RUNBOOK_RESTORE, "etcd lost writes: marking the namespace rolled back; no machine id is claimed in it until an operator confirms a floor");
    record = record.with_incarnation();
    record.state = NamespaceState::RolledBack {
        at: at.clone(),
        reason: reason.clone(),
    };
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            mod_revision,
        )])
        .and_then([TxnOp::put(key, record.encode(), None)]);
    match endpoints.txn("mark rolled back", timeout, txn).await {
        Ok(r) if r.succeeded() => {}
        // Someone changed the record first (marked it too, or confirmed a
        // floor): refuse this time anyway; the next check reads theirs.
        Ok(_) => warn!(
            namespace,
            "the namespace record changed while marking it rolled back"
        ),
        Err(e) => {
            warn!(namespace, error = %snowkeep_core::DisplayChain(&e), "could not mark the namespace rolled back; every check refuses by itself until an operator confirms a floor")
        }
    }
    StoreError::NamespaceRolledBack {
        namespace: namespace.to_owned(),
        since: at,
        reason,
    }
}

/// The check before a claim (and the periodic one of holders): the record
/// must exist and be `ok`, and the store must not show a restore (the
/// revision witness, then the index rule); a restore it finds is marked in
/// the record. Returns the record and its mod revision.
///
/// Errors: [`StoreError::UnknownNamespace`], [`StoreError::CorruptNamespace`],
/// [`StoreError::NamespaceRolledBack`], or the etcd failure.
pub(crate) async fn guard(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    unix_ms: u64,
) -> Result<(NamespaceRecord, i64), StoreError> {
    let before = endpoints.witness().highest(namespace);
    let (found, revision) = read_at(endpoints, timeout, namespace).await?;
    let Some((record, mod_revision)) = found else {
        return Err(StoreError::UnknownNamespace {
            namespace: namespace.to_owned(),
        });
    };
    let confirmed_at = record.confirmed_at.as_deref();
    if let Some(refusal) = record.refusal(namespace) {
        endpoints
            .witness()
            .start_over(namespace, revision, confirmed_at);
        return Err(refusal);
    }
    let went_back = endpoints
        .witness()
        .check(namespace, before, revision, confirmed_at);
    let reason = match went_back {
        Some(reason) => Some(reason),
        None => restored(progress(endpoints, timeout).await?, record.acknowledged_gap),
    };
    if let Some(reason) = reason {
        return Err(mark_rolled_back(
            endpoints,
            timeout,
            namespace,
            record,
            mod_revision,
            reason,
            unix_ms,
        )
        .await);
    }
    Ok((record, mod_revision))
}

/// The namespace as a claim sees it: the floor, and the compare that keeps
/// the claim from committing once the record changed (a rollback marked, a
/// floor confirmed). Read once per round of candidates.
pub(crate) struct ClaimGuard {
    /// The confirmed floor, layout ms.
    pub floor: Millis,
    /// The record's key.
    pub key: String,
    /// The record's mod revision when read.
    pub mod_revision: i64,
}

impl ClaimGuard {
    /// Reads the record for a claim: [`StoreError::UnknownNamespace`] when
    /// absent, [`StoreError::NamespaceRolledBack`] when rolled back.
    pub(crate) async fn read(
        endpoints: &Endpoints,
        timeout: Duration,
        namespace: &str,
    ) -> Result<Self, StoreError> {
        let Some((record, mod_revision)) = read(endpoints, timeout, namespace).await? else {
            return Err(StoreError::UnknownNamespace {
                namespace: namespace.to_owned(),
            });
        };
        if let Some(refusal) = record.refusal(namespace) {
            return Err(refusal);
        }
        Ok(Self {
            floor: record.floor,
            key: keys::layout(namespace),
            mod_revision,
        })
    }

    /// Holds while the record is the one read.
    pub(crate) fn compare(&self) -> Compare {
        Compare::mod_revision(self.key.clone(), CompareOp::Equal, self.mod_revision)
    }

    /// True when `resp` (a failed claim transaction whose `or_else` read the
    /// record as its operation number `at`) shows the record changed since it
    /// was read.
    pub(crate) fn changed(&self, resp: &etcd_client::TxnResponse, at: usize) -> bool {
        match resp.op_responses().get(at) {
            Some(etcd_client::TxnOpResponse::Get(get)) => {
                get.kvs().first().map(|kv| kv.mod_revision()) != Some(self.mod_revision)
            }
            _ => false,
        }
    }
}
