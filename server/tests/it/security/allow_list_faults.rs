//! Findings of the break session on the network controls, kept as
//! regression tests of their fixes; see each test's comment.

use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpSocket;

use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

/// An HTTP/2 connection from `source` that keeps calling (each call is
/// denied) so that it never counts as idle; returns once it is open.
async fn busy_connection_from(source: &str, port: u16) -> Option<tokio::task::JoinHandle<()>> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let tcp = socket
        .connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .ok()?;
    let (client, conn) = h2::client::Builder::new()
        .handshake::<_, Bytes>(tcp)
        .await
        .ok()?;
    let mut client = client.ready().await.ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(tokio::spawn(async move {
        loop {
            let request = http::Request::builder()
                .method("POST")
                .uri(format!(
                    "http://127.0.0.1:{port}/grpc.health.v1.Health/Check"
                ))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .unwrap();
            let Ok((response, mut send)) = client.send_request(request, false) else {
                return;
            };
            let _ = send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true);
            if response.await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            match client.clone().ready().await {
                Ok(c) => client = c,
                Err(_) => return,
            }
        }
    }))
}

/// Regression: `--allow-cidrs` was only a tower layer answering each *call*
/// PERMISSION_DENIED, while the TCP connection was accepted, counted against
/// `--max-connections` and `--max-connections-per-peer`, and kept open for
/// as long as the peer kept calling, so peers outside the list, from a few
/// source addresses, took every connection slot and the allowed clients were
/// turned away. Now the listener sorts connections by the list at accept:
/// those from outside count against no limit of the allowed peers, only
/// against a budget of their own (8 open, 8 new per second; more are
/// closed at accept, counted with `reason="allow_list"`), and each closes
/// soon after its first call is denied. Here 12 busy connections from
/// outside, more than the budget and than `--max-connections 8`, neither
/// lock out the allowed client nor stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_outside_the_allow_list_take_no_connection_slot_from_allowed_ones() {
    let server = ServerProcess::spawn(&[
        "--allow-cidrs",
        "127.0.0.1/32",
        "--max-connections",
        "8",
        "--max-connections-per-peer",
        "4",
    ]);
    server.wait_serving(READY).await;
    let mut held = Vec::new();
    for source in ["127.0.0.2", "127.0.0.3"] {
        for _ in 0..6 {
            if let Some(task) = busy_connection_from(source, server.port).await {
                held.push(task);
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let alive = held.iter().filter(|t| !t.is_finished()).count();
    let allowed = tokio::time::timeout(Duration::from_secs(5), async {
        let channel = tonic::transport::Channel::from_shared(server.url())
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|_| ())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    })
    .await
    .unwrap_or_else(|_| Err("no answer within 5 s".into()));
    assert!(
        allowed.is_ok(),
        "{alive} connections from 127.0.0.2 and 127.0.0.3 (outside --allow-cidrs 127.0.0.1/32) hold the connection slots; the allowed client 127.0.0.1 gets: {allowed:?}"
    );
    // The server closes them although they keep calling: at the latest 2 s
    // after accept, here soon after the first denial.
    eventually(
        "the server closes the connections from outside the list",
        Duration::from_secs(5),
        || std::future::ready(held.iter().all(|t| t.is_finished())),
    )
    .await;
    // More than the budget came at once: some were closed at accept.
    let refused = server
        .metric(r#"snowkeep_connections_refused_total{listener="gRPC",reason="allow_list"}"#)
        .await;
    assert!(refused >= 1.0, "refused at accept: {refused}");
    for reason in ["max_connections", "max_connections_per_peer"] {
        let series =
            format!(r#"snowkeep_connections_refused_total{{listener="gRPC",reason="{reason}"}}"#);
        assert_eq!(server.metric(&series).await, 0.0, "{series}");
    }
}
