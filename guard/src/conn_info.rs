//! What a gRPC connection shares with the calls on it: [`ConnInfo`], which
//! tonic puts into every request's extensions, and the [`ConnState`] it
//! carries (calls in progress, when the client was last heard from, whether
//! the allow-list denied it, the clocks of unsent responses). The listener
//! of `crate::limits::conn` creates and watches it; the allow-list layer
//! (`crate::allow`), the call limits and the server's audit log read it.
//! It imports nothing of the crate, so all of them can.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::server::TcpConnectInfo;

/// What a connection and the calls on it share: calls in progress and when
/// the client was last heard from.
#[derive(Debug)]
pub struct ConnState {
    opened: Instant,
    calls: AtomicUsize,
    ever_called: AtomicBool,
    /// Milliseconds after `opened` of the last byte received or call ended.
    last_active_ms: AtomicU64,
    /// 1 + milliseconds after `opened` when the allow-list first denied a
    /// call on this connection; 0 when it has not.
    denied_ms: AtomicU64,
    /// The response senders of the calls made on this connection (dead ones
    /// are pruned as it grows).
    senders: Mutex<Vec<Weak<Unsent>>>,
    /// What the server's authentication layer remembers of this
    /// connection (see [`Memo`]).
    pub memo: Memo,
}

/// One value a layer above keeps for a connection's calls to share: the
/// server's authentication layer keeps the last key that verified on the
/// connection, so the calls after it that present the same bytes skip the
/// parse and the hash. Type-erased, as this crate knows nothing of keys;
/// dropped with the connection.
#[derive(Default)]
pub struct Memo(Mutex<Option<Arc<dyn Any + Send + Sync>>>);

impl Memo {
    /// The value kept, if any.
    pub fn get(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Keeps `value` in place of the one kept before.
    pub fn set(&self, value: Arc<dyn Any + Send + Sync>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // What is kept may hold a credential: never printed.
        f.write_str("Memo(..)")
    }
}

impl ConnState {
    pub(crate) fn new() -> Self {
        Self {
            opened: Instant::now(),
            calls: AtomicUsize::new(0),
            ever_called: AtomicBool::new(false),
            last_active_ms: AtomicU64::new(0),
            denied_ms: AtomicU64::new(0),
            senders: Mutex::default(),
            memo: Memo::default(),
        }
    }

    /// When the connection was accepted.
    pub(crate) fn opened(&self) -> Instant {
        self.opened
    }

    fn ms_since_opened(&self) -> u64 {
        snowkeep_client::Millis::of(self.opened.elapsed()).get()
    }

    /// A new clock of a call's unsent response message, watched by this
    /// connection's send timeout.
    pub fn sender(self: &Arc<Self>) -> Arc<Unsent> {
        let unsent = Arc::new(Unsent {
            conn: Some(self.clone()),
            since_ms: AtomicU64::new(0),
        });
        let mut senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        if senders.len() == senders.capacity() {
            // Amortized: the vector grows only when all are alive.
            senders.retain(|s| s.strong_count() > 0);
        }
        senders.push(Arc::downgrade(&unsent));
        unsent
    }

    /// When the oldest response message on this connection that is not yet
    /// written out was handed over, if any is.
    pub(crate) fn oldest_unsent(&self) -> Option<Instant> {
        let mut senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        senders.retain(|s| s.strong_count() > 0);
        let oldest = senders
            .iter()
            .filter_map(|s| s.upgrade()?.since_ms())
            .min()?;
        Some(self.opened + Duration::from_millis(oldest))
    }

    pub(crate) fn touch(&self) {
        let ms = self.ms_since_opened();
        self.last_active_ms.fetch_max(ms, Ordering::AcqRel);
    }

    pub(crate) fn last_active(&self) -> Instant {
        self.opened + Duration::from_millis(self.last_active_ms.load(Ordering::Acquire))
    }

    /// The allow-list denied a call on this connection: a connection from
    /// outside the list closes [`DENIED_LINGER`](crate::limits::conn::DENIED_LINGER) after the first one.
    pub fn denied(&self) {
        let now = self.ms_since_opened().saturating_add(1);
        let _ = self
            .denied_ms
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
    }

    /// When the allow-list first denied a call on this connection, if it has.
    pub(crate) fn first_denied(&self) -> Option<Instant> {
        let ms = self.denied_ms.load(Ordering::Acquire).checked_sub(1)?;
        Some(self.opened + Duration::from_millis(ms))
    }

    /// True once a call has started on this connection.
    pub(crate) fn ever_called(&self) -> bool {
        self.ever_called.load(Ordering::Acquire)
    }

    /// Calls in progress on this connection.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Acquire)
    }

    /// Marks a call in progress until the returned guard is dropped.
    pub fn call(self: &Arc<Self>) -> ConnCall {
        self.calls.fetch_add(1, Ordering::AcqRel);
        self.ever_called.store(true, Ordering::Release);
        self.touch();
        ConnCall(self.clone())
    }
}

/// Times the response message a call has handed to hyper that is not yet
/// written out (at most one at a time per call is timed: the oldest).
#[derive(Debug)]
pub struct Unsent {
    /// None for a call with no connection (tests): never times out.
    conn: Option<Arc<ConnState>>,
    /// 1 + milliseconds after the connection opened when the oldest message
    /// not yet written out was handed over; 0 when none is.
    since_ms: AtomicU64,
}

impl Unsent {
    /// A clock watched by no connection.
    pub fn unwatched() -> Arc<Self> {
        Arc::new(Self {
            conn: None,
            since_ms: AtomicU64::new(0),
        })
    }

    /// A message was handed over; the clock starts unless one is running.
    pub fn handed_over(&self) {
        if let Some(conn) = &self.conn {
            let now = conn.ms_since_opened().saturating_add(1);
            let _ = self
                .since_ms
                .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Every message handed over is written out; the clock stops.
    pub fn all_written(&self) {
        self.since_ms.store(0, Ordering::Release);
    }

    fn since_ms(&self) -> Option<u64> {
        self.since_ms.load(Ordering::Acquire).checked_sub(1)
    }
}

/// A call in progress on a connection (see [`ConnState::call`]).
#[derive(Debug)]
pub struct ConnCall(Arc<ConnState>);

impl ConnCall {
    /// A clock for this call's unsent response (see [`ConnState::sender`]).
    pub fn sender(&self) -> Arc<Unsent> {
        self.0.sender()
    }
}

impl Drop for ConnCall {
    fn drop(&mut self) {
        self.0.touch();
        self.0.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connect info of a `crate::limits::conn::GuardedIo`, put into every
/// request's extensions by tonic; the call limit layer marks calls in
/// progress with it.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The connection's shared state.
    pub state: Arc<ConnState>,
    /// Addresses, as tonic's own `TcpConnectInfo`.
    pub tcp: TcpConnectInfo,
}
