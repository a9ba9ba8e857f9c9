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

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use snowkeep_client::Millis;

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
    let threshold_ms = Millis::of(threshold).get();
    let off = skew_ms.unsigned_abs();
    if call == SkewCall::Acquire && threshold_ms > 0 && off > threshold_ms {
        SkewVerdict::Reject
    } else if off > threshold_ms / 2 {
        SkewVerdict::Warn
    } else {
        SkewVerdict::Fine
    }
}

/// Most requesters whose last clock skew one server keeps ([`SkewBook`]).
pub const SKEW_BOOK_CAPACITY: usize = 16_384;

/// The last clock skew each known requester reported, in server memory: a
/// requester that holds machine ids and presented its lease token (nothing
/// else is ever recorded). Keyed by namespace and the SHA-256 of the
/// requester's identity, kept until the requester's lease ends or it
/// releases, and capped at a fixed number of entries (the one seen longest
/// ago makes room), so no caller can grow it beyond that. It feeds the count
/// of skewed requesters that the clock-skew alerts watch.
#[derive(Debug)]
pub struct SkewBook {
    capacity: usize,
    entries: HashMap<(String, [u8; 32]), SkewEntry>,
}

#[derive(Debug, Clone, Copy)]
struct SkewEntry {
    /// Server − client, ms (already clamped by the caller).
    skew_ms: i64,
    /// When it was recorded (monotonic).
    seen: Instant,
    /// When the requester's lease ends: the entry goes then.
    until: Instant,
}

impl SkewBook {
    /// An empty book holding at most `capacity` requesters (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    /// Keeps `skew_ms` (server − client, ms) as the last skew of `requester`
    /// in `namespace`, seen at `now`, until `until`. Returns the namespaces
    /// whose counts may have changed: this one, and that of an entry evicted
    /// to make room.
    pub fn record(
        &mut self,
        namespace: &str,
        requester: [u8; 32],
        skew_ms: i64,
        now: Instant,
        until: Instant,
    ) -> BTreeSet<String> {
        let key = (namespace.to_owned(), requester);
        let mut touched = BTreeSet::new();
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            touched = self.expire(now);
        }
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.seen)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
                touched.insert(oldest.0);
            }
        }
        self.entries.insert(
            key,
            SkewEntry {
                skew_ms,
                seen: now,
                until,
            },
        );
        touched.insert(namespace.to_owned());
        touched
    }

    /// Forgets `requester` of `namespace` (it released); true when it was kept.
    pub fn forget(&mut self, namespace: &str, requester: [u8; 32]) -> bool {
        self.entries
            .remove(&(namespace.to_owned(), requester))
            .is_some()
    }

    /// Drops the entries whose lease ended by `now`; returns their namespaces.
    pub fn expire(&mut self, now: Instant) -> BTreeSet<String> {
        let mut touched = BTreeSet::new();
        self.entries.retain(|(namespace, _), e| {
            let keep = e.until > now;
            if !keep {
                touched.insert(namespace.clone());
            }
            keep
        });
        touched
    }

    /// Requesters of `namespace` whose last skew is off by more than half
    /// `threshold`, and by more than `threshold`, either way; `(0, 0)` for a
    /// threshold of 0 (skew checks off).
    pub fn count(&self, namespace: &str, threshold: Duration) -> (usize, usize) {
        let threshold_ms = Millis::of(threshold).get();
        if threshold_ms == 0 {
            return (0, 0);
        }
        let mut counts = (0, 0);
        for ((ns, _), e) in &self.entries {
            if ns != namespace {
                continue;
            }
            let off = e.skew_ms.unsigned_abs();
            counts.0 += usize::from(off > threshold_ms / 2);
            counts.1 += usize::from(off > threshold_ms);
        }
        counts
    }

    /// Requesters kept, over every namespace.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
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

    fn id(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[test]
    fn the_book_counts_requesters_over_half_and_over_the_threshold() {
        let t0 = snowkeep_client::Clock::now(&snowkeep_client::SystemClock);
        let day = t0 + Duration::from_secs(86_400);
        let mut book = SkewBook::new(10);
        book.record("a", id(1), 300_001, t0, day);
        book.record("a", id(2), -600_001, t0, day);
        book.record("a", id(3), 1_000, t0, day);
        book.record("b", id(4), 900_000, t0, day);
        assert_eq!(book.count("a", TEN_MIN), (2, 1));
        assert_eq!(book.count("b", TEN_MIN), (1, 1));
        assert_eq!(book.count("a", Duration::ZERO), (0, 0));
        // A requester's newer report replaces its older one.
        book.record("a", id(2), 0, t0, day);
        assert_eq!(book.count("a", TEN_MIN), (1, 0));
        assert!(book.forget("a", id(1)));
        assert!(!book.forget("a", id(1)));
        assert_eq!(book.count("a", TEN_MIN), (0, 0));
        assert_eq!(book.len(), 3);
    }

    #[test]
    fn the_book_forgets_a_requester_when_its_lease_ends() {
        let t0 = snowkeep_client::Clock::now(&snowkeep_client::SystemClock);
        let mut book = SkewBook::new(10);
        book.record("a", id(1), 900_000, t0, t0 + Duration::from_secs(10));
        book.record("b", id(2), 900_000, t0, t0 + Duration::from_secs(20));
        let gone = book.expire(t0 + Duration::from_secs(10));
        assert_eq!(gone.into_iter().collect::<Vec<_>>(), vec!["a".to_owned()]);
        assert_eq!(book.count("a", TEN_MIN), (0, 0));
        assert_eq!(book.count("b", TEN_MIN), (1, 1));
    }

    #[test]
    fn a_full_book_drops_the_requester_seen_longest_ago() {
        let t0 = snowkeep_client::Clock::now(&snowkeep_client::SystemClock);
        let day = t0 + Duration::from_secs(86_400);
        let mut book = SkewBook::new(3);
        for n in 0..3u8 {
            book.record(
                "a",
                id(n),
                900_000,
                t0 + Duration::from_secs(u64::from(n)),
                day,
            );
        }
        let touched = book.record("b", id(9), 900_000, t0 + Duration::from_secs(5), day);
        assert_eq!(book.len(), 3);
        assert_eq!(
            touched.into_iter().collect::<Vec<_>>(),
            vec!["a".to_owned(), "b".to_owned()]
        );
        assert_eq!(book.count("a", TEN_MIN), (2, 2), "id 0 made room");
        assert!(!book.forget("a", id(0)));
        // 1,000 distinct requesters never grow a book of 100 past 100.
        let mut book = SkewBook::new(100);
        for n in 0..1_000u32 {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&n.to_be_bytes());
            book.record("a", key, 1, t0, day);
        }
        assert_eq!(book.len(), 100);
    }
}
