//! `LeaseService`: the embedded generators' lease API (spec/002's
//! Alloc/Renew/Remove/remaining-count/version) over [`RequesterLeases`].

use std::collections::HashMap;
use std::time::Duration;

use snowkeep_client::{Layout, MachineId, Millis, SharedClock};
use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status};
use tracing::warn;

use super::convert;
use super::status::ApiError;
use super::StoreAccess;
use crate::config::LeaseApiConfig;
use crate::etcd::requesters::{RequesterGrant, RequesterLeases, MAX_REQUESTER_IDS};
use crate::lease::skew::{self, SkewCall, SkewDirection, SkewVerdict};
use crate::lease::LeaseError;
use crate::metrics as m;

/// How long the last skew seen from a requester is kept beyond its lease
/// (spec/002: lease duration + grace).
const SKEW_RECORD_GRACE: Duration = Duration::from_secs(600);

/// Serves `snowkeep.v1.LeaseService`.
#[derive(Clone)]
pub struct LeaseHandler {
    /// The store; the Lease API needs etcd.
    access: StoreAccess,
    config: LeaseApiConfig,
    clock: SharedClock,
}

impl LeaseHandler {
    /// Creates the handler.
    pub fn new(access: StoreAccess, config: LeaseApiConfig, clock: SharedClock) -> Self {
        Self {
            access,
            config,
            clock,
        }
    }

    fn leases(&self) -> Result<RequesterLeases, ApiError> {
        match self.access.etcd_handles()? {
            Some((_, leases)) => Ok(leases),
            None => Err(ApiError::LeaseApiNeedsEtcd),
        }
    }

    /// Checks a requester call's identity and namespace and reads the
    /// namespace's layout once: its NOT_FOUND comes before anything is
    /// recorded for an unknown namespace. Returns the requester's key, the
    /// store and the layout.
    async fn open(
        &self,
        requester: Option<&pb::Requester>,
        namespace: &str,
    ) -> Result<(String, RequesterLeases, Layout), ApiError> {
        let requester = convert::requester_key(requester)?;
        convert::check_namespace(namespace)?;
        let mut leases = self.leases()?;
        let layout = leases.layout(namespace).await.map_err(ApiError::Lease)?;
        Ok((requester, leases, layout))
    }

    /// Judges and records the client's clock skew; `Err` when `call` must be
    /// refused (an Acquire from a clock off by more than the threshold, either way).
    async fn check_skew(
        &self,
        leases: &mut RequesterLeases,
        namespace: &str,
        requester: &str,
        client_time_unix_ms: Option<u64>,
        call: SkewCall,
    ) -> Result<(), ApiError> {
        let Some(client) = client_time_unix_ms else {
            return Ok(());
        };
        let server = self.clock.unix_ms();
        let skew_ms =
            i64::try_from(server).unwrap_or(i64::MAX) - i64::try_from(client).unwrap_or(i64::MAX);
        m::record_skew(namespace, m::SkewSource::Client, skew_ms);
        leases
            // Kept a first lease + grace at most, whatever the call, so a flood
            // of calls from unknown requesters cannot pile up 48 h leases.
            .record_skew(
                namespace,
                requester,
                skew_ms,
                self.config.first_lease + SKEW_RECORD_GRACE,
            )
            .await;
        let direction = SkewDirection::of(skew_ms);
        match skew::judge(skew_ms, self.config.skew_threshold, call) {
            SkewVerdict::Fine => Ok(()),
            SkewVerdict::Warn => {
                warn!(namespace, requester, skew_ms, threshold = ?self.config.skew_threshold, "client clock skew over half the threshold");
                Ok(())
            }
            SkewVerdict::Reject => {
                metrics::counter!(m::CLOCK_SKEW_REJECTIONS_TOTAL).increment(1);
                warn!(namespace, requester, skew_ms, threshold = ?self.config.skew_threshold, "refused Acquire: client clock {direction} the server by more than the threshold");
                Err(ApiError::ClientClockSkew {
                    skew: skew::magnitude(skew_ms),
                    direction,
                    threshold: self.config.skew_threshold,
                })
            }
        }
    }

    fn grant_to_pb(&self, grant: RequesterGrant) -> pb::LeaseGrant {
        convert::grant_to_pb(grant, self.clock.unix_ms())
    }
}

#[tonic::async_trait]
impl pb::lease_service_server::LeaseService for LeaseHandler {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::LeaseGrant>, Status> {
        let req = request.into_inner();
        if req.count == 0 || req.count > MAX_REQUESTER_IDS {
            return Err(ApiError::InvalidLeaseCount {
                got: req.count,
                max: MAX_REQUESTER_IDS,
            }
            .into());
        }
        let (requester, mut leases, layout) =
            self.open(req.requester.as_ref(), &req.namespace).await?;
        // Refused (FAILED_PRECONDITION) while etcd shows it lost writes, and
        // (UNAVAILABLE) while a confirmed floor is further than a claim waits.
        let record = leases
            .namespace(&req.namespace)
            .await
            .map_err(ApiError::Lease)?;
        leases
            .check_floor(&req.namespace, &record)
            .map_err(ApiError::Lease)?;
        let incarnation = record.incarnation;
        self.check_skew(
            &mut leases,
            &req.namespace,
            &requester,
            req.client_time_unix_ms,
            SkewCall::Acquire,
        )
        .await?;
        let grant = leases
            .acquire(
                &req.namespace,
                layout,
                &requester,
                req.count,
                self.config.first_lease,
            )
            .await
            .map_err(ApiError::Lease)?;
        let mut grant = self.grant_to_pb(grant);
        grant.namespace_incarnation = incarnation;
        Ok(Response::new(grant))
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::LeaseGrant>, Status> {
        let req = request.into_inner();
        let incarnation = match self.renew_standing(&req).await? {
            Ok(incarnation) => incarnation,
            Err(gone) => return Ok(Response::new(gone)),
        };
        let (requester, mut leases, layout) =
            self.open(req.requester.as_ref(), &req.namespace).await?;
        self.check_skew(
            &mut leases,
            &req.namespace,
            &requester,
            req.client_time_unix_ms,
            SkewCall::Renew,
        )
        .await?;
        let grant = leases
            .renew(
                &req.namespace,
                layout,
                &requester,
                self.config.renewed_lease,
            )
            .await
            .map_err(ApiError::Lease)?;
        let mut grant = self.grant_to_pb(grant);
        grant.namespace_incarnation = incarnation;
        Ok(Response::new(grant))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let req = request.into_inner();
        let requester = convert::requester_key(req.requester.as_ref())?;
        convert::check_namespace(&req.namespace)?;
        let mut last_used = HashMap::new();
        for (id, ts) in req.last_used_ms {
            let id = u16::try_from(id).map_err(|_| ApiError::InvalidMachineId { got: id })?;
            last_used.insert(MachineId(id), Millis(ts));
        }
        let released = self
            .leases()?
            .release(&req.namespace, &requester, &last_used)
            .await
            .map_err(ApiError::Lease)?;
        Ok(Response::new(pb::ReleaseResponse { released }))
    }

    async fn capacity(
        &self,
        request: Request<pb::CapacityRequest>,
    ) -> Result<Response<pb::Capacity>, Status> {
        let namespace = request.into_inner().namespace;
        convert::check_namespace(&namespace)?;
        let mut leases = self.leases()?;
        let (capacity, range) = leases.capacity(&namespace).await.map_err(ApiError::Lease)?;
        Ok(Response::new(convert::capacity_to_pb(
            &namespace, capacity, range,
        )))
    }

    async fn version(
        &self,
        _request: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        Ok(Response::new(pb::VersionResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            api: "snowkeep.v1".to_owned(),
        }))
    }

    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let req = request.into_inner();
        let requester = convert::requester_key(req.requester.as_ref())?;
        convert::check_namespace(&req.namespace)?;
        let check = self
            .leases()?
            .check(
                &req.namespace,
                &requester,
                req.namespace_incarnation,
                &req.machine_ids,
            )
            .await
            .map_err(ApiError::Lease)?;
        Ok(Response::new(convert::check_to_pb(check)))
    }
}

impl LeaseHandler {
    /// Before a Renew: the namespace's incarnation when the lease can stand,
    /// or the answer "lease gone" when the namespace does not exist, is
    /// another incarnation than the holder's, or is rolled back. An answer,
    /// not an error status: holders retry errors and would go on issuing up
    /// to their fence, a whole renewed lease ahead.
    async fn renew_standing(
        &self,
        req: &pb::RenewRequest,
    ) -> Result<Result<u64, pb::LeaseGrant>, ApiError> {
        convert::requester_key(req.requester.as_ref())?;
        convert::check_namespace(&req.namespace)?;
        let gone = |reason| Err(convert::gone_grant(reason, None, self.clock.unix_ms()));
        match self.leases()?.namespace(&req.namespace).await {
            Ok(record)
                if req.namespace_incarnation != 0
                    && record.incarnation != 0
                    && req.namespace_incarnation != record.incarnation =>
            {
                Ok(gone(pb::LeaseCheckReason::NamespaceGone))
            }
            Ok(record) => Ok(Ok(record.incarnation)),
            Err(LeaseError::UnknownNamespace { .. }) => {
                Ok(gone(pb::LeaseCheckReason::NamespaceGone))
            }
            Err(LeaseError::NamespaceRolledBack { .. }) => {
                Ok(gone(pb::LeaseCheckReason::RolledBack))
            }
            Err(e) => Err(ApiError::Lease(e)),
        }
    }
}
