//! A `StreamIds` call that ends before its `total` says so: every way a real
//! server ends a stream early (SIGTERM, a holder key deleted in etcd, a clock
//! stepped back) ends it with a non-OK status whose message counts exactly the
//! ids the client received, of the total it asked for.

use std::time::Duration;

use snowkeep_client::{ClientError, Layout, RemoteClient, RemoteConfig};
use snowkeep_proto::v1 as pb;
use tonic::{Code, Streaming};

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::libfaketime;
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);
/// Far more than a test reads: only an early end stops these streams.
const TOTAL: u64 = 50_000_000;

async fn open(server: &ServerProcess, total: u64) -> Streaming<pb::IdBatch> {
    server
        .ids()
        .await
        .stream_ids(pb::StreamIdsRequest {
            total,
            batch_size: 1000,
            ..Default::default()
        })
        .await
        .expect("StreamIds")
        .into_inner()
}

/// Reads `n` batches into `into`.
async fn read_batches(stream: &mut Streaming<pb::IdBatch>, n: usize, into: &mut Vec<u64>) {
    for _ in 0..n {
        let batch = stream.message().await.expect("batch").expect("not ended");
        into.extend(batch.ids);
    }
}

/// Reads to the end within 15 s and returns the end status; panics when the
/// stream ends with OK.
async fn read_to_end(stream: &mut Streaming<pb::IdBatch>, into: &mut Vec<u64>) -> tonic::Status {
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match stream.message().await {
                Ok(Some(batch)) => into.extend(batch.ids),
                Ok(None) => panic!("the stream ended with OK after {} ids", into.len()),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the stream ends within 15 s")
}

fn assert_strictly_ascending(ids: &[u64]) {
    if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
        panic!("ids not strictly ascending: {} then {}", w[0], w[1]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_streams_unavailable_with_the_exact_count_sent() {
    let mut server = ServerProcess::spawn(&[]);
    server.wait_serving(READY).await;
    let mut finite = open(&server, TOTAL).await;
    let mut endless = open(&server, 0).await;
    let (mut from_finite, mut from_endless) = (Vec::new(), Vec::new());
    read_batches(&mut finite, 20, &mut from_finite).await;
    read_batches(&mut endless, 20, &mut from_endless).await;

    server.signal("TERM");
    let finite_end = read_to_end(&mut finite, &mut from_finite).await;
    let endless_end = read_to_end(&mut endless, &mut from_endless).await;

    let n = from_finite.len() as u64;
    assert!((20_000..TOTAL).contains(&n), "{n} ids");
    assert_eq!(finite_end.code(), Code::Unavailable);
    assert_eq!(
        finite_end.message(),
        format!(
            "stream ended early: {n} of {TOTAL} ids sent; this server is shutting down; \
             ask for the remaining {} ids on another snowkeep server",
            TOTAL - n
        )
    );
    let m = from_endless.len();
    assert!(m >= 20_000, "{m} ids");
    assert_eq!(endless_end.code(), Code::Unavailable);
    assert_eq!(
        endless_end.message(),
        format!(
            "stream ended: {m} ids sent; this server is shutting down; \
             open a new stream on another snowkeep server"
        )
    );
    assert_strictly_ascending(&from_finite);
    assert_strictly_ascending(&from_endless);
    // A clean shutdown: the ended streams drained at once.
    let status = server.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "log:\n{}", server.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_key_deleted_mid_stream_ends_it_unavailable_with_the_exact_count_sent() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "cut", &[]);
    server.wait_serving(READY).await;
    let machine_id = server.machine_id().await;
    let mut stream = open(&server, TOTAL).await;
    let mut received = Vec::new();
    read_batches(&mut stream, 20, &mut received).await;

    etcd.client()
        .await
        .delete(format!("/snowkeep/v1/ns/cut/holder/{machine_id:05}"), None)
        .await
        .unwrap();
    let end = read_to_end(&mut stream, &mut received).await;

    let n = received.len() as u64;
    assert!((20_000..TOTAL).contains(&n), "{n} ids");
    assert_eq!(end.code(), Code::Unavailable);
    assert_eq!(
        end.message(),
        format!(
            "stream ended early: {n} of {TOTAL} ids sent; no valid machine-id lease is held; \
             ask for the remaining {} ids on another snowkeep server, or on this one once \
             it is ready again",
            TOTAL - n
        )
    );
    assert_strictly_ascending(&received);
    let layout = Layout::default();
    assert!(received
        .iter()
        .all(|&id| u32::from(layout.decode(id).unwrap().machine_id.get()) == machine_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_back_mid_stream_ends_it_unavailable_with_the_exact_count_sent() {
    // libfaketime reads the server's clock offset from this file (again at
    // most a second later when it changes); the monotonic clock stays real.
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "+0").unwrap();
    let lib = libfaketime();
    let server = ServerProcess::spawn_env(
        &[],
        &[
            ("LD_PRELOAD", &lib),
            ("FAKETIME_TIMESTAMP_FILE", offset.to_str().unwrap()),
            ("FAKETIME_CACHE_DURATION", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    server.wait_serving(READY).await;
    let mut stream = open(&server, TOTAL).await;
    let mut received = Vec::new();
    read_batches(&mut stream, 20, &mut received).await;

    // 10 s back: far more than the 100 ms the server waits out.
    std::fs::write(&offset, "-10").unwrap();
    let end = read_to_end(&mut stream, &mut received).await;

    let n = received.len() as u64;
    assert!((20_000..TOTAL).contains(&n), "{n} ids");
    assert_eq!(end.code(), Code::Unavailable);
    let message = end.message();
    let head = format!("stream ended early: {n} of {TOTAL} ids sent; clock stepped back by ");
    let tail = format!(
        ", more than the 100ms that is waited out; ask for the remaining {} ids on another \
         snowkeep server, or on this one once it is ready again",
        TOTAL - n
    );
    assert!(
        message.starts_with(&head) && message.ends_with(&tail),
        "{message}"
    );
    assert_strictly_ascending(&received);
}

/// An `IdService` like a server from before early ends were reported: its
/// streams end with OK after 3000 ids, whatever `total` asked.
struct EndsShortWithOk;

#[tonic::async_trait]
impl pb::id_service_server::IdService for EndsShortWithOk {
    async fn next_ids(
        &self,
        _: tonic::Request<pb::NextIdsRequest>,
    ) -> Result<tonic::Response<pb::NextIdsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("streams only"))
    }

    type StreamIdsStream =
        futures_util::stream::Iter<std::vec::IntoIter<Result<pb::IdBatch, tonic::Status>>>;

    async fn stream_ids(
        &self,
        _: tonic::Request<pb::StreamIdsRequest>,
    ) -> Result<tonic::Response<Self::StreamIdsStream>, tonic::Status> {
        let batches = (0..3u64)
            .map(|b| {
                Ok(pb::IdBatch {
                    ids: (b * 1000 + 1..=b * 1000 + 1000).collect(),
                    ..Default::default()
                })
            })
            .collect::<Vec<_>>();
        Ok(tonic::Response::new(futures_util::stream::iter(batches)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remote_client_reports_a_stream_ended_short_with_ok_as_an_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::id_service_server::IdServiceServer::new(EndsShortWithOk))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let client = RemoteClient::new(&[url], RemoteConfig::default()).unwrap();

    let mut stream = client.stream_ids(10_000, 1000).await.unwrap();
    let mut received = Vec::new();
    let err = loop {
        match stream.message().await {
            Ok(Some(batch)) => received.extend(batch.ids),
            Ok(None) => panic!("a short stream looked whole after {} ids", received.len()),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err,
            ClientError::ShortStream {
                received: 3000,
                total: 10_000
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the server ended the stream after 3000 of 10000 ids with OK; ask for the remaining 7000 ids again"
    );
    assert_eq!(received, (1..=3000).collect::<Vec<u64>>());
    assert_eq!(stream.received(), 3000);

    // A stream that gets all it asked for still ends with Ok(None).
    let mut whole = client.stream_ids(3000, 1000).await.unwrap();
    let mut n = 0;
    while let Some(batch) = whole.message().await.unwrap() {
        n += batch.ids.len();
    }
    assert_eq!(n, 3000);
}
