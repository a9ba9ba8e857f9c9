//! Clients that stop reading, or stop sending, over HTTP/1.1: the same
//! bounds as gRPC calls (`--stream-send-timeout`, `--request-timeout`).
//! Each client here is a raw TCP socket that writes a request and then
//! reads nothing (or sends part of its body), as a stuck or hostile client
//! does.

use std::time::Duration;

use base64::Engine as _;
use prost::Message;
use snowkeep_proto::v1 as pb;
use snowkeep_test_support::eventually;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::READY;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::curl;

const STALLS: &str = "snowkeep_stream_send_stalls_total";

fn in_flight(method: &str, protocol: &str) -> String {
    format!(
        r#"snowkeep_grpc_requests_in_flight{{service="snowkeep.v1.IdService",method="{method}",protocol="{protocol}"}}"#
    )
}

/// A connection that sent `request` and reads nothing.
async fn stuck(port: u16, request: &[u8]) -> TcpStream {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    socket.write_all(request).await.unwrap();
    socket
}

/// Reads `socket` to its end: the server closed it (an end of file, or a
/// reset for the bytes it never took).
async fn read_to_close(mut socket: TcpStream) {
    let mut buf = vec![0u8; 1 << 20];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the stalled connection was not closed");
}

/// A server with one stream slot and a 2 s send timeout.
fn one_stream_slot() -> (ServerProcess, tempfile::TempDir) {
    super::single_instance(&["--max-open-streams", "1", "--stream-send-timeout", "2s"])
}

/// An unbounded stream whose client stops reading holds the only stream
/// slot; after `--stream-send-timeout` its connection is closed, counted
/// once, and the slot is another client's.
async fn a_stalled_stream_is_cut(request: &[u8], protocol: &str) {
    let (server, _state) = one_stream_slot();
    server.wait_serving(READY).await;
    let socket = stuck(server.port, request).await;
    let series = &in_flight("StreamIds", protocol);
    let server = &server;
    eventually(
        "the stalled stream is open",
        Duration::from_secs(10),
        || async move { server.metric(series).await == 1.0 },
    )
    .await;
    let url = &format!("{}/v1/ids:stream?total=10&batch_size=10", server.url());
    let got = curl(&[url]);
    assert_eq!(got.status, 429, "{got:?}");
    let waited = eventually(
        "the stalled stream's slot is freed",
        Duration::from_secs(20),
        || async move { curl(&[url]).status == 200 },
    )
    .await;
    assert!(waited >= Duration::from_secs(1), "freed after {waited:?}");
    assert_eq!(server.metric(STALLS).await, 1.0);
    assert_eq!(server.metric(series).await, 0.0);
    read_to_close(socket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ndjson_stream_whose_client_stops_reading_is_cut_after_the_send_timeout() {
    let request = b"GET /v1/ids:stream?total=0&batch_size=1000 HTTP/1.1\r\nhost: snowkeep\r\n\r\n";
    a_stalled_stream_is_cut(request, "http").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_web_text_stream_whose_client_stops_reading_is_cut_after_the_send_timeout() {
    let message = pb::StreamIdsRequest {
        total: 0,
        batch_size: 1000,
        ..Default::default()
    }
    .encode_to_vec();
    let framed = super::grpc_frame(&message);
    let body = base64::engine::general_purpose::STANDARD.encode(framed);
    let request = format!(
        "POST /snowkeep.v1.IdService/StreamIds HTTP/1.1\r\nhost: snowkeep\r\ncontent-type: application/grpc-web-text\r\nx-grpc-web: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    a_stalled_stream_is_cut(request.as_bytes(), "grpc-web").await;
}

/// Pipelined `GET /v1/ids?count=100000` answers (about 2 MB of JSON each)
/// that the client never reads: the connection is closed after the send
/// timeout and counted, as a gRPC unary answer's would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_json_answers_lose_their_connection_after_the_send_timeout() {
    let (server, _state) = one_stream_slot();
    server.wait_serving(READY).await;
    let request = b"GET /v1/ids?count=100000 HTTP/1.1\r\nhost: snowkeep\r\n\r\n".repeat(16);
    let socket = stuck(server.port, &request).await;
    let server = &server;
    eventually(
        "the unread answers' connection is closed and counted",
        Duration::from_secs(20),
        || async move { server.metric(STALLS).await == 1.0 },
    )
    .await;
    read_to_close(socket).await;
    assert_eq!(server.metric(&in_flight("NextIds", "http")).await, 0.0);
}

/// A body that stops arriving gets 408 after `--request-timeout`, with a
/// `google.rpc.Status` naming the flag, and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_gets_408_after_the_request_timeout() {
    let (server, _state) = super::single_instance(&["--request-timeout", "1s"]);
    server.wait_serving(READY).await;
    let request = b"POST /v1/leases:check HTTP/1.1\r\nhost: snowkeep\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"namesp";
    let mut socket = stuck(server.port, request).await;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer))
        .await
        .expect("an answer and a close within 10 s")
        .unwrap();
    let got = super::parse(&String::from_utf8_lossy(&answer));
    assert_eq!(got.status, 408, "{got:?}");
    assert_eq!(got.header("connection"), Some("close"));
    assert_eq!(
        got.json(),
        serde_json::json!({"code": 4, "details": [], "message": "the body did not wholly arrive within 1s of the headers (--request-timeout)"})
    );
}
