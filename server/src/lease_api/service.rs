//! `LeaseService`: the Lease API's gRPC handler (Acquire, Renew, Release,
//! Check, Capacity, Version) over a [`RequesterStore`]: etcd's
//! [`RequesterLeases`] in the server, a double of the trait in the unit
//! tests (`tests`).
//!
//! Requesters appear in logs only as their tag (12 hex digits of the SHA-256
//! of their identity) with the caller's network address; lease tokens never
//! appear. Client clocks are judged on every Acquire (a clock behind or ahead
//! of the server's by more than the threshold is refused before anything is
//! claimed) but recorded only from requesters the server knows: a Renew or
//! Acquire retry that presented the lease token of machine ids it holds.
//! Those land, clamped to a day, in the skew histogram and in a [`SkewBook`]
//! in memory, whose counts of skewed requesters the alerts watch; etcd is
//! never written for a clock. Check neither judges nor records a clock.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use snowkeep_client::{Layout, MachineId, Millis, SharedClock};
use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status};
use tracing::warn;

use super::config::LeaseApiConfig;
use super::convert;
use crate::auth::KeyScope;
use crate::metrics as m;
use crate::service::convert::capacity_to_pb;
use crate::service::status::ApiError;
use crate::service::{Reach, StoreAccess};
use snowkeep_core::claim::StoreError;
use snowkeep_core::lease::records::{
    KeyQuota, Renewal, RequesterAbout, RequesterGrant, RequesterId, RequesterStore,
    MAX_REQUESTER_IDS,
};
use snowkeep_core::lease::skew::{
    self, SkewBook, SkewCall, SkewDirection, SkewVerdict, SKEW_BOOK_CAPACITY,
};
use snowkeep_etcd::requesters::RequesterLeases;

/// How often requesters whose lease ended leave the [`SkewBook`] (and its
/// counts), when no call does it first.
const SKEW_SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// What the handler asks of its store: a [`RequesterStore`] it can clone
/// for each call and share between the server's tasks.
pub trait LeaseStore: RequesterStore + Clone + Send + Sync + 'static {}

impl<S: RequesterStore + Clone + Send + Sync + 'static> LeaseStore for S {}

/// Serves `snowkeep.v1.LeaseService` over the requester store `S`
/// (etcd's [`RequesterLeases`] unless a test names another).
pub struct LeaseHandler<S = RequesterLeases> {
    /// Where the store is; the Lease API needs etcd.
    access: Arc<dyn Reach<S>>,
    config: LeaseApiConfig,
    clock: SharedClock,
    /// The last skew of each known requester.
    skews: Arc<Mutex<SkewBook>>,
}

impl<S> Clone for LeaseHandler<S> {
    fn clone(&self) -> Self {
        Self {
            access: Arc::clone(&self.access),
            config: self.config,
            clock: self.clock.clone(),
            skews: Arc::clone(&self.skews),
        }
    }
}

impl LeaseHandler {
    /// Creates the handler on the server's store. Inside a tokio runtime it
    /// also starts the task that drops ended leases from the skew counts
    /// every 30 s; the task ends with the last clone of the handler.
    pub fn new(access: StoreAccess, config: LeaseApiConfig, clock: SharedClock) -> Self {
        Self::reaching(access, config, clock)
    }
}

impl<S: LeaseStore> LeaseHandler<S> {
    /// Creates the handler on the store `access` reaches, as
    /// [`LeaseHandler::new`] does on the server's.
    pub fn reaching(
        access: impl Reach<S> + 'static,
        config: LeaseApiConfig,
        clock: SharedClock,
    ) -> Self {
        let skews = Arc::new(Mutex::new(SkewBook::new(SKEW_BOOK_CAPACITY)));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let book = Arc::downgrade(&skews);
            let clock = clock.clone();
            let threshold = config.skew_threshold;
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(SKEW_SWEEP_INTERVAL);
                loop {
                    tick.tick().await;
                    let Some(book) = book.upgrade() else { return };
                    let mut book = lock(&book);
                    let ended = book.expire(clock.now());
                    publish(&book, ended, threshold);
                }
            });
        }
        Self {
            access: Arc::new(access),
            config,
            clock,
            skews,
        }
    }

    /// The clock that stamps answers and audit events.
    pub(super) fn clock(&self) -> &SharedClock {
        &self.clock
    }

    fn store(&self) -> Result<S, ApiError> {
        match self.access.reach()? {
            Some(store) => Ok(store),
            None => Err(ApiError::LeaseApiNeedsEtcd),
        }
    }

    /// Checks a requester call's identity and namespace and reads the
    /// namespace's layout once: its NOT_FOUND comes before anything is
    /// recorded for an unknown namespace. Returns the requester's id, the
    /// store and the layout.
    async fn open(
        &self,
        requester: Option<&pb::Requester>,
        namespace: &str,
    ) -> Result<(RequesterId, S, Layout), ApiError> {
        let requester = convert::requester_id(requester)?;
        convert::check_namespace(namespace)?;
        let mut store = self.store()?;
        let layout = store.layout(namespace).await.map_err(ApiError::Store)?;
        Ok((requester, store, layout))
    }

    /// Server − client clock, ms.
    fn skew_ms(&self, client_time_unix_ms: u64) -> i64 {
        let server = i64::try_from(self.clock.unix_ms()).unwrap_or(i64::MAX);
        server.saturating_sub(i64::try_from(client_time_unix_ms).unwrap_or(i64::MAX))
    }

    /// Refuses an Acquire from a client whose clock is off the server's by
    /// more than the threshold, either way, before anything is claimed.
    /// Records nothing: the requester is not known yet.
    fn refuse_skewed_acquire(
        &self,
        namespace: &str,
        requester: &RequesterId,
        peer: Option<SocketAddr>,
        client_time_unix_ms: Option<u64>,
    ) -> Result<(), ApiError> {
        let Some(client) = client_time_unix_ms else {
            return Ok(());
        };
        let skew_ms = self.skew_ms(client);
        if skew::judge(skew_ms, self.config.skew_threshold, SkewCall::Acquire)
            != SkewVerdict::Reject
        {
            return Ok(());
        }
        let direction = SkewDirection::of(skew_ms);
        metrics::counter!(m::CLOCK_SKEW_REJECTIONS_TOTAL).increment(1);
        warn!(namespace, requester = %requester.tag(), peer = %addr(peer), skew_ms, threshold = ?self.config.skew_threshold, "refused Acquire: client clock {direction} the server by more than the threshold");
        Err(ApiError::ClientClockSkew {
            skew: skew::magnitude(skew_ms),
            direction,
            threshold: self.config.skew_threshold,
        })
    }

    /// Records (clamped) and judges the clock of a requester the server
    /// knows: `grant` came from a call that presented the lease token of
    /// machine ids it holds. Anyone else's clock is ignored. Only ever warns
    /// (judged as for a Renew): the call was served.
    fn note_skew(
        &self,
        namespace: &str,
        requester: &RequesterId,
        peer: Option<SocketAddr>,
        client_time_unix_ms: Option<u64>,
        grant: &RequesterGrant,
    ) {
        let (Some(client), true) = (client_time_unix_ms, grant.known) else {
            return;
        };
        let skew_ms = m::record_skew(namespace, m::SkewSource::Client, self.skew_ms(client));
        {
            let now = self.clock.now();
            let mut book = lock(&self.skews);
            let touched = book.record(
                namespace,
                requester.digest(),
                skew_ms,
                now,
                now + grant.duration,
            );
            publish(&book, touched, self.config.skew_threshold);
        }
        if skew::judge(skew_ms, self.config.skew_threshold, SkewCall::Renew) != SkewVerdict::Fine {
            let direction = SkewDirection::of(skew_ms);
            warn!(namespace, requester = %requester.tag(), peer = %addr(peer), skew_ms, threshold = ?self.config.skew_threshold, "client clock skew over half the threshold: client clock {direction} the server");
        }
    }

    /// Forgets a requester that released its machine ids.
    fn forget_skew(&self, namespace: &str, requester: &RequesterId) {
        let mut book = lock(&self.skews);
        if book.forget(namespace, requester.digest()) {
            publish(
                &book,
                BTreeSet::from([namespace.to_owned()]),
                self.config.skew_threshold,
            );
        }
    }

    fn grant_to_pb(&self, grant: RequesterGrant) -> pb::LeaseGrant {
        convert::grant_to_pb(grant, self.clock.unix_ms())
    }

    /// The answer to an Acquire or Renew that granted: notes the caller's
    /// skew (known requesters only), then the grant with the namespace's
    /// incarnation.
    fn answer(
        &self,
        namespace: &str,
        requester: &RequesterId,
        peer: Option<SocketAddr>,
        client_time_unix_ms: Option<u64>,
        grant: RequesterGrant,
        incarnation: u64,
    ) -> Response<pb::LeaseGrant> {
        self.note_skew(namespace, requester, peer, client_time_unix_ms, &grant);
        let mut grant = self.grant_to_pb(grant);
        grant.namespace_incarnation = incarnation;
        Response::new(grant)
    }
}

/// The caller's address for a log line, `-` when unknown.
fn addr(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "-".to_owned(), |p| p.to_string())
}

/// The book, even after a panic elsewhere left its lock poisoned (it holds
/// telemetry only).
fn lock(book: &Mutex<SkewBook>) -> MutexGuard<'_, SkewBook> {
    book.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sets the skewed-requester counts of `namespaces` from `book`.
fn publish(book: &SkewBook, namespaces: BTreeSet<String>, threshold: Duration) {
    for namespace in namespaces {
        let (over_half, over) = book.count(&namespace, threshold);
        m::set_skewed_requesters(&namespace, over_half, over);
    }
}

/// A client time as given: 0 (the proto3 default a client may send without
/// meaning it) is "not given", like an absent field, never the Unix epoch.
fn given_time(client_time_unix_ms: Option<u64>) -> Option<u64> {
    client_time_unix_ms.filter(|&t| t != 0)
}

#[tonic::async_trait]
impl<S: LeaseStore> pb::lease_service_server::LeaseService for LeaseHandler<S> {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::LeaseGrant>, Status> {
        self.audited(request, |r| self.acquire_call(r)).await
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::LeaseGrant>, Status> {
        check_scope(&request, &request.get_ref().namespace)?;
        self.renew_call(request).await
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        self.audited(request, |r| self.release_call(r)).await
    }

    async fn capacity(
        &self,
        request: Request<pb::CapacityRequest>,
    ) -> Result<Response<pb::Capacity>, Status> {
        check_scope(&request, &request.get_ref().namespace)?;
        self.capacity_call(request).await
    }

    async fn version(
        &self,
        request: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        self.version_call(request).await
    }

    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        check_scope(&request, &request.get_ref().namespace)?;
        self.check_call(request).await
    }
}

/// The caller's API key scope; `None` when authentication is off.
fn scope_of<T>(request: &Request<T>) -> Option<&KeyScope> {
    request
        .extensions()
        .get::<std::sync::Arc<KeyScope>>()
        .map(|s| &**s)
}

/// PERMISSION_DENIED when the call's API key (if keys are on) may not use
/// `namespace`.
fn check_scope<T>(request: &Request<T>, namespace: &str) -> Result<(), Status> {
    scope_of(request).map_or(Ok(()), |s| {
        s.check_namespace(namespace)
            .map_err(|denied| Status::permission_denied(denied.to_string()))
    })
}

// The calls themselves; the trait methods above add the key scope checks
// and the audit trail.
impl<S: LeaseStore> LeaseHandler<S> {
    async fn acquire_call(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::LeaseGrant>, Status> {
        let peer = request.remote_addr();
        let key_id = crate::audit::Who::of(request.extensions()).key_id;
        check_scope(&request, &request.get_ref().namespace)?;
        let scope = scope_of(&request).cloned();
        let quota = scope.map(|s| KeyQuota {
            key_id: s.key_id,
            max: s.max_lease_machine_ids,
        });
        let mut req = request.into_inner();
        req.client_time_unix_ms = given_time(req.client_time_unix_ms);
        if req.count == 0 || req.count > MAX_REQUESTER_IDS {
            return Err(ApiError::InvalidLeaseCount {
                got: req.count,
                max: MAX_REQUESTER_IDS,
            }
            .into());
        }
        let token = convert::lease_token(&req.lease_token)?;
        let (requester, mut store, layout) =
            self.open(req.requester.as_ref(), &req.namespace).await?;
        let shaped = layout.time_unit_ms() != 1 || layout.total_bits() != 63;
        if shaped && !req.supports_layout_shapes {
            return Err(ApiError::OldClientLayout {
                layout: layout.to_string(),
                unit: layout.time_unit_ms(),
            }
            .into());
        }
        // Refused (FAILED_PRECONDITION) while etcd shows it lost writes, and
        // (UNAVAILABLE) while a confirmed floor is further than a claim waits.
        let incarnation = store.admit(&req.namespace).await.map_err(ApiError::Store)?;
        self.refuse_skewed_acquire(&req.namespace, &requester, peer, req.client_time_unix_ms)?;
        let about = RequesterAbout {
            host_id: req
                .requester
                .as_ref()
                .map(|r| r.host_id.clone())
                .unwrap_or_default(),
            pid: req.requester.as_ref().map_or(0, |r| r.pid),
            start_unix_ms: req.requester.as_ref().map_or(0, |r| r.start_unix_ms),
            skew_ms: req.client_time_unix_ms.map(|c| self.skew_ms(c)),
            key_id,
        };
        let grant = store
            .acquire(
                &req.namespace,
                layout,
                &requester,
                req.count,
                self.config.first_lease,
                token.as_ref(),
                quota.as_ref(),
                &about,
            )
            .await
            .map_err(ApiError::Store)?;
        Ok(self.answer(
            &req.namespace,
            &requester,
            peer,
            req.client_time_unix_ms,
            grant,
            incarnation,
        ))
    }

    async fn renew_call(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::LeaseGrant>, Status> {
        let peer = request.remote_addr();
        let mut req = request.into_inner();
        req.client_time_unix_ms = given_time(req.client_time_unix_ms);
        let token = convert::lease_token(&req.lease_token)?;
        let requester = convert::requester_id(req.requester.as_ref())?;
        convert::check_namespace(&req.namespace)?;
        // The token first; then "lease gone" (an answer, not an error
        // status) when the namespace does not exist, is another incarnation
        // than the holder's, or is rolled back: holders retry errors and
        // would go on issuing up to their fence, a whole renewed lease ahead.
        let renewal = self
            .store()?
            .renew(
                &req.namespace,
                &requester,
                self.config.renewed_lease,
                token.as_ref(),
                req.namespace_incarnation,
            )
            .await
            .map_err(ApiError::Store)?;
        let (grant, incarnation) = match renewal {
            Renewal::Granted { grant, incarnation } => (grant, incarnation),
            Renewal::Gone(gone) => {
                return Ok(Response::new(convert::gone_grant(
                    convert::check_reason(gone),
                    None,
                    self.clock.unix_ms(),
                )))
            }
        };
        Ok(self.answer(
            &req.namespace,
            &requester,
            peer,
            req.client_time_unix_ms,
            grant,
            incarnation,
        ))
    }

    async fn release_call(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        check_scope(&request, &request.get_ref().namespace)?;
        let req = request.into_inner();
        let token = convert::lease_token(&req.lease_token)?;
        let requester = convert::requester_id(req.requester.as_ref())?;
        convert::check_namespace(&req.namespace)?;
        let mut store = self.store()?;
        // The machine ids reported are checked against the namespace's
        // layout. A namespace without a record holds nothing to release, as
        // before: the release below answers 0.
        let layout = if req.last_used_ms.is_empty() {
            None
        } else {
            match store.layout(&req.namespace).await {
                Ok(layout) => Some(layout),
                Err(StoreError::UnknownNamespace { .. }) => None,
                Err(e) => return Err(ApiError::Store(e).into()),
            }
        };
        let (max, machine_bits) = layout.map_or((u32::from(u16::MAX), 16), |l| {
            (l.machine_id_count() - 1, l.machine_bits())
        });
        let mut last_used = HashMap::new();
        for (id, ts) in req.last_used_ms {
            let id = u16::try_from(id)
                .ok()
                .filter(|&id| u32::from(id) <= max)
                .ok_or(ApiError::InvalidMachineId {
                    got: id,
                    max,
                    machine_bits,
                })?;
            last_used.insert(MachineId(id), Millis(ts));
        }
        let released = store
            .release(
                &req.namespace,
                layout,
                &requester,
                &last_used,
                token.as_ref(),
            )
            .await
            .map_err(ApiError::Store)?;
        if released > 0 {
            self.forget_skew(&req.namespace, &requester);
        }
        Ok(Response::new(pb::ReleaseResponse { released }))
    }

    async fn capacity_call(
        &self,
        request: Request<pb::CapacityRequest>,
    ) -> Result<Response<pb::Capacity>, Status> {
        let namespace = request.into_inner().namespace;
        convert::check_namespace(&namespace)?;
        let mut store = self.store()?;
        let (capacity, range) = store.capacity(&namespace).await.map_err(ApiError::Store)?;
        Ok(Response::new(capacity_to_pb(&namespace, capacity, range)))
    }

    async fn version_call(
        &self,
        _request: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        Ok(Response::new(pb::VersionResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            api: "snowkeep.v1".to_owned(),
        }))
    }

    /// Read-only (but for marking a namespace found restored) and grants
    /// nothing: the token is checked first, and the caller's clock is neither
    /// judged nor recorded.
    async fn check_call(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let req = request.into_inner();
        let token = convert::lease_token(&req.lease_token)?;
        let requester = convert::requester_id(req.requester.as_ref())?;
        convert::check_namespace(&req.namespace)?;
        let check = self
            .store()?
            .check(
                &req.namespace,
                &requester,
                token.as_ref(),
                req.namespace_incarnation,
                &req.machine_ids,
            )
            .await
            .map_err(ApiError::Store)?;
        Ok(Response::new(convert::check_to_pb(check)))
    }
}

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
