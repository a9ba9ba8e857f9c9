//! The authentication layer: checks each call's API key before any handler
//! runs (see [`super`] for the rules), counts the result in
//! `snowkeep_auth_requests_total`, and hands the handler the key's id
//! (`audit::CallerKey`) and scope (`Arc<KeyScope>`) in the request's
//! extensions. A connection's calls after the first with the same key skip
//! the hash (see [`super::memo`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use futures_util::future::{ready, Either, Ready};

use metrics::Counter;

use snowkeep_client::SharedClock;
use tonic::Status;
use tower::{Layer, Service};

use super::cache::{KeyCache, Verdict};
use super::cluster::{ClusterAuth, Enforcement};
use super::memo::{self, Checked, Verified};
use super::revoke::{self, Revocable};
use crate::audit::CallerKey;
use crate::limits::admission::Keyless;
use crate::limits::calls::{CallKind, Unwritten};
use snowkeep_core::api_key::{Permission, PresentedKey};
use snowkeep_guard::conn_info::{ConnInfo, Memo};

/// What a gRPC service needs of a key: `None` for one that is always open,
/// `Some(None)` for any valid key, `Some(Some(p))` for permission `p`.
fn required(path: &str) -> Option<Option<Permission>> {
    let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
    match service {
        "grpc.health.v1.Health"
        | "grpc.reflection.v1.ServerReflection"
        | "grpc.reflection.v1alpha.ServerReflection" => None,
        "snowkeep.v1.IdService" => Some(Some(Permission::Ids)),
        "snowkeep.v1.LeaseService" => Some(Some(Permission::Lease)),
        "snowkeep.v1.AdminService" => Some(Some(Permission::Admin)),
        // InfoService, and anything else (which then answers UNIMPLEMENTED
        // to a valid key only).
        _ => Some(None),
    }
}

/// The one call open without a key: InfoService.GetInfo, answered with the
/// server's version and clock only ([`Anonymous`]), so servers' peer clock
/// checks work with `--auth on` (a wrong key is still refused).
const GET_INFO: &str = "/snowkeep.v1.InfoService/GetInfo";

/// Marks a GetInfo call made without a key (`--auth on`): the handler
/// answers only the version and the server's clock.
#[derive(Clone, Copy, Debug)]
pub struct Anonymous;

/// The service's name for messages: `snowkeep.v1.IdService` → `IdService`.
fn service_name(path: &str) -> &str {
    let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
    service.rsplit('.').next().unwrap_or(service)
}

fn count(key_id: &str, result: &'static str) {
    metrics::counter!(
        crate::metrics::AUTH_REQUESTS_TOTAL,
        "key_id" => key_id.to_owned(),
        "result" => result
    )
    .increment(1);
}

/// `snowkeep_auth_requests_total{result="ok"}` of each key id, registered on
/// the key's first accepted call: a lookup by labels costs an allocation
/// and a hash in the recorder. A connection's calls count on the handle its
/// kept key holds (see [`super::memo`]). Holds only ids of keys that
/// verified (at most the keys ever created), never an id a caller merely
/// presented.
#[derive(Default)]
struct AcceptedCounts(RwLock<HashMap<String, Counter>>);

impl AcceptedCounts {
    fn handle(&self, key_id: &str) -> Counter {
        if let Some(counter) = self.0.read().unwrap_or_else(|p| p.into_inner()).get(key_id) {
            return counter.clone();
        }
        let mut counts = self.0.write().unwrap_or_else(|p| p.into_inner());
        counts
            .entry(key_id.to_owned())
            .or_insert_with(|| {
                metrics::counter!(
                    crate::metrics::AUTH_REQUESTS_TOTAL,
                    "key_id" => key_id.to_owned(),
                    "result" => "ok"
                )
            })
            .clone()
    }
}

/// Checks API keys while the server enforces the cluster's security mode
/// (lets everything through while it is off, or not read yet: see
/// [`super::cluster`]).
#[derive(Clone)]
pub struct AuthLayer {
    mode: ClusterAuth,
    cache: KeyCache,
    clock: SharedClock,
    /// The server's namespace, the one IdService issues in.
    namespace: Arc<str>,
    accepted: Arc<AcceptedCounts>,
}

impl AuthLayer {
    /// A layer checking keys from `cache` at `clock`'s time while `mode`
    /// enforces them; IdService calls are in `namespace`.
    pub fn new(mode: ClusterAuth, cache: KeyCache, clock: SharedClock, namespace: String) -> Self {
        Self {
            mode,
            cache,
            clock,
            namespace: namespace.into(),
            accepted: Arc::default(),
        }
    }

    /// What the call at `path` with this `authorization` value gets: the
    /// key that verified (its scope to hand on, and the key as presented: a
    /// stream is ended when that key is refused later), or the refusal.
    /// `memo` is the call's connection's, when it has one.
    fn judge(
        &self,
        path: &str,
        authorization: Option<&[u8]>,
        memo: Option<&Memo>,
    ) -> Result<Option<Arc<Verified>>, Status> {
        let Some(needed) = required(path) else {
            return Ok(None);
        };
        let verified = self.authenticate(authorization, memo)?;
        let scope = &verified.scope;
        if let Some(permission) = needed {
            if !scope.has(permission) {
                count(&scope.key_id, "permission_denied");
                return Err(Status::permission_denied(format!(
                    "API key {} lacks the {} permission that {} needs; use a key created with --permission {}",
                    scope.key_id,
                    permission.as_str(),
                    service_name(path),
                    permission.as_str()
                )));
            }
            // The refusal's text is built only for admin calls.
            if let Some(refusal) = (permission == Permission::Admin)
                .then(|| scope.cluster_wide_refusal())
                .flatten()
            {
                // CreateKey refuses such keys; one written by other means
                // (an edited import, a hand-written record) gets nothing.
                count(&scope.key_id, "permission_denied");
                return Err(Status::permission_denied(refusal));
            }
            if permission == Permission::Ids {
                if let Err(denied) = scope.check_namespace(&self.namespace) {
                    count(&scope.key_id, "permission_denied");
                    return Err(Status::permission_denied(denied.to_string()));
                }
            }
        }
        verified
            .accepted
            .get_or_init(|| self.accepted.handle(&verified.scope.key_id))
            .increment(1);
        Ok(Some(verified))
    }

    /// The key `authorization` presents, verified now: the one `memo` keeps
    /// when these are its bytes and no key changed since (see
    /// [`super::memo`]), else checked in full and kept.
    fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        memo: Option<&Memo>,
    ) -> Result<Arc<Verified>, Status> {
        // Before the check, never after (see `KeyCache::generation`).
        let generation = self.cache.generation();
        let now_unix_ms = self.clock.unix_ms();
        if let Some(kept) = memo::recall(memo, authorization, generation, now_unix_ms) {
            return Ok(kept);
        }
        let presented = match PresentedKey::from_authorization(authorization) {
            Ok(p) => p,
            Err(refusal) => {
                count(refusal.key_label(), refusal.result());
                return Err(Status::unauthenticated(refusal.to_string()));
            }
        };
        let (scope, expires_unix_ms) = match self.cache.verify(&presented, now_unix_ms) {
            Verdict::Accepted {
                scope,
                expires_unix_ms,
            } => (scope, expires_unix_ms),
            Verdict::Refused(refusal) => {
                count(refusal.key_label(), refusal.result());
                return Err(Status::unauthenticated(refusal.to_string()));
            }
            Verdict::NotLoaded => {
                count("-", "unavailable");
                return Err(Status::unavailable(
                    "API keys are not loaded from etcd yet (this server has not reached etcd since it started); retry shortly or on another server",
                ));
            }
        };
        let verified = Arc::new(Verified::new(Checked {
            authorization: authorization.unwrap_or_default().into(),
            generation,
            expires_unix_ms,
            scope,
            presented,
        }));
        memo::keep(memo, &verified);
        Ok(verified)
    }
}

impl AuthLayer {
    /// Records a Lease API Acquire or Release that a valid key was refused
    /// (permission or namespace) as an audit event, like the ones the
    /// handler records. Calls without a valid key are not events (an
    /// anonymous flood must not flood the trail); they are counted in
    /// `snowkeep_auth_requests_total{key_id="-"}`.
    fn audit_refusal<R>(
        &self,
        request: &http::Request<R>,
        authorization: Option<&[u8]>,
        status: &Status,
    ) {
        let action = match request.uri().path() {
            "/snowkeep.v1.LeaseService/Acquire" => "lease.acquire",
            "/snowkeep.v1.LeaseService/Release" => "lease.release",
            _ => return,
        };
        let Ok(presented) = PresentedKey::from_authorization(authorization) else {
            return;
        };
        let mut who = crate::audit::Who::of(request.extensions());
        who.key_id = presented.id().to_owned();
        crate::audit::record(crate::audit::AuditEvent {
            unix_ms: self.clock.unix_ms(),
            action,
            who,
            requester: String::new(),
            namespace: String::new(),
            subject: "refused before the Lease API".to_owned(),
            result: format!("{:?}", status.code()),
        });
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`AuthLayer`].
#[derive(Clone)]
pub struct Auth<S> {
    inner: S,
    layer: AuthLayer,
}

/// The refusal of a call that needs a key check before this server has read
/// the cluster's security mode.
const MODE_UNKNOWN: &str = "this server has not read the cluster's security mode from etcd yet, so it cannot tell whether this call needs an API key; retry shortly or on another server";

/// The methods whose request is a stream and that need a key (the streamed
/// import): their request body ends with the call (see `super::revoke`).
fn request_is_stream(path: &str) -> bool {
    path == "/snowkeep.v1.AdminService/ImportStream"
}

/// The future of [`Auth`]: an answer made here (a refusal), the inner
/// call's own future (every unary call, so no box per call), or a stream
/// whose bodies end when its key or the mode says so.
type AuthFuture<F, E> = Either<
    Either<Ready<Result<http::Response<tonic::body::Body>, E>>, F>,
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, E>> + Send>>,
>;

impl<S> Auth<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    /// The inner call's future unchanged.
    fn pass(
        &mut self,
        request: http::Request<tonic::body::Body>,
    ) -> AuthFuture<S::Future, S::Error> {
        Either::Left(Either::Right(self.inner.call(request)))
    }

    /// An answer without calling the inner service.
    fn answer(response: http::Response<tonic::body::Body>) -> AuthFuture<S::Future, S::Error> {
        Either::Left(Either::Left(ready(Ok(response))))
    }

    /// Calls the inner service; a stream (or streamed import) is ended by
    /// what `ending` makes, both its request and its response body. Only a
    /// stream calls `ending`.
    fn call_ended_by(
        &mut self,
        mut request: http::Request<tonic::body::Body>,
        ending: impl Fn(String) -> revoke::Ending,
    ) -> AuthFuture<S::Future, S::Error> {
        if CallKind::of(request.uri().path()) != CallKind::Stream {
            return self.pass(request);
        }
        let path = request.uri().path().to_owned();
        if request_is_stream(&path) {
            let ended = ending(path.clone());
            request = request
                .map(|body| tonic::body::Body::new(revoke::RevocableRequest::new(body, ended)));
        }
        let until = ending(path);
        let response = self.inner.call(request);
        Either::Right(Box::pin(async move {
            let response = response.await?;
            let unwritten = response.extensions().get::<Unwritten>().cloned();
            Ok(response.map(|body| tonic::body::Body::new(Revocable::new(body, until, unwritten))))
        }))
    }

    /// A call while this server does not check keys: open ones pass; others
    /// get UNAVAILABLE before the mode is read (but an anonymous GetInfo) and
    /// end when the mode turns on.
    fn call_unchecked(
        &mut self,
        mut request: http::Request<tonic::body::Body>,
        enforcement: Enforcement,
    ) -> AuthFuture<S::Future, S::Error> {
        let path = request.uri().path();
        if required(path).is_none() {
            return self.pass(request);
        }
        if enforcement == Enforcement::Unknown {
            if path != GET_INFO {
                count("-", "unavailable");
                return Self::answer(Status::unavailable(MODE_UNKNOWN).into_http());
            }
            request.extensions_mut().insert(Anonymous);
        }
        let mode = self.layer.mode.clone();
        self.call_ended_by(request, |method| revoke::mode_turned_on(&mode, method))
    }
}

impl<S> Service<http::Request<tonic::body::Body>> for Auth<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = AuthFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let enforcement = self.layer.mode.enforcement();
        if enforcement != Enforcement::On {
            return self.call_unchecked(request, enforcement);
        }
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if authorization.is_none() && request.uri().path() == GET_INFO {
            count("-", "anonymous");
            request.extensions_mut().insert(Anonymous);
            request.extensions_mut().insert(Keyless);
            return self.pass(request);
        }
        let memo = request
            .extensions()
            .get::<ConnInfo>()
            .map(|c| &c.state.memo);
        match self.layer.judge(request.uri().path(), authorization, memo) {
            Ok(None) => {
                request.extensions_mut().insert(Keyless);
                self.pass(request)
            }
            Ok(Some(verified)) => {
                request
                    .extensions_mut()
                    .insert(CallerKey(verified.caller.clone()));
                request.extensions_mut().insert(verified.scope.clone());
                let (cache, clock) = (self.layer.cache.clone(), self.layer.clock.clone());
                self.call_ended_by(request, move |method| {
                    let presented = verified.presented.clone();
                    revoke::key_refused(cache.clone(), presented, clock.clone(), method)
                })
            }
            Err(status) => {
                if status.code() == tonic::Code::PermissionDenied {
                    self.layer.audit_refusal(&request, authorization, &status);
                }
                Self::answer(status.into_http::<tonic::body::Body>())
            }
        }
    }
}

#[cfg(test)]
mod tests;
