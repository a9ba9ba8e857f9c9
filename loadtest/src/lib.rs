//! snowkeep-bench's library: the id checker, the report and its output
//! formats, load schedules, request templates and dynamic (reflection or
//! `.proto`) calls, kept apart from the CLI so they are unit-tested.
//!
//! The checker keeps every id it is given. Order is checked per call (a unary
//! batch or a whole stream must be strictly ascending); uniqueness is checked
//! over all ids of the run at the end (sort, then look at neighbours).

use serde::Serialize;

pub mod dynamic;
pub mod report;
pub mod schedule;
pub mod template;

pub use report::{CallRecord, Report};

/// Ids collected by one worker, with the order violations it saw.
#[derive(Debug, Default)]
pub struct IdLog {
    ids: Vec<u64>,
    order_violations: u64,
    keep: bool,
}

impl IdLog {
    /// A log that keeps ids (`keep`) or only counts them.
    pub fn new(keep: bool) -> Self {
        Self {
            keep,
            ..Self::default()
        }
    }

    /// Records one call's ids, in the order received; `prev` is the last id the
    /// same call returned before this batch (streams), for the order check.
    /// Returns the last id of the batch.
    pub fn record(&mut self, prev: Option<u64>, batch: &[u64]) -> Option<u64> {
        let mut last = prev;
        for &id in batch {
            if last.is_some_and(|l| id <= l) {
                self.order_violations += 1;
            }
            last = Some(id);
        }
        if self.keep {
            self.ids.extend_from_slice(batch);
        }
        last
    }
}

/// The outcome of checking all ids of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Ids checked.
    pub ids: u64,
    /// Ids that equal an earlier id (n copies of one id count n − 1).
    pub duplicates: u64,
    /// Ids not greater than the one before them in the same call.
    pub order_violations: u64,
}

impl CheckResult {
    /// True when no duplicate and no order violation was found.
    pub fn passed(&self) -> bool {
        self.duplicates == 0 && self.order_violations == 0
    }
}

/// Merges the workers' logs and counts duplicates.
pub fn check(logs: Vec<IdLog>) -> CheckResult {
    let order_violations = logs.iter().map(|l| l.order_violations).sum();
    let mut all: Vec<u64> = Vec::with_capacity(logs.iter().map(|l| l.ids.len()).sum());
    for log in logs {
        all.extend(log.ids);
    }
    all.sort_unstable();
    let duplicates = all.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    CheckResult {
        ids: all.len() as u64,
        duplicates,
        order_violations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_ids_pass() {
        let mut a = IdLog::new(true);
        let mut b = IdLog::new(true);
        a.record(None, &[1, 2, 3]);
        b.record(None, &[4, 5]);
        assert_eq!(
            check(vec![a, b]),
            CheckResult {
                ids: 5,
                duplicates: 0,
                order_violations: 0
            }
        );
    }

    #[test]
    fn catches_an_injected_duplicate_across_workers() {
        let mut a = IdLog::new(true);
        let mut b = IdLog::new(true);
        a.record(None, &[10, 20, 30]);
        b.record(None, &[15, 20, 25]);
        let r = check(vec![a, b]);
        assert_eq!(
            r,
            CheckResult {
                ids: 6,
                duplicates: 1,
                order_violations: 0
            }
        );
        assert!(!r.passed());
    }

    #[test]
    fn catches_an_order_violation_inside_a_call_and_across_stream_batches() {
        let mut a = IdLog::new(true);
        a.record(None, &[1, 3, 2]);
        let last = a.record(None, &[7, 8]);
        assert_eq!(last, Some(8));
        // The next batch of the same stream must start above 8.
        a.record(last, &[8, 9]);
        let r = check(vec![a]);
        assert_eq!(
            r,
            CheckResult {
                ids: 7,
                duplicates: 1,
                order_violations: 2
            }
        );
    }
}
