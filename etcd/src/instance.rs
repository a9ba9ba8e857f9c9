//! One live process per instance id.
//!
//! A holder key's value is the instance id that holds the machine id. When a
//! server about to claim finds its own instance id on a holder key bound to a
//! lease this process never had, the key belongs either to its predecessor
//! that crashed (a stable instance restarting) or to another live process
//! configured with the same `--instance-id`. Taking the key over would make
//! which of the two survives a race, so the newcomer tells them apart first,
//! before it claims anything, and never disturbs a live holder:
//!
//! * a live holder keeps its lease alive, and while it is busy raises the
//!   machine id's fence (once per half outage budget; an idle one does not);
//! * a crashed holder's lease expires within its TTL, and etcd deletes the
//!   key with it.
//!
//! So the newcomer watches the machine id's holder and fence keys: the key
//! going means the predecessor is gone, and that machine id becomes its
//! first choice; the fence moving under the key means a live holder, and the
//! newcomer stops with [`StoreError::DuplicateInstance`] (exit 64). Past the
//! lease's remaining TTL plus [`EXPIRY_SLACK`] without either, etcd is asked
//! whether the lease still lives (it was renewed: a live holder).
//!
//! Two processes that start at the same moment both find nothing and both
//! claim; [`EtcdStore::check_no_older_twin`] then stops the one whose claim
//! committed later.

use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use futures_util::StreamExt;
use snowkeep_client::MachineId;
use tracing::{debug, info, warn};

use super::{keys, EtcdStore};
use snowkeep_core::claim::StoreError;

/// Wait past a predecessor lease's remaining TTL (whole seconds, rounded
/// down) before asking etcd whether it still lives: etcd expires leases on a
/// 500 ms tick.
pub const EXPIRY_SLACK: Duration = Duration::from_secs(2);

/// Holder leases asked about at once when the range is full.
const LEASES_IN_FLIGHT: usize = 16;

/// Leases of this process remembered, so that a re-claim after a lost lease
/// takes its own holder keys back at once.
pub(super) const OWN_LEASES_KEPT: usize = 16;

/// A holder key that names this instance id.
struct OwnKey {
    machine_id: MachineId,
    lease: i64,
    create_revision: i64,
}

/// What [`EtcdStore::own_holder_keys`] found.
#[derive(Default)]
struct OwnKeys {
    /// Holder keys that name this instance id.
    held: Vec<OwnKey>,
    /// Machine ids this instance id released last.
    released: Vec<MachineId>,
    /// The revision they were read at.
    revision: i64,
}

impl EtcdStore {
    /// Remembers `lease_id` as one of this process's leases.
    pub(super) fn remember_lease(&mut self, lease_id: i64) {
        if self.own_leases.len() == OWN_LEASES_KEPT {
            self.own_leases.remove(0);
        }
        self.own_leases.push(lease_id);
    }

    fn duplicate(&self, machine_id: MachineId) -> StoreError {
        StoreError::DuplicateInstance {
            instance_id: self.settings.instance_id.clone(),
            machine_id,
        }
    }

    /// The holder keys that name this instance id, the revision they were
    /// read at, and the machine ids this instance id released last (their
    /// holder key gone, their last-holder key naming it). Found by key: the
    /// machine ids recorded under its `instance/{instance_id}/` keys (see
    /// [`keys::instance_claim`]), whose holder and last-holder keys are then
    /// read in one transaction, so the cost follows what this instance id
    /// holds, not the pool. A random instance id (no `--instance-id`) names
    /// no key of another process, and this process knows its own: it reads
    /// nothing. With `prune`, records of machine ids neither held nor
    /// released last by this instance id are deleted, each guarded by both
    /// keys as read, so a claim that takes one back meanwhile keeps its
    /// record.
    async fn own_holder_keys(&mut self, prune: bool) -> Result<OwnKeys, StoreError> {
        if !self.settings.stable_instance {
            return Ok(OwnKeys::default());
        }
        let ns = self.ns().to_owned();
        let instance_id = self.settings.instance_id.clone();
        let prefix = keys::instance_claims_prefix(&ns, &instance_id);
        let timeout = self.settings.request_timeout;
        let records = self
            .endpoints
            .call("read own claims", timeout, |mut c| {
                let key = prefix.clone();
                async move { c.get(key, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        self.keys_read += records.kvs().len() as u64;
        let ids: Vec<MachineId> = records
            .kvs()
            .iter()
            .filter_map(|kv| keys::machine_id_of(kv.key(), &prefix))
            .collect();
        if ids.is_empty() {
            let revision = records.header().map(|h| h.revision()).unwrap_or(0);
            return Ok(OwnKeys {
                revision,
                ..OwnKeys::default()
            });
        }
        let (found, revision) = self.holder_and_last_keys(&ids).await?;
        self.keys_read += found.iter().flatten().count() as u64;
        let mut own = OwnKeys {
            revision,
            ..OwnKeys::default()
        };
        let mut stale = Vec::new();
        for (i, &machine_id) in ids.iter().enumerate() {
            let (holder, last) = (
                found.get(2 * i).cloned().flatten(),
                found.get(2 * i + 1).cloned().flatten(),
            );
            let ours = |kv: &Option<KeyValue>| {
                kv.as_ref()
                    .is_some_and(|kv| kv.value() == instance_id.as_bytes())
            };
            if ours(&holder) {
                let kv = holder.as_ref().expect("ours");
                own.held.push(OwnKey {
                    machine_id,
                    lease: kv.lease(),
                    create_revision: kv.create_revision(),
                });
            } else if ours(&last) && holder.is_none() {
                own.released.push(machine_id);
            } else {
                let revision =
                    |kv: &Option<KeyValue>| kv.as_ref().map_or(0, |kv| kv.mod_revision());
                stale.push((machine_id, revision(&holder), revision(&last)));
            }
        }
        if prune {
            self.prune_claims(&stale).await;
        }
        Ok(own)
    }

    /// The holder and last-holder keys of `ids` (two entries per id, in
    /// order; `None` for a missing key), and the earliest revision they were
    /// read at.
    async fn holder_and_last_keys(
        &mut self,
        ids: &[MachineId],
    ) -> Result<(Vec<Option<KeyValue>>, i64), StoreError> {
        let ns = self.ns().to_owned();
        let timeout = self.settings.request_timeout;
        // etcd takes 128 operations per transaction by default.
        let mut found: Vec<Option<KeyValue>> = Vec::with_capacity(2 * ids.len());
        let mut revision = i64::MAX;
        for chunk in ids.chunks(64) {
            let gets: Vec<TxnOp> = chunk
                .iter()
                .flat_map(|&id| {
                    [
                        TxnOp::get(keys::holder(&ns, id), None),
                        TxnOp::get(keys::last_holder(&ns, id), None),
                    ]
                })
                .collect();
            let resp = self
                .endpoints
                .txn("read own holder keys", timeout, Txn::new().and_then(gets))
                .await?;
            // The earliest: a watch from it misses no change of any key.
            revision = revision.min(resp.header().map(|h| h.revision()).unwrap_or(0));
            found.extend(resp.op_responses().into_iter().map(|r| match r {
                TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                _ => None,
            }));
        }
        Ok((found, revision))
    }

    /// Deletes the `instance/{instance_id}/` records of `stale` machine ids
    /// (each with the mod revisions of its holder and last-holder keys as
    /// read, 0 for none), each only while both keys are unchanged. Best
    /// effort: a record left behind costs two key reads per claim.
    async fn prune_claims(&mut self, stale: &[(MachineId, i64, i64)]) {
        let ns = self.ns().to_owned();
        for &(machine_id, holder, last) in stale {
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(keys::holder(&ns, machine_id), CompareOp::Equal, holder),
                    Compare::mod_revision(
                        keys::last_holder(&ns, machine_id),
                        CompareOp::Equal,
                        last,
                    ),
                ])
                .and_then([TxnOp::delete(
                    keys::instance_claim(&ns, &self.settings.instance_id, machine_id),
                    None,
                )]);
            if let Err(e) = self
                .endpoints
                .txn("prune own claims", self.settings.request_timeout, txn)
                .await
            {
                debug!(machine_id = machine_id.get(), error = %e, "could not prune a claim record of this instance id; trying again at the next claim");
            }
        }
    }

    /// Before a claim: settles every holder key that names this instance id
    /// under a lease this process never had. Returns the machine ids whose
    /// holder turned out gone (a crashed predecessor: claim them first), and
    /// every machine id found by key that this instance id holds or released
    /// last (the claim reads their blocks); [`StoreError::DuplicateInstance`]
    /// when one turns out alive. Takes at most the remaining TTL of each
    /// such lease plus [`EXPIRY_SLACK`].
    pub(super) async fn settle_own_holders(
        &mut self,
    ) -> Result<(Vec<MachineId>, Vec<MachineId>), StoreError> {
        let own = self.own_holder_keys(true).await?;
        let mut known: Vec<MachineId> = own.released.clone();
        known.extend(own.held.iter().map(|k| k.machine_id));
        let mut gone = Vec::new();
        for key in own.held {
            if self.own_leases.contains(&key.lease) {
                continue;
            }
            if self.predecessor_lives(&key, own.revision).await? {
                return Err(self.duplicate(key.machine_id));
            }
            info!(namespace = %self.ns(), machine_id = key.machine_id.get(), wait_up_to = ?self.settings.fence_horizon.max(self.settings.max_fence_wait), "the previous holder under this instance id is gone; claiming its machine id first, and waiting for its fence (a crashed holder's stands up to 1.5 outage budgets ahead) rather than taking another");
            gone.push(key.machine_id);
        }
        Ok((gone, known))
    }

    /// After a claim under `lease_id`: [`StoreError::DuplicateInstance`] when
    /// another process's holder key naming this instance id was created
    /// before this claim's first key (two processes started together: the
    /// later claim stops, the earlier one keeps running).
    pub(super) async fn check_no_older_twin(&mut self, lease_id: i64) -> Result<(), StoreError> {
        let own = self.own_holder_keys(false).await?.held;
        let Some(first_ours) = own
            .iter()
            .filter(|k| k.lease == lease_id)
            .map(|k| k.create_revision)
            .min()
        else {
            // Our keys are gone already; the holder watch reports that.
            return Ok(());
        };
        match own
            .iter()
            .find(|k| !self.own_leases.contains(&k.lease) && k.create_revision < first_ours)
        {
            Some(twin) => Err(self.duplicate(twin.machine_id)),
            None => Ok(()),
        }
    }

    /// True when the holder of `key` (read at `revision`) is alive, false
    /// once it is gone.
    async fn predecessor_lives(&mut self, key: &OwnKey, revision: i64) -> Result<bool, StoreError> {
        let Some(remaining) = self.lease_remaining(key.lease).await? else {
            return Ok(false);
        };
        let patience = remaining + EXPIRY_SLACK;
        info!(namespace = %self.ns(), instance_id = %self.settings.instance_id, machine_id = key.machine_id.get(), lease_id = key.lease, wait = ?patience, "this instance id holds a machine id under another process's etcd lease: waiting until that lease ends (a crashed predecessor) or its fence moves (another live process with the same --instance-id)");
        let deadline = self.clock.now() + patience;
        if let Some(lives) = self.watch_predecessor(key, revision, deadline).await {
            return Ok(lives);
        }
        // No telling event before the deadline (or the watch failed): by now
        // an unrenewed lease has expired.
        tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
        Ok(self.lease_remaining(key.lease).await?.is_some())
    }

    /// After a claim refused for a full range: how soon one of the etcd
    /// leases of the range's holder keys ends, if one ends within a fence
    /// lead (a frozen or crashed holder's lease counts down; a live one is
    /// renewed every TTL/3, so it too ends within one TTL unless renewed).
    /// An expired lease ends now: its keys are going.
    ///
    /// Asks about every lease the refused claim's read found (one per
    /// holder at most, so never more than the range has machine ids),
    /// `LEASES_IN_FLIGHT` at a time, and answers with the first found
    /// ending that soon: a bound on when a machine id frees, whichever lease
    /// it is. Reads no key: the leases come from the claim's own read of the
    /// range. `Ok(None)` when none ends that soon (or the range's holders
    /// have no lease); the first error etcd answers with otherwise, at once
    /// (the requests still out are dropped): the claim loop retries, and
    /// this asks again, rather than wait out a request timeout per lease of
    /// an etcd that does not answer.
    pub async fn holder_lease_end(&mut self) -> Result<Option<Duration>, StoreError> {
        let horizon = self.settings.fence_horizon;
        let leases = self.full_range_leases.clone();
        let this = &*self;
        let mut asked = futures_util::stream::iter(leases)
            .map(|lease| this.lease_remaining(lease))
            .buffer_unordered(LEASES_IN_FLIGHT);
        while let Some(answer) = asked.next().await {
            let left = answer?.unwrap_or(Duration::ZERO);
            if left <= horizon {
                return Ok(Some(left));
            }
        }
        Ok(None)
    }

    /// The remaining TTL of `lease` (whole seconds), `None` once it expired.
    async fn lease_remaining(&self, lease: i64) -> Result<Option<Duration>, StoreError> {
        let ttl = self
            .endpoints
            .call(
                "lease ttl",
                self.settings.request_timeout,
                |mut c| async move { c.lease_time_to_live(lease, None).await },
            )
            .await?
            .ttl();
        Ok(u64::try_from(ttl).ok().map(Duration::from_secs))
    }

    /// Watches `key`'s holder and fence keys from `revision + 1` until
    /// `deadline`: `Some(false)` when the holder key goes or changes hands,
    /// `Some(true)` when the fence moves under it, `None` otherwise.
    async fn watch_predecessor(
        &mut self,
        key: &OwnKey,
        revision: i64,
        deadline: Instant,
    ) -> Option<bool> {
        let holder = keys::holder(self.ns(), key.machine_id);
        let fence = keys::fence(self.ns(), key.machine_id);
        let prefix = keys::namespace_prefix(self.ns());
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let opened = self
            .endpoints
            .call(
                "watch predecessor",
                self.settings.request_timeout,
                |mut c| {
                    let (prefix, opts) = (prefix.clone(), opts.clone());
                    async move { c.watch(prefix, Some(opts)).await }
                },
            )
            .await;
        let mut stream = match opened {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %snowkeep_core::DisplayChain(&e), "cannot watch the previous holder; deciding by its lease alone");
                return None;
            }
        };
        loop {
            let left = deadline.saturating_duration_since(self.clock.now());
            let resp = match tokio::time::timeout(left, stream.message()).await {
                Ok(Ok(Some(resp))) if !resp.canceled() => resp,
                _ => return None,
            };
            // One transaction's events arrive together: a clean release
            // writes the fence and deletes the holder key at once, which is a
            // departure, not a sign of life.
            let mut fence_moved = false;
            for event in resp.events() {
                let Some(kv) = event.kv() else { continue };
                if kv.key() == holder.as_bytes() {
                    if event.event_type() == EventType::Delete
                        || kv.value() != self.settings.instance_id.as_bytes()
                    {
                        return Some(false);
                    }
                    if kv.lease() != key.lease {
                        // Rebound to yet another lease under this instance
                        // id: a live process holds it.
                        return Some(true);
                    }
                } else if kv.key() == fence.as_bytes() && event.event_type() == EventType::Put {
                    fence_moved = true;
                }
            }
            if fence_moved {
                return Some(true);
            }
        }
    }
}
