//! The status page (`--admin-listen`): one read-only HTML page of the
//! cluster's namespaces (layout, capacity bars), machine ids (holder, fence
//! against the clock, lease remaining), Lease API requesters (never their nonces or
//! lease tokens), this server's state (ready, held machine ids, peers and
//! their clock offsets) and recent audit events. It refreshes itself every
//! [`REFRESH_SECONDS`] with a `<meta http-equiv="refresh">`: no script, and
//! nothing fetched from elsewhere (the CSS is inline).
//!
//! The cluster's state comes from the `AdminService` handler snowkeepctl
//! calls, in process ([`view`]), so the page and snowkeepctl never disagree.
//!
//! With `--auth on` every request needs an API key with the admin
//! permission, as `Authorization: Bearer <id>.<secret>` or as HTTP Basic
//! credentials whose password is the key (any user name): a browser asks for
//! them and sends them again on each refresh. Without a valid key the answer
//! is 401 and says why; a key without the admin permission, or an admin key
//! limited to namespaces (refused by `AdminService` too: the page shows the
//! whole cluster), gets 403. Keys are never logged and never part of a URL the
//! page links to.
//!
//! Served like the metrics port: the same accept loop with a connection cap
//! ([`MAX_CONNECTIONS`]), silent connections closed, headers within a bound.

mod fence;
mod view;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use askama::Template;
use base64::Engine;
use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use snowkeep_client::{GeneratorSet, SharedClock};
use tokio::net::TcpListener;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::admin::AdminHandler;
use crate::audit::{self, AuditEvent};
use crate::auth::cache::Verdict;
use crate::auth::{ClusterAuth, Enforcement, KeyCache};
use crate::peers::PeerClocks;
use crate::service::info::InfoHandler;
use snowkeep_core::api_key::{KeyRefusal, Permission, PresentedKey};

/// Most open connections to the status page (a few operators' browsers):
/// the metrics port's, as both are served by `metrics_http::serve_http1`.
pub(crate) const MAX_CONNECTIONS: usize = crate::metrics_http::MAX_CONNECTIONS;
/// How often the page reloads itself, seconds.
pub const REFRESH_SECONDS: u32 = 2;
/// How many recent audit events the page shows.
pub const RECENT_EVENTS: usize = 100;
/// The HTTP Basic realm a browser shows when it asks for the key.
const REALM: &str = "Basic realm=\"snowkeep status page: any user name, the admin API key as password\", charset=\"UTF-8\"";

/// The last [`RECENT_EVENTS`] audit events of this server, fed from
/// [`audit::subscribe`]. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct AuditRing(Arc<Mutex<VecDeque<AuditEvent>>>);

impl AuditRing {
    /// Follows the audit trail from now until `shutdown`.
    pub fn follow(shutdown: CancellationToken) -> Self {
        let ring = Self::default();
        let mut events = audit::subscribe();
        let kept = ring.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    e = events.recv() => e,
                };
                match event {
                    Ok(event) => kept.push(event),
                    // Missed events are gone; the page shows the later ones.
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                }
            }
        });
        ring
    }

    fn push(&self, event: AuditEvent) {
        let mut ring = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == RECENT_EVENTS {
            ring.pop_front();
        }
        ring.push_back(event);
    }

    /// The events kept, newest first.
    pub fn recent(&self) -> Vec<AuditEvent> {
        let ring = self.0.lock().unwrap_or_else(|p| p.into_inner());
        ring.iter().rev().cloned().collect()
    }
}

/// Everything the page reads. Cheap to clone.
#[derive(Clone)]
pub struct StatusSources {
    /// The administration service's handler (what snowkeepctl calls).
    pub admin: AdminHandler,
    /// This server's InfoService handler (held machine ids, fences).
    pub info: InfoHandler,
    /// This server's generators (ready or not).
    pub generators: Arc<GeneratorSet>,
    /// The peer clock check's last round.
    pub peers: PeerClocks,
    /// True when the peer clock check runs.
    pub peer_check: bool,
    /// Offsets past this are shown as a problem.
    pub peer_warn: Duration,
    /// Recent audit events.
    pub audit: AuditRing,
    /// The server's clock.
    pub clock: SharedClock,
    /// This server's instance id.
    pub instance_id: String,
    /// This server's namespace.
    pub namespace: String,
    /// The cluster's security mode as this server follows it.
    pub auth: ClusterAuth,
    /// The API keys, to check the page's key.
    pub keys: KeyCache,
}

/// The key a request presents: `Authorization: Bearer <key>`, or HTTP Basic
/// with the key as the password.
fn presented(authorization: Option<&HeaderValue>) -> Result<PresentedKey, KeyRefusal> {
    let value = authorization.ok_or(KeyRefusal::Missing)?;
    let text = value
        .to_str()
        .map_err(|_| KeyRefusal::Malformed("the Authorization header is not text"))?;
    match text.trim().split_once(' ') {
        Some((scheme, encoded)) if scheme.eq_ignore_ascii_case("basic") => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|_| KeyRefusal::Malformed("the Basic credentials are not base64"))?;
            let decoded = String::from_utf8(decoded)
                .map_err(|_| KeyRefusal::Malformed("the Basic credentials are not text"))?;
            let (_user, password) = decoded.split_once(':').ok_or(KeyRefusal::Malformed(
                "the Basic credentials are `user:password`",
            ))?;
            PresentedKey::parse(password)
        }
        _ => PresentedKey::from_authorization(Some(value.as_bytes())),
    }
}

/// Why a request may not see the page: status and message.
fn refusal(
    mode: Enforcement,
    keys: &KeyCache,
    now_unix_ms: u64,
    authorization: Option<&HeaderValue>,
) -> Option<(StatusCode, String)> {
    match mode {
        Enforcement::Off => return None,
        Enforcement::Unknown => {
            return Some((
                StatusCode::SERVICE_UNAVAILABLE,
                "this server has not read the cluster's security mode from etcd yet; retry shortly"
                    .to_owned(),
            ))
        }
        Enforcement::On => {}
    }
    let how = "the status page needs an API key with the admin permission (the cluster's security mode is on): sign in with any user name and the key as password, or send `Authorization: Bearer <id>.<secret>`";
    let key = match presented(authorization) {
        Ok(k) => k,
        Err(KeyRefusal::Missing) => {
            return Some((StatusCode::UNAUTHORIZED, format!("no API key: {how}")))
        }
        Err(e) => return Some((StatusCode::UNAUTHORIZED, format!("{e}; {how}"))),
    };
    match keys.verify(&key, now_unix_ms) {
        // As AdminService: the page shows the whole cluster.
        Verdict::Accepted { scope, .. } if scope.has(Permission::Admin) => scope
            .cluster_wide_refusal()
            .map(|refusal| (StatusCode::FORBIDDEN, refusal)),
        Verdict::Accepted { scope, .. } => Some((
            StatusCode::FORBIDDEN,
            format!(
                "API key {} lacks the admin permission; {how}",
                scope.key_id
            ),
        )),
        Verdict::Refused(e) => Some((StatusCode::UNAUTHORIZED, format!("{e}; {how}"))),
        Verdict::NotLoaded => Some((
            StatusCode::SERVICE_UNAVAILABLE,
            "API keys are not loaded from etcd yet (this server has not reached etcd since it started); retry shortly".to_owned(),
        )),
    }
}

fn response(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> http::Response<Full<Bytes>> {
    let mut response = http::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn text(status: StatusCode, message: String) -> http::Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", format!("{message}\n"))
}

/// Answers one request.
async fn answer<B>(
    sources: StatusSources,
    request: http::Request<B>,
) -> http::Response<Full<Bytes>> {
    if let Some((status, message)) = refusal(
        sources.auth.enforcement(),
        &sources.keys,
        sources.clock.unix_ms(),
        request.headers().get(header::AUTHORIZATION),
    ) {
        let mut r = text(status, message);
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(REALM));
        }
        return r;
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the status page is read-only: GET /".to_owned(),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    if request.uri().path() != "/" {
        return text(
            StatusCode::NOT_FOUND,
            "not found: the status page is at /".to_owned(),
        );
    }
    match view::gather(&sources).await.render() {
        Ok(html) => response(StatusCode::OK, "text/html; charset=utf-8", html),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot render the status page: {e}"),
        ),
    }
}

/// Serves the page from `sources` on `listener` until `shutdown`, to the
/// peers `allow` admits (others get 403). Idle connections close after
/// `idle_timeout`.
pub async fn serve(
    listener: TcpListener,
    sources: StatusSources,
    allow: crate::allow::AllowList,
    idle_timeout: Duration,
    shutdown: CancellationToken,
) {
    crate::metrics_http::serve_http1(
        listener,
        ("status page", "the status page's 16"),
        allow,
        idle_timeout,
        shutdown,
        move |request| answer(sources.clone(), request),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user_password: &str) -> HeaderValue {
        let encoded = base64::engine::general_purpose::STANDARD.encode(user_password);
        HeaderValue::from_str(&format!("Basic {encoded}")).unwrap()
    }

    #[test]
    fn the_key_comes_as_bearer_or_as_the_basic_password() {
        let key = "kadmin01.0123456789abcdef0123";
        let bearer = HeaderValue::from_str(&format!("Bearer {key}")).unwrap();
        assert_eq!(presented(Some(&bearer)).unwrap().reveal(), key);
        assert_eq!(
            presented(Some(&basic(&format!("admin:{key}"))))
                .unwrap()
                .reveal(),
            key
        );
        assert_eq!(presented(None), Err(KeyRefusal::Missing));
        assert_eq!(
            presented(Some(&HeaderValue::from_static("Basic !!!"))),
            Err(KeyRefusal::Malformed(
                "the Basic credentials are not base64"
            ))
        );
        assert_eq!(
            presented(Some(&basic("no-colon"))),
            Err(KeyRefusal::Malformed(
                "the Basic credentials are `user:password`"
            ))
        );
    }

    #[test]
    fn without_authentication_every_request_sees_the_page() {
        assert_eq!(refusal(Enforcement::Off, &KeyCache::new(), 0, None), None);
    }

    #[test]
    fn with_authentication_a_request_without_a_key_gets_401() {
        let (status, message) = refusal(Enforcement::On, &KeyCache::new(), 0, None).unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(
            message.starts_with(
                "no API key: the status page needs an API key with the admin permission"
            ),
            "{message}"
        );
    }

    #[test]
    fn the_ring_keeps_the_last_events_newest_first() {
        let ring = AuditRing::default();
        for i in 0..(RECENT_EVENTS as u64 + 5) {
            ring.push(AuditEvent {
                unix_ms: i,
                action: "lease.acquire",
                who: audit::Who::default(),
                requester: String::new(),
                namespace: String::new(),
                subject: String::new(),
                result: "ok".into(),
            });
        }
        let recent = ring.recent();
        assert_eq!(recent.len(), RECENT_EVENTS);
        assert_eq!(recent[0].unix_ms, RECENT_EVENTS as u64 + 4);
        assert_eq!(recent[RECENT_EVENTS - 1].unix_ms, 5);
    }
}
