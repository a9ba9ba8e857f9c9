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
        Ok(Response::new(pb::NextIdsResponse { ids }))
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
        let state = StreamState {
            // One machine id per stream: ids of several machine ids
            // interleaved in time could not ascend across batches.
            generator: self.generators.pick(),
            shutdown: self.shutdown.clone(),
            issued: metrics::counter!(m::IDS_ISSUED_TOTAL, "namespace" => self.namespace.clone(), "method" => "StreamIds"),
            refusals: self.refusals.clone(),
            total: req.total,
            batch,
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
        Some(Ok(pb::IdBatch { ids }))
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
mod tests {
    use std::time::Duration;

    use snowkeep_client::generator::DEFAULT_MAX_BACKWARD_WAIT;
    use snowkeep_client::layout::DEFAULT_EPOCH_UNIX_MS as EPOCH;
    use snowkeep_client::{GeneratorMetrics, Grant, Layout, ManualClock, Millis};
    use snowkeep_proto::v1::id_service_server::IdService;
    use tokio::sync::watch;
    use tokio_stream::StreamExt;
    use tonic::Code;

    use super::*;

    struct Fixture {
        handler: IdHandler,
        clock: Arc<ManualClock>,
        grant: watch::Sender<Option<Grant>>,
        shutdown: CancellationToken,
    }

    /// A handler over one generator on `layout`, holding machine id 5 with
    /// fence `fence`, its clock at layout ms 1000.
    fn fixture(layout: Layout, fence: u64) -> Fixture {
        let clock = ManualClock::new(layout.epoch_unix_ms() + 1000);
        let (grant, rx) = watch::channel(Some(grant_of(5, fence)));
        let generator = Generator::new(
            layout,
            clock.clone(),
            rx,
            DEFAULT_MAX_BACKWARD_WAIT,
            GeneratorMetrics::default(),
        );
        let shutdown = CancellationToken::new();
        let handler = IdHandler::new(
            GeneratorSet::new(vec![generator]),
            "test".into(),
            clock.clone(),
            shutdown.clone(),
        );
        Fixture {
            handler,
            clock,
            grant,
            shutdown,
        }
    }

    fn grant_of(machine_id: u16, fence: u64) -> Grant {
        Grant {
            machine_id: MachineId(machine_id),
            floor: Millis(0),
            fence: Millis(fence),
            deadline: None,
        }
    }

    async fn open(f: &Fixture, total: u64, batch_size: u32) -> IdStream {
        f.handler
            .stream_ids(Request::new(pb::StreamIdsRequest { total, batch_size }))
            .await
            .expect("stream opens")
            .into_inner()
    }

    /// The next batch; panics on anything else.
    async fn batch(s: &mut IdStream) -> Vec<u64> {
        match s.next().await {
            Some(Ok(b)) => b.ids,
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// The end status; panics on a batch, and checks nothing follows it.
    async fn end_status(s: &mut IdStream) -> Status {
        let status = match s.next().await {
            Some(Err(status)) => status,
            other => panic!("expected the end status, got {other:?}"),
        };
        assert!(s.next().await.is_none(), "the stream goes on after its end");
        status
    }

    /// The 1024 ids of machine id 5 at layout ms `ts` (default layout).
    fn ms_of_ids(ts: u64) -> Vec<u64> {
        let first = (ts << 22) | (5 << 10);
        (first..first + 1024).collect()
    }

    #[tokio::test]
    async fn a_finite_stream_ends_ok_after_exactly_total_ids() {
        let f = fixture(Layout::default(), 1_000_000);
        let mut s = open(&f, 2500, 1000).await;
        let mut got = Vec::new();
        while let Some(item) = s.next().await {
            got.push(item.expect("no error").ids.len());
            f.clock.advance(Duration::from_millis(1));
        }
        assert_eq!(got, vec![1000, 1000, 500]);
    }

    /// A stream whose body stops being polled while its batch waits for the
    /// next millisecond (hyper holding a message for a reader whose window
    /// is shut) must not hold other calls of its machine id up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_no_longer_polled_mid_batch_does_not_hold_other_calls_up() {
        let f = fixture(Layout::default(), 1_000_000);
        let mut s = open(&f, 0, 1000).await;
        assert_eq!(batch(&mut s).await, ms_of_ids(1000)[..1000].to_vec());
        // The second batch finds 24 ids of ms 1000 and waits for ms 1001.
        let pending = {
            let next = std::pin::pin!(s.next());
            futures_util::poll!(next).is_pending()
        };
        assert!(pending, "the second batch waits for ms 1001");
        // The stream is never polled again; the clock moves on.
        f.clock.advance(Duration::from_millis(1));
        let ids = tokio::time::timeout(
            Duration::from_secs(5),
            f.handler.next_ids(Request::new(pb::NextIdsRequest {
                count: 3,
                client_time_unix_ms: 0,
            })),
        )
        .await
        .expect("NextIds is served while the stream is not polled")
        .expect("NextIds succeeds")
        .into_inner()
        .ids;
        // The stream's batch, made meanwhile on its own task, and the call
        // share 1,003 ids, each once: the 24 left of ms 1000 and the first
        // 979 of ms 1001 when the batch task ran before the clock moved, or
        // the first 1,003 of ms 1001 when it ran after (those 24 are a gap).
        let second = batch(&mut s).await;
        assert_eq!(second.len(), 1000);
        assert_eq!(ids.len(), 3);
        let mut all: Vec<u64> = second.into_iter().chain(ids).collect();
        all.sort_unstable();
        let waited: Vec<u64> = ms_of_ids(1000)[1000..]
            .iter()
            .chain(&ms_of_ids(1001)[..979])
            .copied()
            .collect();
        let later = ms_of_ids(1001)[..1003].to_vec();
        assert!(
            all == waited || all == later,
            "ids {:?}..{:?} ({} of them)",
            all.first(),
            all.last(),
            all.len()
        );
    }

    #[tokio::test]
    async fn a_clock_stepped_back_mid_stream_ends_it_unavailable_with_the_count() {
        let f = fixture(Layout::default(), 1_000_000);
        let mut s = open(&f, 10 * 1024, 1024).await;
        let mut received = Vec::new();
        for ts in 1000..1003 {
            let ids = batch(&mut s).await;
            assert_eq!(ids, ms_of_ids(ts));
            received.extend(ids);
            f.clock.advance(Duration::from_millis(1));
        }
        // Back by 1 s from the last stamped ms (1002): more than the 100 ms
        // that are waited out.
        f.clock.set_unix_ms(EPOCH + 2);
        let status = end_status(&mut s).await;
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "stream ended early: 3072 of 10240 ids sent; clock stepped back by 1s, more than \
             the 100ms that is waited out; ask for the remaining 7168 ids on another snowkeep \
             server, or on this one once it is ready again"
        );
        assert_eq!(received.len(), 3072);
    }

    #[tokio::test]
    async fn a_lease_lost_mid_stream_ends_it_unavailable_with_the_count() {
        let f = fixture(Layout::default(), 1_000_000);
        let mut s = open(&f, 5000, 1024).await;
        assert_eq!(batch(&mut s).await, ms_of_ids(1000));
        f.clock.advance(Duration::from_millis(1));
        f.grant.send_replace(None);
        let status = end_status(&mut s).await;
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "stream ended early: 1024 of 5000 ids sent; no valid machine-id lease is held; \
             ask for the remaining 3976 ids on another snowkeep server, or on this one once \
             it is ready again"
        );
    }

    #[tokio::test]
    async fn a_stream_never_changes_machine_id_when_its_lease_is_claimed_again_elsewhere() {
        let f = fixture(Layout::default(), 1_000_000);
        let mut s = open(&f, 5000, 1024).await;
        assert_eq!(batch(&mut s).await, ms_of_ids(1000));
        f.clock.advance(Duration::from_millis(1));
        // Lost and claimed again on machine id 9 while the stream waited:
        // the next batch would be machine id 9's, so it is never sent.
        f.grant.send_replace(Some(grant_of(9, 1_000_000)));
        let status = end_status(&mut s).await;
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "stream ended early: 1024 of 5000 ids sent; the lease on machine id 5 was lost \
             and this server now issues from machine id 9; ask for the remaining 3976 ids on \
             another snowkeep server, or on this one once it is ready again"
        );
    }

    #[tokio::test]
    async fn a_fence_not_raised_in_time_ends_the_stream_unavailable_with_the_count() {
        let f = fixture(Layout::default(), 1001);
        let mut s = open(&f, 4096, 1024).await;
        for ts in 1000..1002 {
            assert_eq!(batch(&mut s).await, ms_of_ids(ts));
            f.clock.advance(Duration::from_millis(1));
        }
        let status = end_status(&mut s).await;
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "stream ended early: 2048 of 4096 ids sent; clock reached the persisted fence \
             1001ms that has not been raised; ask for the remaining 2048 ids on another \
             snowkeep server, or on this one once it is ready again"
        );
    }

    #[tokio::test]
    async fn a_layout_out_of_timestamps_ends_the_stream_failed_precondition() {
        // 11 timestamp bits: the last timestamp is layout ms 2047.
        let layout = Layout::new(11, 12, 40, EPOCH).unwrap();
        let f = fixture(layout, 1_000_000);
        let mut s = open(&f, 3000, 1000).await;
        assert_eq!(batch(&mut s).await.len(), 1000);
        f.clock.advance(Duration::from_millis(1048));
        let status = end_status(&mut s).await;
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "stream ended early: 1000 of 3000 ids sent; clock is past the layout's last \
             timestamp 2047ms"
        );
    }

    #[tokio::test]
    async fn shutdown_ends_a_finite_and_an_unbounded_stream_unavailable_with_the_count() {
        let f = fixture(Layout::default(), 1_000_000);
        let mut finite = open(&f, 10_000, 1024).await;
        assert_eq!(batch(&mut finite).await, ms_of_ids(1000));
        f.clock.advance(Duration::from_millis(1));
        let mut endless = open(&f, 0, 512).await;
        let first = batch(&mut endless).await;
        assert_eq!(first, ms_of_ids(1001)[..512]);
        f.shutdown.cancel();
        let status = end_status(&mut finite).await;
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "stream ended early: 1024 of 10000 ids sent; this server is shutting down; \
             ask for the remaining 8976 ids on another snowkeep server"
        );
        let status = end_status(&mut endless).await;
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "stream ended: 512 ids sent; this server is shutting down; open a new stream on \
             another snowkeep server"
        );
    }
}
