//! The handler's streams and unary calls against a manual clock.

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
        .stream_ids(Request::new(pb::StreamIdsRequest {
            total,
            batch_size,
            ..Default::default()
        }))
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
            ..Default::default()
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

#[tokio::test]
async fn texts_come_beside_the_ids_when_asked_for_and_an_unknown_format_is_refused() {
    let f = fixture(Layout::default(), 1_000_000);
    let unary = |format: i32| {
        f.handler.next_ids(Request::new(pb::NextIdsRequest {
            count: 2,
            format,
            ..Default::default()
        }))
    };
    let numbers = unary(0).await.unwrap().into_inner();
    assert_eq!(numbers.ids, ms_of_ids(1000)[..2]);
    assert!(numbers.texts.is_empty());
    let both = unary(pb::IdFormat::CrockfordBase32 as i32)
        .await
        .unwrap()
        .into_inner();
    // ms 1000, machine id 5, sequences 2 and 3.
    assert_eq!(both.ids, ms_of_ids(1000)[2..4]);
    assert_eq!(both.texts, ["0000003X00502", "0000003X00503"]);
    let refused = unary(2).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);

    let mut s = f
        .handler
        .stream_ids(Request::new(pb::StreamIdsRequest {
            total: 3,
            batch_size: 2,
            format: pb::IdFormat::CrockfordBase32 as i32,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut texts = Vec::new();
    while let Some(b) = s.next().await {
        let b = b.unwrap();
        assert_eq!(b.texts.len(), b.ids.len());
        texts.extend(b.texts);
    }
    assert_eq!(texts, ["0000003X00504", "0000003X00505", "0000003X00506"]);
    let refused = f
        .handler
        .stream_ids(Request::new(pb::StreamIdsRequest {
            format: -1,
            ..Default::default()
        }))
        .await
        .err()
        .expect("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
}
