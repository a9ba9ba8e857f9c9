//! Who an embedded generator is, to the Lease API: host machine id + pid +
//! process start time. The start time keeps a restarted process
//! apart from its predecessor even when both run as PID 1 in a container.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use snowkeep_proto::v1 as pb;

use crate::clock::{Clock, SystemClock};

/// The identity of an embedded client process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requester {
    /// The host's machine id (`/etc/machine-id`), or its host name.
    pub host_id: String,
    /// The process id.
    pub pid: u32,
    /// The process start time, ms since the Unix epoch.
    pub start_unix_ms: u64,
    /// Drawn at random for each generator: two generators of one process
    /// (two libraries, say) are two requesters, never one sharing machine ids.
    pub nonce: String,
}

impl Requester {
    /// This process: `/etc/machine-id` (else the host name), its pid, and its
    /// start time from `/proc/self/stat` (else the time of the first call).
    pub fn current() -> Self {
        Self {
            host_id: host_id(),
            pid: std::process::id(),
            start_unix_ms: process_start_unix_ms(),
            nonce: new_nonce(),
        }
    }

    /// A copy with a fresh nonce: another requester in the same process.
    pub fn renewed_nonce(&self) -> Self {
        Self {
            nonce: new_nonce(),
            ..self.clone()
        }
    }

    /// A short name for logs: the first 12 hex digits of the SHA-256 of
    /// `host_id:pid:start_unix_ms:nonce`. The server logs requesters by the
    /// same tag (and never logs the identity), so the two logs can be matched.
    pub fn tag(&self) -> String {
        let identity = format!(
            "{}:{}:{}:{}",
            self.host_id, self.pid, self.start_unix_ms, self.nonce
        );
        Sha256::digest(identity.as_bytes())[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The protobuf form.
    pub fn to_pb(&self) -> pb::Requester {
        pb::Requester {
            host_id: self.host_id.clone(),
            pid: self.pid,
            start_unix_ms: self.start_unix_ms,
            nonce: self.nonce.clone(),
        }
    }
}

fn new_nonce() -> String {
    format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

fn host_id() -> String {
    let keep = |s: &str| -> String {
        s.trim()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
            .take(128)
            .collect()
    };
    for path in ["/etc/machine-id", "/var/lib/dbus/machine-id"] {
        if let Ok(text) = std::fs::read_to_string(path) {
            let id = keep(&text);
            if !id.is_empty() {
                return id;
            }
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| keep(&h))
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// Linux's clock ticks per second for /proc times (USER_HZ, 100 on every
/// mainstream architecture).
const USER_HZ: u64 = 100;

fn process_start_unix_ms() -> u64 {
    static FIRST_CALL: OnceLock<u64> = OnceLock::new();
    from_proc().unwrap_or_else(|| *FIRST_CALL.get_or_init(|| SystemClock.unix_ms()))
}

fn from_proc() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Field 22 (starttime) counts from after the ")" that closes the command name.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(boot * 1000 + ticks * 1000 / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_process_has_a_stable_identity() {
        let a = Requester::current();
        let b = Requester::current();
        assert_eq!(
            (&a.host_id, a.pid, a.start_unix_ms),
            (&b.host_id, b.pid, b.start_unix_ms)
        );
        assert_ne!(a.nonce, b.nonce, "two generators are two requesters");
        assert_eq!(a.nonce.len(), 32);
        assert_eq!(a.pid, std::process::id());
        assert!(!a.host_id.is_empty());
        // Started before now, and not before 2020.
        assert!(a.start_unix_ms <= SystemClock.unix_ms());
        assert!(a.start_unix_ms > 1_577_836_800_000);
    }

    #[test]
    fn the_tag_is_twelve_hex_digits_of_the_identity_hash() {
        let r = Requester {
            host_id: "h".into(),
            pid: 1,
            start_unix_ms: 2,
            nonce: "00".into(),
        };
        // The first 12 hex digits of SHA-256("h:1:2:00").
        assert_eq!(r.tag(), "4ed3c3420511");
        assert_ne!(r.tag(), r.renewed_nonce().tag());
    }
}
