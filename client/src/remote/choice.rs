//! Which server an attempt goes to: round robin over the endpoints, skipping
//! an *ejected* one (its last attempt failed with a retryable code) until its
//! ejection ends: the passive health check of the client contract
//! (`conformance/README.md`, "Choosing a server, retrying"), in the manner of
//! Envoy's outlier ejection. An ejection lasts `backoff`, doubling with each
//! consecutive failure of that endpoint up to `max_backoff`; a success clears
//! it. When every endpoint is ejected, the one whose ejection ends first is
//! chosen, so a call never waits for an ejection to end.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Ejection state of one endpoint.
#[derive(Debug, Default)]
struct Health {
    /// Milliseconds after [`Choice::start`] until which it is skipped.
    ejected_until_ms: AtomicU64,
    /// Retryable failures in a row.
    failures: AtomicU32,
}

/// The round-robin cursor and each endpoint's health.
#[derive(Debug)]
pub(crate) struct Choice {
    start: Instant,
    next: AtomicUsize,
    health: Vec<Health>,
    backoff: Duration,
    max_backoff: Duration,
}

impl Choice {
    /// Choice over `endpoints` endpoints (at least one).
    pub(crate) fn new(endpoints: usize, backoff: Duration, max_backoff: Duration) -> Self {
        Self {
            start: Instant::now(),
            next: AtomicUsize::new(0),
            health: (0..endpoints.max(1)).map(|_| Health::default()).collect(),
            backoff,
            max_backoff,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The endpoint of the next attempt: the next one in round-robin order
    /// that is not ejected, else the one whose ejection ends first.
    pub(crate) fn pick(&self) -> usize {
        let n = self.health.len();
        let now = self.now_ms();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut soonest = (first, u64::MAX);
        for k in 0..n {
            let i = (first + k) % n;
            let until = self.health[i].ejected_until_ms.load(Ordering::Relaxed);
            if until <= now {
                if k > 0 {
                    // Go on after the endpoint chosen, not after a skipped one.
                    self.next.store(i + 1, Ordering::Relaxed);
                }
                return i;
            }
            if until < soonest.1 {
                soonest = (i, until);
            }
        }
        soonest.0
    }

    /// Endpoint `i` failed with a retryable code: eject it for `backoff`
    /// doubled per failure in a row, up to `max_backoff`.
    pub(crate) fn failed(&self, i: usize) {
        let h = &self.health[i];
        let failures = h.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let factor = 1u32 << (failures - 1).min(20);
        let ejection = self.backoff.saturating_mul(factor).min(self.max_backoff);
        let until = self
            .now_ms()
            .saturating_add(u64::try_from(ejection.as_millis()).unwrap_or(u64::MAX));
        h.ejected_until_ms.store(until, Ordering::Relaxed);
    }

    /// Endpoint `i` answered: it is healthy again.
    pub(crate) fn succeeded(&self, i: usize) {
        let h = &self.health[i];
        if h.failures.load(Ordering::Relaxed) != 0 {
            h.failures.store(0, Ordering::Relaxed);
            h.ejected_until_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Endpoints.
    pub(crate) fn len(&self) -> usize {
        self.health.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(n: usize) -> Choice {
        Choice::new(n, Duration::from_secs(60), Duration::from_secs(60))
    }

    #[test]
    fn healthy_endpoints_take_turns() {
        let c = choice(3);
        let picks: Vec<usize> = (0..6).map(|_| c.pick()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn an_ejected_endpoint_is_skipped_until_it_succeeds() {
        let c = choice(3);
        c.failed(1);
        let picks: Vec<usize> = (0..4).map(|_| c.pick()).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
        c.succeeded(1);
        let picks: Vec<usize> = (0..3).map(|_| c.pick()).collect();
        assert_eq!(picks, [0, 1, 2]);
    }

    #[test]
    fn with_every_endpoint_ejected_the_one_ejected_first_is_tried() {
        let c = Choice::new(3, Duration::from_secs(10), Duration::from_secs(60));
        c.failed(2); // 10 s
        c.failed(0);
        c.failed(0); // 20 s
        c.failed(1);
        c.failed(1);
        c.failed(1); // 40 s
        assert_eq!(c.pick(), 2);
        assert_eq!(c.pick(), 2);
    }

    #[test]
    fn an_ejection_ends_after_its_time() {
        let c = Choice::new(2, Duration::ZERO, Duration::ZERO);
        c.failed(0);
        let picks: Vec<usize> = (0..4).map(|_| c.pick()).collect();
        assert_eq!(picks, [0, 1, 0, 1]);
    }
}
