//! The close and drain policy of a [`GuardedIo`]: when a connection must
//! end. In order: at shutdown when it never made a call; when a response
//! message has waited `send_timeout` for its client; for a peer outside the
//! allow-list, at its deadline or soon after its first denied call; when it
//! is idle (or silent since it was accepted) with no call in progress.

use std::future::Future;
use std::task::Context;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::guarded::GuardedIo;
use super::DENIED_LINGER;

impl GuardedIo {
    /// True once the connection must end; registers `cx` for the moments
    /// that can make it so (the idle deadline, shutdown).
    pub(super) fn must_close(&mut self, cx: &mut Context<'_>) -> bool {
        if self.closed {
            return true;
        }
        self.watch_shutdown(cx);
        // Calls are marked when the call's task first runs the service
        // (hyper runs the tower stack in each call's own task), so a call
        // whose headers were just read may not be marked yet: at shutdown a
        // connection that never made a call may close with such a call in
        // it, which its client sees reset (never issued). One ending
        // elsewhere only makes the connection more idle.
        let no_calls = self.state.calls() == 0;
        let close = self.never_called_at_shutdown(no_calls)
            || self.send_stalled(cx)
            || self.past_its_deadline(cx, no_calls);
        if close {
            self.closed = true;
        }
        close
    }

    /// Polls the shutdown token once to register `cx`, and again once it is
    /// cancelled; notes when shutdown has begun.
    fn watch_shutdown(&mut self, cx: &mut Context<'_>) {
        if !self.shutting_down && (!self.shutdown_armed || self.shutdown_token.is_cancelled()) {
            self.shutdown_armed = true;
            if self.shutdown.as_mut().poll(cx).is_ready() {
                self.shutting_down = true;
            }
        }
    }

    /// True when the server is shutting down and no call has ever started
    /// on this connection.
    fn never_called_at_shutdown(&self, no_calls: bool) -> bool {
        if self.shutting_down && no_calls && !self.state.ever_called() {
            debug!(listener = self.listener, peer = ?self.tcp.remote_addr, "shutting down: closing a connection that never made a call");
            return true;
        }
        false
    }

    /// True (counted and logged) when a response message has waited the send
    /// timeout for the client to take it; else re-arms the send check for
    /// the oldest unsent message's deadline.
    fn send_stalled(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(timeout) = self.send_timeout else {
            return false;
        };
        while self.send_check.fired(cx) {
            let now = Instant::now();
            match self.state.oldest_unsent() {
                Some(since) if now >= since + timeout => {
                    self.count_stall(now, timeout);
                    return true;
                }
                Some(since) => self.send_check.reset(since + timeout),
                None => self.send_check.reset(now + timeout),
            }
        }
        false
    }

    /// Counts a send stall in `snowkeep_stream_send_stalls_total` and logs
    /// it, throttled across the listener's connections.
    fn count_stall(&self, now: Instant, timeout: Duration) {
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
    }

    /// When a connection from outside the allow-list ends: at its deadline,
    /// or once its first denied call has had time to be answered, whatever
    /// else happens on it. `None` for an allowed peer's connection.
    fn disallowed_end(&self) -> Option<Instant> {
        self.disallowed_until.map(|until| {
            self.state
                .first_denied()
                .map_or(until, |denied| until.min(denied + DENIED_LINGER))
        })
    }

    /// True when the connection is past the end of a disallowed peer's
    /// connection, or idle (silent since accepted: the handshake timeout)
    /// with `no_calls` in progress; else re-arms the idle alarm for the
    /// next of those deadlines.
    fn past_its_deadline(&mut self, cx: &mut Context<'_>, no_calls: bool) -> bool {
        let end = self.disallowed_end();
        if let Some(end) = end {
            if self.idle.deadline() > end {
                self.idle.reset(end);
            }
        }
        while self.idle.fired(cx) {
            let now = Instant::now();
            if end.is_some_and(|end| now >= end) {
                debug!(listener = self.listener, peer = ?self.tcp.remote_addr, denied = self.state.first_denied().is_some(), "closing a connection from outside --allow-cidrs");
                return true;
            }
            let deadline = if self.heard {
                self.state.last_active() + self.idle_timeout
            } else {
                self.state.opened() + self.handshake_timeout
            };
            if no_calls && now >= deadline {
                debug!(listener = self.listener, peer = ?self.tcp.remote_addr, idle_timeout = ?self.idle_timeout, heard = self.heard, "closing an idle connection");
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
