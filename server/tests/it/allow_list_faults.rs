//! Findings of the break session on the network controls. Each test here
//! FAILS on the code it was written against; see its comment for why.

use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpSocket;

use crate::support::server::ServerProcess;
use crate::support::READY;

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

/// `--allow-cidrs` is meant to keep peers outside the listed networks
/// away ("Stops 1: any process that reaches the gRPC port"), but it is a
/// tower layer that answers each *call* PERMISSION_DENIED: the TCP
/// connection is accepted, counted against `--max-connections`, its TLS
/// handshake (if any) run, and it is kept open for as long as the peer
/// keeps calling. Peers outside the list, from a few source addresses
/// (`--max-connections` / `--max-connections-per-peer`: 4 at the default
/// 256/64), therefore take every connection slot, and the allowed clients
/// are turned away. A peer outside the list should be closed at accept,
/// before it counts against any limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_outside_the_allow_list_take_every_connection_slot_from_allowed_ones() {
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
        for _ in 0..4 {
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
}
