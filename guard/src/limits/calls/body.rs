//! The response side of a call's hold: every data chunk of a response owns a
//! reference to the call's [`Hold`], so the hold ends only when hyper and h2
//! drop the last chunk; a stream's body hands over its next chunk only once
//! the last one is written out (see [`HeldBody`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};

use super::Hold;
use crate::conn_info::Unsent;

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
    pub(super) fn new(unsent: Arc<Unsent>) -> Arc<Self> {
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
pub struct Unwritten(pub(super) Arc<InFlight>);

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
pub(super) struct HeldBody<B> {
    inner: B,
    hold: Option<Arc<Hold>>,
    paced: bool,
    in_flight: Arc<InFlight>,
}

impl<B> HeldBody<B> {
    pub(super) fn new(inner: B, hold: Arc<Hold>, paced: bool, in_flight: Arc<InFlight>) -> Self {
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
