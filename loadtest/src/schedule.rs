//! Load schedules, as ghz names them: a rate (calls per second) or a
//! concurrency (workers) that is constant, rises in steps, or rises along a
//! line, as a pure function of the time since the run began.

use std::time::Duration;

/// How a quantity changes over the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// `start` for the whole run.
    Const {
        /// The value.
        start: f64,
    },
    /// `start`, plus `step` after every `step_duration`, until `end` (when
    /// set) or `max_duration` (after which it stays put).
    Step {
        /// First value.
        start: f64,
        /// Added after each step (may be negative).
        step: f64,
        /// Bound the value never passes (upwards or downwards).
        end: Option<f64>,
        /// Time at each value.
        step_duration: Duration,
        /// Time after which the value stops changing.
        max_duration: Option<Duration>,
    },
    /// `start + step × seconds`, until `end` or `max_duration`.
    Line {
        /// Value at 0 s.
        start: f64,
        /// Change per second.
        step: f64,
        /// Bound the value never passes.
        end: Option<f64>,
        /// Time after which the value stops changing.
        max_duration: Option<Duration>,
    },
}

impl Schedule {
    /// The value at `elapsed` since the run began; never below 0.
    pub fn at(&self, elapsed: Duration) -> f64 {
        let clamp_time = |max: Option<Duration>| max.map_or(elapsed, |m| elapsed.min(m));
        let bound = |v: f64, start: f64, step: f64, end: Option<f64>| match end {
            Some(e) if step >= 0.0 => v.min(e.max(start)),
            Some(e) => v.max(e.min(start)),
            None => v,
        };
        let v = match *self {
            Schedule::Const { start } => start,
            Schedule::Step {
                start,
                step,
                end,
                step_duration,
                max_duration,
            } => {
                let t = clamp_time(max_duration);
                let steps = if step_duration.is_zero() {
                    0.0
                } else {
                    (t.as_nanos() / step_duration.as_nanos()) as f64
                };
                bound(start + step * steps, start, step, end)
            }
            Schedule::Line {
                start,
                step,
                end,
                max_duration,
            } => {
                let t = clamp_time(max_duration).as_secs_f64();
                bound(start + step * t, start, step, end)
            }
        };
        v.max(0.0)
    }

    /// True when the value can still grow later in a run (a rising step or
    /// line); a constant or falling schedule never gives back what it has not.
    pub fn rises(&self) -> bool {
        match *self {
            Schedule::Const { .. } => false,
            Schedule::Step { step, .. } | Schedule::Line { step, .. } => step > 0.0,
        }
    }

    /// The largest value the schedule reaches within `run` (or ever, when it
    /// is bounded); `None` for an unbounded rise over an unbounded run.
    pub fn peak(&self, run: Option<Duration>) -> Option<f64> {
        match *self {
            Schedule::Const { start } => Some(start),
            Schedule::Step {
                end: Some(e),
                step,
                start,
                ..
            }
            | Schedule::Line {
                end: Some(e),
                step,
                start,
                ..
            } => Some(if step >= 0.0 { e.max(start) } else { start }),
            Schedule::Step { max_duration, .. } | Schedule::Line { max_duration, .. } => {
                let t = match (max_duration, run) {
                    (Some(m), Some(r)) => m.min(r),
                    (Some(m), None) => m,
                    (None, Some(r)) => r,
                    (None, None) => return None,
                };
                Some(self.at(t).max(self.at(Duration::ZERO)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn only_rising_schedules_rise() {
        assert!(!Schedule::Const { start: 5.0 }.rises());
        let line = |step| Schedule::Line {
            start: 5.0,
            step,
            end: None,
            max_duration: None,
        };
        assert!(line(1.0).rises());
        assert!(!line(-1.0).rises());
        assert!(!line(0.0).rises());
    }

    #[test]
    fn const_is_flat() {
        let s = Schedule::Const { start: 50.0 };
        assert_eq!(s.at(S(0)), 50.0);
        assert_eq!(s.at(S(100)), 50.0);
        assert_eq!(s.peak(None), Some(50.0));
    }

    #[test]
    fn step_rises_each_step_duration_and_stops_at_end() {
        let s = Schedule::Step {
            start: 10.0,
            step: 5.0,
            end: Some(30.0),
            step_duration: S(2),
            max_duration: None,
        };
        let values: Vec<f64> = [0, 1, 2, 3, 4, 6, 8, 100]
            .iter()
            .map(|&t| s.at(S(t)))
            .collect();
        assert_eq!(values, [10.0, 10.0, 15.0, 15.0, 20.0, 25.0, 30.0, 30.0]);
        assert_eq!(s.peak(None), Some(30.0));
    }

    #[test]
    fn a_falling_step_stops_at_its_end_and_never_goes_negative() {
        let s = Schedule::Step {
            start: 10.0,
            step: -4.0,
            end: None,
            step_duration: S(1),
            max_duration: None,
        };
        assert_eq!(s.at(S(1)), 6.0);
        assert_eq!(s.at(S(3)), 0.0);
        let bounded = Schedule::Step {
            start: 10.0,
            step: -4.0,
            end: Some(5.0),
            step_duration: S(1),
            max_duration: None,
        };
        assert_eq!(bounded.at(S(10)), 5.0);
    }

    #[test]
    fn line_rises_per_second_until_max_duration() {
        let s = Schedule::Line {
            start: 100.0,
            step: 10.0,
            end: None,
            max_duration: Some(S(5)),
        };
        assert_eq!(s.at(Duration::from_millis(2500)), 125.0);
        assert_eq!(s.at(S(60)), 150.0);
        assert_eq!(s.peak(None), Some(150.0));
        let unbounded = Schedule::Line {
            start: 100.0,
            step: 10.0,
            end: None,
            max_duration: None,
        };
        assert_eq!(unbounded.peak(None), None);
        assert_eq!(unbounded.peak(Some(S(10))), Some(200.0));
    }
}
