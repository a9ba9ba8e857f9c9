//! snowkeep-bench's library: the id checker and the report, kept apart from the
//! CLI so they are unit-tested.
//!
//! The checker keeps every id it is given. Order is checked per call (a unary
//! batch or a whole stream must be strictly ascending); uniqueness is checked
//! over all ids of the run at the end (sort, then look at neighbours).

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

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

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Latency {
    /// Reads percentiles from a histogram of microseconds.
    pub fn from_micros(h: &Histogram<u64>) -> Self {
        let ms = |v: u64| v as f64 / 1000.0;
        Self {
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// The whole report of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `unary` or `stream`.
    pub call: String,
    /// Calls finished (any status).
    pub calls: u64,
    /// Ids received.
    pub ids: u64,
    /// Wall time of the run, seconds.
    pub elapsed_seconds: f64,
    /// Calls per second.
    pub calls_per_second: f64,
    /// Ids per second.
    pub ids_per_second: f64,
    /// Per-call latency (a whole stream for `stream`).
    pub latency: Latency,
    /// Calls by final gRPC status (`Ok`, `Unavailable`, …).
    pub status_codes: BTreeMap<String, u64>,
    /// Failed calls by `code: message`, as the server (or the client) said it.
    pub errors: BTreeMap<String, u64>,
    /// Checker result, when `--check` was given.
    pub check: Option<CheckResult>,
}

impl Report {
    /// Builds the report from the run's raw figures.
    pub fn new(
        call: &str,
        elapsed: Duration,
        ids: u64,
        latency_us: &Histogram<u64>,
        status_codes: BTreeMap<String, u64>,
        errors: BTreeMap<String, u64>,
        check: Option<CheckResult>,
    ) -> Self {
        let calls = status_codes.values().sum();
        let secs = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        Self {
            call: call.to_owned(),
            calls,
            ids,
            elapsed_seconds: secs,
            calls_per_second: calls as f64 / secs,
            ids_per_second: ids as f64 / secs,
            latency: Latency::from_micros(latency_us),
            status_codes,
            errors,
            check,
        }
    }

    /// True when at least one call was made and none succeeded.
    pub fn all_failed(&self) -> bool {
        self.calls > 0 && self.status_codes.get("Ok").copied().unwrap_or(0) == 0
    }

    /// The human-readable summary.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "Summary ({}):\n  calls:      {}\n  ids:        {}\n  elapsed:    {:.3} s\n  calls/s:    {:.1}\n  ids/s:      {:.0}\n\nLatency per call:\n  p50: {:.3} ms  p90: {:.3} ms  p99: {:.3} ms  max: {:.3} ms\n\nStatus codes:\n",
            self.call,
            self.calls,
            self.ids,
            self.elapsed_seconds,
            self.calls_per_second,
            self.ids_per_second,
            self.latency.p50_ms,
            self.latency.p90_ms,
            self.latency.p99_ms,
            self.latency.max_ms,
        );
        for (code, n) in &self.status_codes {
            out.push_str(&format!("  [{code}] {n}\n"));
        }
        if !self.errors.is_empty() {
            out.push_str("\nError distribution:\n");
            for (error, n) in &self.errors {
                out.push_str(&format!("  [{n}] {error}\n"));
            }
        }
        if let Some(c) = &self.check {
            out.push_str(&format!(
                "\nCheck: {} ids, {} duplicates, {} order violations: {}\n",
                c.ids,
                c.duplicates,
                c.order_violations,
                if c.passed() { "PASS" } else { "FAIL" }
            ));
        }
        out
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

    #[test]
    fn text_report_states_the_verdict() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        h.record(1500).unwrap();
        let codes = BTreeMap::from([("Ok".to_owned(), 2u64)]);
        let check = CheckResult {
            ids: 4,
            duplicates: 0,
            order_violations: 0,
        };
        let errors = BTreeMap::from([("Unavailable: no lease".to_owned(), 1u64)]);
        let r = Report::new(
            "unary",
            Duration::from_secs(2),
            4,
            &h,
            codes,
            errors,
            Some(check),
        );
        assert_eq!(r.calls, 2);
        assert_eq!(r.ids_per_second, 2.0);
        let text = r.to_text();
        assert!(text.contains("[Ok] 2"), "{text}");
        assert!(
            text.contains("Error distribution:\n  [1] Unavailable: no lease\n"),
            "{text}"
        );
        assert!(!r.all_failed());
        assert!(
            text.contains("Check: 4 ids, 0 duplicates, 0 order violations: PASS"),
            "{text}"
        );
    }
}
