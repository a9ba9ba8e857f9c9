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

use crate::limits::conn::ConnInfo;

/// The tracing target of audit events.
pub const TARGET: &str = "snowkeep::audit";

/// How many events a slow TailAudit follower may fall behind before it
/// misses some (it is told how many).
const FOLLOWER_BACKLOG: usize = 1024;

/// The API key id of an authenticated call, put into the request's
/// extensions by the authentication layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallerKey(pub String);

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
                .map(|k| k.0.clone())
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

/// Records `event`: logs it under [`TARGET`], counts it, and sends it to
/// TailAudit followers.
pub fn record(event: AuditEvent) {
    tracing::info!(
        target: TARGET,
        unix_ms = event.unix_ms,
        action = event.action,
        key_id = %event.who.key_id,
        peer = %event.who.peer,
        requester = %event.requester,
        namespace = %event.namespace,
        subject = %event.subject,
        result = %event.result,
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
