//! The byte stream under a [`super::GuardedIo`]: plaintext, a TLS handshake
//! in progress, TLS, or a failed handshake being wound down.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The byte stream of a connection: plaintext, or TLS once its handshake is
/// done.
pub(super) enum Io {
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
    pub(super) fn not_ready() -> io::Error {
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
