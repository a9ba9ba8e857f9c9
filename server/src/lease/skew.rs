//! The client clock-skew policy of the Lease API (spec/002), as a pure rule.
//!
//! `skew = server time − client time`: positive means the client's clock is
//! behind, the dangerous direction (a client behind the server believes its
//! lease lasts longer than it does). Under DESIGN §2's fences skew cannot
//! cause duplicates, but a client far behind would stamp nothing useful and
//! hold machine ids long after the server let them go, so it is refused at
//! Acquire. One threshold drives everything:
//!
//! | skew | Acquire | Renew |
//! | --- | --- | --- |
//! | \|skew\| ≤ threshold / 2 | fine | fine |
//! | \|skew\| > threshold / 2 | warn | warn |
//! | skew > threshold (client behind) | **reject** (FAILED_PRECONDITION) | warn |
//!
//! Renew is never rejected: the skew alone is harmless while renewals succeed,
//! and rejecting would stop a healthy process over a cluster-wide NTP fault.
//! A threshold of 0 disables rejection and warns on any skew.

use std::time::Duration;

/// What to do about a request's clock skew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkewVerdict {
    /// Within half the threshold.
    Fine,
    /// Log a warning, serve the request.
    Warn,
    /// Refuse the request.
    Reject,
}

/// Judges `skew_ms` (server − client) under `threshold`; `acquire` is true
/// for Acquire, false for Renew.
pub fn judge(skew_ms: i64, threshold: Duration, acquire: bool) -> SkewVerdict {
    let threshold_ms = i64::try_from(threshold.as_millis()).unwrap_or(i64::MAX);
    if acquire && threshold_ms > 0 && skew_ms > threshold_ms {
        SkewVerdict::Reject
    } else if skew_ms.unsigned_abs() > (threshold_ms / 2).unsigned_abs() {
        SkewVerdict::Warn
    } else {
        SkewVerdict::Fine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEN_MIN: Duration = Duration::from_secs(600);

    #[test]
    fn a_client_fifteen_minutes_behind_is_refused_on_acquire_only() {
        let skew = 15 * 60 * 1000;
        assert_eq!(judge(skew, TEN_MIN, true), SkewVerdict::Reject);
        assert_eq!(judge(skew, TEN_MIN, false), SkewVerdict::Warn);
    }

    #[test]
    fn half_the_threshold_warns_in_either_direction() {
        assert_eq!(judge(300_000, TEN_MIN, true), SkewVerdict::Fine);
        assert_eq!(judge(300_001, TEN_MIN, true), SkewVerdict::Warn);
        assert_eq!(judge(-300_001, TEN_MIN, true), SkewVerdict::Warn);
        // A client ahead is never refused: it stops early, which is safe.
        assert_eq!(judge(-3_600_000, TEN_MIN, true), SkewVerdict::Warn);
        assert_eq!(judge(600_000, TEN_MIN, true), SkewVerdict::Warn);
        assert_eq!(judge(600_001, TEN_MIN, true), SkewVerdict::Reject);
    }

    #[test]
    fn a_zero_threshold_only_warns() {
        assert_eq!(judge(3_600_000, Duration::ZERO, true), SkewVerdict::Warn);
        assert_eq!(judge(0, Duration::ZERO, true), SkewVerdict::Fine);
    }
}
