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
//!   limits, the idle and send timeouts,
//!   [`ConnInfo`](crate::conn_info::ConnInfo) with the peer's address) is
//!   the same for TLS and plaintext connections.
//! * At shutdown it ends at once every connection on which no call has ever
//!   started. Such a connection may have no HTTP/2 session to end gracefully:
//!   hyper waits for the client's preface before it can send GOAWAY, so a
//!   silent client would otherwise hold the drain for the whole grace period.
//!   Connections that did make calls get the HTTP/2 graceful shutdown
//!   (GOAWAY) and drain.
//!
//! | file | holds |
//! | --- | --- |
//! | this one | [`Listener`], [`ListenerLimits`], [`OpenConnections`] and the limits' constants |
//! | `accept` | the accept loop and its admission decision: the connection limit, the allow-list's budget, accept-error backoff |
//! | `peers` | per-peer accounting against `max_connections_per_peer` |
//! | `guarded` | [`GuardedIo`], the connection hyper and tonic serve, and its TLS handshake |
//! | `io` | the byte stream under it: plaintext, TLS, a failed handshake |
//! | `close` | the close and drain policy: when a connection must end |
//! | `descriptors` | [`open_file_limit`], [`OWN_DESCRIPTORS`] |

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;

use crate::allow::AllowList;
use crate::tls::ServerTls;

mod accept;
mod close;
mod descriptors;
mod guarded;
mod io;
mod peers;

use accept::Accepting;
pub use descriptors::{open_file_limit, OWN_DESCRIPTORS};
pub use guarded::GuardedIo;

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
        futures_util::stream::unfold(Accepting::new(self), |mut state| async move {
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

#[cfg(test)]
mod tests;
