//! A new requester's grant: the claim of its machine ids, then its fences,
//! record, token and description in one transaction; and the count of an
//! API key's holdings.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use snowkeep_client::{Layout, Millis};
use tracing::{info, warn};

use super::super::keys::{self, encode_record, quoted};
use super::super::pool::ClaimReads;
use super::super::{claim_ids, ClaimRequest};
use super::{got, RequesterLeases};
use snowkeep_core::claim::{HeldId, StoreError};
use snowkeep_core::lease::records::{
    KeyQuota, LeaseToken, RequesterAbout, RequesterId, MAX_REQUESTER_IDS,
};
use snowkeep_core::text::hex;

/// How one claim of a new requester's machine ids ended
/// ([`RequesterLeases::claim_new`]).
pub(super) enum NewClaim {
    /// Granted: the machine ids and the new lease token.
    Granted(Vec<HeldId>, LeaseToken),
    /// Another holding of the API key was written since the count: count
    /// again.
    QuotaRaced,
    /// Another grant of the requester was committed first (or an ended
    /// grant's keys were in the way, now revoked): read its record again.
    RequesterRaced,
}

impl RequesterLeases {
    /// One claim of a new requester's machine ids: a lease, the claim
    /// transactions, then the fences, record, token, description (and, with
    /// a quota, the key's holding) in one transaction, which commits only
    /// while the requester has no record, token (or holding of the key):
    /// each put would replace another grant's and leave that grant's machine
    /// ids held and counted nowhere. [`NewClaim::QuotaRaced`] when another
    /// holding of the key was written since `counted`'s revision,
    /// [`NewClaim::RequesterRaced`] when another grant of the requester was
    /// committed first (or keys of an ended grant were still there: their
    /// lease is revoked); nothing is left claimed then, nor on an error.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim_new(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &RequesterId,
        count: u32,
        duration: Duration,
        counted: Option<(&KeyQuota, i64)>,
        about: &RequesterAbout,
    ) -> Result<NewClaim, StoreError> {
        let lease_id = self.grant_lease(duration).await?;
        let held = self
            .claim_ids_on(namespace, layout, requester, count, lease_id)
            .await?;
        let fence = self.fence_for(&layout, duration);
        let held: Vec<HeldId> = held
            .into_iter()
            .map(|h| HeldId {
                fence: fence.max(h.floor),
                ..h
            })
            .collect();
        let token = LeaseToken::generate();
        let grant = Grant {
            namespace,
            requester,
            lease_id,
            held: &held,
            token: &token,
            counted,
        };
        let txn = grant.txn(about);
        let resp = self
            .endpoints
            .txn("requester fence txn", self.timeout, txn)
            .await;
        let r = match resp {
            Ok(r) if r.succeeded() => return Ok(NewClaim::Granted(held, token)),
            Ok(r) => r,
            Err(e) => {
                // Had the transaction committed before the answer was
                // lost, every key of the grant is on this claim's lease:
                // revoking it takes back a grant nobody was told about.
                self.revoke(lease_id).await;
                return Err(e);
            }
        };
        match self.refused(&grant, &r).await? {
            Some(raced) => Ok(raced),
            None => Ok(NewClaim::Granted(held, token)),
        }
    }

    /// Claims `count` machine ids of this deployment's range for
    /// `requester` on `lease_id`; on an error the lease is revoked.
    async fn claim_ids_on(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &RequesterId,
        count: u32,
        lease_id: i64,
    ) -> Result<Vec<HeldId>, StoreError> {
        let holder = keys::requester_holder(&requester.key());
        let now = self.now(&layout);
        let (absent_floor, max_floor) =
            ClaimRequest::floors(now, self.fence_horizon, self.max_fence_wait);
        let want = ClaimRequest {
            namespace,
            holder: &holder,
            range: self.range_in(&layout),
            count: count as usize,
            lease_id,
            now,
            absent_floor,
            max_floor,
            max_own_floor: max_floor,
            prefer: &[],
            take_own: false,
            known: &[],
            index: false,
            // The grant transaction writes the fence it grants.
            created_fence: Millis(0),
            peer: None,
        };
        let claimed = claim_ids(
            &self.endpoints,
            self.timeout,
            want,
            &mut ClaimReads::default(),
        )
        .await;
        match claimed {
            Ok(claimed) => Ok(claimed.held),
            Err(e) => {
                self.revoke(lease_id).await;
                Err(e)
            }
        }
    }

    /// What a refused grant transaction `r` of `grant` means: `None` when it
    /// is a retry that found its own first attempt committed (granted), else
    /// the race it lost, once this claim's lease is revoked (and an ended
    /// grant's leftover lease too); [`StoreError::LeaseLost`] when neither
    /// explains it.
    async fn refused(
        &mut self,
        grant: &Grant<'_>,
        r: &etcd_client::TxnResponse,
    ) -> Result<Option<NewClaim>, StoreError> {
        let (namespace, requester, lease_id) = (grant.namespace, grant.requester, grant.lease_id);
        let counted = grant.counted;
        let ops = r.op_responses();
        match got(&ops, 0) {
            // A retry of this transaction (on another endpoint) after its
            // first attempt committed and the answer was lost.
            Some((_, lease)) if lease == lease_id => return Ok(None),
            // Another Acquire of this requester was granted first.
            Some(_) => {
                self.revoke(lease_id).await;
                info!(namespace, requester = %requester.tag(), "another Acquire of this requester was granted first; gave back this one's claim");
                return Ok(Some(NewClaim::RequesterRaced));
            }
            None => {}
        }
        self.revoke(lease_id).await;
        // No record, but its token (or the key's holding) is still there:
        // what a grant that ended (Release, or a lease declared void) left
        // while its lease's revocation failed or is under way. Nothing of a
        // live grant is on that lease (its record is gone), so revoke it
        // and claim again.
        let leftover = [1, 2]
            .into_iter()
            .filter(|&i| i == 1 || counted.is_some())
            .find_map(|i| got(&ops, i));
        if let Some((_, left)) = leftover.filter(|&(_, left)| left != 0) {
            warn!(namespace, requester = %requester.tag(), lease_id = left, "keys of an ended grant of this requester are still in etcd; revoking their lease");
            self.revoke(left).await;
            return Ok(Some(NewClaim::RequesterRaced));
        }
        let raced = counted.is_some_and(|(_, revision)| {
            ops.iter().skip(3).any(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().iter().any(|kv| kv.mod_revision() > revision),
                _ => false,
            })
        });
        if raced {
            return Ok(Some(NewClaim::QuotaRaced));
        }
        Err(StoreError::LeaseLost {
            reason: snowkeep_core::claim::LossReason::HolderChanged,
        })
    }

    /// The revision `quota`'s key's holdings were counted at, when they
    /// leave room for `count` more machine ids;
    /// [`StoreError::KeyQuotaExceeded`] otherwise.
    pub(super) async fn room_for(
        &mut self,
        quota: &KeyQuota,
        count: u32,
    ) -> Result<i64, StoreError> {
        let (held, revision) = self.key_holdings(quota).await?;
        if held.saturating_add(count) > quota.max {
            return Err(StoreError::KeyQuotaExceeded {
                key_id: quota.key_id.clone(),
                held,
                max: quota.max,
                asked: count,
            });
        }
        Ok(revision)
    }

    /// The machine ids `quota`'s key holds through the Lease API now,
    /// cluster-wide, and the revision they were counted at; an unreadable
    /// holding counts as [`MAX_REQUESTER_IDS`] (never under-counted).
    async fn key_holdings(&mut self, quota: &KeyQuota) -> Result<(u32, i64), StoreError> {
        let prefix = keys::key_holds_prefix(&quota.key_id);
        let resp = self
            .endpoints
            .call("count key holdings", self.timeout, |mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let held = resp
            .kvs()
            .iter()
            .map(|kv| {
                std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or_else(|| {
                        warn!(key = %String::from_utf8_lossy(kv.key()), value = %quoted(kv.value()), "unreadable API key holding: counted as {MAX_REQUESTER_IDS} machine ids until its lease ends");
                        MAX_REQUESTER_IDS
                    })
            })
            .fold(0u32, u32::saturating_add);
        Ok((held, revision))
    }
}

/// A new requester's grant as its one transaction writes it.
struct Grant<'a> {
    namespace: &'a str,
    requester: &'a RequesterId,
    /// The etcd lease the claim's holder keys are on.
    lease_id: i64,
    /// The machine ids claimed, with their fences.
    held: &'a [HeldId],
    token: &'a LeaseToken,
    /// The API key's quota and the revision its holdings were counted at.
    counted: Option<(&'a KeyQuota, i64)>,
}

impl Grant<'_> {
    /// The fences, the record, token and description (`about`) on the
    /// lease, and with a quota the key's holding: guarded by every holder key
    /// being on the lease and the requester having no record, token (nor
    /// holding, and no holding of the key written since the count). The
    /// failure branch reads the record, the token, then the holding and the
    /// key's holdings.
    fn txn(&self, about: &RequesterAbout) -> Txn {
        let (held, lease_id, counted) = (self.held, self.lease_id, self.counted);
        let ns = self.namespace.to_owned();
        let on_lease = || Some(PutOptions::new().with_lease(lease_id));
        let mut ops: Vec<TxnOp> = held
            .iter()
            .map(|h| {
                TxnOp::put(
                    keys::fence(&ns, h.machine_id),
                    h.fence.get().to_string(),
                    None,
                )
            })
            .collect();
        let key_id = counted.map(|(q, _)| q.key_id.as_str());
        let rk = keys::requester(&ns, &self.requester.key());
        let tk = keys::token(&ns, &self.requester.key());
        ops.push(TxnOp::put(
            rk.clone(),
            encode_record(held, key_id),
            on_lease(),
        ));
        ops.push(TxnOp::put(
            tk.clone(),
            hex(&self.token.digest()),
            on_lease(),
        ));
        ops.push(TxnOp::put(
            keys::about(&ns, &self.requester.key()),
            serde_json::to_vec(about).unwrap_or_default(),
            on_lease(),
        ));
        let absent = |key: &str| Compare::version(key, CompareOp::Equal, 0);
        let mut guard: Vec<Compare> = held
            .iter()
            .map(|h| Compare::lease(keys::holder(&ns, h.machine_id), CompareOp::Equal, lease_id))
            .collect();
        guard.push(absent(&rk));
        guard.push(absent(&tk));
        // The failure branch reads what the guard is about (compares are
        // free; these gets are the else branch's only operations): the
        // record and token, then the key's holding and holdings.
        let mut on_failure = vec![TxnOp::get(rk, None), TxnOp::get(tk, None)];
        if let Some((q, revision)) = counted {
            let prefix = keys::key_holds_prefix(&q.key_id);
            let hold = keys::key_hold(&q.key_id, &ns, &self.requester.key());
            ops.push(TxnOp::put(hold.clone(), held.len().to_string(), on_lease()));
            guard.push(absent(&hold));
            guard.push(
                Compare::mod_revision(prefix.clone(), CompareOp::Less, revision + 1).with_prefix(),
            );
            on_failure.push(TxnOp::get(hold, None));
            on_failure.push(TxnOp::get(prefix, Some(GetOptions::new().with_prefix())));
        }
        Txn::new().when(guard).and_then(ops).or_else(on_failure)
    }
}
