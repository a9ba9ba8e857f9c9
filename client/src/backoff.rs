//! Exponential backoff with optional jitter: the one schedule every retry
//! loop of the workspace sleeps by.

use std::time::Duration;

use rand::Rng;

/// Delays between attempts: `first`, then each twice the one before, capped
/// at `max`. With jitter `j`, each delay is scaled by a random factor in
/// `[1 - j, 1 + j]` (the doubling goes on from the unscaled delay), so many
/// clients that failed together do not retry together.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
    jitter: f64,
}

impl Backoff {
    /// Starts at `first` and doubles up to `max`, without jitter. A `max`
    /// below `first` caps every delay, the first one too.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first.min(max),
            jitter: 0.0,
        }
    }

    /// Scales each delay by a random factor in `[1 - fraction, 1 + fraction]`
    /// (0.2 is ±20%); `fraction` is clamped to 0 to 1.
    pub fn with_jitter(mut self, fraction: f64) -> Self {
        self.jitter = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// The delay to sleep before the next attempt; the one after it doubles.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = base.saturating_mul(2).min(self.max);
        if self.jitter == 0.0 {
            return base;
        }
        base.mul_f64(1.0 + rand::rng().random_range(-self.jitter..=self.jitter))
    }

    /// Starts over at `first`, after an attempt succeeded.
    pub fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn delays_double_from_the_first_up_to_the_cap() {
        let mut b = Backoff::new(20 * MS, 1000 * MS);
        let delays: Vec<Duration> = (0..9).map(|_| b.next_delay()).collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
    }

    #[test]
    fn reset_starts_over_at_the_first_delay() {
        let mut b = Backoff::new(100 * MS, 2000 * MS);
        assert_eq!(b.next_delay(), 100 * MS);
        assert_eq!(b.next_delay(), 200 * MS);
        b.reset();
        assert_eq!(b.next_delay(), 100 * MS);
        assert_eq!(b.next_delay(), 200 * MS);
    }

    #[test]
    fn a_cap_below_the_first_delay_caps_it() {
        let mut b = Backoff::new(5000 * MS, 1000 * MS);
        assert_eq!(b.next_delay(), 1000 * MS);
        assert_eq!(b.next_delay(), 1000 * MS);
        b.reset();
        assert_eq!(b.next_delay(), 1000 * MS);
    }

    #[test]
    fn jitter_scales_each_delay_within_its_fraction_and_keeps_doubling() {
        for _ in 0..200 {
            let mut b = Backoff::new(3000 * MS, 60_000 * MS).with_jitter(0.2);
            for base in [3000, 6000, 12_000, 24_000, 48_000, 60_000, 60_000] {
                let d = b.next_delay().as_secs_f64() * 1000.0;
                let (lo, hi) = (base as f64 * 0.8, base as f64 * 1.2);
                assert!(
                    lo - 1e-6 <= d && d <= hi + 1e-6,
                    "{d} ms outside {lo}..={hi} ms"
                );
            }
        }
    }

    #[test]
    fn a_jitter_fraction_outside_zero_to_one_is_clamped() {
        let mut none = Backoff::new(10 * MS, 10 * MS).with_jitter(-1.0);
        assert_eq!(none.next_delay(), 10 * MS);
        let mut nan = Backoff::new(10 * MS, 10 * MS).with_jitter(f64::NAN);
        assert_eq!(nan.next_delay(), 10 * MS);
        for _ in 0..200 {
            let mut full = Backoff::new(10 * MS, 10 * MS).with_jitter(7.0);
            assert!(full.next_delay() <= 20 * MS);
        }
    }
}
