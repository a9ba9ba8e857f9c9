//! Keeps a translated answer's source chunks alive until the translation is
//! written out.
//!
//! The call limits (`snowkeep-guard`) know a response chunk is written out
//! when hyper drops it: that ends its `--stream-send-timeout` clock, paces a
//! stream's next message and, with the last chunk, frees the call's slot and
//! memory. An HTTP/JSON answer (JSON, NDJSON) or a gRPC-Web one (tonic-web,
//! base64 in text mode) is made of new bytes, and the gRPC chunks it was
//! made from would be dropped as soon as they are read: a client that stops
//! reading would keep its call, its slot and its memory forever, unseen by
//! the send timeout. [`Taken`] wraps the gRPC body and keeps every data
//! chunk read from it; [`Carried`] wraps the translated body and hands the
//! chunks kept so far over to each data chunk it gives hyper, so they are
//! dropped with it, once it is written out.
//!
//! A translation must emit an output chunk for every input chunk it has
//! read whole (NDJSON: a line per message; tonic-web: a frame per chunk),
//! which both do: tonic never splits one message over two chunks.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// The source chunks read and not yet handed to an output chunk.
#[derive(Debug, Default)]
pub(crate) struct Kept(Mutex<Vec<Bytes>>);

impl Kept {
    fn push(&self, data: Bytes) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(data);
    }

    fn take(&self) -> Vec<Bytes> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

pin_project_lite::pin_project! {
    /// A gRPC body whose data chunks are also kept in [`Kept`].
    pub(crate) struct Taken<B> {
        #[pin]
        inner: B,
        kept: Arc<Kept>,
    }
}

impl<B> Taken<B> {
    /// `inner`, keeping its chunks in `kept`.
    pub(crate) fn new(inner: B, kept: Arc<Kept>) -> Self {
        Self { inner, kept }
    }
}

impl<B: Body<Data = Bytes>> Body for Taken<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            this.kept.push(data.clone());
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

/// An output chunk that owns the source chunks it was made from.
struct WithSources {
    data: Bytes,
    _sources: Vec<Bytes>,
}

impl AsRef<[u8]> for WithSources {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

pin_project_lite::pin_project! {
    /// A translated body whose data chunks carry the source chunks kept
    /// since the one before.
    pub(crate) struct Carried<B> {
        #[pin]
        inner: B,
        kept: Arc<Kept>,
    }
}

impl<B> Carried<B> {
    /// `inner`, carrying what `kept` holds.
    pub(crate) fn new(inner: B, kept: Arc<Kept>) -> Self {
        Self { inner, kept }
    }
}

impl<B: Body<Data = Bytes>> Body for Carried<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        let frame = frame.map(|f| {
            f.map(|f| {
                f.map_data(|data| {
                    let sources = this.kept.take();
                    match sources.is_empty() {
                        true => data,
                        false => Bytes::from_owner(WithSources {
                            data,
                            _sources: sources,
                        }),
                    }
                })
            })
        });
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
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    /// A chunk that records when it is dropped.
    struct Probe(Arc<std::sync::atomic::AtomicUsize>, &'static [u8]);

    impl AsRef<[u8]> for Probe {
        fn as_ref(&self) -> &[u8] {
            self.1
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_source_chunk_lives_until_the_output_chunk_made_from_it_is_dropped() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dropped = Arc::new(AtomicUsize::new(0));
        let chunks = [b"one".as_slice(), b"two".as_slice()].map(|c| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_owner(Probe(
                dropped.clone(),
                c,
            ))))
        });
        let kept = Arc::new(Kept::default());
        let source = Taken::new(
            StreamBody::new(futures_util::stream::iter(chunks)),
            kept.clone(),
        );
        // A translation that copies every chunk into new bytes.
        let copied = source.map_frame(|f| f.map_data(|d| Bytes::copy_from_slice(&d)));
        let mut out = Carried::new(copied, kept);
        let first = out.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"one");
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            0,
            "kept while its copy lives"
        );
        let second = out.frame().await.unwrap().unwrap().into_data().unwrap();
        drop(first);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert_eq!(&second[..], b"two");
        drop(second);
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
    }
}
