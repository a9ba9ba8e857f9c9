//! `--allow-cidrs` against real server processes: a peer outside every
//! range gets PERMISSION_DENIED (health included) naming its address and the
//! flag, counted under its code; a peer inside one is served.

use std::time::Duration;

use tonic::Code;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_outside_the_allow_list_is_denied_every_call() {
    let server = ServerProcess::spawn(&["--allow-cidrs", "10.0.0.0/8"]);
    // The server answers (with the denial) once it listens.
    let url = server.url();
    eventually("the server listens", READY, || {
        let url = url.clone();
        async move {
            tonic::transport::Channel::from_shared(url)
                .unwrap()
                .connect()
                .await
                .is_ok()
        }
    })
    .await;
    let denied = server.next_ids(5).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert_eq!(
        denied.message(),
        "peer 127.0.0.1 is outside this server's --allow-cidrs (10.0.0.0/8): call from an allowed network, or have the operator add the client's range to --allow-cidrs"
    );
    let health = HealthClient::new(server.channel().await)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(health.code(), Code::PermissionDenied);
    // Both denials are counted under their code, before any handler ran.
    assert_eq!(
        server
            .metric(r#"snowkeep_grpc_requests_total{service="snowkeep.v1.IdService",method="NextIds",protocol="grpc",code="PERMISSION_DENIED"}"#)
            .await,
        1.0
    );
    assert_eq!(
        server
            .metric(r#"snowkeep_grpc_requests_total{service="snowkeep.v1.IdService",method="NextIds",protocol="grpc",code="OK"}"#)
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_inside_the_allow_list_is_served() {
    let server = ServerProcess::spawn(&["--allow-cidrs", "192.168.0.0/16,127.0.0.0/8"]);
    server.wait_serving(Duration::from_secs(20)).await;
    let ids = server.next_ids(25).await.unwrap();
    assert_eq!(ids.len(), 25);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
}

/// NextIds over a channel whose connections come from `source`.
async fn next_ids_from(source: &str, url: &str) -> Result<Vec<u64>, tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .local_address(Some(source.parse().unwrap()))
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    snowkeep_proto::v1::id_service_client::IdServiceClient::new(channel)
        .next_ids(snowkeep_proto::v1::NextIdsRequest {
            count: 5,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().ids)
}

/// A connection from outside the list is closed at accept only beyond its
/// own small budget, and soon after its first denial: within the budget a
/// peer outside the list still learns why it is refused, on every new
/// connection, and takes no slot of the allowed peers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_outside_the_allow_list_still_gets_the_denial_on_each_new_connection() {
    let server = ServerProcess::spawn(&["--allow-cidrs", "127.0.0.1/32", "--max-connections", "1"]);
    server.wait_serving(READY).await;
    let url = server.url();
    for _ in 0..3 {
        let denied = next_ids_from("127.0.0.2", &url).await.unwrap_err();
        assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
        assert_eq!(
            denied.message(),
            "peer 127.0.0.2 is outside this server's --allow-cidrs (127.0.0.1/32): call from an allowed network, or have the operator add the client's range to --allow-cidrs"
        );
    }
    // The one connection slot is the allowed peer's.
    let ids = next_ids_from("127.0.0.1", &url).await.unwrap();
    assert_eq!(ids.len(), 5);
    assert_eq!(
        server
            .metric(r#"snowkeep_grpc_requests_total{service="snowkeep.v1.IdService",method="NextIds",protocol="grpc",code="PERMISSION_DENIED"}"#)
            .await,
        3.0
    );
    for reason in ["allow_list", "max_connections"] {
        let series =
            format!(r#"snowkeep_connections_refused_total{{listener="gRPC",reason="{reason}"}}"#);
        assert_eq!(server.metric(&series).await, 0.0, "{series}");
    }
}

/// A raw HTTP/1.1 GET of `/` (or `path`) from local address `from` to
/// `127.0.0.1:port`: the status line's code and the body.
async fn http_get_from(from: &str, port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut stream = socket
        .connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: snowkeep\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let code = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

/// The status page shows the whole cluster: `--allow-cidrs` guards it as it
/// guards the gRPC port. The metrics port is for the monitoring network and
/// is not guarded by it (bind it with `--metrics-listen`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_obeys_the_allow_list_and_the_metrics_port_serves_scrapers() {
    let etcd = snowkeep_test_support::etcd::EtcdProcess::start().await;
    let page = snowkeep_test_support::free_port();
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "allow-page",
        &[
            "--allow-cidrs",
            "127.0.0.1/32",
            "--admin-listen",
            &page.to_string(),
        ],
    );
    server.wait_serving(READY).await;
    let (code, body) = http_get_from("127.0.0.2", page, "/").await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body,
        "peer 127.0.0.2 is outside this server's --allow-cidrs (127.0.0.1/32): call from an allowed network, or have the operator add the client's range to --allow-cidrs\n"
    );
    let (code, body) = http_get_from("127.0.0.1", page, "/").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("<h1>snowkeep status</h1>"), "{body}");
    let (code, body) = http_get_from("127.0.0.2", server.metrics_port, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("snowkeep_"), "{body}");
}

/// Over HTTP/JSON a peer outside the list gets 403 for everything: a routed
/// call (denied by the allow-list layer and counted under `protocol="http"`)
/// and what the HTTP layer answers itself (the OpenAPI document, a path the
/// API does not have, a body it would refuse).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_outside_the_allow_list_gets_403_for_every_http_request() {
    let server = ServerProcess::spawn(&["--allow-cidrs", "10.0.0.0/8"]);
    let url = server.url();
    eventually("the server listens", READY, || {
        let url = url.clone();
        async move { std::net::TcpStream::connect(url.trim_start_matches("http://")).is_ok() }
    })
    .await;
    let refusal = "peer 127.0.0.1 is outside this server's --allow-cidrs (10.0.0.0/8): call from an allowed network, or have the operator add the client's range to --allow-cidrs";
    let bad_body = format!("{url}/v1/leases:check");
    for args in [
        vec![format!("{url}/v1/ids?count=3")],
        vec![format!("{url}/healthz")],
        vec![format!("{url}/openapi.json")],
        vec![format!("{url}/no/such/path")],
        vec!["-X".into(), "DELETE".into(), format!("{url}/v1/ids")],
        vec![
            "-H".into(),
            "content-type: application/json".into(),
            "-d".into(),
            "{not json".into(),
            bad_body.clone(),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let got = crate::http::curl(&args);
        assert_eq!(got.status, 403, "{args:?}: {got:?}");
        assert_eq!(
            got.json(),
            serde_json::json!({"code": 7, "details": [], "message": refusal}),
            "{args:?}"
        );
    }
    assert_eq!(
        server
            .metric(r#"snowkeep_grpc_requests_total{service="snowkeep.v1.IdService",method="NextIds",protocol="http",code="PERMISSION_DENIED"}"#)
            .await,
        1.0
    );
}
