//! The accept loop and its admission decision: which accepted socket
//! becomes a [`GuardedIo`] and which is closed at once (the connection
//! limit, the per-peer cap, the budget of peers outside the allow-list), and
//! the backoff after accept errors.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tracing::{debug, warn};

use super::guarded::GuardedIo;
use super::peers::{self, PerPeer};
use super::{
    Listener, ListenerLimits, ACCEPT_BACKOFF_MAX, ACCEPT_BACKOFF_MIN, DISALLOWED_MAX_CONNECTIONS,
    DISALLOWED_RATE_PERIOD, WARN_PERIOD,
};
use crate::allow::AllowList;
use crate::limits::throttle::Throttle;
use crate::tls::ServerTls;

/// The state of a listener's accept loop ([`super::Listener::incoming`]).
pub(super) struct Accepting {
    pub(super) incoming: TcpIncoming,
    pub(super) limits: ListenerLimits,
    pub(super) open: Arc<AtomicUsize>,
    pub(super) per_peer: PerPeer,
    pub(super) shutdown: CancellationToken,
    pub(super) tls: Option<ServerTls>,
    pub(super) accept_errors: Throttle,
    pub(super) refusals: Throttle,
    pub(super) peer_refusals: Throttle,
    pub(super) refused_total: metrics::Counter,
    pub(super) refused_per_peer: metrics::Counter,
    pub(super) stalls: Stalls,
    pub(super) allow: AllowList,
    /// Open connections from peers outside `allow`.
    pub(super) disallowed_open: Arc<AtomicUsize>,
    /// When the current rate period began, and the disallowed connections
    /// accepted since.
    pub(super) disallowed_window: (Instant, usize),
    pub(super) disallowed_refusals: Throttle,
    /// `Some` with a non-empty allow-list.
    pub(super) refused_disallowed: Option<metrics::Counter>,
}

/// The send stalls of a listener's connections: counted, logged throttled.
#[derive(Clone)]
pub(super) struct Stalls {
    pub(super) total: metrics::Counter,
    pub(super) log: Arc<Mutex<Throttle>>,
}

impl Default for Stalls {
    fn default() -> Self {
        Self {
            total: metrics::counter!(snowkeep_core::metrics::STREAM_SEND_STALLS_TOTAL),
            log: Arc::new(Mutex::new(Throttle::new(WARN_PERIOD))),
        }
    }
}

impl Accepting {
    /// The accept loop of `listener`, with its refusal counters registered.
    pub(super) fn new(from: Listener) -> Self {
        let Listener {
            listener,
            limits,
            open,
            shutdown,
            tls,
            allow,
        } = from;
        // Registered at 0, so the series exist before the first refusal.
        let refused = |reason: &'static str| {
            let c = metrics::counter!(snowkeep_core::metrics::CONNECTIONS_REFUSED_TOTAL, "listener" => limits.name, "reason" => reason);
            c.increment(0);
            c
        };
        Accepting {
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
        }
    }

    /// The next connection admitted; connections refused are closed and
    /// accept errors backed off from on the way.
    pub(super) async fn next(&mut self) -> GuardedIo {
        let mut backoff = snowkeep_client::Backoff::new(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
        loop {
            match self.incoming.next().await {
                Some(Ok(stream)) => {
                    if let Some(io) = self.admit(stream) {
                        return io;
                    }
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

    /// `stream` as a guarded connection when the limits admit it; `None`
    /// (the socket dropped, the refusal counted and logged) when they do not.
    fn admit(&mut self, stream: TcpStream) -> Option<GuardedIo> {
        let peer = stream.peer_addr().ok().map(|a| a.ip());
        if !self.allow.admits(peer) {
            let slot = self.take_disallowed_slot(peer)?;
            return Some(GuardedIo::new(stream, self, slot, None, true));
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
            return None;
        }
        let Some(peer_slot) =
            peers::take(&self.per_peer, self.limits.max_connections_per_peer, peer)
        else {
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
            return None;
        };
        self.open.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(self.open.clone());
        Some(GuardedIo::new(stream, self, slot, peer_slot, false))
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
}

/// An open slot of the listener; frees it on drop.
#[derive(Debug)]
pub(super) struct Slot(pub(super) Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
