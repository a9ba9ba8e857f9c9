//! The client clock-skew policy of the Lease API, as a pure rule.
//!
//! `skew = server time − client time`: positive means the client's clock is
//! behind, negative that it is ahead. Fences keep ids unique whatever the
//! skew, but a skewed client cannot use what it is granted:
//!
//! * a client **behind** must wait for its clock to pass the granted floor
//!   (about the server's time), so it would wait the whole skew before its
//!   first id, and it believes its lease lasts longer than it does;
//! * a client **ahead** is past the granted fence (the lease's expiry plus a
//!   minute, by the server's clock) as soon as the skew exceeds that, and
//!   stamps nothing while holding the machine ids.
//!
//! So Acquire is refused in both directions past one threshold:
//!
//! | \|skew\| | Acquire | Renew |
//! | --- | --- | --- |
//! | ≤ threshold / 2 | fine | fine |
//! | > threshold / 2 | warn | warn |
//! | > threshold | **reject** (FAILED_PRECONDITION) | warn |
//!
//! Renew is never rejected: a running client keeps its machine ids until its
//! lease ends, and rejecting would stop a healthy process over a cluster-wide
//! NTP fault (the embedded client itself stops when its clock passes a
//! renewed fence). A threshold of 0 disables rejection and warns on any skew.

use std::time::Duration;

/// The Lease API call a skew is judged for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkewCall {
    /// Acquire: a skew over the threshold is refused.
    Acquire,
    /// Renew: a skew is only ever warned about.
    Renew,
}

/// Which way a client's clock is off the server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkewDirection {
    /// The client's clock reads earlier than the server's (skew > 0).
    Behind,
    /// The client's clock reads later than the server's (skew < 0).
    Ahead,
}

impl SkewDirection {
    /// The direction of `skew_ms` (server − client); 0 counts as behind.
    pub fn of(skew_ms: i64) -> Self {
        if skew_ms < 0 {
            SkewDirection::Ahead
        } else {
            SkewDirection::Behind
        }
    }
}

impl std::fmt::Display for SkewDirection {
    /// `behind` or `ahead of`, to read "client clock is 5m behind the server".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SkewDirection::Behind => "behind",
            SkewDirection::Ahead => "ahead of",
        })
    }
}

/// The size of `skew_ms` as messages state it: whole seconds (rounded) from
/// one second on, so "20m" rather than "19m 59s 987ms"; milliseconds below.
pub fn magnitude(skew_ms: i64) -> Duration {
    let off = skew_ms.unsigned_abs();
    if off >= 1000 {
        Duration::from_secs(off.saturating_add(500) / 1000)
    } else {
        Duration::from_millis(off)
    }
}

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

/// Judges `skew_ms` (server − client, ms, either sign) under `threshold` for
/// `call`: [`SkewVerdict::Reject`] only for Acquire with `|skew|` over a
/// non-zero threshold, [`SkewVerdict::Warn`] over half of it.
pub fn judge(skew_ms: i64, threshold: Duration, call: SkewCall) -> SkewVerdict {
    let threshold_ms = u64::try_from(threshold.as_millis()).unwrap_or(u64::MAX);
    let off = skew_ms.unsigned_abs();
    if call == SkewCall::Acquire && threshold_ms > 0 && off > threshold_ms {
        SkewVerdict::Reject
    } else if off > threshold_ms / 2 {
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
    fn a_client_fifteen_minutes_off_is_refused_on_acquire_only_either_way() {
        for skew in [15 * 60 * 1000, -15 * 60 * 1000] {
            assert_eq!(judge(skew, TEN_MIN, SkewCall::Acquire), SkewVerdict::Reject);
            assert_eq!(judge(skew, TEN_MIN, SkewCall::Renew), SkewVerdict::Warn);
        }
    }

    #[test]
    fn the_threshold_and_its_half_apply_in_both_directions() {
        for sign in [1, -1] {
            let at = |ms: i64| judge(sign * ms, TEN_MIN, SkewCall::Acquire);
            assert_eq!(at(300_000), SkewVerdict::Fine);
            assert_eq!(at(300_001), SkewVerdict::Warn);
            assert_eq!(at(600_000), SkewVerdict::Warn);
            assert_eq!(at(600_001), SkewVerdict::Reject);
            assert_eq!(at(3_600_000), SkewVerdict::Reject);
        }
        assert_eq!(
            judge(i64::MIN, TEN_MIN, SkewCall::Acquire),
            SkewVerdict::Reject
        );
    }

    #[test]
    fn a_zero_threshold_only_warns() {
        for call in [SkewCall::Acquire, SkewCall::Renew] {
            assert_eq!(judge(3_600_000, Duration::ZERO, call), SkewVerdict::Warn);
            assert_eq!(judge(-3_600_000, Duration::ZERO, call), SkewVerdict::Warn);
            assert_eq!(judge(0, Duration::ZERO, call), SkewVerdict::Fine);
        }
    }

    #[test]
    fn messages_round_the_skew_to_seconds() {
        assert_eq!(magnitude(-1_199_501), Duration::from_secs(1_200));
        assert_eq!(magnitude(900_499), Duration::from_secs(900));
        assert_eq!(magnitude(999), Duration::from_millis(999));
    }

    #[test]
    fn the_direction_reads_in_a_sentence() {
        assert_eq!(SkewDirection::of(5).to_string(), "behind");
        assert_eq!(SkewDirection::of(-5).to_string(), "ahead of");
    }
}
