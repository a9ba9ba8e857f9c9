//! The remote client's retry rule against loopback `IdService`s.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use snowkeep_proto::v1::id_service_server::{IdService, IdServiceServer};
use tonic::{Code, Request, Response, Status};

use super::*;

/// An `IdService` that answers every `NextIds` with `refusal`, or, when
/// that is `None`, with the ids 1 to `count`; it counts the calls. Its
/// streams send ids from `first_stream_id` in batches, and with a
/// `refusal` end with it after their first batch.
struct Fixed {
    refusal: Option<Code>,
    calls: Arc<AtomicU32>,
    first_stream_id: u64,
    /// Ids a stream sends beyond the `total` asked for (a faulty server).
    overshoot: u64,
    /// The first call (counting from 1) that never answers: a server that
    /// stalls; `u32::MAX` for one that always answers.
    stall_from: u32,
    /// Streams from the `stall_from`-th call on answer with their headers,
    /// then stall before the first batch (instead of stalling unanswered).
    headers_then_stall: bool,
}

impl Fixed {
    /// Counts a call; true when it is one that stalls.
    fn count_call(&self) -> bool {
        self.calls.fetch_add(1, Ordering::SeqCst) + 1 >= self.stall_from
    }
}

#[tonic::async_trait]
impl IdService for Fixed {
    async fn next_ids(
        &self,
        request: Request<pb::NextIdsRequest>,
    ) -> Result<Response<pb::NextIdsResponse>, Status> {
        if self.count_call() {
            std::future::pending::<()>().await;
        }
        match self.refusal {
            Some(code) => Err(Status::new(code, "refused")),
            None => Ok(Response::new(pb::NextIdsResponse {
                ids: (1..=u64::from(request.into_inner().count)).collect(),
                ..Default::default()
            })),
        }
    }

    type StreamIdsStream = futures_util::stream::BoxStream<'static, Result<pb::IdBatch, Status>>;

    async fn stream_ids(
        &self,
        request: Request<pb::StreamIdsRequest>,
    ) -> Result<Response<Self::StreamIdsStream>, Status> {
        if self.count_call() {
            if self.headers_then_stall {
                return Ok(Response::new(Box::pin(futures_util::stream::pending())));
            }
            std::future::pending::<()>().await;
        }
        let r = request.into_inner();
        let end = self.first_stream_id + r.total + self.overshoot;
        let ids: Vec<u64> = (self.first_stream_id..end).collect();
        let mut items: Vec<Result<pb::IdBatch, Status>> = ids
            .chunks(r.batch_size.max(1) as usize)
            .map(|c| {
                Ok(pb::IdBatch {
                    ids: c.to_vec(),
                    ..Default::default()
                })
            })
            .collect();
        if let Some(code) = self.refusal {
            items.truncate(1);
            items.push(Err(Status::new(code, "stream ended early")));
        }
        Ok(Response::new(Box::pin(futures_util::stream::iter(items))))
    }
}

/// Serves a [`Fixed`] on a free loopback port; its URL and call count.
async fn serve(refusal: Option<Code>) -> (String, Arc<AtomicU32>) {
    serve_from(refusal, 1).await
}

/// [`serve`] with streams starting at `first_stream_id`.
async fn serve_from(refusal: Option<Code>, first_stream_id: u64) -> (String, Arc<AtomicU32>) {
    serve_fixed(refusal, first_stream_id, 0, u32::MAX).await
}

/// [`serve_fixed`] whose streams from the `stall_from`-th call on send
/// their headers, then nothing.
async fn serve_stalling_after_headers(
    refusal: Option<Code>,
    stall_from: u32,
) -> (String, Arc<AtomicU32>) {
    serve_with(refusal, 1, 0, stall_from, true).await
}

/// [`serve_from`] whose streams send `overshoot` ids more than asked, and
/// whose calls from the `stall_from`-th on never answer.
async fn serve_fixed(
    refusal: Option<Code>,
    first_stream_id: u64,
    overshoot: u64,
    stall_from: u32,
) -> (String, Arc<AtomicU32>) {
    serve_with(refusal, first_stream_id, overshoot, stall_from, false).await
}

/// Serves a [`Fixed`] with these fields on a free loopback port.
async fn serve_with(
    refusal: Option<Code>,
    first_stream_id: u64,
    overshoot: u64,
    stall_from: u32,
    headers_then_stall: bool,
) -> (String, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(AtomicU32::new(0));
    let service = IdServiceServer::new(Fixed {
        refusal,
        calls: calls.clone(),
        first_stream_id,
        overshoot,
        stall_from,
        headers_then_stall,
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (url, calls)
}

fn config(attempts: u32) -> RemoteConfig {
    RemoteConfig {
        attempts,
        backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        ..RemoteConfig::default()
    }
}

#[tokio::test]
async fn a_server_at_its_limits_is_retried_on_the_next_server() {
    for code in [Code::ResourceExhausted, Code::Unavailable] {
        let (busy, busy_calls) = serve(Some(code)).await;
        let (ok, ok_calls) = serve(None).await;
        let client = RemoteClient::new(&[busy, ok], config(2)).unwrap();
        assert_eq!(client.next_ids(3).await.unwrap(), vec![1, 2, 3], "{code:?}");
        assert_eq!(busy_calls.load(Ordering::SeqCst), 1, "{code:?}");
        assert_eq!(ok_calls.load(Ordering::SeqCst), 1, "{code:?}");
    }
}

#[tokio::test]
async fn a_refusal_no_retry_can_heal_is_returned_after_one_call() {
    for code in [Code::InvalidArgument, Code::PermissionDenied] {
        let (bad, bad_calls) = serve(Some(code)).await;
        let (ok, ok_calls) = serve(None).await;
        let client = RemoteClient::new(&[bad, ok], config(2)).unwrap();
        match client.next_ids(3).await {
            Err(ClientError::Status(s)) => assert_eq!(s.code(), code),
            other => panic!("{code:?}: expected the status, got {other:?}"),
        }
        assert_eq!(bad_calls.load(Ordering::SeqCst), 1, "{code:?}");
        assert_eq!(ok_calls.load(Ordering::SeqCst), 0, "{code:?}");
    }
}

#[tokio::test]
async fn a_count_outside_the_range_is_refused_before_any_call() {
    let (ok, calls) = serve(None).await;
    let client = RemoteClient::new(&[ok], config(2)).unwrap();
    for n in [0, MAX_COUNT + 1] {
        let err = client.next_ids(n).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(
            err.to_string(),
            format!("invalid count: must be 1 to 100000, got {n}")
        );
    }
    let err = client.stream(10, MAX_COUNT + 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid batch_size: must be 0 to 100000, got 100001"
    );
    for total in [0, MAX_TOTAL + 1, u64::MAX] {
        let err = client.stream(total, 10).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(
            err.to_string(),
            format!("invalid total: must be 1 to 9223372036854775807, got {total}")
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_stream_delivers_exactly_total_even_from_a_server_that_sends_more() {
    let (over, _) = serve_fixed(None, 1, 5, u32::MAX).await;
    let client = RemoteClient::new(&[over], config(1)).unwrap();
    let mut stream = client.stream(10, 4).unwrap();
    let mut ids = Vec::new();
    while let Some(batch) = stream.next_batch().await.unwrap() {
        ids.extend(batch);
    }
    assert_eq!(ids, (1..=10).collect::<Vec<u64>>());
    assert_eq!(stream.received(), 10);
}

#[tokio::test]
async fn a_pool_returns_a_refill_refusal_with_its_code_and_asks_again_only_when_asked() {
    let (bad, calls) = serve(Some(Code::PermissionDenied)).await;
    let client = RemoteClient::new(&[bad], config(u32::MAX)).unwrap();
    let pool = IdPool::new(
        client,
        PoolConfig {
            max_wait: Duration::from_secs(3600),
            ..PoolConfig::default()
        },
    );
    // The refill at the start fails once, and nothing calls again unasked.
    let wait = async {
        while pool.last_error().is_none() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the first refill fails");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    for asked in 2..=3 {
        let next = tokio::time::timeout(Duration::from_secs(10), pool.next_id());
        match next
            .await
            .expect("next_id answers without waiting max_wait")
        {
            Err(ClientError::Status(s)) => {
                assert_eq!((s.code(), s.message()), (Code::PermissionDenied, "refused"));
            }
            other => panic!("expected the refusal, got {other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), asked);
    }
}

#[tokio::test]
async fn a_stream_cut_short_is_resumed_on_the_next_server_for_the_rest() {
    let (cut, cut_calls) = serve_from(Some(Code::Unavailable), 1).await;
    let (whole, whole_calls) = serve_from(None, 1000).await;
    let client = RemoteClient::new(&[cut, whole], config(u32::MAX)).unwrap();
    let mut stream = client.stream(10, 4).unwrap();
    let mut ids = Vec::new();
    while let Some(batch) = stream.next_batch().await.unwrap() {
        ids.extend(batch);
    }
    // 4 ids from the first server, then the remaining 6 from the second.
    assert_eq!(ids, [1, 2, 3, 4, 1000, 1001, 1002, 1003, 1004, 1005]);
    assert_eq!((stream.received(), stream.resumes()), (10, 1));
    assert_eq!(cut_calls.load(Ordering::SeqCst), 1);
    assert_eq!(whole_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_stream_ended_by_a_refusal_no_retry_heals_returns_it_after_its_batches() {
    let (cut, _) = serve_from(Some(Code::PermissionDenied), 1).await;
    let client = RemoteClient::new(&[cut], config(u32::MAX)).unwrap();
    let mut stream = client.stream(10, 4).unwrap();
    assert_eq!(stream.next_batch().await.unwrap(), Some(vec![1, 2, 3, 4]));
    let err = stream.next_batch().await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(stream.next_batch().await.unwrap(), None);
    assert_eq!(stream.received(), 4);
}

#[tokio::test]
async fn the_retry_budget_ends_a_call_to_servers_that_keep_failing() {
    let (a, a_calls) = serve(Some(Code::Unavailable)).await;
    let (b, b_calls) = serve(Some(Code::Unavailable)).await;
    let config = RemoteConfig {
        retry_budget: Duration::from_millis(300),
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(20),
        ..RemoteConfig::default()
    };
    let client = RemoteClient::new(&[a, b], config).unwrap();
    let err = client.next_ids(1).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    let calls = a_calls.load(Ordering::SeqCst) + b_calls.load(Ordering::SeqCst);
    // Rounds of two attempts, 20 ms (±20 %) apart, within 300 ms: more than
    // one round, and never more than the budget allows.
    assert!((4..=32).contains(&calls), "{calls} calls");
}

/// Asserts that `result` is the status `code` with `message`.
#[track_caller]
fn assert_status<T: std::fmt::Debug>(result: Result<T, ClientError>, code: Code, message: &str) {
    match result {
        Err(ClientError::Status(s)) => assert_eq!((s.code(), s.message()), (code, message)),
        other => panic!("expected {code:?} {message:?}, got {other:?}"),
    }
}

/// Settings whose attempts only the retry budget (500 ms) cuts short.
fn budget_config() -> RemoteConfig {
    RemoteConfig {
        retry_budget: Duration::from_millis(500),
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(20),
        request_timeout: Duration::from_secs(30),
        ..RemoteConfig::default()
    }
}

#[tokio::test]
async fn an_attempt_the_budget_cuts_short_reports_the_failure_before_it() {
    // The first call is refused as unavailable; the retry stalls until the
    // budget's end cuts it short. What the caller learns is why the server
    // failed, not that the client stopped waiting.
    let (url, calls) = serve_fixed(Some(Code::Unavailable), 1, 0, 2).await;
    let client = RemoteClient::new(&[url], budget_config()).unwrap();
    assert_status(client.next_ids(1).await, Code::Unavailable, "refused");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_stream_whose_resume_the_budget_cuts_short_reports_the_end_before_it() {
    // The part ends early after one batch; reopening stalls until the
    // budget (restarted by that batch) ends.
    let (url, calls) = serve_fixed(Some(Code::Unavailable), 1, 0, 2).await;
    let client = RemoteClient::new(&[url], budget_config()).unwrap();
    let mut stream = client.stream(10, 4).unwrap();
    assert_eq!(stream.next_batch().await.unwrap(), Some(vec![1, 2, 3, 4]));
    assert_status(
        stream.next_batch().await,
        Code::Unavailable,
        "stream ended early",
    );
    assert_eq!(stream.next_batch().await.unwrap(), None);
    assert_eq!((stream.received(), calls.load(Ordering::SeqCst)), (4, 2));
}

#[tokio::test]
async fn a_first_batch_the_budget_cuts_short_reports_the_end_before_it() {
    // The part ends early after one batch; the next server answers the
    // reopened stream with its headers, then sends nothing. The wait for
    // its first batch is the budget left (500 ms), not the request timeout
    // (30 s), and ends with the part's end.
    let (url, calls) = serve_stalling_after_headers(Some(Code::Unavailable), 2).await;
    let client = RemoteClient::new(&[url], budget_config()).unwrap();
    let mut stream = client.stream(10, 4).unwrap();
    assert_eq!(stream.next_batch().await.unwrap(), Some(vec![1, 2, 3, 4]));
    let started = Instant::now();
    assert_status(
        stream.next_batch().await,
        Code::Unavailable,
        "stream ended early",
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!((stream.received(), calls.load(Ordering::SeqCst)), (4, 2));
}

#[tokio::test]
async fn a_stream_ended_with_ok_too_early_is_the_failure_a_cut_resume_reports() {
    // The part ends with OK after one batch (an older server); the resume
    // stalls until the budget's end.
    let (url, calls) = serve_fixed(Some(Code::Ok), 1, 0, 2).await;
    let client = RemoteClient::new(&[url], budget_config()).unwrap();
    let mut stream = client.stream(10, 4).unwrap();
    assert_eq!(stream.next_batch().await.unwrap(), Some(vec![1, 2, 3, 4]));
    let short = ClientError::ShortStream {
        received: 4,
        total: 10,
    };
    assert_status(
        stream.next_batch().await,
        Code::Unavailable,
        &short.to_string(),
    );
    assert_eq!((stream.received(), calls.load(Ordering::SeqCst)), (4, 2));
}
