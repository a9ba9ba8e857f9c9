//! [`GuardedIo`], the connection hyper serves: the tower/hyper side of the
//! guard. It runs the TLS handshake on first use, hands tonic the
//! connection's [`ConnInfo`], and asks [`GuardedIo::must_close`] (in
//! `close`) on every read whether the connection must end.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::debug;

use super::accept::{Accepting, Slot, Stalls};
use super::io::Io;
use super::peers::PeerSlot;
use super::DISALLOWED_TIMEOUT;
use crate::conn_info::{ConnInfo, ConnState};
use crate::limits::alarm::Alarm;

/// An accepted TCP connection (plaintext, or TLS with
/// [`Listener::with_tls`](super::Listener::with_tls)) that closes itself
/// when idle, or at shutdown when it never made a call (see the docs of
/// [`limits::conn`](super)).
pub struct GuardedIo {
    pub(super) inner: Io,
    pub(super) state: Arc<ConnState>,
    pub(super) tcp: TcpConnectInfo,
    pub(super) idle_timeout: Duration,
    pub(super) handshake_timeout: Duration,
    /// True once the client has sent a byte.
    pub(super) heard: bool,
    pub(super) idle: Alarm,
    pub(super) send_timeout: Option<Duration>,
    /// Fires at the send deadline of the oldest unsent message (or one
    /// timeout from the last check when none is unsent).
    pub(super) send_check: Alarm,
    pub(super) stalls: Stalls,
    /// Checked first on every read (an atomic load); the future is polled
    /// once to register the task, and again once the token is cancelled.
    pub(super) shutdown_token: CancellationToken,
    pub(super) shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    pub(super) shutdown_armed: bool,
    pub(super) shutting_down: bool,
    pub(super) closed: bool,
    pub(super) listener: &'static str,
    /// For a connection from outside the allow-list: when it closes at the
    /// latest (see [`DISALLOWED_TIMEOUT`]).
    pub(super) disallowed_until: Option<Instant>,
    pub(super) _slot: Slot,
    pub(super) _peer_slot: Option<PeerSlot>,
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
    pub(super) fn new(
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
}

impl GuardedIo {
    /// A write that waits for the client is where a stalled connection
    /// shows: an HTTP/1 server blocked writing a response does not read
    /// (the path [`must_close`](Self::must_close) is otherwise checked on),
    /// so a write that cannot go on checks it too, and fails once the
    /// connection must end (registering `cx` for the moment it must).
    fn unless_closing<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_pending() && self.must_close(cx) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection was closed by the server's limits",
            )));
        }
        polled
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
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.unless_closing(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_handshake(cx))?;
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.unless_closing(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_handshake(cx))?;
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.unless_closing(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
