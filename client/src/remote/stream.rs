//! [`IdStream`]: the batches of one `StreamIds` call, counted, so that a
//! stream which ends before its `total` is an error and never looks like a
//! whole one.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use snowkeep_proto::v1 as pb;

use crate::error::ClientError;

type Batches = Pin<Box<dyn Stream<Item = Result<pb::IdBatch, tonic::Status>> + Send>>;

/// The batches of one `StreamIds` call, from one server. Ids ascend across
/// the whole stream.
///
/// Read it with [`IdStream::message`] (or as a `Stream`):
///
/// - `Ok(Some(batch))` for each batch;
/// - `Ok(None)` once exactly `total` ids arrived (for `total` 0: only if the
///   server ended the stream with OK, which servers that report early ends
///   never do);
/// - `Err(ClientError::Status(_))` when the server ended the stream with an
///   error status. The server's message says how many ids it sent of how
///   many were asked; [`IdStream::received`] counts what arrived. A
///   retryable status (UNAVAILABLE) means: ask another server for the rest.
/// - `Err(ClientError::ShortStream { .. })` when the server ended a finite
///   stream with OK before `total` ids (an older server at shutdown).
///
/// After an error, the stream yields `Ok(None)`.
pub struct IdStream {
    batches: Batches,
    total: u64,
    received: u64,
    ended: bool,
    /// True when every batch must carry a text per id.
    texts: bool,
    /// Longest wait for one batch ([`IdStream::message`]); `None`: no limit.
    idle: Option<std::time::Duration>,
}

impl std::fmt::Debug for IdStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdStream")
            .field("total", &self.total)
            .field("received", &self.received)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl IdStream {
    /// Counts the `batches` of a call that asked for `total` ids (0 =
    /// unbounded).
    pub(crate) fn new(
        batches: impl Stream<Item = Result<pb::IdBatch, tonic::Status>> + Send + 'static,
        total: u64,
    ) -> Self {
        Self {
            batches: Box::pin(batches),
            total,
            received: 0,
            ended: false,
            texts: false,
            idle: None,
        }
    }

    /// The same stream, ending with `DEADLINE_EXCEEDED` (retryable) when
    /// [`IdStream::message`] waits longer than `idle` for a batch: a server
    /// that stalls (stopped, partitioned) ends the part instead of holding
    /// the reader forever.
    pub(crate) fn idle_timeout(mut self, idle: std::time::Duration) -> Self {
        self.idle = Some(idle);
        self
    }

    /// The same stream, ending with [`ClientError::NoTexts`] at a batch
    /// whose texts do not match its ids one for one.
    pub(crate) fn expecting_texts(mut self) -> Self {
        self.texts = true;
        self
    }

    /// The next batch, `Ok(None)` at a whole stream's end, or the error that
    /// ended it early (see [`IdStream`]).
    pub async fn message(&mut self) -> Result<Option<pb::IdBatch>, ClientError> {
        match self.idle {
            None => futures_util::StreamExt::next(self).await.transpose(),
            Some(idle) => self.message_within(idle).await,
        }
    }

    /// [`IdStream::message`], waiting at most `wait` for the batch (a
    /// resuming stream's wait is the smaller of its idle timeout and the
    /// retry budget left); then the stream ends with `DEADLINE_EXCEEDED`.
    pub(crate) async fn message_within(
        &mut self,
        wait: std::time::Duration,
    ) -> Result<Option<pb::IdBatch>, ClientError> {
        match tokio::time::timeout(wait, futures_util::StreamExt::next(self)).await {
            Ok(item) => item.transpose(),
            Err(_) => {
                self.ended = true;
                Err(ClientError::Status(tonic::Status::deadline_exceeded(
                    format!("no batch within {wait:?} after {} ids", self.received),
                )))
            }
        }
    }

    /// Ids received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Ids asked for; 0 = unbounded.
    pub fn total(&self) -> u64 {
        self.total
    }
}

impl Stream for IdStream {
    type Item = Result<pb::IdBatch, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let item = match futures_util::ready!(self.batches.as_mut().poll_next(cx)) {
            Some(Ok(batch)) if self.texts && batch.texts.len() != batch.ids.len() => {
                self.ended = true;
                Some(Err(ClientError::NoTexts {
                    ids: batch.ids.len(),
                    texts: batch.texts.len(),
                }))
            }
            Some(Ok(batch)) => {
                self.received += batch.ids.len() as u64;
                Some(Ok(batch))
            }
            Some(Err(status)) => {
                self.ended = true;
                Some(Err(ClientError::Status(status)))
            }
            None => {
                self.ended = true;
                (self.total != 0 && self.received < self.total).then_some(Err(
                    ClientError::ShortStream {
                        received: self.received,
                        total: self.total,
                    },
                ))
            }
        };
        Poll::Ready(item)
    }
}

#[cfg(test)]
mod tests {
    use tonic::{Code, Status};

    use super::*;

    fn batch(ids: std::ops::Range<u64>) -> Result<pb::IdBatch, Status> {
        Ok(pb::IdBatch {
            ids: ids.collect(),
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn a_whole_stream_ends_with_none_after_total_ids() {
        let mut s = IdStream::new(futures_util::stream::iter([batch(1..4), batch(4..6)]), 5);
        assert_eq!(s.message().await.unwrap().unwrap().ids, vec![1, 2, 3]);
        assert_eq!(s.message().await.unwrap().unwrap().ids, vec![4, 5]);
        assert!(s.message().await.unwrap().is_none());
        assert_eq!((s.received(), s.total()), (5, 5));
    }

    #[tokio::test]
    async fn a_finite_stream_ended_with_ok_before_its_total_is_an_error() {
        let mut s = IdStream::new(futures_util::stream::iter([batch(1..4)]), 10);
        assert_eq!(s.message().await.unwrap().unwrap().ids, vec![1, 2, 3]);
        let err = s.message().await.unwrap_err();
        assert!(
            matches!(
                err,
                ClientError::ShortStream {
                    received: 3,
                    total: 10
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "the server ended the stream after 3 of 10 ids with OK; ask for the remaining 7 ids again"
        );
        assert!(err.is_retryable());
        assert!(s.message().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_error_status_mid_stream_is_returned_with_the_count_received() {
        let end = Status::unavailable("stream ended early: 3 of 10 ids sent; ...");
        let mut s = IdStream::new(futures_util::stream::iter([batch(1..4), Err(end)]), 10);
        s.message().await.unwrap();
        match s.message().await {
            Err(ClientError::Status(status)) => assert_eq!(status.code(), Code::Unavailable),
            other => panic!("expected the status, got {other:?}"),
        }
        assert_eq!(s.received(), 3);
        assert!(s.message().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_unbounded_stream_ended_with_ok_just_ends() {
        let mut s = IdStream::new(futures_util::stream::iter([batch(1..3)]), 0);
        s.message().await.unwrap();
        assert!(s.message().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_stream_expecting_texts_ends_at_a_batch_without_them() {
        let with_texts = Ok(pb::IdBatch {
            ids: vec![1, 2],
            texts: vec!["0000000000001".into(), "0000000000002".into()],
        });
        let mut s = IdStream::new(futures_util::stream::iter([with_texts, batch(3..5)]), 4)
            .expecting_texts();
        let first = s.message().await.unwrap().unwrap();
        assert_eq!(first.texts, ["0000000000001", "0000000000002"]);
        let err = s.message().await.unwrap_err();
        assert!(
            matches!(err, ClientError::NoTexts { ids: 2, texts: 0 }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "asked for ids as text, the server returned 2 ids and 0 texts: it predates IdFormat; \
             upgrade it, or encode the ids with snowkeep_client::text_id under the namespace's \
             layout"
        );
        assert_eq!(s.received(), 2);
        assert!(s.message().await.unwrap().is_none());
    }
}
