//! The only module that talks to etcd: connect, layout check, claim, fence,
//! keepalive and release, each one etcd request (or transaction) under a
//! timeout, because a hung etcd must never hang the lease loop
//! (ECOSYSTEM-NOTES §5: a SIGSTOPped etcd leaves streams silent, not failed).

pub mod keys;

use std::ops::Range;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
    PutOptions, Txn, TxnOp, TxnOpResponse,
};
use snowkeep_client::{Layout, MachineId, Millis, SharedClock};
use tracing::{debug, info, warn};

use crate::lease::claim::{rank_candidates, CandidateKind, PoolView};
use crate::lease::{Claim, LeaseError, LossReason};

/// Candidates tried per read of the pool before reading it again.
const CANDIDATES_PER_ROUND: usize = 8;
/// Pool reads per claim before giving up on this attempt (the caller retries).
const CLAIM_ROUNDS: usize = 16;

/// Settings of the etcd store.
#[derive(Debug, Clone)]
pub struct EtcdSettings {
    /// Client URLs, `http://host:port`.
    pub endpoints: Vec<String>,
    /// The namespace.
    pub namespace: String,
    /// This instance's id (the holder key's value).
    pub instance_id: String,
    /// etcd lease TTL (whole seconds, at least 2).
    pub lease_ttl: Duration,
    /// Machine ids this instance may claim, `[start, end)`.
    pub machine_id_range: Range<u32>,
    /// Timeout of one etcd request.
    pub request_timeout: Duration,
}

/// Machine-id leases kept in etcd.
pub struct EtcdStore {
    client: Client,
    settings: EtcdSettings,
    clock: SharedClock,
    layout: Layout,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Runs one etcd request under the timeout.
async fn timed<T>(
    op: &'static str,
    after: Duration,
    fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LeaseError> {
    match tokio::time::timeout(after, fut).await {
        Ok(r) => r.map_err(LeaseError::from),
        Err(_) => Err(LeaseError::Timeout { op, after }),
    }
}

fn parse_fence(key: &str, value: &[u8]) -> Result<Millis, LeaseError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Millis)
        .ok_or_else(|| LeaseError::Corrupt {
            key: key.to_owned(),
            value: String::from_utf8_lossy(value).into_owned(),
        })
}

impl EtcdStore {
    /// Connects (lazily: etcd-client connects on first use) and checks or
    /// records the namespace's layout. Errors with
    /// [`LeaseError::LayoutMismatch`] when the stored layout differs.
    pub async fn connect(
        settings: EtcdSettings,
        layout: Layout,
        clock: SharedClock,
    ) -> Result<Self, LeaseError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(settings.request_timeout)
            .with_keep_alive(Duration::from_secs(2), settings.request_timeout);
        let client = timed(
            "connect",
            settings.request_timeout,
            Client::connect(&settings.endpoints, Some(options)),
        )
        .await?;
        let mut store = Self {
            client,
            settings,
            clock,
            layout,
            keeper: None,
        };
        store.ensure_layout().await?;
        Ok(store)
    }

    fn ns(&self) -> &str {
        &self.settings.namespace
    }

    async fn ensure_layout(&mut self) -> Result<(), LeaseError> {
        let key = keys::layout(self.ns());
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), self.layout.to_string(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = timed(
            "ensure layout",
            self.settings.request_timeout,
            self.client.txn(txn),
        )
        .await?;
        if resp.succeeded() {
            info!(namespace = %self.ns(), layout = %self.layout, "recorded the namespace layout in etcd");
            return Ok(());
        }
        let stored_text = first_value(&resp).unwrap_or_default();
        let stored: Layout =
            String::from_utf8_lossy(&stored_text)
                .parse()
                .map_err(|_| LeaseError::Corrupt {
                    key: key.clone(),
                    value: String::from_utf8_lossy(&stored_text).into_owned(),
                })?;
        if stored != self.layout {
            return Err(LeaseError::LayoutMismatch {
                namespace: self.ns().to_owned(),
                stored,
                configured: self.layout,
            });
        }
        Ok(())
    }

    async fn read_pool(&mut self) -> Result<PoolView, LeaseError> {
        let timeout = self.settings.request_timeout;
        let prefix = keys::namespace_prefix(self.ns());
        let resp = timed(
            "read pool",
            timeout,
            self.client
                .get(prefix, Some(GetOptions::new().with_prefix())),
        )
        .await?;
        let holder_prefix = keys::holder_prefix(self.ns());
        let fence_prefix = keys::fence_prefix(self.ns());
        let last_prefix = keys::last_holder_prefix(self.ns());
        let mut view = PoolView::default();
        for kv in resp.kvs() {
            if let Some(id) = keys::machine_id_of(kv.key(), &holder_prefix) {
                view.holders
                    .insert(id, String::from_utf8_lossy(kv.value()).into_owned());
            } else if let Some(id) = keys::machine_id_of(kv.key(), &fence_prefix) {
                view.fences
                    .insert(id, parse_fence(&fence_prefix, kv.value())?);
            } else if let Some(id) = keys::machine_id_of(kv.key(), &last_prefix) {
                view.last_holders
                    .insert(id, String::from_utf8_lossy(kv.value()).into_owned());
            }
        }
        Ok(view)
    }

    /// Grants a lease and claims one machine id for it with an atomic
    /// transaction per candidate. The fence returned as the floor is read
    /// *inside* the claiming transaction (DESIGN §2.3).
    pub async fn claim(&mut self) -> Result<Claim, LeaseError> {
        let timeout = self.settings.request_timeout;
        let ttl_secs = i64::try_from(self.settings.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        self.keeper = None;
        let sent = self.clock.now();
        let lease = timed(
            "lease grant",
            timeout,
            self.client.lease_grant(ttl_secs, None),
        )
        .await?;
        let lease_id = lease.id();
        let deadline = sent + Duration::from_secs(u64::try_from(lease.ttl()).unwrap_or(0));
        match self.claim_with_lease(lease_id).await {
            Ok((machine_id, floor)) => {
                info!(namespace = %self.ns(), machine_id = machine_id.get(), lease_id, fence_ms = floor.get(), "claimed machine id");
                Ok(Claim {
                    machine_id,
                    floor,
                    fence: floor,
                    lease_id: Some(lease_id),
                    deadline: Some(deadline),
                })
            }
            Err(e) => {
                // Best effort: an unused lease would expire by itself anyway.
                let _ = timed("lease revoke", timeout, self.client.lease_revoke(lease_id)).await;
                Err(e)
            }
        }
    }

    async fn claim_with_lease(&mut self, lease_id: i64) -> Result<(MachineId, Millis), LeaseError> {
        let timeout = self.settings.request_timeout;
        for round in 0..CLAIM_ROUNDS {
            let view = self.read_pool().await?;
            let now = self
                .layout
                .to_layout_ms(self.clock.unix_ms())
                .unwrap_or_default();
            let candidates = rank_candidates(
                &view,
                self.settings.machine_id_range.clone(),
                &self.settings.instance_id,
                now,
                &mut rand::rng(),
            );
            if candidates.is_empty() {
                let range = &self.settings.machine_id_range;
                return Err(LeaseError::NoFreeMachineId {
                    namespace: self.ns().to_owned(),
                    capacity: range.end - range.start,
                    start: range.start,
                    end: range.end,
                });
            }
            for candidate in candidates.into_iter().take(CANDIDATES_PER_ROUND) {
                let holder = keys::holder(self.ns(), candidate.machine_id);
                let fence = keys::fence(self.ns(), candidate.machine_id);
                let guard = match candidate.kind {
                    CandidateKind::Own => Compare::value(
                        holder.clone(),
                        CompareOp::Equal,
                        self.settings.instance_id.clone(),
                    ),
                    CandidateKind::Free => {
                        Compare::create_revision(holder.clone(), CompareOp::Equal, 0)
                    }
                };
                let txn = Txn::new().when([guard]).and_then([
                    TxnOp::put(
                        holder,
                        self.settings.instance_id.clone(),
                        Some(PutOptions::new().with_lease(lease_id)),
                    ),
                    TxnOp::get(fence.clone(), None),
                ]);
                let resp = timed("claim txn", timeout, self.client.txn(txn)).await?;
                if !resp.succeeded() {
                    debug!(
                        machine_id = candidate.machine_id.get(),
                        round, "claim lost a race, trying the next candidate"
                    );
                    continue;
                }
                let floor = match resp.op_responses().get(1) {
                    Some(TxnOpResponse::Get(get)) => match get.kvs().first() {
                        Some(kv) => parse_fence(&fence, kv.value())?,
                        None => Millis(0),
                    },
                    _ => Millis(0),
                };
                return Ok((candidate.machine_id, floor));
            }
        }
        Err(LeaseError::Timeout {
            op: "claim (every candidate was taken concurrently)",
            after: timeout,
        })
    }

    /// Raises the fence of the claimed machine id to `fence`, guarded by our
    /// lease still owning the holder key. [`LeaseError::LeaseLost`] with
    /// `HolderChanged` when it does not.
    pub async fn advance_fence(&mut self, claim: &Claim, fence: Millis) -> Result<(), LeaseError> {
        let holder = keys::holder(self.ns(), claim.machine_id);
        let txn = Txn::new()
            .when([Compare::lease(
                holder,
                CompareOp::Equal,
                claim.lease_id.unwrap_or(0),
            )])
            .and_then([TxnOp::put(
                keys::fence(self.ns(), claim.machine_id),
                fence.get().to_string(),
                None,
            )]);
        let resp = timed(
            "fence txn",
            self.settings.request_timeout,
            self.client.txn(txn),
        )
        .await?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(LeaseError::LeaseLost {
                reason: LossReason::HolderChanged,
            })
        }
    }

    /// Sends one keepalive and waits for its answer under the request timeout.
    /// Returns the new local deadline: send time + TTL.
    pub async fn renew(&mut self, claim: &Claim) -> Result<Instant, LeaseError> {
        let lease_id = claim.lease_id.unwrap_or(0);
        let timeout = self.settings.request_timeout;
        let sent = self.clock.now();
        let ttl = match self.keeper.as_mut() {
            None => {
                match timed("keepalive", timeout, self.client.lease_keep_alive(lease_id)).await {
                    Ok(pair) => {
                        self.keeper = Some(pair);
                        self.settings.lease_ttl
                    }
                    Err(LeaseError::Etcd(etcd_client::Error::LeaseKeepAliveError(msg)))
                        if msg.contains("not found") =>
                    {
                        return Err(LeaseError::LeaseLost {
                            reason: LossReason::Expired,
                        })
                    }
                    Err(e) => return Err(e),
                }
            }
            Some((keeper, stream)) => {
                let round_trip = async {
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                match tokio::time::timeout(timeout, round_trip).await {
                    Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                        Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(0))
                    }
                    Ok(Ok(Some(_))) => {
                        self.keeper = None;
                        return Err(LeaseError::LeaseLost {
                            reason: LossReason::Expired,
                        });
                    }
                    Ok(Ok(None)) => {
                        // etcd closed the stream: reopen on the next renewal; the
                        // reopening answers whether the lease still exists.
                        self.keeper = None;
                        warn!(lease_id, "etcd closed the keepalive stream");
                        return Err(LeaseError::Timeout {
                            op: "keepalive (stream closed)",
                            after: timeout,
                        });
                    }
                    Ok(Err(e)) => {
                        self.keeper = None;
                        return Err(e.into());
                    }
                    Err(_) => {
                        self.keeper = None;
                        return Err(LeaseError::Timeout {
                            op: "keepalive",
                            after: timeout,
                        });
                    }
                }
            }
        };
        Ok(sent + ttl.min(self.settings.lease_ttl))
    }

    /// Lowers the fence to `last_used` and deletes the holder key in one
    /// transaction guarded by our lease (DESIGN §2.4), then revokes the lease.
    pub async fn release(&mut self, claim: &Claim, last_used: Millis) -> Result<(), LeaseError> {
        let timeout = self.settings.request_timeout;
        let lease_id = claim.lease_id.unwrap_or(0);
        self.keeper = None;
        let holder = keys::holder(self.ns(), claim.machine_id);
        let txn = Txn::new()
            .when([Compare::lease(holder.clone(), CompareOp::Equal, lease_id)])
            .and_then([
                TxnOp::put(
                    keys::fence(self.ns(), claim.machine_id),
                    last_used.get().to_string(),
                    None,
                ),
                TxnOp::put(
                    keys::last_holder(self.ns(), claim.machine_id),
                    self.settings.instance_id.clone(),
                    None,
                ),
                TxnOp::delete(holder, None),
            ]);
        let resp = timed("release txn", timeout, self.client.txn(txn)).await?;
        if !resp.succeeded() {
            warn!(
                machine_id = claim.machine_id.get(),
                "holder key no longer ours at release; fence left as is"
            );
        }
        timed("lease revoke", timeout, self.client.lease_revoke(lease_id)).await?;
        info!(namespace = %self.ns(), machine_id = claim.machine_id.get(), fence_ms = last_used.get(), "released machine id");
        Ok(())
    }

    /// Revokes a lease that is no longer used, best effort.
    pub async fn forget(&mut self, claim: &Claim) {
        self.keeper = None;
        if let Some(lease_id) = claim.lease_id {
            let timeout = self.settings.request_timeout;
            if let Err(e) = timed("lease revoke", timeout, self.client.lease_revoke(lease_id)).await
            {
                debug!(lease_id, error = %e, "could not revoke the lost lease; it expires by itself");
            }
        }
    }
}

fn first_value(resp: &etcd_client::TxnResponse) -> Option<Vec<u8>> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    })
}
