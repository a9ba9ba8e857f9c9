//! Server-wide bounds on calls in progress, in two pools: unary calls and
//! streams. Streams are the memory hog; with pools of their own they can
//! never take the slots and memory that unary calls need.
//!
//! Before it runs, a call must take from its pool:
//!
//! * a **slot**: at most `--max-concurrent-calls` unary calls and
//!   `--max-open-streams` streams are in progress;
//! * its **weight**, in bytes of the pool's share of `--max-call-memory` (a
//!   quarter for unary calls, the rest for streams): the most memory the
//!   call can make the server hold at once (see [`super::weight`]).
//!
//! A call that finds its pool full gets RESOURCE_EXHAUSTED at once, with the
//! limit and what to do in the message: load is shed, never queued.
//!
//! Both are held until the call's response has **left the process**, not
//! merely until the handler returns: every data chunk of the response owns a
//! reference to the call's hold (`Bytes::from_owner`), so the hold ends when
//! hyper and h2 drop the last chunk, written to the socket or discarded with
//! the stream. A client that stops reading keeps its calls' slots and memory
//! taken, so it cannot make the server buffer more. tower's
//! `ConcurrencyLimitLayer` cannot bound this: it releases its permit when the
//! response future resolves, which for gRPC is when the response headers are
//! ready, before a single id is sent.
//!
//! A stream hands over its next message only once the last one has been
//! written out (see `HeldBody`, in `body`), so at most one message is queued ahead
//! of whatever ends the stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::{Layer, Service};
use tracing::warn;

use super::admission::{read_request, receive, KeySlot, Keyless, PerKey};
use super::throttle::Throttle;
use super::weight::{Weigh, GRPC_HEADER, SMALL_RESPONSE};
use super::{status, LimitError, Limits};
use crate::conn_info::{ConnCall, ConnInfo, Unsent};

mod body;

pub use body::Unwritten;
use body::{HeldBody, InFlight};

/// Memory of a call besides its messages: the HTTP/2 stream, the tasks and
/// tonic's state, bytes.
const CALL_OVERHEAD: usize = 8 * 1024;
/// The memory semaphores count in units of this many bytes (a permit count
/// is a `u32`).
const UNIT: usize = 1024;

/// Every method whose request or response is a stream: they take from the
/// streams pool.
pub const STREAMING_METHODS: &[&str] = &[
    "/snowkeep.v1.IdService/StreamIds",
    "/snowkeep.v1.AdminService/TailAudit",
    "/snowkeep.v1.AdminService/ExportStream",
    "/snowkeep.v1.AdminService/ImportStream",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// The API key id of an authenticated call, put into the request's
/// extensions by the authentication layer; the call takes from that key's
/// share of the pools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallerKey(pub Arc<str>);

/// Which pool a call takes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A call with one response message.
    Unary,
    /// A call whose request or response is a stream.
    Stream,
}

impl CallKind {
    /// The pool of a request path (`/package.Service/Method`).
    pub fn of(path: &str) -> Self {
        if STREAMING_METHODS.contains(&path) {
            CallKind::Stream
        } else {
            CallKind::Unary
        }
    }

    fn noun(self) -> &'static str {
        match self {
            CallKind::Unary => "unary calls",
            CallKind::Stream => "streams",
        }
    }
}

#[derive(Debug)]
struct Pool {
    kind: CallKind,
    /// What the pool holds, for messages: `unary calls`, `keyless streams`.
    noun: &'static str,
    /// The flag that sets its slots.
    flag: &'static str,
    slots: Arc<Semaphore>,
    max_slots: usize,
    /// In units of [`UNIT`] bytes.
    memory: Arc<Semaphore>,
    max_memory: usize,
}

impl Pool {
    fn new(
        (kind, noun, flag): (CallKind, &'static str, &'static str),
        max_slots: usize,
        max_memory: usize,
    ) -> Self {
        Self {
            kind,
            noun,
            flag,
            slots: Arc::new(Semaphore::new(max_slots)),
            max_slots,
            memory: Arc::new(Semaphore::new(max_memory / UNIT)),
            max_memory: max_memory / UNIT * UNIT,
        }
    }

    fn slot(&self) -> Result<OwnedSemaphorePermit, LimitError> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| LimitError::Busy {
                calls: self.noun,
                max: self.max_slots,
                flag: self.flag,
            })
    }

    /// Reserves `bytes` more for a call that already holds `held`.
    fn reserve(&self, bytes: usize, held: usize) -> Result<OwnedSemaphorePermit, LimitError> {
        if bytes + held > self.max_memory {
            return Err(LimitError::CallTooLarge {
                calls: self.noun,
                need: bytes + held,
                pool: self.max_memory,
            });
        }
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
        self.memory
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| LimitError::MemoryInUse {
                calls: self.noun,
                need: bytes,
                pool: self.max_memory,
            })
    }

    fn in_progress(&self) -> usize {
        self.max_slots - self.slots.available_permits()
    }
}

#[derive(Debug)]
struct Inner {
    unary: Pool,
    streams: Pool,
    /// The pools of keyless calls (see [`super::admission`]).
    keyless_unary: Pool,
    keyless_streams: Pool,
    /// Each key's share of `unary` and `streams`.
    per_key_unary: Arc<PerKey>,
    per_key_streams: Arc<PerKey>,
    /// Each remote address's share of `keyless_unary` and `keyless_streams`.
    per_peer_unary: Arc<PerKey>,
    per_peer_streams: Arc<PerKey>,
    request_timeout: std::time::Duration,
    max_recv: usize,
    max_send: usize,
    /// Weighs each call's response from its request.
    weigh: Arc<dyn Weigh>,
    /// Weight every call takes on admission: its request (at most one
    /// message of `max_recv`), its headers and [`CALL_OVERHEAD`].
    base: usize,
    shed_log: Mutex<Throttle>,
}

/// The call limits of one server; [`CallLimits::layer`] enforces them.
#[derive(Debug, Clone)]
pub struct CallLimits(Arc<Inner>);

impl CallLimits {
    /// Pools sized by `limits`; `weigh` weighs each call's response from
    /// its request.
    pub fn new(limits: &Limits, weigh: Arc<dyn Weigh>) -> Self {
        let unary_memory = limits.max_call_memory / 4;
        let base = limits.max_recv_message_size
            + GRPC_HEADER
            + limits.http2_max_header_list_size as usize
            + CALL_OVERHEAD;
        // Keyless calls weigh `base` and a small response, no more: their
        // pools are sized in slots, and their memory is that many calls'.
        let keyless = |slots: usize| slots * (base + SMALL_RESPONSE).div_ceil(UNIT) * UNIT;
        let (unary, stream) = (CallKind::Unary, CallKind::Stream);
        Self(Arc::new(Inner {
            unary: Pool::new(
                (unary, "unary calls", "--max-concurrent-calls"),
                limits.max_concurrent_calls,
                unary_memory,
            ),
            streams: Pool::new(
                (stream, "streams", "--max-open-streams"),
                limits.max_open_streams,
                limits.max_call_memory - unary_memory,
            ),
            keyless_unary: Pool::new(
                (unary, "keyless unary calls", "--max-keyless-calls"),
                limits.max_keyless_calls,
                keyless(limits.max_keyless_calls),
            ),
            keyless_streams: Pool::new(
                (stream, "keyless streams", "--max-keyless-streams"),
                limits.max_keyless_streams,
                keyless(limits.max_keyless_streams),
            ),
            per_key_unary: PerKey::new(
                unary.noun(),
                "--max-calls-per-key",
                limits.max_calls_per_key,
            ),
            per_key_streams: PerKey::new(
                stream.noun(),
                "--max-streams-per-key",
                limits.max_streams_per_key,
            ),
            per_peer_unary: PerKey::per_peer(
                "keyless unary calls",
                "--max-keyless-calls-per-peer",
                limits.max_keyless_calls_per_peer,
            ),
            per_peer_streams: PerKey::per_peer(
                "keyless streams",
                "--max-keyless-calls-per-peer",
                limits.max_keyless_calls_per_peer,
            ),
            request_timeout: limits.request_timeout,
            max_recv: limits.max_recv_message_size,
            max_send: limits.max_send_message_size,
            weigh,
            base,
            shed_log: Mutex::new(Throttle::new(std::time::Duration::from_secs(10))),
        }))
    }

    /// The layer enforcing these limits.
    pub fn layer(&self) -> CallLimitLayer {
        CallLimitLayer(self.clone())
    }

    /// Calls in progress now (unary and streams), responses not yet sent
    /// included.
    pub fn in_progress(&self) -> usize {
        [
            &self.0.unary,
            &self.0.streams,
            &self.0.keyless_unary,
            &self.0.keyless_streams,
        ]
        .iter()
        .map(|p| p.in_progress())
        .sum()
    }

    fn pool(&self, kind: CallKind, keyless: bool) -> &Pool {
        match (kind, keyless) {
            (CallKind::Unary, false) => &self.0.unary,
            (CallKind::Stream, false) => &self.0.streams,
            (CallKind::Unary, true) => &self.0.keyless_unary,
            (CallKind::Stream, true) => &self.0.keyless_streams,
        }
    }

    /// Takes a slot of `pool`, one of `key_id`'s share (or, for a keyless
    /// call, of its remote address `peer`'s), and the base weight: what
    /// every call holds from admission on.
    fn admit(
        &self,
        (pool, keyless): (&Pool, bool),
        key_id: Option<&Arc<str>>,
        peer: Option<std::net::IpAddr>,
        conn: Option<ConnCall>,
    ) -> Result<Hold, LimitError> {
        let (per_key, per_peer) = match pool.kind {
            CallKind::Unary => (&self.0.per_key_unary, &self.0.per_peer_unary),
            CallKind::Stream => (&self.0.per_key_streams, &self.0.per_peer_streams),
        };
        let peer = peer
            .filter(|_| keyless)
            .map(|ip| per_peer.take(&Arc::from(ip.to_string())))
            .transpose()?;
        let slot = pool.slot()?;
        let key = key_id.map(|id| per_key.take(id)).transpose()?;
        Ok(Hold {
            memory: pool.reserve(self.0.base, 0)?,
            _slot: slot,
            _key: key,
            _peer: peer,
            _conn: conn,
        })
    }

    fn shed(&self, path: &str, error: LimitError) -> http::Response<tonic::body::Body> {
        let held_back = self
            .0
            .shed_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .hit(Instant::now());
        if let Some(held_back) = held_back {
            warn!(
                method = path,
                shed_since_last_log = held_back,
                reason = %error,
                "shedding a call: RESOURCE_EXHAUSTED"
            );
        }
        status(error).into_http()
    }
}

/// What a call holds while in progress; dropping it frees its slot, its
/// memory and its mark on the connection.
#[derive(Debug)]
struct Hold {
    _slot: OwnedSemaphorePermit,
    _key: Option<KeySlot>,
    _peer: Option<KeySlot>,
    memory: OwnedSemaphorePermit,
    _conn: Option<ConnCall>,
}

/// The longest a shed call waits for the rest of its request before it is
/// answered anyway (see [`CallLimit`]).
const SHED_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Enforces [`CallLimits`] on every call (see the module docs).
#[derive(Debug, Clone)]
pub struct CallLimitLayer(CallLimits);

impl<S> Layer<S> for CallLimitLayer {
    type Service = CallLimit<S>;

    fn layer(&self, inner: S) -> CallLimit<S> {
        CallLimit {
            inner,
            limits: self.0.clone(),
        }
    }
}

/// The service of [`CallLimitLayer`].
#[derive(Debug, Clone)]
pub struct CallLimit<S> {
    inner: S,
    limits: CallLimits,
}

impl<S, B> Service<http::Request<tonic::body::Body>> for CallLimit<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        // The ready service goes into the future; a clone stays for next time.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        // Marked at once, so the connection does not look idle while the call
        // runs (the read that brought its headers had touched it already).
        let conn_call: Option<ConnCall> = request
            .extensions()
            .get::<ConnInfo>()
            .map(|c| c.state.call());
        Box::pin(limited_call(self.limits.clone(), inner, request, conn_call))
    }
}

/// Runs one call under `limits`: admits it (or sheds it), receives its
/// request, reserves its response's weight, calls `inner`, and makes the
/// response's chunks hold the call's slot and memory (see the module docs).
async fn limited_call<S, B>(
    limits: CallLimits,
    mut inner: S,
    mut request: http::Request<tonic::body::Body>,
    conn_call: Option<ConnCall>,
) -> Result<http::Response<tonic::body::Body>, S::Error>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<B>>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    expose_remote_addr(&mut request);
    let unsent = conn_call
        .as_ref()
        .map_or_else(Unsent::unwatched, ConnCall::sender);
    // A clone of the URI shares its bytes (no copy of the path).
    let uri = request.uri().clone();
    let path = uri.path();
    let keyless = request.extensions().get::<Keyless>().is_some();
    let pool = limits.pool(CallKind::of(path), keyless);
    let key_id = request.extensions().get::<CallerKey>().map(|k| &k.0);
    let admitted = limits.admit((pool, keyless), key_id, remote_ip(&request), conn_call);
    let mut hold = match admitted {
        Ok(hold) => hold,
        Err(error) => return Ok(shed_after_request(&limits, request, path, error).await),
    };
    let received = receive(request, limits.0.max_recv, limits.0.request_timeout);
    let (request, frame) = match received.await {
        Ok(received) => received,
        Err(status) => return Ok(status.into_http()),
    };
    let weight = match limits.0.weigh.weigh(path, &frame, limits.0.max_send) {
        Ok(weight) => weight,
        Err(error) => return Ok(status(error).into_http()),
    };
    match pool.reserve(weight, limits.0.base) {
        Ok(more) => hold.memory.merge(more),
        Err(error) => return Ok(limits.shed(path, error)),
    }
    let response = inner.call(request).await?;
    Ok(hold_response(response, hold, pool.kind, unsent))
}

/// Puts the TCP connect info of the call's connection where tonic's
/// `Request::remote_addr` reads it.
fn expose_remote_addr(request: &mut http::Request<tonic::body::Body>) {
    if let Some(tcp) = request
        .extensions()
        .get::<ConnInfo>()
        .map(|c| c.tcp.clone())
    {
        request.extensions_mut().insert(tcp);
    }
}

/// The client's IP address, when the connection has one.
fn remote_ip(request: &http::Request<tonic::body::Body>) -> Option<std::net::IpAddr> {
    request
        .extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|c| c.remote_addr())
        .map(|a| a.ip())
}

/// Sheds a call that was refused admission, after taking the end of its
/// request: a call answered while its request is still open is reset by
/// h2, and h2 closes a connection after 1,024 such resets
/// (ENHANCE_YOUR_CALM), failing every call on it. A client busy enough to
/// be shed that often must keep its connection. Bounded by the message size
/// limit and [`SHED_BODY_WAIT`].
async fn shed_after_request(
    limits: &CallLimits,
    request: http::Request<tonic::body::Body>,
    path: &str,
    error: LimitError,
) -> http::Response<tonic::body::Body> {
    let (_, mut body) = request.into_parts();
    let read = read_request(&mut body, limits.0.max_recv, false);
    let _ = tokio::time::timeout(SHED_BODY_WAIT, read).await;
    limits.shed(path, error)
}

/// `response` with its body's chunks holding `hold`; a stream's body is
/// paced and its response carries [`Unwritten`].
fn hold_response<B>(
    response: http::Response<B>,
    hold: Hold,
    kind: CallKind,
    unsent: Arc<Unsent>,
) -> http::Response<tonic::body::Body>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    let hold = Arc::new(hold);
    let paced = kind == CallKind::Stream;
    let in_flight = InFlight::new(unsent);
    let mut response = response
        .map(|body| tonic::body::Body::new(HeldBody::new(body, hold, paced, in_flight.clone())));
    if paced {
        // Read only for streams (the authentication layer's
        // revocation); a unary call skips the extension's box.
        response.extensions_mut().insert(Unwritten(in_flight));
    }
    response
}

#[cfg(test)]
mod tests;
