//! The Lease API's calls (`RequesterStore`) on etcd.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{Layout, MachineId, Millis};
use tracing::{info, warn};

use super::super::keys::{self};
use super::grant::NewClaim;
use super::{namespace_record, RequesterLeases, QUOTA_ATTEMPTS};
use snowkeep_core::claim::{Capacity, StoreError};
use snowkeep_core::lease::records::{
    released_fence, FenceRead, KeyQuota, LeaseCheck, LeaseToken, Renewal, RequesterAbout,
    RequesterGrant, RequesterId, RequesterStore,
};

impl RequesterStore for RequesterLeases {
    async fn admit(&mut self, namespace: &str) -> Result<u64, StoreError> {
        let record = self.namespace(namespace).await?;
        self.check_floor(namespace, &record)?;
        Ok(record.incarnation)
    }

    /// The namespace's layout; [`StoreError::UnknownNamespace`] when none is recorded.
    async fn layout(&mut self, namespace: &str) -> Result<Layout, StoreError> {
        let key = keys::layout(namespace);
        let (kv, _) = self
            .endpoints
            .get_key("read layout", self.timeout, &key)
            .await?;
        let kv = kv.ok_or_else(|| StoreError::UnknownNamespace {
            namespace: namespace.to_owned(),
        })?;
        Ok(namespace_record(namespace, &key, kv.value())?.layout)
    }

    /// Claims `count` machine ids for `requester` for `duration` and returns
    /// them with a new lease token. When the requester already holds machine
    /// ids, a call presenting their `token` gets them back with the lease
    /// reset to `duration` (an idempotent retry; the same token), failing
    /// with [`StoreError::CountMismatch`] when it holds a different number;
    /// without the token it fails with [`StoreError::TokenRefused`] and
    /// nothing changes. `layout` is the namespace's, as [`Self::layout`] read it.
    async fn acquire(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &RequesterId,
        count: u32,
        duration: Duration,
        token: Option<&LeaseToken>,
        quota: Option<&KeyQuota>,
        about: &RequesterAbout,
    ) -> Result<RequesterGrant, StoreError> {
        // With a quota: count the key's holdings, claim, and commit the
        // claim's holding only if no holding of the key was written since
        // the count (etcd compares the whole prefix), so the holdings
        // committed never exceed the quota; a lost race counts again.
        // Every claim also commits only while the requester has no record:
        // of concurrent Acquires of one requester, one is granted and the
        // others read its record again and are answered from it (without
        // its token: refused).
        let mut attempts = 0;
        let mut requester_races = 0;
        let (held, token) = loop {
            if let Some(record) = self.record(namespace, requester).await? {
                return self
                    .acquire_again(namespace, layout, requester, record, count, duration, token)
                    .await;
            }
            let counted = match quota {
                Some(q) => Some((q, self.room_for(q, count).await?)),
                None => None,
            };
            match self
                .claim_new(
                    namespace, layout, requester, count, duration, counted, about,
                )
                .await?
            {
                NewClaim::Granted(held, token) => break (held, token),
                NewClaim::QuotaRaced => {
                    attempts += 1;
                    if attempts >= QUOTA_ATTEMPTS {
                        return Err(StoreError::KeyQuotaContended {
                            key_id: quota.map(|q| q.key_id.clone()).unwrap_or_default(),
                            attempts,
                        });
                    }
                }
                NewClaim::RequesterRaced => {
                    // Each lost race means another Acquire of this requester
                    // was granted; its record answers the next pass. The
                    // bound only stops a livelock (granted and released
                    // again each time).
                    requester_races += 1;
                    if requester_races >= QUOTA_ATTEMPTS {
                        return Err(StoreError::TokenRefused {
                            reason: "other Acquires of this requester were granted first",
                        });
                    }
                }
            }
        };
        info!(namespace, requester = %requester.tag(), machine_ids = ?held.iter().map(|h| h.machine_id.get()).collect::<Vec<_>>(), "leased machine ids to a requester");
        Ok(RequesterGrant {
            held,
            duration,
            layout,
            token: Some(token),
            known: false,
        })
    }

    /// Extends the requester's lease to `duration` and raises its fences, for
    /// the caller presenting its `token` ([`StoreError::TokenRefused`]
    /// otherwise, checked first, with nothing changed); an empty grant when
    /// it holds nothing (its lease is gone), for which nothing is written.
    /// Then, before anything is extended, the namespace must stand for a
    /// grant of `incarnation` (0 skips the comparison): [`Renewal::Gone`] when
    /// it does not exist, is another incarnation or is rolled back.
    async fn renew(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        duration: Duration,
        token: Option<&LeaseToken>,
        incarnation: u64,
    ) -> Result<Renewal, StoreError> {
        let record = self.authorized(namespace, requester, token).await?;
        let standing = match self.standing(namespace, incarnation).await? {
            Ok(standing) => standing,
            Err(gone) => return Ok(Renewal::Gone(gone)),
        };
        let grant = match record {
            Some(record) => {
                let mut grant = self
                    .extend(namespace, requester, record, standing.layout, duration)
                    .await?;
                grant.known = !grant.held.is_empty();
                grant
            }
            None => RequesterGrant::nothing(duration, standing.layout),
        };
        Ok(Renewal::Granted {
            grant,
            incarnation: standing.incarnation,
        })
    }

    /// Gives the requester's machine ids back, for the caller presenting its
    /// `token` ([`StoreError::TokenRefused`] otherwise, with nothing
    /// changed): each fence in `last_used` is lowered towards it as
    /// [`released_fence`] allows (others keep theirs), every key of the
    /// requester is deleted and its lease revoked. Returns how many machine
    /// ids were released (0 when it held none).
    async fn release(
        &mut self,
        namespace: &str,
        layout: Option<Layout>,
        requester: &RequesterId,
        last_used: &HashMap<MachineId, Millis>,
        token: Option<&LeaseToken>,
    ) -> Result<u32, StoreError> {
        let Some(record) = self.authorized(namespace, requester, token).await? else {
            return Ok(0);
        };
        let layout = match layout {
            Some(layout) => layout,
            None => self.layout(namespace).await?,
        };
        let current = self.own_fences(namespace, &record.machine_ids()).await?;
        let now = self.now(&layout);
        let ns = namespace.to_owned();
        let guard = record.unchanged(&ns, &requester.key());
        let mut ops = Vec::new();
        for &(machine_id, floor) in &record.ids {
            let hk = keys::holder(&ns, machine_id);
            let read = current
                .get(&machine_id)
                .cloned()
                .unwrap_or(FenceRead::Missing);
            if let FenceRead::Corrupt(_) = read {
                warn!(namespace, machine_id = machine_id.get(), key = %keys::fence(&ns, machine_id), "releasing a machine id whose fence is unreadable: the key is left as it is, so the machine id stays out of use until it is repaired");
            }
            if let Some(fence) =
                released_fence(floor, last_used.get(&machine_id).copied(), &read, now)
            {
                ops.push(TxnOp::put(
                    keys::fence(&ns, machine_id),
                    fence.get().to_string(),
                    None,
                ));
            }
            ops.push(TxnOp::delete(hk, None));
        }
        ops.push(TxnOp::delete(keys::requester(&ns, &requester.key()), None));
        ops.push(TxnOp::delete(keys::token(&ns, &requester.key()), None));
        // The description (and an API key holding) are on the lease, which
        // is revoked below: with 63 machine ids this transaction already
        // has etcd's 128 operations.
        let txn = Txn::new().when(guard).and_then(ops);
        let resp = self
            .endpoints
            .txn("requester release txn", self.timeout, txn)
            .await?;
        // The holder asked to let go, so its lease goes either way: when the
        // guard failed (a key deleted by hand, say), revoking drops what is
        // left and keeps every fence where it was.
        self.revoke(record.lease_id).await;
        if !resp.succeeded() {
            return Ok(0);
        }
        info!(
            namespace,
            requester = %requester.tag(),
            released = record.ids.len(),
            "requester released its machine ids"
        );
        Ok(record.ids.len() as u32)
    }

    /// Counts the machine ids of this deployment's range in a namespace;
    /// returns the counts and the range.
    async fn capacity(
        &mut self,
        namespace: &str,
    ) -> Result<(Capacity, std::ops::Range<u32>), StoreError> {
        let layout = self.layout(namespace).await?;
        let range = self.range_in(&layout);
        let mut reader = super::super::CapacityReader {
            endpoints: self.endpoints.clone(),
            namespace: namespace.to_owned(),
            range: range.clone(),
            timeout: self.timeout,
        };
        Ok((reader.read().await?, range))
    }

    /// Whether `requester`'s lease in `namespace` still stands, for the
    /// caller presenting its `token`: like every call that acts on a lease it
    /// reads the requester's record and checks the token first
    /// ([`StoreError::TokenRefused`] when it holds machine ids and the token
    /// is missing or wrong, with nothing else read). Then by reads only (the
    /// one write: marking the namespace rolled back when etcd shows a
    /// restore). `incarnation` 0 and an empty `machine_ids` skip those
    /// comparisons. Errors only when etcd does not answer or a record is
    /// unreadable.
    async fn check(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        token: Option<&LeaseToken>,
        incarnation: u64,
        machine_ids: &[u32],
    ) -> Result<LeaseCheck, StoreError> {
        let held = self.authorized(namespace, requester, token).await?;
        if let Err(gone) = self.standing(namespace, incarnation).await? {
            return Ok(gone);
        }
        let Some(held) = held else {
            return Ok(LeaseCheck::LeaseGone);
        };
        if !machine_ids.is_empty() {
            let mut asked: Vec<u32> = machine_ids.to_vec();
            let mut have: Vec<u32> = held.ids.iter().map(|(id, _)| u32::from(id.get())).collect();
            asked.sort_unstable();
            have.sort_unstable();
            if asked != have {
                return Ok(LeaseCheck::LeaseGone);
            }
        }
        // Every holder key still names this requester on its lease (one
        // read-only transaction: no raft entry).
        let holder = keys::requester_holder(&requester.key());
        let gets: Vec<TxnOp> = held
            .ids
            .iter()
            .map(|(id, _)| TxnOp::get(keys::holder(namespace, *id), None))
            .collect();
        let resp = self
            .endpoints
            .txn("check holders", self.timeout, Txn::new().and_then(gets))
            .await?;
        let intact = resp.op_responses().into_iter().all(|r| match r {
            TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .is_some_and(|kv| kv.value() == holder.as_bytes() && kv.lease() == held.lease_id),
            _ => false,
        });
        if !intact {
            return Ok(LeaseCheck::LeaseGone);
        }
        // Unlike `remaining`, an etcd failure is an error here, never "gone".
        let lease_id = held.lease_id;
        let ttl = self
            .endpoints
            .call("lease ttl", self.timeout, |mut c| async move {
                c.lease_time_to_live(lease_id, None).await
            })
            .await?
            .ttl();
        match u64::try_from(ttl) {
            Ok(secs) if secs > 0 => Ok(LeaseCheck::Valid {
                remaining: Duration::from_secs(secs),
            }),
            _ => Ok(LeaseCheck::LeaseGone),
        }
    }
}
