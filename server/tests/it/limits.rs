//! Bounded resources under hostile or broken clients, against the real
//! server: silent TCP connections under a low file limit, SIGTERM with a
//! silent client connected, and a raw HTTP/2 client (the `h2` crate). All
//! on the embedded store.

use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use snowkeep_proto::v1 as pb;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::Code;

use crate::support::eventually;
use crate::support::server::ServerProcess;

/// utime + stime of process `pid` (all threads), clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which ends with the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of stat(5); fields[0] is field 3.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// File descriptors process `pid` has open with a number below `limit`
/// (`limit` of them means it cannot open another under that RLIMIT_NOFILE).
fn open_fds_below(pid: u32, limit: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|fd| *fd < limit)
        .count()
}

/// One uncompressed gRPC message.
fn frame(msg: &impl Message) -> Bytes {
    raw_frame(0, &msg.encode_to_vec())
}

fn raw_frame(flag: u8, body: &[u8]) -> Bytes {
    let mut out = vec![flag];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out.into()
}

fn request(port: u16, path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// A raw HTTP/2 client with a stream receive window of `window` bytes; its
/// connection is driven by a task until the client is dropped and that
/// task aborted.
async fn h2_client(
    port: u16,
    window: u32,
) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (client, task)
}

/// Sends one request with `body` and returns the call's final status code
/// and message, reading the whole response (within 10 s).
async fn call(
    client: &mut h2::client::SendRequest<Bytes>,
    port: u16,
    path: &str,
    body: Bytes,
) -> (Code, String) {
    tokio::time::timeout(
        Duration::from_secs(10),
        call_unbounded(client, port, path, body),
    )
    .await
    .unwrap_or_else(|_| panic!("{path}: no final status within 10 s"))
}

async fn call_unbounded(
    client: &mut h2::client::SendRequest<Bytes>,
    port: u16,
    path: &str,
    body: Bytes,
) -> (Code, String) {
    let ready = client.clone().ready().await.unwrap();
    *client = ready;
    let (response, mut send) = client.send_request(request(port, path), false).unwrap();
    send.send_data(body, true).unwrap();
    let response = response.await.unwrap();
    let status_of = |h: &http::HeaderMap| tonic::Status::from_header_map(h);
    if let Some(s) = status_of(response.headers()) {
        return (s.code(), s.message().to_owned());
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    let s = status_of(&trailers).expect("grpc-status in trailers");
    (s.code(), s.message().to_owned())
}

fn next_ids(count: u32) -> Bytes {
    frame(&pb::NextIdsRequest {
        count,
        ..Default::default()
    })
}

/// 80 silent connections to the gRPC port and 4 to the metrics port, with
/// the server limited to 64 file descriptors: accepting fails with EMFILE,
/// and the server backs off (little CPU, one log line per listener) instead
/// of spinning; the idle timeout closes the silent connections and a client
/// is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_under_a_low_file_limit_neither_spin_nor_stay() {
    let server = ServerProcess::spawn(&["--idle-timeout", "2s", "--max-connections", "1000"]);
    server.wait_serving(Duration::from_secs(15)).await;
    let pid = server.pid();
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=64:64"])
        .status()
        .expect("run prlimit (util-linux)");
    assert!(status.success(), "prlimit failed");

    let mut silent = Vec::new();
    for _ in 0..80 {
        silent.push(
            TcpStream::connect(("127.0.0.1", server.port))
                .await
                .unwrap(),
        );
    }
    eventually(
        "the server out of file descriptors",
        Duration::from_secs(5),
        || async { open_fds_below(pid, 64) == 64 },
    )
    .await;
    // These wait in the metrics listener's backlog: it cannot accept them.
    for _ in 0..4 {
        silent.push(
            TcpStream::connect(("127.0.0.1", server.metrics_port))
                .await
                .unwrap(),
        );
    }
    eventually(
        "both listeners failing to accept",
        Duration::from_secs(5),
        || async {
            let log = server.log();
            ["gRPC", "metrics"].iter().all(|l| {
                log.lines().any(|line| {
                    line.contains("cannot accept connections")
                        && line.contains(&format!("listener=\"{l}\""))
                })
            })
        },
    )
    .await;
    // The window of the measurement, not a wait for a condition: CPU time
    // spent in one second with descriptors exhausted. A spinning accept
    // loop takes about 100 ticks per core.
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spent = cpu_ticks(pid) - before;
    assert_eq!(
        open_fds_below(pid, 64),
        64,
        "still exhausted at the end of the window"
    );
    assert!(
        spent <= 10,
        "{spent} ticks of CPU in 1 s while out of descriptors"
    );
    let log = server.log();
    let warned = |listener: &str| {
        log.lines()
            .filter(|l| {
                l.contains("cannot accept connections")
                    && l.contains(&format!("listener=\"{listener}\""))
            })
            .count()
    };
    assert_eq!(warned("gRPC"), 1, "log:\n{log}");
    assert_eq!(warned("metrics"), 1, "log:\n{log}");

    // The idle timeout closes every silent connection, those accepted late
    // included: each one reads end-of-stream.
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        for mut s in silent {
            let mut buf = [0u8; 64];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    // HTTP/2 SETTINGS from the server, then nothing.
                    Ok(_) => {}
                }
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "silent connections still open after 20 s");
    assert_eq!(
        server
            .next_ids(3)
            .await
            .expect("NextIds after the flood")
            .len(),
        3
    );
}

/// SIGTERM with one client connected that never says a word, and one that
/// made a call and sits idle: the server exits 0 at once, well within the
/// 10 s grace period, and does not report a drain timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_silent_client_exits_at_once() {
    let mut server = ServerProcess::spawn(&[]);
    server.wait_serving(Duration::from_secs(15)).await;
    let _silent = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    let idle = server.ids().await;
    let mut idle_client = idle.clone();
    idle_client
        .next_ids(pb::NextIdsRequest {
            count: 1,
            ..Default::default()
        })
        .await
        .expect("NextIds");
    // Accepted in order: the silent connection was accepted before the one
    // that just made a call.

    let started = tokio::time::Instant::now();
    server.signal("TERM");
    let status = server.wait_exit(Duration::from_secs(3)).await;
    let took = started.elapsed();
    let log = server.log();
    assert_eq!(status.code(), Some(0), "log:\n{log}");
    assert!(took < Duration::from_secs(3), "exit took {took:?}");
    assert!(!log.contains("drain timed out"), "log:\n{log}");
    assert!(
        log.contains("in-flight requests drained gracefully"),
        "log:\n{log}"
    );
}

/// A client that makes no call but answers the server's keepalive pings is
/// not idle: it stays connected past the idle timeout and is served on the
/// same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_answering_keepalive_pings_stays_connected() {
    let server = ServerProcess::spawn(&[
        "--idle-timeout",
        "1500ms",
        "--http2-keepalive-interval",
        "1s",
    ]);
    server.wait_serving(Duration::from_secs(15)).await;
    let port = server.port;
    let (mut client, conn) = h2_client(port, 1 << 20).await;
    let (code, _) = call(
        &mut client,
        port,
        "/snowkeep.v1.IdService/NextIds",
        next_ids(1),
    )
    .await;
    assert_eq!(code, Code::Ok);
    // The span under test: over two idle timeouts with no call, only the
    // answers to the server's pings.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!conn.is_finished(), "the connection was closed");
    let (code, _) = call(
        &mut client,
        port,
        "/snowkeep.v1.IdService/NextIds",
        next_ids(1),
    )
    .await;
    assert_eq!(code, Code::Ok);
}

/// Under an open-file limit of 128, the default `--max-connections` (256)
/// could let clients take every descriptor: the server says so at start.
/// 32 connections fit, and it says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_limit_above_the_open_file_limit_is_reported_at_start() {
    let prlimit = ["prlimit", "--nofile=128:128", "--"];
    let warning = "exceed the open-file limit 128";
    let over = ServerProcess::spawn_wrapped(&prlimit, &[], &[]);
    over.wait_serving(Duration::from_secs(15)).await;
    assert!(over.log().contains(&format!("--max-connections 256 plus 16 metrics connections and about 64 descriptors of the server's own {warning}")), "log:\n{}", over.log());
    let within = ServerProcess::spawn_wrapped(&prlimit, &["--max-connections", "32"], &[]);
    within.wait_serving(Duration::from_secs(15)).await;
    assert!(!within.log().contains(warning), "log:\n{}", within.log());
}
