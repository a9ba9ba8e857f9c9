//! Text forms the server writes in records, keys and messages: lower-case
//! hex of digests and tokens, and times as RFC 3339. The Lease API's
//! records, API keys, the etcd store and the status page write them alike;
//! this module imports nothing of the crate, so all of them can.

use std::time::{Duration, UNIX_EPOCH};

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 bytes from exactly 64 hex digits (either case); `None` otherwise.
pub fn unhex32(text: &str) -> Option<[u8; 32]> {
    let text = text.as_bytes();
    if text.len() != 64 {
        return None;
    }
    // Runs for every call with an API key: byte arithmetic, no char decoding.
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// `unix_ms` as RFC 3339 (UTC, seconds); a time after the year 9999, which
/// RFC 3339 cannot write, as the number itself (never a panic).
pub fn rfc3339(unix_ms: u64) -> String {
    const LAST_RFC3339_MS: u64 = 253_402_300_799_999;
    if unix_ms > LAST_RFC3339_MS {
        return format!("{unix_ms} ms (after 9999)");
    }
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_after_9999_are_written_as_numbers_not_a_panic() {
        assert_eq!(rfc3339(5_000), "1970-01-01T00:00:05Z");
        assert_eq!(rfc3339(u64::MAX), "18446744073709551615 ms (after 9999)");
    }
}
