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
//! written out (see `HeldBody`), so at most one message is queued ahead
//! of whatever ends the stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::{Layer, Service};
use tracing::warn;

use super::admission::{read_request, receive, KeySlot, Keyless, PerKey};
use super::throttle::Throttle;
use super::weight::{weigh, GRPC_HEADER, NEXT_IDS, SMALL_RESPONSE, STREAM_IDS};
use super::{status, LimitError, Limits};
use crate::audit::CallerKey;
use crate::conn_info::{ConnCall, ConnInfo, Unsent};

/// Memory of a call besides its messages: the HTTP/2 stream, the tasks and
/// tonic's state, bytes.
const CALL_OVERHEAD: usize = 8 * 1024;
/// The memory semaphores count in units of this many bytes (a permit count
/// is a `u32`).
const UNIT: usize = 1024;

/// Every method whose request or response is a stream: they take from the
/// streams pool.
pub const STREAMING_METHODS: &[&str] = &[
    STREAM_IDS,
    "/snowkeep.v1.AdminService/TailAudit",
    "/snowkeep.v1.AdminService/ExportStream",
    "/snowkeep.v1.AdminService/ImportStream",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

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
    /// Weight every call takes on admission: its request (at most one
    /// message of `max_recv`), its headers and [`CALL_OVERHEAD`].
    base: usize,
    shed_log: Mutex<Throttle>,
}

/// The call limits of one server; [`CallLimits::layer`] enforces them.
#[derive(Debug, Clone)]
pub struct CallLimits(Arc<Inner>);

impl CallLimits {
    /// Pools sized by `limits`.
    pub fn new(limits: &Limits) -> Self {
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
        key_id: Option<&str>,
        peer: Option<std::net::IpAddr>,
        conn: Option<ConnCall>,
    ) -> Result<Hold, LimitError> {
        let (per_key, per_peer) = match pool.kind {
            CallKind::Unary => (&self.0.per_key_unary, &self.0.per_peer_unary),
            CallKind::Stream => (&self.0.per_key_streams, &self.0.per_peer_streams),
        };
        let peer = peer
            .filter(|_| keyless)
            .map(|ip| per_peer.take(&ip.to_string()))
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

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        // The ready service goes into the future; a clone stays for next time.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limits = self.limits.clone();
        // Marked at once, so the connection does not look idle while the call
        // runs (the read that brought its headers had touched it already).
        let conn_call: Option<ConnCall> = request
            .extensions()
            .get::<ConnInfo>()
            .map(|c| c.state.call());
        Box::pin(async move {
            if let Some(tcp) = request
                .extensions()
                .get::<ConnInfo>()
                .map(|c| c.tcp.clone())
            {
                // What tonic's `Request::remote_addr` reads.
                request.extensions_mut().insert(tcp);
            }
            let unsent = conn_call
                .as_ref()
                .map_or_else(Unsent::unwatched, ConnCall::sender);
            // A clone of the URI shares its bytes (no copy of the path).
            let uri = request.uri().clone();
            let path = uri.path();
            let keyless = request.extensions().get::<Keyless>().is_some();
            let pool = limits.pool(CallKind::of(path), keyless);
            let key_id = request.extensions().get::<CallerKey>().map(|k| &k.0);
            let peer = request
                .extensions()
                .get::<tonic::transport::server::TcpConnectInfo>()
                .and_then(|c| c.remote_addr())
                .map(|a| a.ip());
            let admitted =
                limits.admit((pool, keyless), key_id.map(String::as_str), peer, conn_call);
            let mut hold = match admitted {
                Ok(hold) => hold,
                Err(error) => {
                    // Take the request's end before answering: a call
                    // answered while its request is still open is reset by
                    // h2, and h2 closes a connection after 1,024 such resets
                    // (ENHANCE_YOUR_CALM), failing every call on it. A
                    // client busy enough to be shed that often must keep
                    // its connection. Bounded by the message size limit and
                    // SHED_BODY_WAIT.
                    let (_, mut body) = request.into_parts();
                    let read = read_request(&mut body, limits.0.max_recv, false);
                    let _ = tokio::time::timeout(SHED_BODY_WAIT, read).await;
                    return Ok(limits.shed(path, error));
                }
            };
            let received = receive(request, limits.0.max_recv, limits.0.request_timeout);
            let (request, frame) = match received.await {
                Ok(received) => received,
                Err(status) => return Ok(status.into_http()),
            };
            let weight = if path == NEXT_IDS || path == STREAM_IDS {
                match weigh(path, &frame, limits.0.max_send) {
                    Ok(w) => w,
                    Err(error) => return Ok(status(error).into_http()),
                }
            } else {
                SMALL_RESPONSE
            };
            match pool.reserve(weight, limits.0.base) {
                Ok(more) => hold.memory.merge(more),
                Err(error) => return Ok(limits.shed(path, error)),
            }
            let response = inner.call(request).await?;
            let hold = Arc::new(hold);
            let paced = pool.kind == CallKind::Stream;
            let in_flight = InFlight::new(unsent);
            let mut response = response.map(|body| {
                tonic::body::Body::new(HeldBody::new(body, hold, paced, in_flight.clone()))
            });
            if paced {
                // Read only for streams (the authentication layer's
                // revocation); a unary call skips the extension's box.
                response.extensions_mut().insert(Unwritten(in_flight));
            }
            Ok(response)
        })
    }
}

/// A response chunk that keeps its call's [`Hold`] until hyper and h2 have
/// dropped it, and tells its body when they have (see [`HeldBody`]).
struct HeldChunk {
    data: Bytes,
    _hold: Arc<Hold>,
    _out: ChunkOut,
}

impl AsRef<[u8]> for HeldChunk {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// Whether a body has a chunk in hyper or h2 that is not yet written out.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// Times the chunk for the connection's `--stream-send-timeout`.
    unsent: Arc<Unsent>,
    /// True from handing a chunk over until h2 drops it, which it does once
    /// the chunk's last byte is written to the connection (or the stream is
    /// gone).
    pending: AtomicBool,
    /// The body's task, woken when the chunk is dropped.
    waker: AtomicWaker,
}

impl InFlight {
    fn new(unsent: Arc<Unsent>) -> Arc<Self> {
        Arc::new(Self {
            unsent,
            pending: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        })
    }
}

/// Put into a stream's response extensions: whether a chunk of the response is
/// handed to hyper and not yet written out, which means its client does not
/// read. The authentication layer then ends a revoked stream with a reset
/// (dropping the chunk, and the call's slot and memory with it) instead of
/// trailers queued behind data the client never takes.
#[derive(Debug, Clone)]
pub struct Unwritten(Arc<InFlight>);

impl Unwritten {
    /// True once no chunk is waiting to be written out; else `cx` is woken
    /// when the chunk is (the body that handed it over is gone by then).
    pub fn poll_written(&self, cx: &mut Context<'_>) -> bool {
        self.0.waker.register(cx.waker());
        !self.0.pending.load(Ordering::Acquire)
    }
}

/// Marks its body's chunk written when dropped.
struct ChunkOut(Arc<InFlight>);

impl Drop for ChunkOut {
    fn drop(&mut self) {
        self.0.pending.store(false, Ordering::Release);
        self.0.unsent.all_written();
        self.0.waker.wake();
    }
}

/// A response body whose data chunks carry the call's [`Hold`].
///
/// A stream's body (`paced`) hands hyper its next message only once the
/// previous one has been written out to the connection. hyper polls a body
/// for its next chunk as soon as it has queued the last one, and then holds
/// that chunk while it waits for the client's flow-control window, not
/// polling the body again until the window opens. Unpaced, a slowly read
/// stream would have two whole messages (up to twice
/// `--max-send-message-size`) queued ahead of anything the server decides
/// next, such as the counted status that ends a stream at shutdown. Paced,
/// at most the rest of one message is: the status goes out as soon as the
/// client has taken it.
struct HeldBody<B> {
    inner: B,
    hold: Option<Arc<Hold>>,
    paced: bool,
    in_flight: Arc<InFlight>,
}

impl<B> HeldBody<B> {
    fn new(inner: B, hold: Arc<Hold>, paced: bool, in_flight: Arc<InFlight>) -> Self {
        Self {
            inner,
            hold: Some(hold),
            paced,
            in_flight,
        }
    }

    /// True while a paced body's last chunk is not yet written out; then
    /// `cx` is woken when it is.
    fn waiting_for_last_chunk(&self, cx: &mut Context<'_>) -> bool {
        if !self.paced || !self.in_flight.pending.load(Ordering::Acquire) {
            return false;
        }
        self.in_flight.waker.register(cx.waker());
        // Dropped between the check and the registration: go on.
        self.in_flight.pending.load(Ordering::Acquire)
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for HeldBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if this.waiting_for_last_chunk(cx) {
            return Poll::Pending;
        }
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let frame = match frame {
            Some(Ok(frame)) => Some(Ok(match (frame.into_data(), &this.hold) {
                (Ok(data), Some(hold)) => {
                    this.in_flight.pending.store(true, Ordering::Release);
                    this.in_flight.unsent.handed_over();
                    Frame::data(Bytes::from_owner(HeldChunk {
                        data,
                        _hold: hold.clone(),
                        _out: ChunkOut(this.in_flight.clone()),
                    }))
                }
                (Ok(data), None) => Frame::data(data),
                (Err(other), _) => other,
            })),
            other => other,
        };
        if frame.is_none() {
            // Chunks still queued in h2 keep the hold alive.
            this.hold = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::BodyExt;
    use tonic::Status;

    use prost::Message;
    use snowkeep_proto::v1 as pb;
    use tonic::Code;
    use tower::ServiceExt;

    use super::*;
    use crate::limits::test_frame as frame;

    /// Every server-streaming method the server serves is in the streams
    /// pool, and no other.
    #[test]
    fn streaming_methods_are_exactly_the_server_streaming_ones() {
        let sets = [
            snowkeep_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        let mut streaming = Vec::new();
        let mut methods = 0;
        for bytes in sets {
            let set = prost_types::FileDescriptorSet::decode(bytes).unwrap();
            for file in set.file {
                for service in &file.service {
                    for m in &service.method {
                        methods += 1;
                        let path = format!("/{}.{}/{}", file.package(), service.name(), m.name());
                        let kind = CallKind::of(&path);
                        if m.server_streaming() || m.client_streaming() {
                            assert_eq!(kind, CallKind::Stream, "{path}");
                            streaming.push(path);
                        } else {
                            assert_eq!(kind, CallKind::Unary, "{path}");
                        }
                    }
                }
            }
        }
        assert!(methods >= 14, "{methods} methods");
        streaming.sort();
        let mut expected: Vec<String> = STREAMING_METHODS.iter().map(|s| (*s).to_owned()).collect();
        expected.sort();
        assert_eq!(streaming, expected);
    }

    fn request(path: &str, body: Vec<u8>) -> http::Request<tonic::body::Body> {
        http::Request::post(path)
            .body(tonic::body::Body::new(http_body_util::Full::new(
                Bytes::from(body),
            )))
            .unwrap()
    }

    type Answering = tower::util::BoxCloneService<
        http::Request<tonic::body::Body>,
        http::Response<tonic::body::Body>,
        Infallible,
    >;

    /// An inner service answering every call with one 1000-byte chunk.
    fn answering() -> Answering {
        tower::util::BoxCloneService::new(tower::service_fn(
            |_req: http::Request<tonic::body::Body>| async {
                Ok::<_, Infallible>(http::Response::new(tonic::body::Body::new(
                    http_body_util::Full::new(Bytes::from(vec![7u8; 1000])),
                )))
            },
        ))
    }

    fn status_of(resp: &http::Response<tonic::body::Body>) -> Option<Status> {
        Status::from_header_map(resp.headers())
    }

    /// A shed call is answered only once its request has ended, so h2 never
    /// has to reset it (after 1,024 such resets h2 closes the connection,
    /// and every call on it fails).
    #[tokio::test(start_paused = true)]
    async fn a_shed_call_is_answered_after_its_request_ends_or_a_second() {
        let limits = CallLimits::new(&Limits {
            max_concurrent_calls: 1,
            ..Limits::default()
        });
        let svc = limits.layer().layer(answering());
        let path = "/snowkeep.v1.InfoService/GetInfo";
        let held = svc.clone().oneshot(request(path, vec![])).await.unwrap();
        assert!(status_of(&held).is_none());
        // A request whose body is still on its way when the call is shed.
        let late_body = |rx: tokio::sync::mpsc::Receiver<Bytes>| {
            let frames = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                |b| Ok::<_, Status>(Frame::data(b)),
            );
            http::Request::post(path)
                .body(tonic::body::Body::new(http_body_util::StreamBody::new(
                    frames,
                )))
                .unwrap()
        };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut shed = Box::pin(svc.clone().oneshot(late_body(rx)));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(shed.as_mut().poll(&mut cx).is_pending());
        tx.send(Bytes::from_static(&[0, 0, 0, 0, 0])).await.unwrap();
        assert!(
            shed.as_mut().poll(&mut cx).is_pending(),
            "answered before the request ended"
        );
        drop(tx);
        let started = tokio::time::Instant::now();
        let resp = shed.await.unwrap();
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);
        assert_eq!(status_of(&resp).unwrap().code(), Code::ResourceExhausted);
        // A request that never ends is answered after SHED_BODY_WAIT.
        let (_tx, rx) = tokio::sync::mpsc::channel(1);
        let started = tokio::time::Instant::now();
        let resp = svc.clone().oneshot(late_body(rx)).await.unwrap();
        assert_eq!(started.elapsed(), SHED_BODY_WAIT);
        assert_eq!(status_of(&resp).unwrap().code(), Code::ResourceExhausted);
        drop(held);
    }

    #[tokio::test]
    async fn a_full_pool_sheds_until_the_response_chunks_are_dropped() {
        let limits = CallLimits::new(&Limits {
            max_concurrent_calls: 2,
            ..Limits::default()
        });
        let svc = limits.layer().layer(answering());
        let path = "/snowkeep.v1.InfoService/GetInfo";
        let mut bodies = Vec::new();
        for _ in 0..2 {
            let resp = svc.clone().oneshot(request(path, vec![])).await.unwrap();
            assert!(status_of(&resp).is_none());
            bodies.push(resp.into_body());
        }
        assert_eq!(limits.in_progress(), 2);
        let shed = svc.clone().oneshot(request(path, vec![])).await.unwrap();
        let status = status_of(&shed).expect("a status");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "this server already has 2 unary calls in progress, its limit (--max-concurrent-calls); retry with backoff or call another snowkeep server"
        );
        // Streams have their own pool.
        let stream = svc
            .clone()
            .oneshot(request("/grpc.health.v1.Health/Watch", vec![]))
            .await
            .unwrap();
        assert!(status_of(&stream).is_none());
        drop(stream);
        // Reading a body to its end is not enough while its chunk lives on
        // (queued in h2, say); dropping the chunk frees the slot.
        let mut body = bodies.pop().unwrap();
        let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(body.frame().await.is_none());
        drop(body);
        assert_eq!(limits.in_progress(), 2);
        assert_eq!(chunk.len(), 1000);
        drop(chunk);
        assert_eq!(limits.in_progress(), 1);
        let resp = svc.clone().oneshot(request(path, vec![])).await.unwrap();
        assert!(status_of(&resp).is_none());
    }

    /// An inner service answering every call with two 1000-byte chunks.
    fn answering_twice() -> Answering {
        tower::util::BoxCloneService::new(tower::service_fn(
            |_req: http::Request<tonic::body::Body>| async {
                let chunks =
                    (0..2u8).map(|i| Ok::<_, Status>(Frame::data(Bytes::from(vec![i; 1000]))));
                Ok::<_, Infallible>(http::Response::new(tonic::body::Body::new(
                    http_body_util::StreamBody::new(futures_util::stream::iter(chunks)),
                )))
            },
        ))
    }

    /// A stream's body hands over its next chunk only once the last one has
    /// been dropped (written out); a unary call's body does not wait.
    #[tokio::test]
    async fn a_stream_body_hands_over_a_chunk_only_after_the_last_is_written() {
        use futures_util::FutureExt;
        let limits = CallLimits::new(&Limits::default());
        let svc = limits.layer().layer(answering_twice());
        let stream = svc
            .clone()
            .oneshot(request("/grpc.health.v1.Health/Watch", vec![]))
            .await
            .unwrap();
        let mut body = stream.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, vec![0u8; 1000]);
        assert!(
            body.frame().now_or_never().is_none(),
            "handed over unwritten"
        );
        drop(first);
        let second = body.frame().now_or_never().expect("ready once written");
        assert_eq!(
            second.unwrap().unwrap().into_data().unwrap(),
            vec![1u8; 1000]
        );

        let unary = svc
            .oneshot(request("/snowkeep.v1.InfoService/GetInfo", vec![]))
            .await
            .unwrap();
        let mut body = unary.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        let second = body
            .frame()
            .now_or_never()
            .expect("unary bodies are not paced");
        assert_eq!(
            second.unwrap().unwrap().into_data().unwrap(),
            vec![1u8; 1000]
        );
        drop(first);
    }

    #[tokio::test]
    async fn memory_is_reserved_by_weight_and_refused_when_full() {
        // 4 MiB: 1 MiB for unary calls; a NextIds(50000) weighs ~800 KB.
        let limits = CallLimits::new(&Limits {
            max_call_memory: 4 << 20,
            ..Limits::default()
        });
        let svc = limits.layer().layer(answering());
        let big = || {
            request(
                NEXT_IDS,
                frame(&pb::NextIdsRequest {
                    count: 50_000,
                    ..Default::default()
                }),
            )
        };
        let first = svc.clone().oneshot(big()).await.unwrap();
        assert!(status_of(&first).is_none());
        let second = svc.clone().oneshot(big()).await.unwrap();
        let status = status_of(&second).expect("a status");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status
                .message()
                .starts_with("this server's memory for unary calls is in use: "),
            "{}",
            status.message()
        );
        drop(first);
        let third = svc.clone().oneshot(big()).await.unwrap();
        assert!(status_of(&third).is_none());
        // More than the whole pool can ever give: says so.
        let huge = svc
            .clone()
            .oneshot(request(
                NEXT_IDS,
                frame(&pb::NextIdsRequest {
                    count: 100_000,
                    ..Default::default()
                }),
            ))
            .await
            .unwrap();
        let status = status_of(&huge).expect("a status");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status
                .message()
                .ends_with("a share of --max-call-memory); ask for fewer ids per call"),
            "{}",
            status.message()
        );
    }

    #[tokio::test]
    async fn an_oversized_request_is_refused_from_its_length_prefix() {
        let limits = CallLimits::new(&Limits::default());
        let svc = limits.layer().layer(answering());
        let mut body = vec![0u8, 0, 1, 0, 0]; // promises 65536 bytes
        body.extend_from_slice(&[1, 2, 3]);
        let resp = svc.oneshot(request(NEXT_IDS, body)).await.unwrap();
        let status = status_of(&resp).expect("a status");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "the request message is 65536 bytes, over this server's limit of 16384 bytes (--max-recv-message-size)"
        );
        assert_eq!(limits.in_progress(), 0);
    }
}
