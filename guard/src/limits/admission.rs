//! Who may take what before a call runs, and how long a call may take to
//! send its request (see [`super::calls`] for the pools themselves).
//!
//! * **Keyless calls** (`--auth on`): the calls let through without an API
//!   key (health Check and Watch, server reflection, GetInfo without a key)
//!   are marked [`Keyless`] by the authentication layer and take from pools
//!   of their own, `--max-keyless-calls` and `--max-keyless-streams`. However
//!   many such calls a client opens, callers with a key keep every slot and
//!   byte of theirs.
//! * **Per peer**: one remote IP address has at most
//!   `--max-keyless-calls-per-peer` keyless unary calls and as many keyless
//!   streams in progress, so one peer cannot take the keyless pools that
//!   probes and the peers' clock checks need.
//! * **Per key**: one API key has at most `--max-calls-per-key` unary calls
//!   and `--max-streams-per-key` streams in progress on a server
//!   (`PerKey`), so one key cannot take every slot of its pool.
//! * **Request deadline**: a call whose request message has not fully
//!   arrived `--request-timeout` after its headers is answered
//!   DEADLINE_EXCEEDED and frees its slot (`receive`). For the methods
//!   whose request is a stream (reflection, the streamed import) the
//!   deadline holds for its first message, and each later message is due
//!   within `--request-timeout` of the one before: a stream that pauses
//!   longer fails with DEADLINE_EXCEEDED and frees its slot.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tonic::Status;

use super::weight::GRPC_HEADER;
use super::{status, LimitError};

/// Marks a call the authentication layer let through without an API key
/// while `--auth on`: it takes from the keyless pools.
#[derive(Clone, Copy, Debug)]
pub struct Keyless;

/// The calls of each API key in progress in one pool, at most `max` per key.
#[derive(Debug)]
pub(super) struct PerKey {
    /// Counts remote addresses' keyless calls, not keys' calls.
    per_peer: bool,
    calls: &'static str,
    flag: &'static str,
    max: usize,
    counts: Mutex<HashMap<Arc<str>, usize>>,
}

impl PerKey {
    /// At most `max` `calls` (`unary calls`, `streams`) per key, set by `flag`.
    pub(super) fn new(calls: &'static str, flag: &'static str, max: usize) -> Arc<Self> {
        Arc::new(Self {
            per_peer: false,
            calls,
            flag,
            max,
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// At most `max` keyless `calls` per remote IP address, set by `flag`.
    pub(super) fn per_peer(calls: &'static str, flag: &'static str, max: usize) -> Arc<Self> {
        Arc::new(Self {
            per_peer: true,
            calls,
            flag,
            max,
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// One more call of `key_id` (a remote address for [`PerKey::per_peer`]),
    /// held until the [`KeySlot`] is dropped.
    pub(super) fn take(self: &Arc<Self>, key_id: &Arc<str>) -> Result<KeySlot, LimitError> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        // Looked up first: a key with calls in progress needs no new entry.
        let count = match counts.get_mut(&**key_id) {
            Some(count) => count,
            None => counts.entry(key_id.clone()).or_insert(0),
        };
        if *count >= self.max && self.per_peer {
            return Err(LimitError::PeerBusy {
                peer: key_id.to_string(),
                calls: self.calls,
                max: self.max,
                flag: self.flag,
            });
        }
        if *count >= self.max {
            return Err(LimitError::KeyBusy {
                key_id: key_id.to_string(),
                calls: self.calls,
                max: self.max,
                flag: self.flag,
            });
        }
        *count += 1;
        Ok(KeySlot {
            per_key: self.clone(),
            key_id: key_id.clone(),
        })
    }

    /// Calls of `key_id` in progress now.
    #[cfg(test)]
    pub(super) fn of(&self, key_id: &str) -> usize {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(key_id).copied().unwrap_or(0)
    }
}

/// One call of a key in a [`PerKey`]; dropping it gives the slot back.
#[derive(Debug)]
pub(super) struct KeySlot {
    per_key: Arc<PerKey>,
    key_id: Arc<str>,
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        let mut counts = self
            .per_key
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&*self.key_id) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&*self.key_id);
            }
        }
    }
}

/// The methods whose request is a stream (reflection, bidirectional, and
/// the administration service's streamed import, client-streaming): only
/// their first message is awaited and weighed here; tonic limits each later
/// message to `--max-recv-message-size`.
fn request_is_stream(path: &str) -> bool {
    path.ends_with(".ServerReflection/ServerReflectionInfo")
        || path == "/snowkeep.v1.AdminService/ImportStream"
}

/// Reads `body` up to its end (or, with `first_only`, up to the end of its
/// first message): at most one message of `max_recv` bytes, refused as soon
/// as its length prefix says it is larger.
pub(super) async fn read_request(
    body: &mut tonic::body::Body,
    max_recv: usize,
    first_only: bool,
) -> Result<Bytes, Status> {
    // Most requests arrive in one frame, kept as it came (no copy); a
    // second frame starts a buffer.
    let mut only: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        match only.take() {
            None if buf.is_empty() => only = Some(data),
            first => {
                if let Some(first) = first {
                    buf.extend_from_slice(&first);
                }
                buf.extend_from_slice(&data);
            }
        }
        let buf: &[u8] = only.as_deref().unwrap_or(&buf);
        if let Some(&[_, a, b, c, d]) = buf.get(..GRPC_HEADER) {
            let len = u32::from_be_bytes([a, b, c, d]) as usize;
            if len > max_recv {
                return Err(status(LimitError::RequestTooLarge { len, max: max_recv }));
            }
            if first_only && buf.len() >= GRPC_HEADER + len {
                break;
            }
        }
        if !first_only && buf.len() > GRPC_HEADER + max_recv {
            return Err(status(LimitError::RequestTooLarge {
                len: buf.len() - GRPC_HEADER,
                max: max_recv,
            }));
        }
    }
    Ok(only.unwrap_or_else(|| buf.freeze()))
}

/// Waits at most `timeout` for `request`'s message (see the module docs)
/// and returns the request to run, its body replaced by what was read, and
/// the bytes read.
///
/// # Errors
/// DEADLINE_EXCEEDED when the message did not arrive in time; the statuses
/// of [`read_request`].
pub(super) async fn receive(
    request: http::Request<tonic::body::Body>,
    max_recv: usize,
    timeout: Duration,
) -> Result<(http::Request<tonic::body::Body>, Bytes), Status> {
    let first_only = request_is_stream(request.uri().path());
    let (parts, mut body) = request.into_parts();
    let frame = {
        let mut read = std::pin::pin!(read_request(&mut body, max_recv, first_only));
        // A request whose message came with its headers (nearly all) is read
        // without setting a timer.
        match std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
            Poll::Ready(frame) => frame?,
            Poll::Pending => match tokio::time::timeout(timeout, read).await {
                Ok(frame) => frame?,
                Err(_) => return Err(status(LimitError::RequestTimeout { after: timeout })),
            },
        }
    };
    let body = if first_only {
        tonic::body::Body::new(Prefixed::new(frame.clone(), body, timeout))
    } else {
        tonic::body::Body::new(http_body_util::Full::new(frame.clone()))
    };
    Ok((http::Request::from_parts(parts, body), frame))
}

/// Where a streamed request is in its gRPC messages: the bytes of the
/// current message's prefix seen so far, or the body bytes still to come.
#[derive(Debug, Default)]
struct Framing {
    prefix: Vec<u8>,
    remaining: usize,
}

impl Framing {
    /// Takes in `data`; true when at least one message ended in it.
    fn feed(&mut self, mut data: &[u8]) -> bool {
        let mut ended = false;
        while !data.is_empty() {
            if self.remaining > 0 {
                let take = self.remaining.min(data.len());
                self.remaining -= take;
                data = &data[take..];
                ended |= self.remaining == 0;
                continue;
            }
            let take = (GRPC_HEADER - self.prefix.len()).min(data.len());
            self.prefix.extend_from_slice(&data[..take]);
            data = &data[take..];
            if let &[_, a, b, c, d] = &self.prefix[..] {
                self.remaining = u32::from_be_bytes([a, b, c, d]) as usize;
                self.prefix.clear();
                ended |= self.remaining == 0;
            }
        }
        ended
    }
}

/// A streamed request's body whose first bytes were already read: them,
/// then the rest, each next message due within `stall` of the one before
/// (else the body fails with DEADLINE_EXCEEDED, and the handler with it),
/// so a trickled stream cannot hold its slot without bound.
struct Prefixed {
    first: Option<Bytes>,
    rest: Option<tonic::body::Body>,
    framing: Framing,
    stall: Duration,
    due: Pin<Box<tokio::time::Sleep>>,
}

impl Prefixed {
    fn new(first: Bytes, rest: tonic::body::Body, stall: Duration) -> Self {
        let mut framing = Framing::default();
        framing.feed(&first);
        Self {
            first: Some(first),
            rest: Some(rest),
            framing,
            stall,
            due: Box::pin(tokio::time::sleep(stall)),
        }
    }
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(rest).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if self.framing.feed(data) {
                        let next = tokio::time::Instant::now() + self.stall;
                        self.due.as_mut().reset(next);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending => {
                std::task::ready!(self.due.as_mut().poll(cx));
                self.rest = None;
                let after = self.stall;
                Poll::Ready(Some(Err(status(LimitError::StreamStalled { after }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_takes_at_most_its_share_and_gets_it_back() {
        let per_key = PerKey::new("unary calls", "--max-calls-per-key", 2);
        let a1 = per_key.take(&Arc::from("ka")).unwrap();
        let _a2 = per_key.take(&Arc::from("ka")).unwrap();
        let refused = per_key.take(&Arc::from("ka")).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "API key ka already has 2 unary calls in progress on this server, the most one key may have (--max-calls-per-key); retry with backoff, spread the calls over more keys, or call another snowkeep server"
        );
        let _b = per_key
            .take(&Arc::from("kb"))
            .expect("another key has its own share");
        drop(a1);
        assert_eq!(per_key.of("ka"), 1);
        let _a3 = per_key.take(&Arc::from("ka")).unwrap();
        assert_eq!(per_key.of("ka"), 2);
    }

    fn streamed(chunks: Vec<&'static [u8]>) -> tonic::body::Body {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        for c in chunks {
            tx.try_send(Ok::<_, Status>(Frame::data(Bytes::from_static(c))))
                .unwrap();
        }
        // The sender stays open: the body never ends by itself.
        std::mem::forget(tx);
        tonic::body::Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_never_ends_is_deadline_exceeded_after_the_timeout() {
        let request = http::Request::post("/grpc.health.v1.Health/Check")
            .body(streamed(vec![&[0, 0, 0, 0, 0]]))
            .unwrap();
        let started = tokio::time::Instant::now();
        let refused = receive(request, 16384, Duration::from_secs(3))
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert_eq!(refused.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(
            refused.message(),
            "the request did not arrive in full within 3s of the call's headers (--request-timeout); send each request whole, at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_bidirectional_call_waits_only_for_its_first_message() {
        let path = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
        let request = http::Request::post(path)
            .body(streamed(vec![&[0, 0, 0, 0, 2, 7], &[7, 0]]))
            .unwrap();
        let started = tokio::time::Instant::now();
        let (request, first) = receive(request, 16384, Duration::from_secs(3))
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(&first[..], &[0, 0, 0, 0, 2, 7, 7, 0]);
        let mut body = request.into_body();
        let again = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&again[..], &[0, 0, 0, 0, 2, 7, 7, 0]);
    }

    /// A client-streaming import may send far more than one message's limit
    /// in all: only its first message is read here.
    #[tokio::test(start_paused = true)]
    async fn a_streamed_import_is_not_weighed_as_one_message() {
        let path = "/snowkeep.v1.AdminService/ImportStream";
        const MESSAGE: &[u8] = &[0, 0, 0, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        let message = MESSAGE;
        let request = http::Request::post(path)
            .body(streamed(vec![message, message, message]))
            .unwrap();
        let (request, first) = receive(request, 16, Duration::from_secs(3)).await.unwrap();
        assert_eq!(&first[..], message);
        let mut body = request.into_body();
        let mut all = Vec::new();
        // The test body never ends by itself: its three frames.
        for _ in 0..3 {
            let frame = body.frame().await.unwrap().unwrap();
            all.extend_from_slice(&frame.into_data().unwrap());
        }
        assert_eq!(all, [message, message, message].concat());
    }

    /// A streamed import that stops sending after its first message fails
    /// `--request-timeout` later; each whole message moves the deadline on.
    #[tokio::test(start_paused = true)]
    async fn a_streamed_import_that_pauses_longer_than_the_timeout_fails() {
        let path = "/snowkeep.v1.AdminService/ImportStream";
        const MESSAGE: &[u8] = &[0, 0, 0, 0, 2, 1, 2];
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(Ok::<_, Status>(Frame::data(Bytes::from_static(MESSAGE))))
            .unwrap();
        let body = tonic::body::Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let request = http::Request::post(path).body(body).unwrap();
        let timeout = Duration::from_secs(3);
        let (request, _) = receive(request, 16, timeout).await.unwrap();
        let mut body = request.into_body();
        assert_eq!(
            &body.frame().await.unwrap().unwrap().into_data().unwrap()[..],
            MESSAGE
        );
        // Half a message, then the rest 2 s later: 4 s after the first, still on time.
        let feeder = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            tx.send(Ok(Frame::data(Bytes::from_static(&MESSAGE[..4]))))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(900)).await;
            tx.send(Ok(Frame::data(Bytes::from_static(&MESSAGE[4..]))))
                .await
                .unwrap();
            // Then silence, the sender kept open.
            std::future::pending::<()>().await;
        });
        let started = tokio::time::Instant::now();
        for _ in 0..2 {
            assert!(body.frame().await.unwrap().is_ok());
        }
        assert_eq!(started.elapsed(), Duration::from_millis(2900));
        let stalled = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_millis(5900));
        assert_eq!(stalled.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(
            stalled.message(),
            "no whole message of this streamed request arrived within 3s of the one before (--request-timeout); send the pieces one after another, without pauses"
        );
        assert!(body.frame().await.is_none());
        feeder.abort();
    }

    #[test]
    fn framing_counts_messages_across_chunks() {
        let mut framing = Framing::default();
        assert!(!framing.feed(&[0, 0, 0]));
        assert!(!framing.feed(&[0, 2, 9]));
        assert!(framing.feed(&[9, 0, 0, 0, 0, 0]));
        assert!(!framing.feed(&[0, 0, 0, 0, 1]));
        assert!(framing.feed(&[5]));
    }
}
