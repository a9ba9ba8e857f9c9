//! snowkeep-bench's library: the id checker, the report and its output
//! formats, load schedules, request templates and dynamic (reflection or
//! `.proto`) calls, kept apart from the CLI so they are unit-tested.
//!
//! The checker keeps every id it is given. Order is checked per call (a unary
//! batch or a whole stream must be strictly ascending); uniqueness is checked
//! over all ids of the run at the end (sort, then look at neighbours). A
//! finite stream that delivered fewer ids than it asked for is a short
//! stream, counted with the ids it is missing, whatever its status.

use serde::Serialize;

pub mod dynamic;
pub mod report;
pub mod schedule;
pub mod template;

pub use report::{CallRecord, Report};

/// Ids collected by one worker, with the order violations and short
/// streams it saw.
#[derive(Debug, Default)]
pub struct IdLog {
    ids: Vec<u64>,
    order_violations: u64,
    short_streams: u64,
    missing_ids: u64,
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

    /// Records a finite stream that ended after `delivered` of the `asked`
    /// ids; nothing when it delivered them all.
    pub fn record_stream_end(&mut self, asked: u64, delivered: u64) {
        if delivered < asked {
            self.short_streams += 1;
            self.missing_ids += asked - delivered;
        }
    }

    /// Finite streams that ended short of their total.
    pub fn short_streams(&self) -> u64 {
        self.short_streams
    }

    /// Ids those short streams did not deliver.
    pub fn missing_ids(&self) -> u64 {
        self.missing_ids
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
    /// Finite streams that delivered fewer ids than they asked for, whatever
    /// their final status.
    pub short_streams: u64,
    /// Ids those short streams asked for and did not deliver.
    pub missing_ids: u64,
}

impl CheckResult {
    /// True when no duplicate, no order violation and no short stream was
    /// found.
    pub fn passed(&self) -> bool {
        self.duplicates == 0 && self.order_violations == 0 && self.short_streams == 0
    }

    /// The one-line verdict: `3000 ids, 0 duplicates, 0 order violations:
    /// PASS`, with `, 1 short stream missing 7000 ids` before the verdict
    /// when streams ended short.
    pub fn summary(&self) -> String {
        let short = match self.short_streams {
            0 => String::new(),
            1 => format!(", 1 short stream missing {} ids", self.missing_ids),
            n => format!(", {n} short streams missing {} ids", self.missing_ids),
        };
        format!(
            "{} ids, {} duplicates, {} order violations{short}: {}",
            self.ids,
            self.duplicates,
            self.order_violations,
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// Merges the workers' logs and counts duplicates.
pub fn check(logs: Vec<IdLog>) -> CheckResult {
    let order_violations = logs.iter().map(|l| l.order_violations).sum();
    let short_streams = logs.iter().map(|l| l.short_streams).sum();
    let missing_ids = logs.iter().map(|l| l.missing_ids).sum();
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
        short_streams,
        missing_ids,
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
                order_violations: 0,
                short_streams: 0,
                missing_ids: 0,
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
                order_violations: 0,
                short_streams: 0,
                missing_ids: 0,
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
                order_violations: 2,
                short_streams: 0,
                missing_ids: 0,
            }
        );
    }

    #[test]
    fn a_short_stream_fails_the_check_and_counts_what_is_missing() {
        let mut a = IdLog::new(true);
        a.record(None, &[1, 2, 3]);
        a.record_stream_end(10, 3);
        a.record_stream_end(5, 5); // whole: not short
        let mut b = IdLog::new(false);
        b.record_stream_end(4, 0);
        let r = check(vec![a, b]);
        assert_eq!(
            r,
            CheckResult {
                ids: 3,
                duplicates: 0,
                order_violations: 0,
                short_streams: 2,
                missing_ids: 11,
            }
        );
        assert!(!r.passed());
        assert_eq!(
            r.summary(),
            "3 ids, 0 duplicates, 0 order violations, 2 short streams missing 11 ids: FAIL"
        );
    }
}
