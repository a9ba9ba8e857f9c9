//! Accepting connections without spinning, and closing connections that hold
//! a file descriptor and memory but do nothing.
//!
//! * [`Listener::incoming`] accepts from a listener. After an accept error
//!   (EMFILE when the process is out of file descriptors, ENFILE, ENOBUFS…)
//!   it sleeps 10 ms, doubling up to 1 s, until an accept succeeds. tonic's
//!   own accept loop retries at once, which spins a core for as long as the
//!   descriptors stay exhausted. The error is logged at most once per 10 s.
//! * A connection beyond `max_connections` is closed as soon as it is
//!   accepted, so the server never runs out of descriptors because of
//!   clients, and memory per connection stays bounded.
//! * So is a connection beyond `max_connections_per_peer` from one source IP
//!   address: a client that keeps reopening sockets (each held until the
//!   handshake timeout) cannot take every slot from the others. Both
//!   refusals are counted in `snowkeep_connections_refused_total`.
//! * With an allow-list ([`Listener::with_allow_list`], `--allow-cidrs`), a
//!   connection from a peer outside it counts against neither limit and
//!   holds no slot of theirs: such connections share a budget of their own,
//!   at most [`DISALLOWED_MAX_CONNECTIONS`] open at once and as many new
//!   ones per second; one beyond it is closed as soon as it is accepted,
//!   before any TLS handshake (counted with `reason="allow_list"`). One
//!   inside the budget is served only so that its calls get the
//!   allow-list's PERMISSION_DENIED: it is closed [`DENIED_LINGER`] after
//!   its first call is denied, and [`DISALLOWED_TIMEOUT`] after it was
//!   accepted whatever it does (handshake included). Peers outside the list
//!   therefore never take a connection slot, a per-peer slot, handshake
//!   work or connection memory from allowed ones beyond that fixed budget.
//! * [`GuardedIo`] wraps each accepted socket. It ends the read side (the
//!   HTTP server then sees the client close) when no call is in progress on
//!   the connection and the client has sent nothing for `idle_timeout`. A
//!   client that answers the server's HTTP/2 keepalive pings is never idle;
//!   one that connects and stays silent is closed.
//! * A connection whose client has sent no byte at all (not even the HTTP/2
//!   preface) is closed after `handshake_timeout`, which the server sets to
//!   the idle timeout or [`HANDSHAKE_TIMEOUT`], whichever is shorter: a
//!   client that opens sockets and never speaks holds a connection slot for
//!   seconds, not for the whole idle timeout.
//! * A connection on which a call's response message has waited
//!   `send_timeout` without the client taking all of it is closed: a client
//!   that stops reading (its flow-control window stays shut) while it
//!   answers pings would otherwise keep its calls' slots and memory
//!   forever. Counted in `snowkeep_stream_send_stalls_total`. The whole
//!   connection goes: while hyper waits for the client's window it polls
//!   neither the response body nor anything else of the call, so nothing
//!   short of ending the connection reaches the stalled call.
//! * With TLS ([`Listener::with_tls`]) each connection takes the TLS
//!   configuration current when it is accepted and runs its handshake on
//!   its own task, the first time hyper reads or writes it, so a slow or
//!   silent client never holds up the accept loop. The handshake counts as
//!   silence: a client that has not completed it and sent its first
//!   application byte within `handshake_timeout` is closed, as a plaintext
//!   client that sends no preface is. A failed handshake (no client
//!   certificate under mTLS, an untrusted one, a plaintext client) closes
//!   the connection; it is logged at debug level. Everything else (the
//!   limits, the idle and send timeouts, [`ConnInfo`] with the peer's
//!   address) is the same for TLS and plaintext connections.
//! * At shutdown it ends at once every connection on which no call has ever
//!   started. Such a connection may have no HTTP/2 session to end gracefully:
//!   hyper waits for the client's preface before it can send GOAWAY, so a
//!   silent client would otherwise hold the drain for the whole grace period.
//!   Connections that did make calls get the HTTP/2 graceful shutdown
//!   (GOAWAY) and drain.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};
use tracing::{debug, warn};

use super::alarm::Alarm;
use super::throttle::Throttle;
use crate::allow::AllowList;
use crate::conn_info::{ConnInfo, ConnState};
use crate::tls::ServerTls;

/// First sleep after an accept error.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest sleep after repeated accept errors.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A repeated warning is logged at most once per this period.
const WARN_PERIOD: Duration = Duration::from_secs(10);
/// Longest a connection may stay open without its client sending a byte:
/// 10 s, ample for an HTTP/2 preface over any network.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections from peers outside the allow-list open at once, and
/// most such connections accepted per second; beyond either, one is closed
/// at accept. They count against no other limit.
pub const DISALLOWED_MAX_CONNECTIONS: usize = 8;
/// Longest a connection from a peer outside the allow-list stays open,
/// TLS handshake and first call included.
pub const DISALLOWED_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a connection from a peer outside the allow-list stays open after
/// its first call was denied: time for the answer to go out.
pub const DENIED_LINGER: Duration = Duration::from_millis(100);
/// The period [`DISALLOWED_MAX_CONNECTIONS`] new disallowed connections
/// may be accepted in.
const DISALLOWED_RATE_PERIOD: Duration = Duration::from_secs(1);

/// What a listener allows its connections.
#[derive(Debug, Clone)]
pub struct ListenerLimits {
    /// Names the listener in logs (`gRPC`, `metrics`).
    pub name: &'static str,
    /// Most open connections.
    pub max_connections: usize,
    /// The flag (or constant) behind `max_connections`, named in the log.
    pub max_connections_flag: &'static str,
    /// Most open connections from one source IP address; `None` for no
    /// per-peer cap. Named `--max-connections-per-peer` in the log.
    pub max_connections_per_peer: Option<usize>,
    /// A connection with a response message handed over and not fully
    /// written out for this long is closed; `None` never closes one.
    pub send_timeout: Option<Duration>,
    /// A connection with no call in progress and nothing received for this
    /// long is closed.
    pub idle_timeout: Duration,
    /// A connection whose client has sent nothing at all for this long after
    /// it was accepted is closed (at most `idle_timeout`).
    pub handshake_timeout: Duration,
    /// TCP keepalive idle time; `None` leaves it off.
    pub tcp_keepalive: Option<Duration>,
}

/// A listening socket with its limits; [`Listener::incoming`] yields its
/// connections.
#[derive(Debug)]
pub struct Listener {
    listener: TcpListener,
    limits: ListenerLimits,
    open: Arc<AtomicUsize>,
    shutdown: CancellationToken,
    tls: Option<ServerTls>,
    allow: AllowList,
}

/// Open connections per source IP address; an address with none has no
/// entry, so the map holds at most `max_connections` entries.
type PerPeer = Arc<Mutex<HashMap<IpAddr, usize>>>;

impl Listener {
    /// Wraps `listener`; `shutdown` closes connections that never made a call.
    pub fn new(listener: TcpListener, limits: ListenerLimits, shutdown: CancellationToken) -> Self {
        Self {
            listener,
            limits,
            open: Arc::default(),
            shutdown,
            tls: None,
            allow: AllowList::default(),
        }
    }

    /// Sorts connections by `allow` at accept: one from a peer outside it
    /// gets the small budget of [`DISALLOWED_MAX_CONNECTIONS`] and a short
    /// life (see the module docs), and no slot of the allowed peers. The
    /// allow-list layer still answers its calls.
    pub fn with_allow_list(mut self, allow: AllowList) -> Self {
        self.allow = allow;
        self
    }

    /// Serves TLS: every connection accepted from now on runs a TLS
    /// handshake with the configuration `tls` holds when it is accepted.
    pub fn with_tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// A counter of this listener's open connections, live.
    pub fn open_connections(&self) -> OpenConnections {
        OpenConnections(self.open.clone())
    }

    /// The accepted connections, forever. Never yields an error: accept
    /// errors are logged (throttled) and retried after a backoff sleep.
    pub fn incoming(self) -> impl Stream<Item = Result<GuardedIo, Infallible>> + Send + 'static {
        let Listener {
            listener,
            limits,
            open,
            shutdown,
            tls,
            allow,
        } = self;
        // Registered at 0, so the series exist before the first refusal.
        let refused = |reason: &'static str| {
            let c = metrics::counter!(crate::metrics::CONNECTIONS_REFUSED_TOTAL, "listener" => limits.name, "reason" => reason);
            c.increment(0);
            c
        };
        let state = Accepting {
            // Without TCP_NODELAY small unary replies wait out delayed ACKs (~40 ms).
            incoming: TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(limits.tcp_keepalive),
            refused_total: refused("max_connections"),
            refused_per_peer: refused("max_connections_per_peer"),
            // Only where there is a list to refuse by.
            refused_disallowed: (!allow.is_empty()).then(|| refused("allow_list")),
            allow,
            disallowed_open: Arc::default(),
            disallowed_window: (Instant::now(), 0),
            disallowed_refusals: Throttle::new(WARN_PERIOD),
            stalls: Stalls::default(),
            limits,
            open,
            per_peer: PerPeer::default(),
            shutdown,
            tls,
            accept_errors: Throttle::new(WARN_PERIOD),
            refusals: Throttle::new(WARN_PERIOD),
            peer_refusals: Throttle::new(WARN_PERIOD),
        };
        futures_util::stream::unfold(state, |mut state| async move {
            let io = state.next().await;
            Some((Ok(io), state))
        })
    }
}

/// The number of open connections of a listener.
#[derive(Debug, Clone)]
pub struct OpenConnections(Arc<AtomicUsize>);

impl OpenConnections {
    /// Connections open now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

struct Accepting {
    incoming: TcpIncoming,
    limits: ListenerLimits,
    open: Arc<AtomicUsize>,
    per_peer: PerPeer,
    shutdown: CancellationToken,
    tls: Option<ServerTls>,
    accept_errors: Throttle,
    refusals: Throttle,
    peer_refusals: Throttle,
    refused_total: metrics::Counter,
    refused_per_peer: metrics::Counter,
    stalls: Stalls,
    allow: AllowList,
    /// Open connections from peers outside `allow`.
    disallowed_open: Arc<AtomicUsize>,
    /// When the current rate period began, and the disallowed connections
    /// accepted since.
    disallowed_window: (Instant, usize),
    disallowed_refusals: Throttle,
    /// `Some` with a non-empty allow-list.
    refused_disallowed: Option<metrics::Counter>,
}

/// The send stalls of a listener's connections: counted, logged throttled.
#[derive(Clone)]
struct Stalls {
    total: metrics::Counter,
    log: Arc<Mutex<Throttle>>,
}

impl Default for Stalls {
    fn default() -> Self {
        Self {
            total: metrics::counter!(crate::metrics::STREAM_SEND_STALLS_TOTAL),
            log: Arc::new(Mutex::new(Throttle::new(WARN_PERIOD))),
        }
    }
}

impl Accepting {
    async fn next(&mut self) -> GuardedIo {
        let mut backoff = snowkeep_client::Backoff::new(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
        loop {
            match self.incoming.next().await {
                Some(Ok(stream)) => {
                    let peer = stream.peer_addr().ok().map(|a| a.ip());
                    if !self.allow.admits(peer) {
                        match self.take_disallowed_slot(peer) {
                            Some(slot) => return GuardedIo::new(stream, self, slot, None, true),
                            None => {
                                drop(stream);
                                continue;
                            }
                        }
                    }
                    let open = self.open.load(Ordering::Acquire);
                    if open >= self.limits.max_connections {
                        if let Some(held_back) = self.refusals.hit(Instant::now()) {
                            warn!(
                                listener = self.limits.name,
                                open,
                                limit = self.limits.max_connections_flag,
                                refused_since_last_log = held_back,
                                "closing a new connection: the connection limit is reached; raise it or add servers"
                            );
                        }
                        self.refused_total.increment(1);
                        drop(stream);
                        continue;
                    }
                    let Some(peer_slot) = self.take_peer_slot(peer) else {
                        self.refused_per_peer.increment(1);
                        if let Some(held_back) = self.peer_refusals.hit(Instant::now()) {
                            warn!(
                                listener = self.limits.name,
                                peer = ?peer,
                                limit = "--max-connections-per-peer",
                                max = self.limits.max_connections_per_peer,
                                refused_since_last_log = held_back,
                                "closing a new connection: this client address has the most connections one address may hold; raise the limit (or set it to 0) if many clients share the address through NAT or a proxy"
                            );
                        }
                        drop(stream);
                        continue;
                    };
                    self.open.fetch_add(1, Ordering::AcqRel);
                    let slot = Slot(self.open.clone());
                    return GuardedIo::new(stream, self, slot, peer_slot, false);
                }
                Some(Err(error)) => {
                    let delay = backoff.next_delay();
                    if let Some(held_back) = self.accept_errors.hit(Instant::now()) {
                        warn!(
                            listener = self.limits.name,
                            %error,
                            retry_in = ?delay,
                            errors_since_last_log = held_back,
                            limit = self.limits.max_connections_flag,
                            "cannot accept connections; backing off (with EMFILE, raise the open-file limit or lower the connection limit)"
                        );
                    }
                    tokio::time::sleep(delay).await;
                }
                // TcpIncoming never ends; if it did, wait for shutdown to
                // stop the server rather than spin.
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Counts a connection from `peer`, outside the allow-list, when the
    /// budget of such connections allows it (open at once and accepted in
    /// the current second); `None` (counted and logged) when it does not.
    fn take_disallowed_slot(&mut self, peer: Option<IpAddr>) -> Option<Slot> {
        let now = Instant::now();
        if now >= self.disallowed_window.0 + DISALLOWED_RATE_PERIOD {
            self.disallowed_window = (now, 0);
        }
        let open = self.disallowed_open.load(Ordering::Acquire);
        let recent = self.disallowed_window.1;
        if open >= DISALLOWED_MAX_CONNECTIONS || recent >= DISALLOWED_MAX_CONNECTIONS {
            if let Some(c) = &self.refused_disallowed {
                c.increment(1);
            }
            if let Some(held_back) = self.disallowed_refusals.hit(now) {
                warn!(
                    listener = self.limits.name,
                    peer = ?peer,
                    open,
                    accepted_this_second = recent,
                    max = DISALLOWED_MAX_CONNECTIONS,
                    refused_since_last_log = held_back,
                    "closing a new connection from outside --allow-cidrs: peers outside the list already use all the connections they get; allowed peers are unaffected"
                );
            }
            return None;
        }
        self.disallowed_window.1 += 1;
        self.disallowed_open.fetch_add(1, Ordering::AcqRel);
        debug!(listener = self.limits.name, peer = ?peer, "a connection from outside --allow-cidrs: its calls get PERMISSION_DENIED, and it closes soon");
        Some(Slot(self.disallowed_open.clone()))
    }

    /// Counts a connection from `peer` when the per-peer cap allows it:
    /// `Some` (holding it until dropped) or `None` when `peer` is at the cap.
    /// With no cap, or no known address, always `Some`.
    fn take_peer_slot(&self, peer: Option<IpAddr>) -> Option<Option<PeerSlot>> {
        let (Some(max), Some(peer)) = (self.limits.max_connections_per_peer, peer) else {
            return Some(None);
        };
        let mut map = self.per_peer.lock().unwrap_or_else(|p| p.into_inner());
        let open = map.entry(peer).or_insert(0);
        if *open >= max {
            if *open == 0 {
                map.remove(&peer);
            }
            return None;
        }
        *open += 1;
        Some(Some(PeerSlot {
            map: self.per_peer.clone(),
            peer,
        }))
    }
}

/// One open connection counted against its source address; uncounts it on
/// drop.
#[derive(Debug)]
struct PeerSlot {
    map: PerPeer,
    peer: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = map.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                map.remove(&self.peer);
            }
        }
    }
}

/// File descriptors the server needs besides client connections: etcd
/// connections, the state file, the runtime, logs; generous.
pub const OWN_DESCRIPTORS: u64 = 64;

/// The soft open-file limit (RLIMIT_NOFILE) of this process, from
/// `/proc/self/limits`; `None` when unknown or unlimited.
pub fn open_file_limit() -> Option<u64> {
    parse_open_file_limit(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// An open slot of the listener; frees it on drop.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The byte stream of a connection: plaintext, or TLS once its handshake is
/// done.
enum Io {
    Plain(TcpStream),
    Handshaking(Box<tokio_rustls::server::FallibleAccept<TcpStream>>),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// The TLS handshake failed and its alert is sent: the socket is shut
    /// for writing and what the client still sends is read and dropped
    /// until it closes. Closing a socket with unread bytes resets it, and a
    /// reset can reach the client before the alert that says what was wrong
    /// (a missing or untrusted client certificate): it would see only a
    /// broken pipe.
    Failing {
        tcp: TcpStream,
        error: Option<io::Error>,
        shut: bool,
    },
    /// The TLS handshake failed; the connection is ending.
    Failed,
}

impl Io {
    fn not_ready() -> io::Error {
        io::Error::new(
            io::ErrorKind::NotConnected,
            "the TLS handshake did not complete",
        )
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Io::Handshaking(_) | Io::Failing { .. } | Io::Failed => {
                Poll::Ready(Err(Io::not_ready()))
            }
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Io::Handshaking(_) | Io::Failing { .. } | Io::Failed => {
                Poll::Ready(Err(Io::not_ready()))
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Io::Handshaking(_) | Io::Failing { .. } | Io::Failed => {
                Poll::Ready(Err(Io::not_ready()))
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
            Io::Handshaking(_) | Io::Failing { .. } | Io::Failed => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Io::Handshaking(_) | Io::Failing { .. } | Io::Failed => {
                Poll::Ready(Err(Io::not_ready()))
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            // Nothing negotiated to close; dropping the socket ends it.
            Io::Handshaking(_) | Io::Failing { .. } | Io::Failed => Poll::Ready(Ok(())),
        }
    }
}

/// An accepted TCP connection (plaintext, or TLS with [`Listener::with_tls`])
/// that closes itself when idle, or at shutdown when it never made a call
/// (see the module docs).
pub struct GuardedIo {
    inner: Io,
    state: Arc<ConnState>,
    tcp: TcpConnectInfo,
    idle_timeout: Duration,
    handshake_timeout: Duration,
    /// True once the client has sent a byte.
    heard: bool,
    idle: Alarm,
    send_timeout: Option<Duration>,
    /// Fires at the send deadline of the oldest unsent message (or one
    /// timeout from the last check when none is unsent).
    send_check: Alarm,
    stalls: Stalls,
    /// Checked first on every read (an atomic load); the future is polled
    /// once to register the task, and again once the token is cancelled.
    shutdown_token: CancellationToken,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    shutdown_armed: bool,
    shutting_down: bool,
    closed: bool,
    listener: &'static str,
    /// For a connection from outside the allow-list: when it closes at the
    /// latest (see [`DISALLOWED_TIMEOUT`]).
    disallowed_until: Option<Instant>,
    _slot: Slot,
    _peer_slot: Option<PeerSlot>,
}

impl std::fmt::Debug for GuardedIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedIo")
            .field("tcp", &self.tcp)
            .field("state", &self.state)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl GuardedIo {
    fn new(
        inner: TcpStream,
        accepting: &Accepting,
        slot: Slot,
        peer_slot: Option<PeerSlot>,
        disallowed: bool,
    ) -> Self {
        let tcp = inner.connect_info();
        let inner = match &accepting.tls {
            Some(tls) => Io::Handshaking(Box::new(tls.acceptor().accept(inner).into_fallible())),
            None => Io::Plain(inner),
        };
        let state = Arc::new(ConnState::new());
        let idle_timeout = accepting.limits.idle_timeout;
        let mut handshake_timeout = accepting.limits.handshake_timeout.min(idle_timeout);
        if disallowed {
            handshake_timeout = handshake_timeout.min(DISALLOWED_TIMEOUT);
        }
        let send_timeout = accepting.limits.send_timeout;
        let disallowed_until = disallowed.then(|| state.opened() + DISALLOWED_TIMEOUT);
        Self {
            inner,
            idle: Alarm::at(state.opened() + handshake_timeout),
            send_check: Alarm::at(state.opened() + send_timeout.unwrap_or(Duration::MAX / 4)),
            send_timeout,
            stalls: accepting.stalls.clone(),
            state,
            tcp,
            idle_timeout,
            handshake_timeout,
            heard: false,
            shutdown_token: accepting.shutdown.clone(),
            shutdown: Box::pin(accepting.shutdown.clone().cancelled_owned()),
            shutdown_armed: false,
            shutting_down: false,
            closed: false,
            listener: accepting.limits.name,
            disallowed_until,
            _slot: slot,
            _peer_slot: peer_slot,
        }
    }

    /// Drives the TLS handshake, if one is in progress: `Ready(Ok)` once the
    /// connection can carry data (at once for plaintext), `Ready(Err)` when
    /// the handshake failed or the connection must close before it is done.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Io::Plain(_) | Io::Tls(_) => return Poll::Ready(Ok(())),
            Io::Failed => return Poll::Ready(Err(Io::not_ready())),
            Io::Failing { .. } => return self.poll_failing(cx),
            Io::Handshaking(_) => {}
        }
        // Reads check this too; writes may be all hyper polls until the
        // handshake is done (the HTTP/2 server sends its settings first).
        if self.must_close(cx) {
            self.inner = Io::Failed;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "closed before the TLS handshake completed",
            )));
        }
        let Io::Handshaking(accept) = &mut self.inner else {
            return Poll::Ready(Ok(()));
        };
        match Pin::new(accept.as_mut()).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(stream)) => {
                self.inner = Io::Tls(Box::new(stream));
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err((error, tcp))) => {
                debug!(listener = self.listener, peer = ?self.tcp.remote_addr, %error, "TLS handshake failed; closing the connection");
                self.inner = Io::Failing {
                    tcp,
                    error: Some(error),
                    shut: false,
                };
                self.poll_failing(cx)
            }
        }
    }

    /// Ends a connection whose handshake failed (see [`Io::Failing`]):
    /// `Ready(Err)` with the handshake's error once the client has closed
    /// (or the handshake timeout passed).
    fn poll_failing(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let closing = self.must_close(cx);
            let Io::Failing { tcp, error, shut } = &mut self.inner else {
                return Poll::Ready(Err(Io::not_ready()));
            };
            let mut done = closing;
            if !done && !*shut {
                // Immediate for a TCP socket: sends FIN after the alert.
                let _ = std::task::ready!(Pin::new(&mut *tcp).poll_shutdown(cx));
                *shut = true;
            }
            if !done {
                let mut scratch = [0u8; 512];
                let mut buf = ReadBuf::new(&mut scratch);
                match Pin::new(&mut *tcp).poll_read(cx, &mut buf) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(())) if !buf.filled().is_empty() => continue,
                    Poll::Ready(_) => done = true,
                }
            }
            if done {
                let error = error.take().unwrap_or_else(Io::not_ready);
                self.inner = Io::Failed;
                return Poll::Ready(Err(error));
            }
        }
    }

    /// True once the connection must end; registers `cx` for the moments
    /// that can make it so (the idle deadline, shutdown).
    fn must_close(&mut self, cx: &mut Context<'_>) -> bool {
        if self.closed {
            return true;
        }
        if !self.shutting_down && (!self.shutdown_armed || self.shutdown_token.is_cancelled()) {
            self.shutdown_armed = true;
            if self.shutdown.as_mut().poll(cx).is_ready() {
                self.shutting_down = true;
            }
        }
        // Calls are marked when the call's task first runs the service
        // (hyper runs the tower stack in each call's own task), so a call
        // whose headers were just read may not be marked yet: at shutdown a
        // connection that never made a call may close with such a call in
        // it, which its client sees reset (never issued). One ending
        // elsewhere only makes the connection more idle.
        let no_calls = self.state.calls() == 0;
        if self.shutting_down && no_calls && !self.state.ever_called() {
            debug!(listener = self.listener, peer = ?self.tcp.remote_addr, "shutting down: closing a connection that never made a call");
            self.closed = true;
            return true;
        }
        if let Some(timeout) = self.send_timeout {
            while self.send_check.fired(cx) {
                let now = Instant::now();
                match self.state.oldest_unsent() {
                    Some(since) if now >= since + timeout => {
                        self.stalls.total.increment(1);
                        let held_back = self
                            .stalls
                            .log
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .hit(now);
                        if let Some(held_back) = held_back {
                            warn!(
                                listener = self.listener,
                                peer = ?self.tcp.remote_addr,
                                send_timeout = ?timeout,
                                calls = self.state.calls(),
                                closed_since_last_log = held_back,
                                "closing a connection: a response message on it has waited --stream-send-timeout for its client to take it; the client stopped reading"
                            );
                        }
                        self.closed = true;
                        return true;
                    }
                    Some(since) => self.send_check.reset(since + timeout),
                    None => self.send_check.reset(now + timeout),
                }
            }
        }
        // A connection from outside the allow-list ends at its deadline, or
        // once its first denied call has had time to be answered, whatever
        // else happens on it.
        let end = self.disallowed_until.map(|until| {
            self.state
                .first_denied()
                .map_or(until, |denied| until.min(denied + DENIED_LINGER))
        });
        if let Some(end) = end {
            if self.idle.deadline() > end {
                self.idle.reset(end);
            }
        }
        while self.idle.fired(cx) {
            let now = Instant::now();
            if end.is_some_and(|end| now >= end) {
                debug!(listener = self.listener, peer = ?self.tcp.remote_addr, denied = self.state.first_denied().is_some(), "closing a connection from outside --allow-cidrs");
                self.closed = true;
                return true;
            }
            let deadline = if self.heard {
                self.state.last_active() + self.idle_timeout
            } else {
                self.state.opened() + self.handshake_timeout
            };
            if no_calls && now >= deadline {
                debug!(listener = self.listener, peer = ?self.tcp.remote_addr, idle_timeout = ?self.idle_timeout, heard = self.heard, "closing an idle connection");
                self.closed = true;
                return true;
            }
            let next = if now >= deadline {
                now + self.idle_timeout
            } else {
                deadline
            };
            self.idle.reset(end.map_or(next, |end| next.min(end)));
        }
        false
    }
}

impl Connected for GuardedIo {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            state: self.state.clone(),
            tcp: self.tcp.clone(),
        }
    }
}

impl AsyncRead for GuardedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.must_close(cx) {
            // End of stream: the HTTP server closes the connection.
            return Poll::Ready(Ok(()));
        }
        if let Err(e) = std::task::ready!(this.poll_handshake(cx)) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.heard = true;
            this.state.touch();
        }
        polled
    }
}

impl AsyncWrite for GuardedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_handshake(cx))?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_handshake(cx))?;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_handshake(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
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
}
