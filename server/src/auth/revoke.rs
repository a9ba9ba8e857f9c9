//! A key's open streams end when the key is revoked or expires: the
//! authentication layer wraps the response of every stream opened with a
//! key in a [`Revocable`] body (and the request of a streamed import in a
//! [`RevocableRequest`]). It checks the key again whenever the
//! [`KeyCache`] changes (a revocation, a new expiry or a delete that the
//! key watch delivered) and when the key's expiry comes, by the same rule
//! and at the same moment as new calls with that key are refused, and then
//! ends the stream with that call's UNAUTHENTICATED status, or, when its
//! client is not reading (a chunk still not written out a second later, see
//! `crate::limits::calls::Unwritten`), resets it so h2 drops the queued
//! chunk and the call's slot with it. One case stays with
//! `--stream-send-timeout`: hyper polls no body while it holds a chunk for
//! a window of exactly 0 (the previous message filled it to the byte).
//!
//! The same bodies end the streams admitted without a key check, while the
//! cluster's security mode was off or not read yet, once it turns on
//! ([`mode_turned_on`]): no call opened without a key outlives the moment new
//! calls without one are refused.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use snowkeep_client::SharedClock;
use tonic::Status;
use tracing::info;

use super::cache::{KeyCache, Verdict};
use super::cluster::ClusterAuth;
use crate::limits::calls::Unwritten;
use snowkeep_core::api_key::{KeyRefusal, PresentedKey};

/// Resolves once `presented` is refused (revoked, expired, deleted or its
/// secret replaced), with the refusal a new call would get.
pub(super) async fn refused(
    cache: KeyCache,
    presented: PresentedKey,
    clock: SharedClock,
) -> KeyRefusal {
    let mut changes = cache.changes();
    loop {
        if let Verdict::Refused(refusal) = cache.verify(&presented, clock.unix_ms()) {
            return refusal;
        }
        let expiry = cache
            .expires_unix_ms(presented.id())
            .filter(|&at| at != 0)
            .map(|at| Duration::from_millis(at.saturating_sub(clock.unix_ms())));
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    // The cache is gone: nothing can change any more.
                    std::future::pending::<()>().await;
                }
            }
            _ = tokio::time::sleep(expiry.unwrap_or_default()), if expiry.is_some() => {}
        }
    }
}

/// What ends a call early: resolves with the status the call ends with.
pub(super) type Ending = Pin<Box<dyn Future<Output = Status> + Send>>;

/// Resolves once `presented` is refused, with the UNAUTHENTICATED status a
/// new call with it would get (logged with `method`).
pub(super) fn key_refused(
    cache: KeyCache,
    presented: PresentedKey,
    clock: SharedClock,
    method: String,
) -> Ending {
    Box::pin(async move {
        let refusal = refused(cache, presented, clock).await;
        info!(key_id = refusal.key_label(), method = %method, reason = refusal.result(), "ending a call: its API key is no longer valid");
        Status::unauthenticated(refusal.to_string())
    })
}

/// The status of a call admitted without a key check (the mode was off, or
/// not read yet) that is still open when the cluster's security mode turns
/// on.
pub(super) const MODE_TURNED_ON: &str = "the cluster turned API keys on (its security mode is now on) after this call was admitted without a key; call again with `authorization: Bearer <id>.<secret>` metadata (snowkeepctl --api-key-file)";

/// Resolves once `mode` enforces keys, with UNAUTHENTICATED
/// ([`MODE_TURNED_ON`]; logged with `method`).
pub(super) fn mode_turned_on(mode: &ClusterAuth, method: String) -> Ending {
    let on = mode.turned_on();
    Box::pin(async move {
        on.await;
        info!(method = %method, "ending a call admitted without an API key: the cluster's security mode turned on");
        Status::unauthenticated(MODE_TURNED_ON)
    })
}

/// A stream's response body that ends with its [`Ending`]'s status as soon
/// as that resolves (a revoked or expired key, the mode turning on). The
/// inner body, and with it the call's slot and memory, is dropped then.
pub(super) struct Revocable<B> {
    inner: Option<B>,
    ended: Ending,
    unwritten: Option<Unwritten>,
    /// The status once `ended` resolved, while the last chunk is still
    /// being written out, and how long that may take.
    ending: Option<(Status, Pin<Box<tokio::time::Sleep>>)>,
}

/// How long an ended stream's last chunk may take to be written out before
/// the stream is reset instead of ended with its status.
const UNREAD_GRACE: Duration = Duration::from_secs(1);

/// `status`'s own headers (grpc-status, grpc-message) as trailers.
fn trailers_of(status: Status) -> Frame<Bytes> {
    let mut trailers = status.into_http::<()>().into_parts().0.headers;
    trailers.remove(http::header::CONTENT_TYPE);
    Frame::trailers(trailers)
}

impl<B> Revocable<B> {
    /// `inner`, ended when `ended` resolves. With `unwritten` (from the
    /// call limits), a stream whose client is not reading then is reset at
    /// once instead: its status would wait behind data nobody takes.
    pub(super) fn new(inner: B, ended: Ending, unwritten: Option<Unwritten>) -> Self {
        Self {
            inner: Some(inner),
            ended,
            unwritten,
            ending: None,
        }
    }
}

/// A streamed request's body (ImportStream) that fails with its
/// [`Ending`]'s status as soon as that resolves: the handler reading it gets
/// the status as the stream's error and ends the call with it.
pub(super) struct RevocableRequest {
    inner: Option<tonic::body::Body>,
    ended: Ending,
}

impl RevocableRequest {
    /// `inner`, failed when `ended` resolves.
    pub(super) fn new(inner: tonic::body::Body, ended: Ending) -> Self {
        Self {
            inner: Some(inner),
            ended,
        }
    }
}

impl Body for RevocableRequest {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.inner.is_none() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(status) = self.ended.as_mut().poll(cx) {
            self.inner = None;
            return Poll::Ready(Some(Err(status)));
        }
        let inner = self.inner.as_mut().expect("checked above");
        Pin::new(inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }
}

impl<B> Body for Revocable<B>
where
    B: Body<Data = Bytes, Error = Status> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ending.is_none() {
            if self.inner.is_none() {
                return Poll::Ready(None);
            }
            match self.ended.as_mut().poll(cx) {
                Poll::Ready(status) => {
                    // The inner body, and the call's slot, go now.
                    self.inner = None;
                    self.ending = Some((status, Box::pin(tokio::time::sleep(UNREAD_GRACE))));
                }
                Poll::Pending => {
                    let inner = self.inner.as_mut().expect("checked above");
                    return Pin::new(inner).poll_frame(cx);
                }
            }
        }
        let written = self.unwritten.as_ref().is_none_or(|u| u.poll_written(cx));
        let (_, grace) = self.ending.as_mut().expect("set above");
        if !written && grace.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let (status, _) = self.ending.take().expect("set above");
        if written {
            return Poll::Ready(Some(Ok(trailers_of(status))));
        }
        // The client is not reading: a status would wait behind data it
        // never takes. hyper resets the stream on a body error; h2 then
        // drops the queued chunk, and the call's hold with it.
        Poll::Ready(Some(Err(status)))
    }

    fn is_end_stream(&self) -> bool {
        self.ending.is_none() && self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use snowkeep_client::ManualClock;

    use super::*;
    use crate::auth::test_keys::{assert_expired_at_10_s, stored};
    use snowkeep_core::api_key::BootstrapKey;

    /// A body that never ends by itself.
    fn endless() -> tonic::body::Body {
        let frames = futures_util::stream::pending::<Result<Frame<Bytes>, Status>>();
        tonic::body::Body::new(http_body_util::StreamBody::new(frames))
    }

    async fn trailer_status(body: &mut Revocable<tonic::body::Body>) -> Status {
        let frame = body.frame().await.expect("a frame").expect("no error");
        let trailers = frame.into_trailers().expect("trailers");
        Status::from_header_map(&trailers).expect("a status")
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_unauthenticated_when_its_key_is_revoked() {
        let key = PresentedKey::generate();
        let mut record = BootstrapKey::parse(&key.reveal()).unwrap().record(1);
        let cache = KeyCache::new();
        cache.replace_all(&[stored(&record, 1)], 1);
        let clock: SharedClock = ManualClock::new(5_000);
        let waiting = key_refused(cache.clone(), key.clone(), clock, "/m".into());
        let mut body = Revocable::new(endless(), waiting, None);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        record.revoked = true;
        cache.note(record.clone(), 2);
        let status = trailer_status(&mut body).await;
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert_eq!(
            status.message(),
            format!(
                "API key {} is revoked: ask an administrator for a new key",
                key.id()
            )
        );
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_unauthenticated_when_its_key_expires() {
        let key = PresentedKey::generate();
        let mut record = BootstrapKey::parse(&key.reveal()).unwrap().record(1);
        record.expires_unix_ms = 10_000;
        let cache = KeyCache::new();
        cache.replace_all(&[stored(&record, 1)], 1);
        let clock = ManualClock::new(9_000);
        let waiting = key_refused(cache.clone(), key.clone(), clock.clone(), "/m".into());
        let mut body = Revocable::new(endless(), waiting, None);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        clock.set_unix_ms(10_000);
        let started = tokio::time::Instant::now();
        let status = trailer_status(&mut body).await;
        assert_eq!(started.elapsed(), Duration::from_millis(1));
        assert_expired_at_10_s(&status, &key);
    }
}
