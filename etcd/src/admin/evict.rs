//! Eviction: an operator takes a machine id from its holder
//! (`snowkeepctl evict`, AdminService.Evict).
//!
//! The holder's lease is revoked, which deletes every key on it. A Lease API
//! requester moves its keys to a new etcd lease at each renewal, so a
//! renewal committed between the eviction's read and its revoke would leave
//! the keys alive on the new lease and the eviction a silent no-op: the
//! holder would keep its machine ids (and an embedded generator would never
//! hear that it was evicted). So the eviction reads the holder key again
//! after each revoke and repeats while it still names the same holder.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use snowkeep_client::{MachineId, Millis};
use snowkeep_core::claim::StoreError;

use super::{keys, ms_between, shown_holder, Evicted, StateStore};

/// How many revokes an eviction makes while the same holder keeps moving to
/// a new lease (one per renewal it commits meanwhile) before it gives up
/// with [`StoreError::EvictContended`].
pub(super) const EVICT_ATTEMPTS: u32 = 8;

/// One read of a machine id's holder key.
struct HolderRead {
    /// The key's value: who holds it.
    value: Vec<u8>,
    /// Its etcd lease (0 for a key written without one).
    lease: i64,
    /// Its mod revision, for the guarded delete of a key without a lease.
    mod_revision: i64,
    /// Every machine id on that lease (just the one without a lease).
    machine_ids: Vec<u16>,
    /// The highest fence of those.
    highest: Millis,
}

impl StateStore {
    /// Takes `machine_id` of `ns` from its holder by revoking the holder's
    /// lease, again while the holder moved to a new one meanwhile (see the
    /// module docs); `Ok(None)` when nobody holds it (or the namespace has no
    /// record: [`StoreError::UnknownNamespace`]). Returns once the holder
    /// key is gone or names another holder; [`StoreError::EvictContended`]
    /// when the same holder still holds it after [`EVICT_ATTEMPTS`] revokes.
    pub async fn evict(&self, ns: &str, machine_id: u16) -> Result<Option<Evicted>, StoreError> {
        let record = self.record(ns).await?;
        let mut first: Option<HolderRead> = None;
        let mut revokes = 0;
        loop {
            let Some(current) = self.read_holder(ns, machine_id).await? else {
                break;
            };
            if first.as_ref().is_some_and(|f| f.value != current.value) {
                break; // taken over by another holder since: ours is gone
            }
            if revokes == EVICT_ATTEMPTS {
                return Err(StoreError::EvictContended {
                    namespace: ns.to_owned(),
                    machine_id,
                    attempts: revokes,
                });
            }
            revokes += 1;
            self.take(ns, machine_id, &current).await?;
            match &mut first {
                Some(f) => f.highest = f.highest.max(current.highest),
                None => first = Some(current),
            }
        }
        let Some(first) = first else {
            return Ok(None);
        };
        let wait = ms_between(first.highest, self.now(&record.layout)).max(0);
        Ok(Some(Evicted {
            holder: shown_holder(&first.value),
            machine_ids: first.machine_ids,
            successor_wait_ms: u64::try_from(wait).unwrap_or(0),
        }))
    }

    /// The holder key of `machine_id`, the machine ids on its lease and
    /// their highest fence; `None` when nobody holds it.
    async fn read_holder(
        &self,
        ns: &str,
        machine_id: u16,
    ) -> Result<Option<HolderRead>, StoreError> {
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
        Ok(Some(HolderRead {
            value: held.value().to_vec(),
            lease,
            mod_revision: held.mod_revision(),
            machine_ids,
            highest,
        }))
    }

    /// Revokes the lease of `held` (deleting every key on it), or deletes a
    /// holder key without a lease (written by hand) if it is still the one
    /// read.
    async fn take(&self, ns: &str, machine_id: u16, held: &HolderRead) -> Result<(), StoreError> {
        if held.lease != 0 {
            // A lease already gone (the renewal that moved the keys revoked
            // it) counts as revoked.
            return self.endpoints.revoke(self.timeout, held.lease).await;
        }
        let key = keys::holder(ns, MachineId(machine_id));
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                held.mod_revision,
            )])
            .and_then([TxnOp::delete(key, None)]);
        self.endpoints
            .txn("evict holder", self.timeout, txn)
            .await?;
        Ok(())
    }
}
