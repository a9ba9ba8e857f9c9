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
//!   call can make the server hold at once (see [`weigh`]).
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

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use prost::Message;
use snowkeep_proto::v1 as pb;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::Status;
use tower::{Layer, Service};
use tracing::warn;

use super::conn::{ConnCall, ConnInfo};
use super::throttle::Throttle;
use super::wire;
use crate::config::{Limits, MAX_BATCH};
use crate::service::id::DEFAULT_STREAM_BATCH;

/// gRPC's length-prefix of every message, bytes.
const GRPC_HEADER: usize = 5;
/// tonic encodes response messages into chunks of at least this many bytes
/// before handing them to hyper (its `yield_threshold`).
const ENCODE_CHUNK: usize = 32 * 1024;
/// Memory of a call besides its messages: the HTTP/2 stream, the tasks and
/// tonic's state, bytes.
const CALL_OVERHEAD: usize = 8 * 1024;
/// Weight of the responses of methods other than IdService's: health,
/// info, Lease API and reflection answers are a few KiB.
const SMALL_RESPONSE: usize = 64 * 1024;
/// The memory semaphores count in units of this many bytes (a permit count
/// is a `u32`).
const UNIT: usize = 1024;

const NEXT_IDS: &str = "/snowkeep.v1.IdService/NextIds";
const STREAM_IDS: &str = "/snowkeep.v1.IdService/StreamIds";
/// Every method whose response is a stream: they take from the streams pool.
pub const STREAMING_METHODS: &[&str] = &[
    STREAM_IDS,
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// Which pool a call takes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A call with one response message.
    Unary,
    /// A call whose response is a stream.
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

    fn flag(self) -> &'static str {
        match self {
            CallKind::Unary => "--max-concurrent-calls",
            CallKind::Stream => "--max-open-streams",
        }
    }
}

#[derive(Debug)]
struct Pool {
    kind: CallKind,
    slots: Arc<Semaphore>,
    max_slots: usize,
    /// In units of [`UNIT`] bytes.
    memory: Arc<Semaphore>,
    max_memory: usize,
}

impl Pool {
    fn new(kind: CallKind, max_slots: usize, max_memory: usize) -> Self {
        Self {
            kind,
            slots: Arc::new(Semaphore::new(max_slots)),
            max_slots,
            memory: Arc::new(Semaphore::new(max_memory / UNIT)),
            max_memory: max_memory / UNIT * UNIT,
        }
    }

    fn slot(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "this server already has {} {} in progress, its limit ({}); retry with backoff or call another snowkeep server",
                self.max_slots,
                self.kind.noun(),
                self.kind.flag()
            ))
        })
    }

    /// Reserves `bytes` more for a call that already holds `held`.
    fn reserve(&self, bytes: usize, held: usize) -> Result<OwnedSemaphorePermit, Status> {
        if bytes + held > self.max_memory {
            return Err(Status::resource_exhausted(format!(
                "this call needs {} bytes of server memory, more than the {} bytes this server gives all {} (a share of --max-call-memory); ask for fewer ids per call",
                bytes + held,
                self.max_memory,
                self.kind.noun()
            )));
        }
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
        self.memory.clone().try_acquire_many_owned(units).map_err(|_| {
            Status::resource_exhausted(format!(
                "this server's memory for {} is in use: {bytes} more bytes do not fit in its {} bytes (a share of --max-call-memory); retry with backoff or call another snowkeep server",
                self.kind.noun(),
                self.max_memory
            ))
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
        Self(Arc::new(Inner {
            unary: Pool::new(CallKind::Unary, limits.max_concurrent_calls, unary_memory),
            streams: Pool::new(
                CallKind::Stream,
                limits.max_open_streams,
                limits.max_call_memory - unary_memory,
            ),
            max_recv: limits.max_recv_message_size,
            max_send: limits.max_send_message_size,
            base: limits.max_recv_message_size
                + GRPC_HEADER
                + limits.http2_max_header_list_size as usize
                + CALL_OVERHEAD,
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
        self.0.unary.in_progress() + self.0.streams.in_progress()
    }

    fn pool(&self, kind: CallKind) -> &Pool {
        match kind {
            CallKind::Unary => &self.0.unary,
            CallKind::Stream => &self.0.streams,
        }
    }

    fn shed(&self, path: &str, status: Status) -> http::Response<tonic::body::Body> {
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
                reason = status.message(),
                "shedding a call: RESOURCE_EXHAUSTED"
            );
        }
        status.into_http()
    }
}

/// What a call holds while in progress; dropping it frees its slot, its
/// memory and its mark on the connection.
#[derive(Debug)]
struct Hold {
    _slot: OwnedSemaphorePermit,
    memory: OwnedSemaphorePermit,
    _conn: Option<ConnCall>,
}

/// Weight in bytes of a call's response, from its request `frame` (one
/// length-prefixed gRPC message): what the call can make the server hold at
/// once. A request the handler will refuse weighs [`SMALL_RESPONSE`].
///
/// * `NextIds(count)`: the ids (8 bytes each) and their encoded message,
///   both alive while tonic encodes.
/// * `StreamIds(batch_size)`: one message generated, one waiting in hyper
///   for the client's flow-control window and one in h2's send buffer; tonic
///   packs small messages into chunks of [`ENCODE_CHUNK`] bytes.
///
/// # Errors
/// RESOURCE_EXHAUSTED when one response message would be larger than
/// `max_send` bytes: refused before any id is generated.
pub fn weigh(path: &str, frame: &[u8], max_send: usize) -> Result<usize, Status> {
    match path {
        NEXT_IDS => {
            let Some(req) = decode::<pb::NextIdsRequest>(frame) else {
                return Ok(SMALL_RESPONSE);
            };
            if req.count == 0 || req.count > MAX_BATCH {
                return Ok(SMALL_RESPONSE);
            }
            let n = req.count as usize;
            let len = ids_message_len(n);
            if len > max_send {
                return Err(Status::resource_exhausted(format!(
                    "{n} ids make a {len}-byte response message, over this server's limit of {max_send} bytes (--max-send-message-size); ask for at most {} ids per call",
                    ids_fitting(max_send)
                )));
            }
            Ok(8 * n + GRPC_HEADER + len)
        }
        STREAM_IDS => {
            let Some(req) = decode::<pb::StreamIdsRequest>(frame) else {
                return Ok(SMALL_RESPONSE);
            };
            let batch = match req.batch_size {
                0 => DEFAULT_STREAM_BATCH,
                b if b <= MAX_BATCH => b,
                _ => return Ok(SMALL_RESPONSE),
            };
            let n = match req.total {
                0 => batch as usize,
                total => total.min(u64::from(batch)) as usize,
            };
            let len = ids_message_len(n);
            if len > max_send {
                return Err(Status::resource_exhausted(format!(
                    "batch_size {n} makes {len}-byte messages, over this server's limit of {max_send} bytes (--max-send-message-size); use a batch_size of at most {}",
                    ids_fitting(max_send)
                )));
            }
            Ok(8 * n + 2 * (ENCODE_CHUNK + GRPC_HEADER + len))
        }
        _ => Ok(SMALL_RESPONSE),
    }
}

/// The message of one uncompressed gRPC `frame`, when the frame is exactly that.
fn decode<M: Message + Default>(frame: &[u8]) -> Option<M> {
    let (&[0, a, b, c, d], body) = (frame.get(..GRPC_HEADER)?, frame.get(GRPC_HEADER..)?) else {
        return None;
    };
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    (body.len() == len).then(|| M::decode(body).ok())?
}

/// Bytes of a protobuf message holding `n` ids as its packed `fixed64`
/// field 1 (`NextIdsResponse`, `IdBatch`), gRPC prefix excluded.
pub fn ids_message_len(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let payload = 8 * n as u64;
    let varint = (64 - (payload | 1).leading_zeros() as usize).div_ceil(7);
    1 + varint + 8 * n
}

/// The most ids whose message fits in `max` bytes.
fn ids_fitting(max: usize) -> usize {
    let mut n = max.saturating_sub(11) / 8;
    while ids_message_len(n + 1) <= max {
        n += 1;
    }
    n
}

/// Reads a unary call's request body: at most one message of `max_recv`
/// bytes, refused as soon as its length prefix says it is larger.
async fn read_request(mut body: tonic::body::Body, max_recv: usize) -> Result<Bytes, Status> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        if let Some(&[_, a, b, c, d]) = buf.get(..GRPC_HEADER) {
            let len = u32::from_be_bytes([a, b, c, d]) as usize;
            if len > max_recv {
                return Err(wire::request_too_large(len, max_recv));
            }
        }
        if buf.len() > GRPC_HEADER + max_recv {
            return Err(wire::request_too_large(buf.len() - GRPC_HEADER, max_recv));
        }
    }
    Ok(buf.freeze())
}

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
        // Marked now, on the connection's own task, so the connection never
        // looks idle between accepting this call and running it.
        let conn_call = match request.extensions().get::<ConnInfo>().cloned() {
            Some(c) => {
                // What tonic's `Request::remote_addr` reads.
                request.extensions_mut().insert(c.tcp.clone());
                Some(c.state.call())
            }
            None => None,
        };
        Box::pin(async move {
            let path = request.uri().path().to_owned();
            let pool = limits.pool(CallKind::of(&path));
            let admitted = pool.slot().and_then(|slot| {
                Ok(Hold {
                    memory: pool.reserve(limits.0.base, 0)?,
                    _slot: slot,
                    _conn: conn_call,
                })
            });
            let mut hold = match admitted {
                Ok(hold) => hold,
                Err(status) => return Ok(limits.shed(&path, status)),
            };
            let weight = if path == NEXT_IDS || path == STREAM_IDS {
                let (parts, body) = request.into_parts();
                let frame = match read_request(body, limits.0.max_recv).await {
                    Ok(frame) => frame,
                    Err(status) => return Ok(status.into_http()),
                };
                let weight = match weigh(&path, &frame, limits.0.max_send) {
                    Ok(w) => w,
                    Err(status) => return Ok(status.into_http()),
                };
                request = http::Request::from_parts(
                    parts,
                    tonic::body::Body::new(http_body_util::Full::new(frame)),
                );
                weight
            } else {
                SMALL_RESPONSE
            };
            match pool.reserve(weight, limits.0.base) {
                Ok(more) => hold.memory.merge(more),
                Err(status) => return Ok(limits.shed(&path, status)),
            }
            let response = inner.call(request).await?;
            let hold = Arc::new(hold);
            Ok(response.map(|body| {
                tonic::body::Body::new(HeldBody {
                    inner: body,
                    hold: Some(hold),
                })
            }))
        })
    }
}

/// A response chunk that keeps its call's [`Hold`] until hyper and h2 have
/// dropped it.
struct HeldChunk {
    data: Bytes,
    _hold: Arc<Hold>,
}

impl AsRef<[u8]> for HeldChunk {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// A response body whose data chunks carry the call's [`Hold`].
struct HeldBody<B> {
    inner: B,
    hold: Option<Arc<Hold>>,
}

impl<B: Body<Data = Bytes> + Unpin> Body for HeldBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let frame = match frame {
            Some(Ok(frame)) => Some(Ok(match (frame.into_data(), &this.hold) {
                (Ok(data), Some(hold)) => Frame::data(Bytes::from_owner(HeldChunk {
                    data,
                    _hold: hold.clone(),
                })),
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

    use prost::Message;
    use tonic::Code;
    use tower::ServiceExt;

    use super::*;

    fn frame(msg: &impl Message) -> Vec<u8> {
        let body = msg.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn ids_message_len_matches_prost() {
        for n in [1usize, 2, 15, 16, 1000, 2047, 2048, 100_000] {
            let msg = pb::NextIdsResponse {
                ids: vec![u64::MAX; n],
            };
            assert_eq!(ids_message_len(n), msg.encoded_len(), "{n} ids");
        }
        assert_eq!(ids_message_len(100_000), 800_004);
        assert_eq!(ids_fitting(800_004), 100_000);
        assert_eq!(ids_fitting(800_003), 99_999);
        assert_eq!(ids_fitting(64 * 1024), 8_191);
    }

    #[test]
    fn weights_follow_the_request() {
        let max = 1 << 20;
        let next = |count| {
            weigh(
                NEXT_IDS,
                &frame(&pb::NextIdsRequest {
                    count,
                    ..Default::default()
                }),
                max,
            )
        };
        assert_eq!(next(1).unwrap(), 8 + 5 + 10);
        assert_eq!(next(100_000).unwrap(), 800_000 + 5 + 800_004);
        // Refused by the handler: nothing to weigh.
        assert_eq!(next(0).unwrap(), SMALL_RESPONSE);
        assert_eq!(next(100_001).unwrap(), SMALL_RESPONSE);
        let stream = |total, batch_size| {
            weigh(
                STREAM_IDS,
                &frame(&pb::StreamIdsRequest { total, batch_size }),
                max,
            )
        };
        // batch_size 0 means 1000.
        assert_eq!(stream(0, 0).unwrap(), 8000 + 2 * (ENCODE_CHUNK + 5 + 8003));
        assert_eq!(stream(10, 1000).unwrap(), 80 + 2 * (ENCODE_CHUNK + 5 + 82));
        assert_eq!(
            weigh(NEXT_IDS, b"\0\0\0\0\x02\xff\xff", max).unwrap(),
            SMALL_RESPONSE
        );
        assert_eq!(
            weigh("/snowkeep.v1.InfoService/GetInfo", b"", max).unwrap(),
            SMALL_RESPONSE
        );
    }

    #[test]
    fn a_response_over_the_send_limit_is_refused_before_generating() {
        let f = frame(&pb::NextIdsRequest {
            count: 10_000,
            ..Default::default()
        });
        let s = weigh(NEXT_IDS, &f, 64 * 1024).unwrap_err();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            s.message(),
            "10000 ids make a 80004-byte response message, over this server's limit of 65536 bytes (--max-send-message-size); ask for at most 8191 ids per call"
        );
        let f = frame(&pb::StreamIdsRequest {
            total: 0,
            batch_size: 10_000,
        });
        let s = weigh(STREAM_IDS, &f, 64 * 1024).unwrap_err();
        assert_eq!(
            s.message(),
            "batch_size 10000 makes 80004-byte messages, over this server's limit of 65536 bytes (--max-send-message-size); use a batch_size of at most 8191"
        );
    }

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
                        if m.server_streaming() {
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
            wire::request_too_large(65536, 16384).message()
        );
        assert_eq!(limits.in_progress(), 0);
    }
}
