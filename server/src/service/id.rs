//! `IdService`: unary batches and streams of ascending ids.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use snowkeep_client::{GenerateError, Generator, GeneratorSet, MachineId, SharedClock, Taken};
use snowkeep_proto::v1 as pb;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::status::{ApiError, StreamEnd};
use super::text;
use crate::limits::Throttle;
use crate::metrics as m;
use snowkeep_core::batch::{DEFAULT_STREAM_BATCH, MAX_BATCH};

/// A refusal of one reason is logged at most once per this period.
pub const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// The `reason` label of `snowkeep_issuance_refusals_total` for a generator
/// refusal.
pub fn refusal_reason(e: &GenerateError) -> &'static str {
    match e {
        GenerateError::NoGrant | GenerateError::LeaseExpired => "no_lease",
        GenerateError::ClockBehindFloor { .. } => "clock_behind_floor",
        GenerateError::FenceReached { .. } => "fence_reached",
        GenerateError::ClockSteppedBack { .. } => "clock_stepped_back",
        GenerateError::ClockBeforeEpoch => "clock_before_epoch",
        GenerateError::LayoutExhausted { .. } => "layout_exhausted",
    }
}

/// Every `reason` label value, so the counters exist (at 0) from the start.
pub const REFUSAL_REASONS: [&str; 6] = [
    "no_lease",
    "clock_behind_floor",
    "fence_reached",
    "clock_stepped_back",
    "clock_before_epoch",
    "layout_exhausted",
];

/// Counts the calls the generator refused, by reason, and logs each reason
/// at most once per [`REFUSAL_LOG_PERIOD`] with the number held back: while
/// issuance is stopped, every call is refused, and one log line per call
/// would flood the logs.
struct Refusals {
    namespace: String,
    logged: Mutex<HashMap<&'static str, Throttle>>,
}

impl Refusals {
    fn new(namespace: String) -> Self {
        for reason in REFUSAL_REASONS {
            metrics::counter!(m::ISSUANCE_REFUSALS_TOTAL, "namespace" => namespace.clone(), "reason" => reason)
                .increment(0);
        }
        Self {
            namespace,
            logged: Mutex::new(HashMap::new()),
        }
    }

    fn record(&self, method: &'static str, e: &GenerateError) {
        let reason = refusal_reason(e);
        metrics::counter!(m::ISSUANCE_REFUSALS_TOTAL, "namespace" => self.namespace.clone(), "reason" => reason)
            .increment(1);
        let held_back = self
            .logged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_insert_with(|| Throttle::new(REFUSAL_LOG_PERIOD))
            .hit(tokio::time::Instant::now());
        if let Some(held_back) = held_back {
            tracing::warn!(namespace = %self.namespace, method, reason, error = %e, refusals_not_logged = held_back, "issuance refused a call; this reason is logged at most once per {}s", REFUSAL_LOG_PERIOD.as_secs());
        }
    }
}

/// Serves `snowkeep.v1.IdService`.
#[derive(Clone)]
pub struct IdHandler {
    generators: Arc<GeneratorSet>,
    namespace: String,
    /// For the skew of callers that send their time.
    clock: SharedClock,
    /// Cancelled at shutdown: open streams end with UNAVAILABLE.
    shutdown: CancellationToken,
    refusals: Arc<Refusals>,
    /// `snowkeep_ids_issued_total{method="NextIds"}`, registered on the first
    /// call that issues (so `/metrics` shows it once ids were issued) and
    /// then reused: a lookup by labels costs an allocation and a hash per
    /// call.
    unary_issued: Arc<OnceLock<metrics::Counter>>,
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
            refusals: Arc::new(Refusals::new(namespace.clone())),
            unary_issued: Arc::new(OnceLock::new()),
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
        let text_bits = text::texts_wanted(req.format, &self.generators.layout())?;
        let ids = self
            .generators
            .next_ids(u64::from(count))
            .await
            .map_err(|e| {
                self.refusals.record("NextIds", &e);
                ApiError::from(e)
            })?;
        self.unary_issued
            .get_or_init(|| metrics::counter!(m::IDS_ISSUED_TOTAL, "namespace" => self.namespace.clone(), "method" => "NextIds"))
            .increment(ids.len() as u64);
        let texts = text::texts_of(&ids, text_bits);
        Ok(Response::new(pb::NextIdsResponse { ids, texts }))
    }

    type StreamIdsStream = IdStream;

    /// Streams `total` ids (0 = until cancelled) in batches of `batch_size`.
    /// A stream that ends before `total` (or an unbounded one that ends at
    /// all) ends with a non-OK status whose message counts the ids sent; see
    /// [`ApiError::StreamEnded`].
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
        let text_bits = text::texts_wanted(req.format, &self.generators.layout())?;
        let state = StreamState {
            // One machine id per stream: ids of several machine ids
            // interleaved in time could not ascend across batches.
            generator: self.generators.pick(),
            shutdown: self.shutdown.clone(),
            issued: metrics::counter!(m::IDS_ISSUED_TOTAL, "namespace" => self.namespace.clone(), "method" => "StreamIds"),
            refusals: self.refusals.clone(),
            total: req.total,
            batch,
            text_bits,
            sent: 0,
            machine_id: None,
            ended: false,
        };
        // Generation starts only when tonic polls for the next message, i.e.
        // when HTTP/2 flow control lets it send: a slow reader slows issuance.
        // Each batch is then made on a task of its own, so it runs to its end
        // even when hyper stops polling this body (a reader whose window is
        // shut, with a message already buffered): a batch left half made
        // would keep its place in the generator's queue of waiting callers
        // and hold every other call of this machine id up.
        let stream = futures_util::stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            let made = tokio::spawn(async move {
                let item = state.next_batch().await;
                (state, item)
            })
            .await;
            match made {
                Ok((state, item)) => Some((item?, Some(state))),
                Err(e) => Some((
                    Err(Status::internal(format!(
                        "making the next batch of ids failed: {e}; ask for the remaining ids again"
                    ))),
                    None,
                )),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// One `StreamIds` call in progress.
struct StreamState {
    /// The generator of the one machine id the stream draws from.
    generator: Arc<Generator>,
    /// Cancelled at shutdown.
    shutdown: CancellationToken,
    /// `snowkeep_ids_issued_total{method="StreamIds"}`.
    issued: metrics::Counter,
    /// Counts and logs the generator's refusal that ends the stream.
    refusals: Arc<Refusals>,
    /// Ids asked for; 0 = until cancelled.
    total: u64,
    /// Ids per message.
    batch: u32,
    /// `Some(total_bits)` when each batch carries the ids' texts too.
    text_bits: Option<u8>,
    /// Ids handed to tonic in whole batches so far: exactly what the client
    /// receives before the end status.
    sent: u64,
    /// The machine id of the first batch; every later batch must carry it.
    machine_id: Option<MachineId>,
    /// True once the end status has been yielded.
    ended: bool,
}

impl StreamState {
    /// The next message: a batch, the end status of a stream that ends
    /// early, or `None` once the stream is over (OK after `total` ids).
    async fn next_batch(&mut self) -> Option<Result<pb::IdBatch, Status>> {
        if self.ended {
            return None;
        }
        let want = if self.total == 0 {
            u64::from(self.batch)
        } else {
            (self.total - self.sent).min(u64::from(self.batch))
        };
        if want == 0 {
            return None;
        }
        if self.shutdown.is_cancelled() {
            return Some(Err(self.end(StreamEnd::Shutdown)));
        }
        // The lease can be lost and the slot re-claimed on another machine id
        // between two polls (a slow reader). The stream must not change
        // machine id, or its ids might not ascend: such a batch is dropped (a
        // gap, never a reuse) and the stream ends. Each run the generator
        // hands over is stamped under one grant, so checking runs is exact.
        let layout = self.generator.layout();
        let mut pinned = self.machine_id;
        let mut moved = None;
        let mut ids = Vec::with_capacity(usize::try_from(want).unwrap_or(0));
        let sink = |t: Taken| {
            if let Some(run) = layout.decode(t.first).map(|d| d.machine_id) {
                let from = *pinned.get_or_insert(run);
                if run != from && moved.is_none() {
                    moved = Some(StreamEnd::MachineIdChanged { from, to: run });
                }
            }
            ids.extend(t.first..t.first + t.count);
        };
        let result = tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => Err(StreamEnd::Shutdown),
            r = self.generator.fill(want, sink) => r.map_err(StreamEnd::Generate),
        };
        if let Err(cause) = result.and(moved.map_or(Ok(()), Err)) {
            if let StreamEnd::Generate(e) = &cause {
                self.refusals.record("StreamIds", e);
            }
            return Some(Err(self.end(cause)));
        }
        self.machine_id = pinned;
        self.sent += want;
        self.issued.increment(want);
        let texts = text::texts_of(&ids, self.text_bits);
        Some(Ok(pb::IdBatch { ids, texts }))
    }

    /// The end status for `cause`, after which the stream yields nothing.
    fn end(&mut self, cause: StreamEnd) -> Status {
        self.ended = true;
        ApiError::StreamEnded {
            sent: self.sent,
            total: self.total,
            cause,
        }
        .into()
    }
}

#[cfg(test)]
mod tests;
