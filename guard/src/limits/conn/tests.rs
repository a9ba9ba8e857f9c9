use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

use super::descriptors::parse_open_file_limit;
use super::*;

fn limits(max_connections: usize, idle_ms: u64) -> ListenerLimits {
    ListenerLimits {
        name: "test",
        max_connections,
        max_connections_flag: "--max-connections",
        max_connections_per_peer: None,
        send_timeout: None,
        idle_timeout: Duration::from_millis(idle_ms),
        handshake_timeout: HANDSHAKE_TIMEOUT,
        tcp_keepalive: None,
    }
}

async fn listener(
    max_connections: usize,
    idle_ms: u64,
    shutdown: CancellationToken,
) -> (
    std::net::SocketAddr,
    OpenConnections,
    impl Stream<Item = Result<GuardedIo, Infallible>>,
) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let l = Listener::new(tcp, limits(max_connections, idle_ms), shutdown);
    let open = l.open_connections();
    (addr, open, l.incoming())
}

/// Reads until the server side ends the connection; returns the bytes echoed.
async fn read_to_end(client: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    client.read_to_end(&mut out).await.unwrap();
    out
}

/// Echoes what it reads until its `GuardedIo` ends the stream.
fn echo(mut io: GuardedIo) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        loop {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => io.write_all(&buf[..n]).await.unwrap(),
            }
        }
    })
}

#[test]
fn reads_the_soft_open_file_limit() {
    let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                  Max processes             95595                95595                processes \n\
                  Max open files            1024                 524288               files     \n";
    assert_eq!(parse_open_file_limit(limits), Some(1024));
    let unlimited = "Max open files            unlimited            unlimited            files\n";
    assert_eq!(parse_open_file_limit(unlimited), None);
    assert!(open_file_limit().is_some());
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_idle_timeout_and_frees_its_slot() {
    let (addr, open, incoming) = listener(8, 200, CancellationToken::new()).await;
    let mut incoming = Box::pin(incoming);
    let mut client = TcpStream::connect(addr).await.unwrap();
    let Some(Ok(io)) = incoming.next().await else {
        panic!("no connection")
    };
    assert_eq!(open.get(), 1);
    let started = Instant::now();
    let server = echo(io);
    assert_eq!(read_to_end(&mut client).await, b"");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200),
        "closed after {waited:?}"
    );
    server.await.unwrap();
    assert_eq!(open.get(), 0);
}

#[tokio::test]
async fn a_client_that_never_sends_a_byte_is_closed_at_the_handshake_timeout() {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let mut l = limits(8, 5_000);
    l.handshake_timeout = Duration::from_millis(200);
    let listener = Listener::new(tcp, l, CancellationToken::new());
    let open = listener.open_connections();
    let mut incoming = Box::pin(listener.incoming());
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let Some(Ok(silent_io)) = incoming.next().await else {
        panic!("no connection")
    };
    let mut talker = TcpStream::connect(addr).await.unwrap();
    let Some(Ok(talker_io)) = incoming.next().await else {
        panic!("no connection")
    };
    let started = Instant::now();
    let silent_server = echo(silent_io);
    let talker_server = echo(talker_io);
    talker.write_all(b"p").await.unwrap();
    let mut b = [0u8; 1];
    talker.read_exact(&mut b).await.unwrap();
    assert_eq!(read_to_end(&mut silent).await, b"");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "closed after {waited:?}: the handshake timeout, not the idle one"
    );
    silent_server.await.unwrap();
    // The client that spoke is held to the 5 s idle timeout instead.
    assert_eq!(open.get(), 1);
    talker.write_all(b"q").await.unwrap();
    talker.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"q");
    drop(talker);
    talker_server.await.unwrap();
    assert_eq!(open.get(), 0);
}

#[tokio::test]
async fn bytes_from_the_client_and_calls_in_progress_keep_a_connection_open() {
    let (addr, _open, incoming) = listener(8, 300, CancellationToken::new()).await;
    let mut incoming = Box::pin(incoming);
    let mut client = TcpStream::connect(addr).await.unwrap();
    let Some(Ok(io)) = incoming.next().await else {
        panic!("no connection")
    };
    let state = io.connect_info().state;
    let server = echo(io);
    // Talking every 100 ms for 600 ms (twice the timeout) keeps it open.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        client.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        client.read_exact(&mut b).await.unwrap();
    }
    // A call in progress keeps it open while the client says nothing.
    let call = state.call();
    tokio::time::sleep(Duration::from_millis(600)).await;
    client.write_all(b"y").await.unwrap();
    let mut b = [0u8; 1];
    client.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"y");
    // Once the call ends and the client stays silent, it closes.
    drop(call);
    assert_eq!(read_to_end(&mut client).await, b"");
    server.await.unwrap();
}

#[tokio::test]
async fn connections_beyond_the_limit_are_closed_at_once() {
    let (addr, open, incoming) = listener(2, 60_000, CancellationToken::new()).await;
    let mut incoming = Box::pin(incoming);
    let _a = TcpStream::connect(addr).await.unwrap();
    let _b = TcpStream::connect(addr).await.unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let kept: Vec<GuardedIo> = vec![
        incoming.next().await.unwrap().unwrap(),
        incoming.next().await.unwrap().unwrap(),
    ];
    assert_eq!(open.get(), 2);
    // The third is accepted and closed by the stream's next poll.
    let next = tokio::spawn(async move {
        let io = incoming.next().await;
        drop(io);
    });
    assert_eq!(read_to_end(&mut c).await, b"");
    assert_eq!(open.get(), 2);
    drop(kept);
    assert_eq!(open.get(), 0);
    next.abort();
}

/// A client socket connected to `addr` from source address `from`.
async fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind((std::net::Ipv4Addr::from(from), 0).into())
        .unwrap();
    socket.connect(addr).await.unwrap()
}

#[tokio::test]
async fn a_peer_over_its_cap_is_closed_at_once_while_another_peer_connects() {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let mut l = limits(8, 60_000);
    l.max_connections_per_peer = Some(2);
    let listener = Listener::new(tcp, l, CancellationToken::new());
    let open = listener.open_connections();
    let mut incoming = Box::pin(listener.incoming());
    let _a1 = connect_from([127, 0, 0, 1], addr).await;
    let _a2 = connect_from([127, 0, 0, 1], addr).await;
    let mut a3 = connect_from([127, 0, 0, 1], addr).await;
    let b1 = connect_from([127, 0, 0, 2], addr).await;
    let mut kept = Vec::new();
    for _ in 0..3 {
        kept.push(incoming.next().await.unwrap().unwrap());
    }
    // The third from 127.0.0.1 was closed; 127.0.0.2 got the third slot.
    assert_eq!(read_to_end(&mut a3).await, b"");
    assert_eq!(open.get(), 3);
    let peers: Vec<_> = kept
        .iter()
        .map(|io| io.tcp.remote_addr().unwrap().ip())
        .collect();
    assert_eq!(
        peers
            .iter()
            .filter(|ip| ip.to_string() == "127.0.0.1")
            .count(),
        2
    );
    assert_eq!(peers[2].to_string(), "127.0.0.2");
    assert_eq!(b1.peer_addr().unwrap(), addr);
    // A slot of 127.0.0.1 freed lets it connect again.
    drop(kept.remove(0));
    let _a4 = connect_from([127, 0, 0, 1], addr).await;
    let io = incoming.next().await.unwrap().unwrap();
    assert_eq!(io.tcp.remote_addr().unwrap().ip().to_string(), "127.0.0.1");
    assert_eq!(open.get(), 3);
}

/// A listener allowing 127.0.0.1 only, with room for one connection,
/// one per peer.
async fn allow_listener() -> (
    std::net::SocketAddr,
    OpenConnections,
    impl Stream<Item = Result<GuardedIo, Infallible>>,
) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let mut l = limits(1, 60_000);
    l.max_connections_per_peer = Some(1);
    let allow = AllowList::new(vec!["127.0.0.1/32".parse().unwrap()]);
    let listener = Listener::new(tcp, l, CancellationToken::new()).with_allow_list(allow);
    let open = listener.open_connections();
    (addr, open, listener.incoming())
}

#[tokio::test]
async fn peers_outside_the_allow_list_take_no_slot_of_allowed_ones_and_have_a_small_budget() {
    let (addr, open, incoming) = allow_listener().await;
    let mut incoming = Box::pin(incoming);
    let mut outside = Vec::new();
    let mut kept = Vec::new();
    for i in 0..DISALLOWED_MAX_CONNECTIONS {
        let from = if i % 2 == 0 {
            [127, 0, 0, 2]
        } else {
            [127, 0, 0, 3]
        };
        outside.push(connect_from(from, addr).await);
        kept.push(incoming.next().await.unwrap().unwrap());
    }
    // They count against neither the connection nor the per-peer limit.
    assert_eq!(open.get(), 0);
    // One more from outside is closed at accept; the allowed peer gets
    // the one connection slot.
    let mut over = connect_from([127, 0, 0, 4], addr).await;
    let _allowed = connect_from([127, 0, 0, 1], addr).await;
    let io = incoming.next().await.unwrap().unwrap();
    assert_eq!(io.tcp.remote_addr().unwrap().ip().to_string(), "127.0.0.1");
    assert_eq!(open.get(), 1);
    assert_eq!(read_to_end(&mut over).await, b"");
    // A connection from outside that keeps talking is closed after
    // DISALLOWED_TIMEOUT anyway; the allowed one stays.
    let started = Instant::now();
    let servers: Vec<_> = kept.into_iter().map(echo).collect();
    let mut client = outside.pop().unwrap();
    let talking = async {
        let mut b = [0u8; 1];
        loop {
            if client.write_all(b"t").await.is_err() {
                return;
            }
            match client.read(&mut b).await {
                Ok(1) => tokio::time::sleep(Duration::from_millis(50)).await,
                _ => return,
            }
        }
    };
    tokio::time::timeout(DISALLOWED_TIMEOUT * 2, talking)
        .await
        .expect("closed");
    let waited = started.elapsed();
    assert!(
        waited >= DISALLOWED_TIMEOUT - Duration::from_millis(100),
        "closed after {waited:?}"
    );
    for s in servers {
        s.await.unwrap();
    }
    assert_eq!(open.get(), 1);
    drop(io);
    assert_eq!(open.get(), 0);
}

#[tokio::test]
async fn a_connection_from_outside_the_allow_list_closes_soon_after_its_first_denial() {
    let (addr, _open, incoming) = allow_listener().await;
    let mut incoming = Box::pin(incoming);
    let mut client = connect_from([127, 0, 0, 2], addr).await;
    let io = incoming.next().await.unwrap().unwrap();
    let state = io.connect_info().state;
    let server = echo(io);
    client.write_all(b"a").await.unwrap();
    let mut b = [0u8; 1];
    client.read_exact(&mut b).await.unwrap();
    let started = Instant::now();
    // Denied while hyper reads the call: the connection is read again
    // (here: the client's next byte) and ends after the linger, well
    // before the timeout.
    state.denied();
    client.write_all(b"b").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, b"b");
    let waited = started.elapsed();
    assert!(
        waited >= DENIED_LINGER - Duration::from_millis(10) && waited < DISALLOWED_TIMEOUT,
        "closed after {waited:?}"
    );
    server.await.unwrap();
}

/// A TLS listener for `localhost` with a self-signed certificate, and a
/// connector that trusts it.
async fn tls_listener(
    handshake_ms: u64,
) -> (
    std::net::SocketAddr,
    OpenConnections,
    impl Stream<Item = Result<GuardedIo, Infallible>>,
    tokio_rustls::TlsConnector,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(dir.path().join("c.pem"), c.cert.pem()).unwrap();
    std::fs::write(dir.path().join("k.pem"), c.signing_key.serialize_pem()).unwrap();
    let settings = crate::tls::TlsSettings {
        cert_file: dir.path().join("c.pem"),
        key_file: dir.path().join("k.pem"),
        client_ca_file: None,
        reload_interval: Duration::from_secs(5),
    };
    let (tls, _reloader) = ServerTls::load(&settings).unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let mut l = limits(8, 60_000);
    l.handshake_timeout = Duration::from_millis(handshake_ms);
    let listener = Listener::new(tcp, l, CancellationToken::new()).with_tls(tls);
    let open = listener.open_connections();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    (addr, open, listener.incoming(), connector, dir)
}

#[tokio::test]
async fn a_silent_tls_client_holds_up_no_other_and_is_closed_at_the_handshake_timeout() {
    let (addr, open, incoming, connector, _dir) = tls_listener(300).await;
    let mut incoming = Box::pin(incoming);
    // Connects and never sends a ClientHello.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let silent_io = incoming.next().await.unwrap().unwrap();
    let started = Instant::now();
    let silent_server = echo(silent_io);
    // Another client is accepted and served meanwhile.
    let tcp = TcpStream::connect(addr).await.unwrap();
    let talker_io = incoming.next().await.unwrap().unwrap();
    let talker_server = echo(talker_io);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut talker = connector.connect(name, tcp).await.unwrap();
    talker.write_all(b"hello").await.unwrap();
    let mut b = [0u8; 5];
    talker.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"hello");
    assert_eq!(open.get(), 2);
    assert_eq!(read_to_end(&mut silent).await, b"");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
        "closed after {waited:?}"
    );
    silent_server.await.unwrap();
    assert_eq!(open.get(), 1);
    drop(talker);
    talker_server.await.unwrap();
    assert_eq!(open.get(), 0);
}

#[tokio::test]
async fn a_plaintext_client_on_a_tls_listener_gets_an_alert_and_a_close() {
    let (addr, open, incoming, _connector, _dir) = tls_listener(5_000).await;
    let mut incoming = Box::pin(incoming);
    let mut client = TcpStream::connect(addr).await.unwrap();
    let io = incoming.next().await.unwrap().unwrap();
    let server = echo(io);
    client
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // A TLS alert record (content type 21), then the end of the stream.
    let answer = read_to_end(&mut client).await;
    assert_eq!(answer.first(), Some(&21), "{answer:?}");
    // The server side ends once the client closes, well before the 5 s
    // handshake timeout.
    drop(client);
    let started = Instant::now();
    server.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(open.get(), 0);
}

#[tokio::test]
async fn shutdown_closes_connections_that_never_made_a_call_only() {
    let shutdown = CancellationToken::new();
    let (addr, _open, incoming) = listener(8, 60_000, shutdown.clone()).await;
    let mut incoming = Box::pin(incoming);
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let silent_io = incoming.next().await.unwrap().unwrap();
    let mut busy = TcpStream::connect(addr).await.unwrap();
    let busy_io = incoming.next().await.unwrap().unwrap();
    let call = busy_io.connect_info().state.call();
    let (s1, s2) = (echo(silent_io), echo(busy_io));
    shutdown.cancel();
    assert_eq!(read_to_end(&mut silent).await, b"");
    s1.await.unwrap();
    // The connection with a call keeps serving (HTTP/2 drains it).
    busy.write_all(b"z").await.unwrap();
    let mut b = [0u8; 1];
    busy.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"z");
    drop(call);
    s2.abort();
}
