//! Callers without a key cannot starve callers with one, one key cannot take
//! every slot, a request that never arrives is ended, and a revoked key's
//! open streams end: real etcd, real servers with `--auth on`, and a raw
//! HTTP/2 client (the `h2` crate) that sends a call's headers and never its
//! body.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use snowkeep_proto::v1 as pb;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tonic::Code;

use snowkeep_test_support::auth::{admin, ids, AuthCluster};
use snowkeep_test_support::eventually;

type Answer = Result<(Code, String), String>;

/// Raw HTTP/2 connections to one server, each driven by a task.
struct Raw {
    port: u16,
    clients: Vec<h2::client::SendRequest<Bytes>>,
    /// Request halves kept open (never sent on) and connection tasks.
    open: Vec<h2::SendStream<Bytes>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Raw {
    async fn connect(port: u16, connections: usize) -> Self {
        Self::connect_from(std::net::Ipv4Addr::LOCALHOST, port, connections).await
    }

    /// Like [`Raw::connect`], from source address `from` (any 127.x.y.z on
    /// Linux loopback).
    async fn connect_from(from: std::net::Ipv4Addr, port: u16, connections: usize) -> Self {
        let mut raw = Raw {
            port,
            clients: Vec::new(),
            open: Vec::new(),
            tasks: Vec::new(),
        };
        for _ in 0..connections {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind((from, 0).into()).unwrap();
            let tcp: TcpStream = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
            let (client, conn) = h2::client::handshake(tcp).await.unwrap();
            raw.tasks.push(tokio::spawn(async move {
                let _ = conn.await;
            }));
            raw.clients.push(client);
        }
        raw
    }

    /// Sends the headers of a call to `path` (with `key`, if any) on
    /// connection `on` and never its body; returns a task with the call's
    /// status (from the headers or the trailers).
    async fn headers_only(
        &mut self,
        on: usize,
        path: &str,
        key: Option<&str>,
    ) -> JoinHandle<Answer> {
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!("http://127.0.0.1:{}{path}", self.port))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        let client = self.clients[on].clone().ready().await.unwrap();
        self.clients[on] = client;
        let (response, send) = self.clients[on]
            .send_request(request.body(()).unwrap(), false)
            .unwrap();
        self.open.push(send);
        tokio::spawn(async move {
            let response = response.await.map_err(|e| e.to_string())?;
            if let Some(s) = tonic::Status::from_header_map(response.headers()) {
                return Ok((s.code(), s.message().to_owned()));
            }
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            let trailers = body.trailers().await.map_err(|e| e.to_string())?;
            let s = tonic::Status::from_header_map(&trailers.unwrap_or_default())
                .ok_or("no grpc-status")?;
            Ok((s.code(), s.message().to_owned()))
        })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Waits (at most 20 s) until exactly `answered` of `calls` have an answer,
/// and returns those answers; the others are still open.
async fn answers(calls: &mut Vec<JoinHandle<Answer>>, answered: usize) -> Vec<Answer> {
    eventually(
        &format!("{answered} calls to be answered"),
        Duration::from_secs(20),
        || {
            let done = calls.iter().filter(|c| c.is_finished()).count();
            async move { done >= answered }
        },
    )
    .await;
    let (done, open): (Vec<_>, Vec<_>) = calls.drain(..).partition(|c| c.is_finished());
    *calls = open;
    let mut out = Vec::new();
    for c in done {
        out.push(c.await.unwrap());
    }
    out
}

const CHECK: &str = "/grpc.health.v1.Health/Check";
const WATCH: &str = "/grpc.health.v1.Health/Watch";
const GET_INFO: &str = "/snowkeep.v1.InfoService/GetInfo";
const NEXT_IDS: &str = "/snowkeep.v1.IdService/NextIds";
const STREAM_IDS: &str = "/snowkeep.v1.IdService/StreamIds";

fn next(count: u32) -> pb::NextIdsRequest {
    pb::NextIdsRequest {
        count,
        ..Default::default()
    }
}

/// 300 keyless Check and GetInfo calls that never send their request, over
/// 5 connections, take the 32 keyless slots and are shed beyond them;
/// every NextIds of a key is served meanwhile. Before, they took the unary
/// pool's memory and every NextIds got RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_calls_without_a_body_do_not_starve_keyed_next_ids() {
    // One peer here: its share is raised to the whole pool.
    let c = AuthCluster::start_with(
        "starveunary",
        &[
            "--request-timeout",
            "60s",
            "--max-keyless-calls-per-peer",
            "1000",
        ],
    )
    .await;
    let (key, _) = c.create_key(&[pb::Permission::Ids], &[], 0).await;
    let mut raw = Raw::connect(c.a.port, 5).await;
    let mut calls = Vec::new();
    for i in 0..300 {
        let path = if i % 2 == 0 { CHECK } else { GET_INFO };
        calls.push(raw.headers_only(i % 5, path, None).await);
    }
    let shed = answers(&mut calls, 268).await;
    let expected = Ok((
        Code::ResourceExhausted,
        "this server already has 32 keyless unary calls in progress, its limit (--max-keyless-calls); retry with backoff or call another snowkeep server".to_owned(),
    ));
    assert_eq!(
        shed.iter().filter(|a| **a == expected).count(),
        268,
        "{shed:?}"
    );
    let mut client = ids(&c.a, Some(&key)).await;
    let mut served = 0;
    for _ in 0..20 {
        match client.next_ids(next(10)).await {
            Ok(r) if r.get_ref().ids.len() == 10 => served += 1,
            other => panic!("a keyed NextIds failed: {other:?}"),
        }
    }
    assert_eq!(served, 20);
    assert_eq!(calls.iter().filter(|c| !c.is_finished()).count(), 32);
}

/// 130 keyless health Watch streams that never send their request take the
/// 16 keyless stream slots; a keyed StreamIds still runs to its end.
/// Before, they held the whole --max-open-streams pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keyless_watch_streams_do_not_stop_a_keyed_stream_ids() {
    let c = AuthCluster::start_with(
        "starvestreams",
        &[
            "--request-timeout",
            "60s",
            "--max-keyless-calls-per-peer",
            "1000",
        ],
    )
    .await;
    let (key, _) = c.create_key(&[pb::Permission::Ids], &[], 0).await;
    let mut raw = Raw::connect(c.a.port, 5).await;
    let mut calls = Vec::new();
    for i in 0..130 {
        calls.push(raw.headers_only(i % 5, WATCH, None).await);
    }
    let shed = answers(&mut calls, 114).await;
    let expected = Ok((
        Code::ResourceExhausted,
        "this server already has 16 keyless streams in progress, its limit (--max-keyless-streams); retry with backoff or call another snowkeep server".to_owned(),
    ));
    assert_eq!(
        shed.iter().filter(|a| **a == expected).count(),
        114,
        "{shed:?}"
    );
    let mut stream = ids(&c.a, Some(&key))
        .await
        .stream_ids(pb::StreamIdsRequest {
            total: 1_000,
            batch_size: 100,
            ..Default::default()
        })
        .await
        .expect("a keyed StreamIds is admitted")
        .into_inner();
    let mut got = 0;
    while let Some(batch) = stream.next().await {
        got += batch.expect("a batch").ids.len();
    }
    assert_eq!(got, 1_000);
}

/// A call whose request never arrives is ended DEADLINE_EXCEEDED after
/// --request-timeout, keyless or keyed, and its slot is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_its_request_is_ended_at_the_request_timeout() {
    let c = AuthCluster::start_with(
        "starvetimeout",
        &["--request-timeout", "1s", "--max-keyless-calls", "2"],
    )
    .await;
    let (key, _) = c.create_key(&[pb::Permission::Ids], &[], 0).await;
    let mut raw = Raw::connect(c.a.port, 1).await;
    let expected = Ok((
        Code::DeadlineExceeded,
        "the request did not arrive in full within 1s of the call's headers (--request-timeout); send each request whole, at once".to_owned(),
    ));
    for (path, key) in [(CHECK, None), (NEXT_IDS, Some(key.as_str()))] {
        let started = tokio::time::Instant::now();
        let call = raw.headers_only(0, path, key).await;
        let answer = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .unwrap_or_else(|_| panic!("{path}: not ended within 10 s"))
            .unwrap();
        let took = started.elapsed();
        assert_eq!(answer, expected, "{path}");
        assert!(
            took >= Duration::from_secs(1),
            "{path} ended after {took:?}"
        );
    }
    // The keyless slots are free again.
    assert_eq!(
        c.a.health().await,
        Some(tonic_health::pb::health_check_response::ServingStatus::Serving)
    );
}

/// A key at its per-key limits gets RESOURCE_EXHAUSTED naming them while
/// another key is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_at_its_per_key_limit_is_refused_while_another_key_is_served() {
    let c = AuthCluster::start_with(
        "starveperkey",
        &[
            "--request-timeout",
            "60s",
            "--max-calls-per-key",
            "2",
            "--max-streams-per-key",
            "1",
        ],
    )
    .await;
    let (greedy, greedy_record) = c.create_key(&[pb::Permission::Ids], &[], 0).await;
    let (other, _) = c.create_key(&[pb::Permission::Ids], &[], 0).await;
    let mut raw = Raw::connect(c.a.port, 1).await;
    let paths = [NEXT_IDS, NEXT_IDS, STREAM_IDS];
    let mut held = Vec::new();
    for path in paths {
        held.push(raw.headers_only(0, path, Some(&greedy)).await);
    }
    let mut greedy_ids = ids(&c.a, Some(&greedy)).await;
    // The held calls are admitted on the server's schedule (slow on a busy
    // machine). A probe admitted before a held call takes its slot, and that
    // held call is refused at the key's limit: it is opened again. Should a
    // held call end for any other reason, the answers say why.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let mut ended = Vec::new();
    loop {
        let refused = greedy_ids.clone().next_ids(next(1)).await.err();
        if refused.map(|s| s.code()) == Some(Code::ResourceExhausted) {
            break;
        }
        for (call, path) in held.iter_mut().zip(paths) {
            if !call.is_finished() {
                continue;
            }
            let again = raw.headers_only(0, path, Some(&greedy)).await;
            let answer = std::mem::replace(call, again).await.unwrap();
            let at_the_key_limit = matches!(&answer, Ok((Code::ResourceExhausted, m))
                if m.contains("in progress on this server, the most one key may have"));
            ended.push(format!("{answer:?}"));
            assert!(at_the_key_limit, "a held call ended: {ended:?}");
        }
        if tokio::time::Instant::now() > deadline {
            panic!("the greedy key's calls were not in progress within 40 s; ended: {ended:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The held stream takes its slot on its own schedule: wait for it too.
    eventually(
        "the greedy key's stream to be in progress",
        Duration::from_secs(10),
        || {
            let mut client = greedy_ids.clone();
            async move {
                let request = pb::StreamIdsRequest {
                    total: 1,
                    batch_size: 1,
                    ..Default::default()
                };
                client.stream_ids(request).await.err().map(|s| s.code())
                    == Some(Code::ResourceExhausted)
            }
        },
    )
    .await;
    let id = &greedy_record.id;
    let status = greedy_ids.next_ids(next(1)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        format!("API key {id} already has 2 unary calls in progress on this server, the most one key may have (--max-calls-per-key); retry with backoff, spread the calls over more keys, or call another snowkeep server")
    );
    let status = greedy_ids
        .stream_ids(pb::StreamIdsRequest {
            total: 10,
            batch_size: 10,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        format!("API key {id} already has 1 streams in progress on this server, the most one key may have (--max-streams-per-key); retry with backoff, spread the calls over more keys, or call another snowkeep server")
    );
    let mut other_ids = ids(&c.a, Some(&other)).await;
    assert_eq!(
        other_ids
            .next_ids(next(5))
            .await
            .unwrap()
            .into_inner()
            .ids
            .len(),
        5
    );
    let mut stream = other_ids
        .stream_ids(pb::StreamIdsRequest {
            total: 10,
            batch_size: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.next().await.unwrap().unwrap().ids.len(), 10);
    assert!(held.iter().all(|h| !h.is_finished()));
}

/// An unbounded StreamIds and a TailAudit of keys revoked through the
/// other server end with UNAUTHENTICATED within seconds. Before, the
/// StreamIds kept delivering ids and the TailAudit events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_of_a_key_revoked_elsewhere_end_unauthenticated() {
    let c = AuthCluster::start("starverevoke").await;
    let (ids_key, ids_record) = c.create_key(&[pb::Permission::Ids], &[], 0).await;
    let (admin_key, admin_record) = c.create_key(&[pb::Permission::Admin], &[], 0).await;
    for key in [&ids_key, &admin_key] {
        let key = key.clone();
        eventually(
            "server b to know the new keys",
            Duration::from_secs(10),
            || {
                let (b, key) = (&c.b, key.clone());
                async move {
                    admin(b, Some(&key))
                        .await
                        .list_keys(pb::ListKeysRequest {})
                        .await
                        .err()
                        .map(|s| s.code())
                        != Some(Code::Unauthenticated)
                }
            },
        )
        .await;
    }
    let mut stream = ids(&c.b, Some(&ids_key))
        .await
        .stream_ids(pb::StreamIdsRequest {
            total: 0,
            batch_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.next().await.unwrap().unwrap().ids.len(), 100);
    let mut tail = admin(&c.b, Some(&admin_key))
        .await
        .tail_audit(pb::TailAuditRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut boss = admin(&c.a, Some(&c.admin_key)).await;
    for id in [&ids_record.id, &admin_record.id] {
        boss.revoke_key(pb::RevokeKeyRequest { id: id.clone() })
            .await
            .unwrap();
    }
    let ended = |id: &str| format!("API key {id} is revoked: ask an administrator for a new key");
    let stream_end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return Some(status),
                None => return None,
            }
        }
    })
    .await
    .expect("the revoked key's StreamIds still runs 10 s after the revocation")
    .expect("a status, not a clean end");
    assert_eq!(stream_end.code(), Code::Unauthenticated);
    assert_eq!(stream_end.message(), ended(&ids_record.id));
    let tail_end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match tail.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return Some(status),
                None => return None,
            }
        }
    })
    .await
    .expect("the revoked key's TailAudit still runs 10 s after the revocation")
    .expect("a status, not a clean end");
    assert_eq!(tail_end.code(), Code::Unauthenticated);
    assert_eq!(tail_end.message(), ended(&admin_record.id));
}

/// Opens an ImportStream through `server` with `key` and sends one small
/// piece; returns the call's task and the sender of further pieces.
async fn trickled_import(
    server: &snowkeep_test_support::server::ServerProcess,
    key: &str,
) -> (
    JoinHandle<Result<pb::ImportStreamResponse, tonic::Status>>,
    tokio::sync::mpsc::Sender<pb::ImportStreamRequest>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::ImportStreamRequest {
        chunk: b"{".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut client = admin(server, Some(key)).await;
    let call = tokio::spawn(async move {
        client
            .import_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map(|r| r.into_inner())
    });
    (call, tx)
}

/// A streamed import whose key is revoked mid-upload ends UNAUTHENTICATED
/// at once (before, it ran until its client stopped), and one whose client
/// pauses ends DEADLINE_EXCEEDED `--request-timeout` after its last piece
/// (before, a piece every few seconds held the slot without bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_import_ends_on_revocation_and_when_it_stalls() {
    let c = AuthCluster::start_with("starveimport", &["--request-timeout", "2s"]).await;
    let (key, record) = c.create_key(&[pb::Permission::Admin], &[], 0).await;
    eventually("server a to know the key", Duration::from_secs(10), || {
        let key = key.clone();
        let a = &c.a;
        async move {
            admin(a, Some(&key))
                .await
                .list_keys(pb::ListKeysRequest {})
                .await
                .is_ok()
        }
    })
    .await;
    let (revoked, feed) = trickled_import(&c.a, &key).await;
    // A piece a second: within the stall bound, so only the revocation ends it.
    let feeder = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let piece = pb::ImportStreamRequest {
                chunk: b" ".to_vec(),
                ..Default::default()
            };
            if feed.send(piece).await.is_err() {
                return;
            }
        }
    });
    admin(&c.b, Some(&c.admin_key))
        .await
        .revoke_key(pb::RevokeKeyRequest {
            id: record.id.clone(),
        })
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), revoked)
        .await
        .expect("the revoked key's import still runs 10 s after the revocation")
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (end.code(), end.message()),
        (
            Code::Unauthenticated,
            format!(
                "API key {} is revoked: ask an administrator for a new key",
                record.id
            )
            .as_str()
        )
    );
    feeder.abort();

    let started = tokio::time::Instant::now();
    let (stalled, _feed) = trickled_import(&c.a, &c.admin_key).await;
    let end = tokio::time::timeout(Duration::from_secs(10), stalled)
        .await
        .expect("a stalled import still runs 10 s after its last piece")
        .unwrap()
        .unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        (end.code(), end.message()),
        (
            Code::DeadlineExceeded,
            "no whole message of this streamed request arrived within 2s of the one before (--request-timeout); send the pieces one after another, without pauses"
        )
    );
}

/// 40 headers-only health Checks from one address take its 8 keyless
/// slots (the 32 others get RESOURCE_EXHAUSTED naming the peer's share),
/// and a health Check and a GetInfo from another address are still
/// answered. Before, the first peer's calls filled the 32 keyless slots
/// and every other prober was shed until the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_take_the_keyless_pool_from_probes() {
    let c = AuthCluster::start_with("starvepeer", &["--request-timeout", "60s"]).await;
    let mut flood = Raw::connect(c.a.port, 2).await;
    let mut calls = Vec::new();
    for i in 0..40 {
        calls.push(flood.headers_only(i % 2, CHECK, None).await);
    }
    let shed = answers(&mut calls, 32).await;
    let expected = Ok((
        Code::ResourceExhausted,
        "127.0.0.1 already has 8 keyless unary calls without an API key in progress on this server, the most one address may have (--max-keyless-calls-per-peer); retry with backoff, or send an API key".to_owned(),
    ));
    assert_eq!(
        shed.iter().filter(|a| **a == expected).count(),
        32,
        "{shed:?}"
    );
    let mut prober = Raw::connect_from(std::net::Ipv4Addr::new(127, 0, 0, 2), c.a.port, 1).await;
    let empty = Bytes::from_static(&[0, 0, 0, 0, 0]);
    for path in [CHECK, GET_INFO] {
        let call = prober.headers_only(0, path, None).await;
        let mut send = prober.open.pop().unwrap();
        send.send_data(empty.clone(), true).unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .unwrap_or_else(|_| panic!("{path} from 127.0.0.2 was not answered in 10 s"))
            .unwrap();
        assert_eq!(answer, Ok((Code::Ok, String::new())), "{path}");
    }
    assert_eq!(calls.iter().filter(|c| !c.is_finished()).count(), 8);
}

/// A revoked key's StreamIds whose client does not read (its send blocked
/// on flow control) ends at once and frees its stream slot: another key's
/// StreamIds is served within seconds. Before, the slot stayed taken until
/// --stream-send-timeout (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_s_unread_stream_frees_its_slot_at_once() {
    let c = AuthCluster::start_with(
        "starveunread",
        &["--max-open-streams", "1", "--stream-send-timeout", "60s"],
    )
    .await;
    let (stuck_key, stuck) = c.create_key(&[pb::Permission::Ids], &[], 0).await;
    let (other_key, _) = c.create_key(&[pb::Permission::Ids], &[], 0).await;
    let tcp = TcpStream::connect(("127.0.0.1", c.a.port)).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://127.0.0.1:{}{STREAM_IDS}", c.a.port))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {stuck_key}"))
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let message = prost::Message::encode_to_vec(&pb::StreamIdsRequest {
        total: 0,
        batch_size: 1000,
        ..Default::default()
    });
    let mut framed = vec![0];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    send.send_data(Bytes::from(framed), true).unwrap();
    // Headers arrive; the body is never read, so the window fills.
    let _unread = response.await.unwrap();
    let busy = "this server already has 1 streams in progress, its limit (--max-open-streams); retry with backoff or call another snowkeep server";
    let refused = ids(&c.a, Some(&other_key))
        .await
        .stream_ids(pb::StreamIdsRequest {
            total: 10,
            batch_size: 10,
            ..Default::default()
        })
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (Code::ResourceExhausted, busy)
    );
    admin(&c.a, Some(&c.admin_key))
        .await
        .revoke_key(pb::RevokeKeyRequest {
            id: stuck.id.clone(),
        })
        .await
        .unwrap();
    let took = eventually(
        "the unread stream's slot to be free",
        Duration::from_secs(10),
        || async {
            match ids(&c.a, Some(&other_key))
                .await
                .stream_ids(pb::StreamIdsRequest {
                    total: 10,
                    batch_size: 10,
                    ..Default::default()
                })
                .await
            {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    stream
                        .next()
                        .await
                        .and_then(Result::ok)
                        .map(|b| b.ids.len())
                        == Some(10)
                }
                Err(_) => false,
            }
        },
    )
    .await;
    eprintln!("slot free {took:?} after the revocation");
    driver.abort();
}
