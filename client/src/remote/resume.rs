//! [`ResumingStream`]: exactly `total` ids, asked of the next server for
//! the rest whenever one server's part ends early.

use snowkeep_proto::v1 as pb;

use super::{Budget, IdStream, RemoteClient};
use crate::error::ClientError;

/// A stream of exactly `total` ids that survives servers
/// going away: when a server's part ends early with a retryable status (it
/// shut down, was killed, lost its lease, stalled past `request_timeout`),
/// the remaining `total - received()` ids are asked of the next server under
/// the retry rule, whose budget starts again whenever a batch arrives.
///
/// The guarantee: every id is unique; ids ascend within each server's part
/// (a resumed part may start below the last id of the part before, since it
/// comes from another machine id); on success exactly `total` ids were
/// delivered. A non-retryable end, or a spent budget, is returned after the
/// batches already delivered; [`ResumingStream::received`] counts them.
#[derive(Debug)]
pub struct ResumingStream {
    client: RemoteClient,
    total: u64,
    batch_size: u32,
    received: u64,
    part: Option<(IdStream, usize)>,
    budget: Budget,
    ended: bool,
    resumes: u32,
    /// Paces reopening after parts that ended before any batch (a server
    /// that accepts the call, then refuses at its first message).
    backoff: crate::backoff::Backoff,
    /// True when the current part delivered a batch.
    progressed: bool,
}

impl ResumingStream {
    pub(crate) fn new(client: RemoteClient, total: u64, batch_size: u32) -> Self {
        Self {
            budget: client.budget_from_now(),
            total,
            batch_size,
            received: 0,
            part: None,
            ended: false,
            resumes: 0,
            backoff: crate::backoff::Backoff::new(
                client.config().backoff,
                client.config().max_backoff,
            )
            .with_jitter(0.2),
            progressed: false,
            client,
        }
    }

    /// The next batch (strictly ascending ids), `Ok(None)` once exactly
    /// `total` ids arrived, or the error that ended the stream.
    ///
    /// # Errors
    /// The non-retryable status that ended a part, or the last retryable one
    /// once the retry budget is spent. After an error the stream yields
    /// `Ok(None)`.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<u64>>, ClientError> {
        loop {
            if self.ended || self.received >= self.total {
                self.ended = true;
                return Ok(None);
            }
            let (part, server) = match self.part.as_mut() {
                Some(p) => p,
                None => {
                    let rest = self.total - self.received;
                    let format = pb::IdFormat::Unspecified;
                    match self
                        .client
                        .open_part(&mut self.budget, rest, self.batch_size, format)
                        .await
                    {
                        Ok(p) => {
                            self.progressed = false;
                            self.part.insert(p)
                        }
                        Err(e) => return self.end(e),
                    }
                }
            };
            // Each wait for a batch is an attempt under the budget.
            let (wait, cut) = self
                .budget
                .attempt_timeout(self.client.config().request_timeout);
            match part.message_within(wait).await {
                Ok(Some(mut batch)) => {
                    // Never more than `total`, whatever a server sends.
                    let room = usize::try_from(self.total - self.received).unwrap_or(usize::MAX);
                    batch.ids.truncate(room);
                    self.received += batch.ids.len() as u64;
                    self.budget = self.client.budget_from_now();
                    self.progressed = true;
                    self.backoff.reset();
                    return Ok(Some(batch.ids));
                }
                Ok(None) => {
                    self.ended = true;
                    return Ok(None);
                }
                Err(e) if e.is_retryable() => {
                    let server = *server;
                    if let Some(end) = self.part_failed(e, server, cut).await {
                        return end;
                    }
                }
                Err(e) => return self.end(e),
            }
        }
    }

    /// A part ended early with the retryable `e` on `server`: records it in
    /// the budget and, when the budget allows, waits to resume (after the
    /// backoff when the part brought no batch). Returns the stream's end
    /// when it cannot resume: the budget's last failure, which is `e`
    /// unless `e` was a cut attempt's timeout after an earlier failure.
    async fn part_failed(
        &mut self,
        e: ClientError,
        server: usize,
        cut: bool,
    ) -> Option<Result<Option<Vec<u64>>, ClientError>> {
        let status = match &e {
            ClientError::Status(s) => s.clone(),
            other => tonic::Status::new(other.code(), other.to_string()),
        };
        let kept = self.budget.fail(status, cut);
        let give_up = |stream: &mut Self, e: ClientError| {
            let e = if kept {
                e
            } else {
                ClientError::Status(stream.budget.spent())
            };
            Some(stream.end(e))
        };
        if !self.budget.open() {
            return give_up(self, e);
        }
        tracing::debug!(error = %e, received = self.received, "stream part ended early; resuming on the next server");
        self.client.server_failed(server);
        self.part = None;
        self.resumes += 1;
        if !self.progressed {
            // Not a tight loop over servers that refuse at once.
            let delay = self.backoff.next_delay();
            if self.budget.outlasted_by(delay) {
                return give_up(self, e);
            }
            tokio::time::sleep(delay).await;
        }
        None
    }

    fn end(&mut self, e: ClientError) -> Result<Option<Vec<u64>>, ClientError> {
        self.ended = true;
        self.part = None;
        Err(e)
    }

    /// Ids delivered so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Ids asked for.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Parts that ended early and were resumed on another server.
    pub fn resumes(&self) -> u32 {
        self.resumes
    }
}
