//! The server's own session: grant a lease and claim machine ids under it
//! (registering as a peer in the same transaction), raise their fences,
//! keep the lease alive, and release or revoke.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{MachineId, Millis};
use tracing::{debug, error, info, warn};

use super::endpoints::lease_not_found;
use super::pool::{claim_ids, ClaimReads, ClaimRequest, Claimed};
use super::{keys, Claim, EtcdLease, EtcdStore};
use snowkeep_core::claim::{HeldId, LossReason, StoreError};

/// The most unanswered fence values remembered per machine id: about 12
/// minutes of retries during an outage (one per request timeout plus the
/// retry pause). An older one found committed is taken as foreign, which
/// costs a claim, never an id.
const MAX_FENCE_ATTEMPTS: usize = 1024;

impl EtcdStore {
    /// Grants a lease and claims `machine_ids` machine ids for it, with an
    /// atomic transaction per candidate. The fence returned as each floor is
    /// read inside the claiming transaction (or, for a transaction retried on
    /// another endpoint, after its earlier attempt committed), and is at
    /// least the namespace floor. A fence key the claim creates (a
    /// never-used machine id's) gets the fence the claim loop's first raise
    /// would write, one fence horizon past the clock, so the first grant
    /// needs no write of its own. The first claim transaction also puts this
    /// server's peer key (for the peer clock check) on the lease.
    ///
    /// First checks the namespace may be claimed in, and settles holder keys
    /// that name this instance id under another process's lease (see the
    /// `instance` module): a crashed predecessor's machine id is claimed back
    /// once its lease ends, and [`StoreError::DuplicateInstance`] stops this
    /// process when another live one holds it.
    pub async fn claim(&mut self) -> Result<Claim, StoreError> {
        // Before granting anything: the namespace may be claimed in.
        self.guard_namespace().await?;
        self.keys_read = 0;
        self.full_range_leases.clear();
        let (prefer, mut known) = self.settle_own_holders().await?;
        known.extend(self.claimed_last.iter().copied());
        let timeout = self.settings.request_timeout;
        let ttl_secs = i64::try_from(self.settings.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        self.keeper = None;
        let sent = self.clock.now();
        let lease = self
            .endpoints
            .call("lease grant", timeout, |mut c| async move {
                c.lease_grant(ttl_secs, None).await
            })
            .await?;
        let lease_id = lease.id();
        self.remember_lease(lease_id);
        let deadline = sent + Duration::from_secs(u64::try_from(lease.ttl()).unwrap_or(0));
        let claimed = match self.claim_with_lease(lease_id, &prefer, &known).await {
            Err(StoreError::UnknownNamespace { namespace }) => {
                Err(StoreError::NamespaceNotCreated {
                    namespace,
                    endpoints: self.settings.endpoints.join(","),
                })
            }
            other => other,
        };
        match claimed {
            Ok(claimed) => {
                self.fence_revisions = claimed
                    .held
                    .iter()
                    .map(|h| h.machine_id)
                    .zip(claimed.fence_revisions)
                    .collect();
                self.fence_attempts.clear();
                self.claimed_last = claimed.held.iter().map(|h| h.machine_id).collect();
                for machine_id in prefer
                    .iter()
                    .filter(|m| claimed.held.iter().all(|h| h.machine_id != **m))
                {
                    warn!(namespace = %self.ns(), machine_id = machine_id.get(), max_wait = ?self.settings.fence_horizon.max(self.settings.max_fence_wait), "did not get back the machine id this instance id held before (fenced further ahead than the wait for one's own fence, 1.5 outage budgets, or claimed by another server meanwhile); claimed other machine ids");
                }
                let claim = Claim {
                    own_fences: claimed.own,
                    held: claimed.held,
                    deadline: Some(deadline),
                    lease: EtcdLease {
                        id: lease_id,
                        revision: claimed.revision,
                    },
                };
                info!(namespace = %self.ns(), machine_ids = ?claim.machine_ids(), lease_id, fence_ms = claim.max_floor().get(), keys_read = self.keys_read, "claimed machine ids");
                Ok(claim)
            }
            Err(e) => {
                // Revoking also deletes the holder keys claimed so far; best
                // effort, since an unused lease expires by itself anyway.
                let _ = self.endpoints.revoke(timeout, lease_id).await;
                Err(e)
            }
        }
    }

    /// The keys the last claim (successful or not) read from etcd: pool
    /// windows or whole-pool reads, and this instance id's claim records
    /// with their holder and last-holder keys. The namespace record and
    /// the keys a claim transaction reads are not counted. Read accounting
    /// for tests and benchmarks: a claim's cost follows the window, not the
    /// pool.
    pub fn claim_keys_read(&self) -> u64 {
        self.keys_read
    }

    async fn claim_with_lease(
        &mut self,
        lease_id: i64,
        prefer: &[MachineId],
        known: &[MachineId],
    ) -> Result<Claimed, StoreError> {
        let now = self.clock.layout_ms(&self.layout);
        let (absent_floor, max_floor) = ClaimRequest::floors(
            now,
            self.settings.fence_horizon,
            self.settings.max_fence_wait,
        );
        let want = ClaimRequest {
            namespace: &self.settings.namespace,
            holder: &self.settings.instance_id,
            range: self.settings.machine_id_range.clone(),
            count: self.settings.machine_ids as usize,
            lease_id,
            now,
            absent_floor,
            max_floor,
            // A crashed predecessor's fences stand up to one fence lead ahead.
            max_own_floor: ClaimRequest::floors(
                now,
                self.settings.fence_horizon,
                self.settings.fence_horizon,
            )
            .1,
            prefer,
            take_own: true,
            known,
            index: self.settings.stable_instance,
            // The fence the claim loop's first raise would write.
            created_fence: absent_floor,
            peer: self.settings.advertise_address.clone().map(|address| {
                let key = keys::peer(&self.settings.namespace, &self.settings.instance_id);
                (key, address)
            }),
        };
        let mut reads = ClaimReads::default();
        let claimed = claim_ids(
            &self.endpoints,
            self.settings.request_timeout,
            want,
            &mut reads,
        )
        .await;
        // Counted whether the claim succeeded or not.
        self.keys_read += reads.keys_read;
        self.full_range_leases = reads.full_range_leases;
        let claimed = claimed?;
        self.check_no_older_twin(lease_id).await?;
        Ok(claimed)
    }

    /// Raises the fence of every claimed machine id (`fences[i]` for
    /// `claim.held[i]`) in one transaction guarded by our lease still owning
    /// every holder key and by each fence key being as this holder last wrote
    /// it (its mod revision). The second guard keeps a late write out: a fence
    /// write that timed out on a hung member, and was retried on another one,
    /// may still be applied when that member resumes; it then finds the fence
    /// moved on and changes nothing, rather than lowering a fence already in
    /// use.
    ///
    /// An earlier attempt whose answer was lost may have committed instead
    /// (etcd down or restarting when the request timed out, then applying it
    /// once back). A fence that holds this write's own value counts as done;
    /// one that holds the value of another attempt made since the last
    /// confirmed write is taken as ours too: its revision becomes the guard
    /// and the write is sent again. [`StoreError::LeaseLost`] with
    /// `HolderChanged` when a holder key is not ours any more, or a fence key
    /// holds anything else (the caller stops issuing and claims again,
    /// reading the fence).
    pub async fn advance_fences(
        &mut self,
        claim: &Claim,
        fences: &[Millis],
    ) -> Result<(), StoreError> {
        for (h, f) in claim.held.iter().zip(fences) {
            let attempts = self.fence_attempts.entry(h.machine_id).or_default();
            if !attempts.contains(f) {
                if attempts.len() == MAX_FENCE_ATTEMPTS {
                    attempts.remove(0);
                }
                attempts.push(*f);
            }
        }
        // All unanswered attempts were guarded by the same revision, so at
        // most one of them commits: one pass finds it and takes its
        // revision, the next writes over it.
        for _ in 0..2 {
            if self.try_advance_fences(claim, fences).await? {
                for h in &claim.held {
                    self.fence_attempts.remove(&h.machine_id);
                }
                return Ok(());
            }
        }
        Err(StoreError::Request {
            store: "etcd",
            source: "fence txn: another unanswered fence write committed under its retry".into(),
        })
    }

    /// One fence transaction of [`EtcdStore::advance_fences`]: `true` when
    /// every fence now holds `fences[i]`, `false` when an earlier unanswered
    /// attempt of this holder was found committed (its revision is now the
    /// guard; send again).
    async fn try_advance_fences(
        &mut self,
        claim: &Claim,
        fences: &[Millis],
    ) -> Result<bool, StoreError> {
        let ns = self.ns().to_owned();
        let lease_id = claim.lease.id;
        let txn = self.fence_txn(claim, fences);
        let resp = self.txn("fence txn", txn).await?;
        if resp.succeeded() {
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            for h in &claim.held {
                self.fence_revisions.insert(h.machine_id, revision);
            }
            return Ok(true);
        }
        // The guard failed: the reads say whether the holder keys are still
        // ours and whether each fence holds what this holder wrote.
        let found: Vec<Option<etcd_client::KeyValue>> = resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                _ => None,
            })
            .collect();
        let mut revisions = Vec::with_capacity(claim.held.len());
        let mut done = true;
        for (i, (h, f)) in claim.held.iter().zip(fences).enumerate() {
            let holder_ours = found
                .get(2 * i)
                .and_then(Option::as_ref)
                .is_some_and(|kv| kv.lease() == lease_id);
            if !holder_ours {
                return Err(StoreError::LeaseLost {
                    reason: LossReason::HolderChanged,
                });
            }
            let fence = found.get(2 * i + 1).and_then(Option::as_ref);
            let holds = |kv: &etcd_client::KeyValue, v: &Millis| {
                kv.value() == v.get().to_string().as_bytes()
            };
            let earlier = fence.and_then(|kv| {
                self.fence_attempts
                    .get(&h.machine_id)?
                    .iter()
                    .find(|a| holds(kv, a))
            });
            match (fence, earlier) {
                // This very write committed earlier; its answer was lost.
                (Some(kv), _) if holds(kv, f) => revisions.push((h.machine_id, kv.mod_revision())),
                // Another unanswered attempt of ours committed.
                (Some(kv), Some(v)) => {
                    debug!(namespace = %ns, machine_id = h.machine_id.get(), fence_found_ms = v.get(), fence_ms = f.get(), "an earlier fence write of this holder committed after its answer was lost; writing again over it");
                    revisions.push((h.machine_id, kv.mod_revision()));
                    done = false;
                }
                _ => return Err(self.fence_changed(h, fence)),
            }
        }
        self.fence_revisions.extend(revisions);
        Ok(done)
    }

    /// The fence transaction of `claim` writing `fences`: every fence put,
    /// guarded by the holder keys being on the claim's lease and each fence
    /// key still at the revision this holder last wrote it at; the failure
    /// branch reads each holder key and fence key, in turn.
    fn fence_txn(&self, claim: &Claim, fences: &[Millis]) -> Txn {
        let ns = self.ns();
        let mut guard = self.ownership(claim);
        let mut puts = Vec::with_capacity(claim.held.len());
        let mut reads = Vec::with_capacity(claim.held.len() * 2);
        for (h, f) in claim.held.iter().zip(fences) {
            let key = keys::fence(ns, h.machine_id);
            if let Some(&revision) = self.fence_revisions.get(&h.machine_id) {
                guard.push(Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                ));
            }
            puts.push(TxnOp::put(key.clone(), f.get().to_string(), None));
            reads.push(TxnOp::get(keys::holder(ns, h.machine_id), None));
            reads.push(TxnOp::get(key, None));
        }
        Txn::new().when(guard).and_then(puts).or_else(reads)
    }

    /// The loss of a claim whose fence key of `h` changed under it, not by
    /// it (`fence`: the key as the failed fence transaction read it),
    /// logged; a key found below the revision this holder wrote it at is
    /// reported to the revision witness as etcd gone back.
    fn fence_changed(&self, h: &HeldId, fence: Option<&etcd_client::KeyValue>) -> StoreError {
        let ns = self.ns();
        // A fence key below the revision this holder wrote it at
        // can only be etcd gone back in time (a restore): mark it
        // at the next check, which comes before the claim again.
        let written = self.fence_revisions.get(&h.machine_id).copied();
        if let (Some(kv), Some(written)) = (fence, written) {
            if kv.mod_revision() < written {
                let key = keys::fence(ns, h.machine_id);
                error!(namespace = %ns, machine_id = h.machine_id.get(), key = %key, mod_revision = kv.mod_revision(), written_at = written, "a fence key is at a revision below the one this holder wrote it at: etcd was restored from an older snapshot");
                self.endpoints
                    .witness()
                    .key_went_back(ns, &key, kv.mod_revision(), written);
            }
        }
        let now = fence.map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
        warn!(namespace = %ns, machine_id = h.machine_id.get(), fence_now = ?now, fence_written_ms = h.fence.get(), "a fence key changed under its holder, not by it; stopping issuance and claiming again");
        StoreError::LeaseLost {
            reason: LossReason::HolderChanged,
        }
    }

    /// Compares that hold while every holder key of `claim` is bound to its lease.
    fn ownership(&self, claim: &Claim) -> Vec<Compare> {
        let lease_id = claim.lease.id;
        claim
            .held
            .iter()
            .map(|h| {
                Compare::lease(
                    keys::holder(self.ns(), h.machine_id),
                    CompareOp::Equal,
                    lease_id,
                )
            })
            .collect()
    }

    /// Sends one keepalive and waits for its answer, under the request
    /// timeout. Returns the new local deadline: the send time + TTL. A
    /// keepalive stream that fails, ends or stays silent is reopened at once
    /// on the next endpoint, failing over like any request; opening a stream
    /// sends a keepalive too, and its answer says whether the lease still
    /// exists. Errors with [`StoreError::LeaseLost`] (`Expired`) when etcd
    /// says the lease is gone, and with a retryable error when no endpoint
    /// answers.
    pub async fn renew(&mut self, claim: &Claim) -> Result<Instant, StoreError> {
        let lease_id = claim.lease.id;
        let timeout = self.settings.request_timeout;
        // The earliest send time of this renewal: the deadline counts from it
        // even when the answer comes from a stream reopened later.
        let sent = self.clock.now();
        if let Some((keeper, stream)) = self.keeper.as_mut() {
            let round_trip = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            let why = match tokio::time::timeout(timeout, round_trip).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    let ttl = Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(0));
                    return Ok(sent + ttl.min(self.settings.lease_ttl));
                }
                Ok(Ok(Some(_))) => {
                    self.keeper = None;
                    return Err(StoreError::LeaseLost {
                        reason: LossReason::Expired,
                    });
                }
                Ok(Ok(None)) => "the stream ended".to_owned(),
                Ok(Err(e)) => snowkeep_core::DisplayChain(&e).to_string(),
                Err(_) => format!("no answer within {timeout:?}"),
            };
            warn!(endpoint = self.endpoints.url_at(self.keeper_position), error = %why, "keepalive stream failed; reopening it on the next endpoint");
            self.keeper = None;
            self.endpoints.failed_at(self.keeper_position);
        }
        let opened = self
            .endpoints
            .call_at("keepalive", timeout, |mut c| async move {
                c.lease_keep_alive(lease_id).await
            })
            .await;
        match opened {
            Ok((pair, position)) => {
                self.keeper = Some(pair);
                self.keeper_position = position;
                Ok(sent + self.settings.lease_ttl)
            }
            Err(e) if lease_not_found(&e) => Err(StoreError::LeaseLost {
                reason: LossReason::Expired,
            }),
            Err(e) => Err(e),
        }
    }

    /// Lowers each fence to its last used timestamp (`last_used[i]` for
    /// `claim.held[i]`), records this instance as each id's last holder and
    /// deletes the holder keys, all in one transaction guarded by our lease,
    /// so a rolling restart waits for nothing; then revokes the lease. Both
    /// fail over like any request; a retried release transaction that finds
    /// its own earlier attempt committed counts as done.
    pub async fn release(&mut self, claim: &Claim, last_used: &[Millis]) -> Result<(), StoreError> {
        let timeout = self.settings.request_timeout;
        let lease_id = claim.lease.id;
        self.keeper = None;
        let ns = self.ns().to_owned();
        let instance_id = self.settings.instance_id.clone();
        let mut ops = Vec::with_capacity(claim.held.len() * 3);
        let mut reads = Vec::with_capacity(claim.held.len() * 3);
        for (h, last) in claim.held.iter().zip(last_used) {
            ops.push(TxnOp::put(
                keys::fence(&ns, h.machine_id),
                last.get().to_string(),
                None,
            ));
            ops.push(TxnOp::put(
                keys::last_holder(&ns, h.machine_id),
                instance_id.clone(),
                None,
            ));
            ops.push(TxnOp::delete(keys::holder(&ns, h.machine_id), None));
            reads.push(TxnOp::get(keys::fence(&ns, h.machine_id), None));
            reads.push(TxnOp::get(keys::last_holder(&ns, h.machine_id), None));
            reads.push(TxnOp::get(keys::holder(&ns, h.machine_id), None));
        }
        let txn = Txn::new()
            .when(self.ownership(claim))
            .and_then(ops)
            .or_else(reads);
        let resp = self.txn("release txn", txn).await?;
        if !resp.succeeded() {
            let found: Vec<Option<etcd_client::KeyValue>> = resp
                .op_responses()
                .into_iter()
                .map(|r| match r {
                    TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                    _ => None,
                })
                .collect();
            let released_before = last_used.iter().enumerate().all(|(i, last)| {
                let value = |j: usize| {
                    found
                        .get(3 * i + j)
                        .and_then(Option::as_ref)
                        .map(|kv| kv.value())
                };
                value(0) == Some(last.get().to_string().as_bytes())
                    && value(1) == Some(instance_id.as_bytes())
                    && value(2).is_none()
            });
            if !released_before {
                warn!(machine_ids = ?claim.machine_ids(), "holder keys no longer all ours at release; fences left as they are");
            }
        }
        self.endpoints.revoke(timeout, lease_id).await?;
        info!(namespace = %self.ns(), machine_ids = ?claim.machine_ids(), fences_ms = ?last_used, "released machine ids");
        Ok(())
    }

    /// Abandons a claim that is no longer used: revokes its etcd lease (etcd
    /// deletes the holder keys with it and keeps the fences), best effort.
    pub async fn abandon(&mut self, claim: &Claim) {
        self.keeper = None;
        let lease_id = claim.lease.id;
        let timeout = self.settings.request_timeout;
        if let Err(e) = self.endpoints.revoke(timeout, lease_id).await {
            debug!(lease_id, error = %e, "could not revoke the lost lease; it expires by itself");
        }
    }
}
