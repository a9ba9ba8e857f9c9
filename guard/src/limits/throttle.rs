//! A log line that repeats under load (an accept error while file descriptors
//! are exhausted can fail thousands of times a second) is written at most
//! once per period, with the number of repeats it stood for.

use std::time::Duration;

use tokio::time::Instant;

/// Lets one event through per period and counts the ones it holds back.
#[derive(Debug)]
pub struct Throttle {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    /// At most one event per `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// Records an event at `now`. `Some(n)` means: log it now, mentioning the
    /// `n` events held back since the last one logged; `None` means: hold it
    /// back.
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.period => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_one_event_through_per_period_and_counts_the_rest() {
        let start = Instant::now();
        let mut t = Throttle::new(Duration::from_secs(10));
        assert_eq!(t.hit(start), Some(0));
        for ms in 1..=1000 {
            assert_eq!(t.hit(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(t.hit(start + Duration::from_secs(10)), Some(1000));
        assert_eq!(t.hit(start + Duration::from_secs(11)), None);
        assert_eq!(t.hit(start + Duration::from_secs(25)), Some(1));
    }
}
