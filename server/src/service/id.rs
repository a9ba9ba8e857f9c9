//! `IdService`: unary batches and streams of ascending ids.

use std::pin::Pin;
use std::sync::Arc;

use snowkeep_client::{GeneratorSet, SharedClock};
use snowkeep_proto::v1 as pb;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::status::ApiError;
use crate::config::MAX_BATCH;
use crate::metrics as m;

/// Default ids per streamed message.
pub const DEFAULT_STREAM_BATCH: u32 = 1000;

/// Serves `snowkeep.v1.IdService`.
#[derive(Clone)]
pub struct IdHandler {
    generators: Arc<GeneratorSet>,
    namespace: String,
    /// For the skew of callers that send their time.
    clock: SharedClock,
    /// Cancelled at shutdown: open streams end.
    shutdown: CancellationToken,
}

impl std::fmt::Debug for IdHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdHandler")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl IdHandler {
    /// Creates the handler.
    pub fn new(
        generators: Arc<GeneratorSet>,
        namespace: String,
        clock: SharedClock,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            generators,
            namespace,
            clock,
            shutdown,
        }
    }
}

type IdStream = Pin<Box<dyn Stream<Item = Result<pb::IdBatch, Status>> + Send>>;

#[tonic::async_trait]
impl pb::id_service_server::IdService for IdHandler {
    async fn next_ids(
        &self,
        request: Request<pb::NextIdsRequest>,
    ) -> Result<Response<pb::NextIdsResponse>, Status> {
        let req = request.into_inner();
        let count = req.count;
        if req.client_time_unix_ms != 0 {
            let server = i64::try_from(self.clock.unix_ms()).unwrap_or(i64::MAX);
            let client = i64::try_from(req.client_time_unix_ms).unwrap_or(i64::MAX);
            m::record_skew(
                &self.namespace,
                m::SkewSource::Caller,
                server.saturating_sub(client),
            );
        }
        if count == 0 || count > MAX_BATCH {
            return Err(ApiError::count(count).into());
        }
        let ids = self
            .generators
            .next_ids(u64::from(count))
            .await
            .map_err(ApiError::from)?;
        metrics::counter!(m::IDS_ISSUED_TOTAL, "namespace" => self.namespace.clone(), "method" => "NextIds")
            .increment(ids.len() as u64);
        Ok(Response::new(pb::NextIdsResponse { ids }))
    }

    type StreamIdsStream = IdStream;

    async fn stream_ids(
        &self,
        request: Request<pb::StreamIdsRequest>,
    ) -> Result<Response<IdStream>, Status> {
        let req = request.into_inner();
        let batch = match req.batch_size {
            0 => DEFAULT_STREAM_BATCH,
            b if b <= MAX_BATCH => b,
            got => {
                return Err(ApiError::InvalidBatchSize {
                    got,
                    max: MAX_BATCH,
                }
                .into())
            }
        };
        let remaining = if req.total == 0 { u64::MAX } else { req.total };
        let issued = metrics::counter!(m::IDS_ISSUED_TOTAL, "namespace" => self.namespace.clone(), "method" => "StreamIds");
        // One machine id per stream: ids of several machine ids interleaved in
        // time could not ascend across batches.
        let state = (
            self.generators.pick(),
            self.shutdown.clone(),
            remaining,
            false,
        );
        // Generation happens only when tonic polls for the next message, i.e.
        // when HTTP/2 flow control lets it send: a slow reader slows issuance.
        let stream =
            futures_util::stream::unfold(state, move |(generator, shutdown, remaining, failed)| {
                let issued = issued.clone();
                async move {
                    if remaining == 0 || failed || shutdown.is_cancelled() {
                        return None;
                    }
                    let n = remaining.min(u64::from(batch));
                    let result = tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        r = generator.next_ids(n) => r,
                    };
                    match result {
                        Ok(ids) => {
                            issued.increment(n);
                            Some((
                                Ok(pb::IdBatch { ids }),
                                (generator, shutdown, remaining - n, false),
                            ))
                        }
                        Err(e) => Some((
                            Err(ApiError::from(e).into()),
                            (generator, shutdown, 0, true),
                        )),
                    }
                }
            });
        Ok(Response::new(Box::pin(stream)))
    }
}
