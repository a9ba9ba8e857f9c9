//! The audit trail: one structured event per Lease API acquire and release,
//! eviction, key change and import, logged under its own target
//! [`TARGET`] (so it can be routed or filtered apart from the server's
//! other logs), counted in `snowkeep_audit_events_total` by action, key id
//! and result, and broadcast to `AdminService.TailAudit` followers.
//!
//! Events name who acted by API key id, requester hash (the first hex digits
//! of the SHA-256 of the requester's identity) and peer address. Secrets,
//! lease tokens and nonces are never part of an event.

use std::sync::OnceLock;

use tokio::sync::broadcast;

use crate::conn_info::ConnInfo;

/// The tracing target of audit events.
pub const TARGET: &str = "snowkeep::audit";

/// How many events a slow TailAudit follower may fall behind before it
/// misses some (it is told how many).
const FOLLOWER_BACKLOG: usize = 1024;

/// The API key id of an authenticated call (defined by the guard, whose call
/// limits share the pools by it).
pub use snowkeep_guard::limits::calls::CallerKey;

/// Who made a call: API key id (empty when authentication is off) and peer
/// address (empty when unknown).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Who {
    /// The API key id.
    pub key_id: String,
    /// The peer's `ip:port`.
    pub peer: String,
}

impl Who {
    /// Reads who made a call from its request extensions.
    pub fn of(extensions: &http::Extensions) -> Self {
        Who {
            key_id: extensions
                .get::<CallerKey>()
                .map(|k| k.0.to_string())
                .unwrap_or_default(),
            peer: extensions
                .get::<ConnInfo>()
                .and_then(|c| c.tcp.remote_addr())
                .map(|a| a.to_string())
                .unwrap_or_default(),
        }
    }
}

/// One audit event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEvent {
    /// When, ms since the Unix epoch (from the server's clock,
    /// `snowkeep_client::Clock::unix_ms`).
    pub unix_ms: u64,
    /// What: `lease.acquire`, `lease.release`, `admin.evict`, `key.create`,
    /// `key.expire`, `key.revoke`, `state.import`.
    pub action: &'static str,
    /// Who.
    pub who: Who,
    /// The requester hash, for Lease API events; empty otherwise.
    pub requester: String,
    /// The namespace, when there is one.
    pub namespace: String,
    /// What it acted on (machine ids, a key id).
    pub subject: String,
    /// `ok` or the gRPC status code's name.
    pub result: String,
}

fn channel() -> &'static broadcast::Sender<AuditEvent> {
    static TX: OnceLock<broadcast::Sender<AuditEvent>> = OnceLock::new();
    TX.get_or_init(|| broadcast::channel(FOLLOWER_BACKLOG).0)
}

/// The result field for a call's outcome: `ok`, or the status code's name.
pub fn result_of<T>(r: &Result<T, tonic::Status>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(s) => format!("{:?}", s.code()),
    }
}

/// An outsider-supplied string as a log line may show it: control
/// characters (newline, CR, ESC, BEL and the rest), the Unicode marks that
/// reorder or hide text, and the backslash itself are written as escapes
/// (`\n`, `\u{1b}`, `\\`), so no value can end a log line, forge the
/// next one, or drive the terminal of whoever reads the log.
pub struct Escaped<'a>(pub &'a str);

/// True for a character [`Escaped`] writes as an escape.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || c == '\\'
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        for c in self.0.chars() {
            if needs_escape(c) {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// Records `event`: logs it under [`TARGET`] (every string [`Escaped`]),
/// counts it, and sends it to TailAudit followers.
pub fn record(event: AuditEvent) {
    tracing::info!(
        target: TARGET,
        unix_ms = event.unix_ms,
        action = event.action,
        key_id = %Escaped(&event.who.key_id),
        peer = %Escaped(&event.who.peer),
        requester = %Escaped(&event.requester),
        namespace = %Escaped(&event.namespace),
        subject = %Escaped(&event.subject),
        result = %Escaped(&event.result),
        "audit"
    );
    metrics::counter!(
        crate::metrics::AUDIT_EVENTS_TOTAL,
        "action" => event.action,
        "key_id" => event.who.key_id.clone(),
        "result" => event.result.clone()
    )
    .increment(1);
    // No follower is not an error.
    let _ = channel().send(event);
}

/// Follows the events recorded from now on.
pub fn subscribe() -> broadcast::Receiver<AuditEvent> {
    channel().subscribe()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_nothing_else() {
        assert_eq!(
            Escaped("a\nb\r\x1b[2J\x07\\ é\u{202E}").to_string(),
            "a\\nb\\r\\u{1b}[2J\\u{7}\\\\ é\\u{202e}"
        );
        assert_eq!(Escaped("orders-1.eu_west").to_string(), "orders-1.eu_west");
    }

    #[test]
    fn a_follower_receives_each_recorded_event_once() {
        let mut rx = subscribe();
        let event = AuditEvent {
            unix_ms: 1,
            action: "key.revoke",
            who: Who {
                key_id: "k1".into(),
                peer: "127.0.0.1:9".into(),
            },
            requester: String::new(),
            namespace: String::new(),
            subject: "k2".into(),
            result: "ok".into(),
        };
        record(event.clone());
        // Other tests may record too: find ours.
        let got = std::iter::from_fn(|| rx.try_recv().ok())
            .find(|e| e.subject == "k2" && e.action == "key.revoke");
        assert_eq!(got, Some(event));
    }
}
