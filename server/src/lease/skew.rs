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

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

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
        let threshold_ms = u64::try_from(threshold.as_millis()).unwrap_or(u64::MAX);
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
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no requester is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
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
