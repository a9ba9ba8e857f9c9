//! The report of a run and its output formats: a text summary (as ghz prints
//! it), JSON, CSV (one row per call), a self-contained HTML page with the
//! latency histogram, and Prometheus text exposition.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::CheckResult;

/// The status-distribution entry of a finite stream that the server ended
/// with OK before it delivered the ids asked for: a failed call, kept apart
/// from `Ok`.
pub const SHORT_STREAM: &str = "ShortStream";

/// One finished call, kept for the CSV output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    /// When the call started, ms since the run began.
    pub offset_ms: f64,
    /// How long it took, µs.
    pub latency_us: u64,
    /// Its entry in the status distribution: the final gRPC code (`Ok`,
    /// `Unavailable`, ...) or [`SHORT_STREAM`].
    pub code: String,
}

/// Latency percentiles, ms.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    /// 10th percentile.
    pub p10_ms: f64,
    /// 25th percentile.
    pub p25_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 75th percentile.
    pub p75_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p99_9_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Latency {
    /// The quantiles and their names, for the outputs.
    pub fn quantiles(&self) -> [(&'static str, f64, f64); 8] {
        [
            ("10", 0.10, self.p10_ms),
            ("25", 0.25, self.p25_ms),
            ("50", 0.50, self.p50_ms),
            ("75", 0.75, self.p75_ms),
            ("90", 0.90, self.p90_ms),
            ("95", 0.95, self.p95_ms),
            ("99", 0.99, self.p99_ms),
            ("99.9", 0.999, self.p99_9_ms),
        ]
    }
}

/// One bar of the latency histogram: calls slower than the previous mark and
/// at most this one.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Bucket {
    /// Upper edge, ms.
    pub mark_ms: f64,
    /// Calls in the bucket.
    pub count: u64,
    /// Share of all calls, 0 to 1.
    pub frequency: f64,
}

/// The whole report of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What was called: `unary`, `stream` or `package.Service/Method`.
    pub call: String,
    /// Calls finished (any status).
    pub count: u64,
    /// Ids received.
    pub ids: u64,
    /// Wall time of the run, s.
    pub total_seconds: f64,
    /// Slowest call, ms.
    pub slowest_ms: f64,
    /// Fastest call, ms.
    pub fastest_ms: f64,
    /// Mean call, ms.
    pub average_ms: f64,
    /// Calls per second.
    pub rps: f64,
    /// Ids per second.
    pub ids_per_second: f64,
    /// Per-call latency (a whole stream for a streaming call).
    pub latency: Latency,
    /// Ten bars from the fastest to the slowest call.
    pub histogram: Vec<Bucket>,
    /// Calls by final gRPC status (`Ok`, `Unavailable`, …); a finite stream
    /// ended with OK before its total counts as `ShortStream`, not `Ok`.
    pub status_codes: BTreeMap<String, u64>,
    /// Finite streams that delivered fewer ids than asked, whatever their
    /// status.
    pub short_streams: u64,
    /// Ids those streams did not deliver.
    pub missing_ids: u64,
    /// Failed calls by `code: message`, as the server (or the client) said it.
    pub errors: BTreeMap<String, u64>,
    /// Checker result, when `--check` was given.
    pub check: Option<CheckResult>,
    /// Every call, for the CSV output.
    #[serde(skip)]
    pub details: Vec<CallRecord>,
}

impl Report {
    /// Builds the report from the run's raw figures; `latency_us` holds
    /// microseconds.
    pub fn new(
        call: &str,
        elapsed: Duration,
        ids: u64,
        latency_us: &Histogram<u64>,
        status_codes: BTreeMap<String, u64>,
        errors: BTreeMap<String, u64>,
        check: Option<CheckResult>,
    ) -> Self {
        let count = status_codes.values().sum();
        let secs = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        // hdrhistogram's values: exact below 2.048 ms, within 0.1 % above; the
        // slowest and the percentiles are the high edge of their bucket, so
        // the mean (bucket middles) never exceeds the slowest.
        let ms = |v: u64| v as f64 / 1000.0;
        let q = |x: f64| ms(latency_us.value_at_quantile(x));
        let empty = latency_us.is_empty();
        Self {
            call: call.to_owned(),
            count,
            ids,
            total_seconds: secs,
            slowest_ms: if empty { 0.0 } else { ms(latency_us.max()) },
            fastest_ms: if empty { 0.0 } else { ms(latency_us.min()) },
            average_ms: if empty {
                0.0
            } else {
                latency_us.mean() / 1000.0
            },
            rps: count as f64 / secs,
            ids_per_second: ids as f64 / secs,
            latency: Latency {
                p10_ms: q(0.10),
                p25_ms: q(0.25),
                p50_ms: q(0.50),
                p75_ms: q(0.75),
                p90_ms: q(0.90),
                p95_ms: q(0.95),
                p99_ms: q(0.99),
                p99_9_ms: q(0.999),
                max_ms: if empty { 0.0 } else { ms(latency_us.max()) },
            },
            histogram: buckets(latency_us),
            status_codes,
            short_streams: 0,
            missing_ids: 0,
            errors,
            check,
            details: Vec::new(),
        }
    }

    /// Calls in the fullest histogram bucket, at least 1 (bars scale to it).
    fn widest_bucket(&self) -> u64 {
        self.histogram
            .iter()
            .map(|b| b.count)
            .max()
            .unwrap_or(0)
            .max(1)
    }

    /// True when at least one call was made and none succeeded.
    pub fn all_failed(&self) -> bool {
        self.count > 0 && self.status_codes.get("Ok").copied().unwrap_or(0) == 0
    }

    /// The human-readable summary.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "Summary ({}):\n  Count:\t{}\n  Total:\t{:.2} s\n  Slowest:\t{:.2} ms\n  Fastest:\t{:.2} ms\n  Average:\t{:.2} ms\n  Requests/sec:\t{:.2}\n  Ids:\t\t{}\n  Ids/sec:\t{:.0}\n\nResponse time histogram:\n",
            self.call,
            self.count,
            self.total_seconds,
            self.slowest_ms,
            self.fastest_ms,
            self.average_ms,
            self.rps,
            self.ids,
            self.ids_per_second,
        );
        let widest = self.widest_bucket();
        for b in &self.histogram {
            let bar = "∎".repeat((b.count * 40 / widest) as usize);
            let _ = writeln!(out, "  {:>10.3} [{}]\t|{bar}", b.mark_ms, b.count);
        }
        out.push_str("\nLatency distribution:\n");
        for (name, _, v) in self.latency.quantiles() {
            let _ = writeln!(out, "  {name} % in {v:.2} ms");
        }
        out.push_str("\nStatus code distribution:\n");
        for (code, n) in &self.status_codes {
            let _ = writeln!(out, "  [{code}]\t{n} responses");
        }
        if self.short_streams > 0 {
            let _ = writeln!(
                out,
                "\nShort streams:\t{} ({} ids missing)",
                self.short_streams, self.missing_ids
            );
        }
        if !self.errors.is_empty() {
            out.push_str("\nError distribution:\n");
            for (error, n) in &self.errors {
                let _ = writeln!(out, "  [{n}]\t{error}");
            }
        }
        if let Some(c) = &self.check {
            let _ = writeln!(out, "\nCheck: {}", c.summary());
        }
        out
    }

    /// The report as pretty JSON (without the per-call details).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// One row per call: `offset_ms,duration_ms,status`.
    pub fn to_csv(&self) -> String {
        let mut out = String::from("offset_ms,duration_ms,status\n");
        for r in &self.details {
            let _ = writeln!(
                out,
                "{:.3},{:.3},{}",
                r.offset_ms,
                r.latency_us as f64 / 1000.0,
                r.code
            );
        }
        out
    }

    /// Prometheus text exposition of the run's figures.
    pub fn to_prometheus(&self) -> String {
        let call = escape_label(&self.call);
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<String>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for l in lines {
                let _ = writeln!(out, "{l}");
            }
        };
        metric(
            "snowkeep_bench_calls_total",
            "counter",
            "Calls finished, by final gRPC status.",
            self.status_codes
                .iter()
                .map(|(c, n)| {
                    format!("snowkeep_bench_calls_total{{call=\"{call}\",code=\"{c}\"}} {n}")
                })
                .collect(),
        );
        metric(
            "snowkeep_bench_ids_total",
            "counter",
            "Ids received.",
            vec![format!(
                "snowkeep_bench_ids_total{{call=\"{call}\"}} {}",
                self.ids
            )],
        );
        metric(
            "snowkeep_bench_duration_seconds",
            "gauge",
            "Wall time of the run.",
            vec![format!(
                "snowkeep_bench_duration_seconds{{call=\"{call}\"}} {}",
                self.total_seconds
            )],
        );
        metric(
            "snowkeep_bench_requests_per_second",
            "gauge",
            "Calls per second over the run.",
            vec![format!(
                "snowkeep_bench_requests_per_second{{call=\"{call}\"}} {}",
                self.rps
            )],
        );
        let mut lines: Vec<String> = self
            .latency
            .quantiles()
            .iter()
            .map(|(_, q, v)| {
                format!(
                    "snowkeep_bench_latency_seconds{{call=\"{call}\",quantile=\"{q}\"}} {}",
                    v / 1000.0
                )
            })
            .collect();
        lines.push(format!(
            "snowkeep_bench_latency_seconds_sum{{call=\"{call}\"}} {}",
            self.average_ms * self.count as f64 / 1000.0
        ));
        lines.push(format!(
            "snowkeep_bench_latency_seconds_count{{call=\"{call}\"}} {}",
            self.count
        ));
        metric(
            "snowkeep_bench_latency_seconds",
            "summary",
            "Per-call latency.",
            lines,
        );
        if let Some(c) = &self.check {
            metric(
                "snowkeep_bench_check_duplicates",
                "gauge",
                "Duplicate ids found by the checker.",
                vec![format!(
                    "snowkeep_bench_check_duplicates{{call=\"{call}\"}} {}",
                    c.duplicates
                )],
            );
            metric(
                "snowkeep_bench_check_order_violations",
                "gauge",
                "Ids not above the one before them in the same call.",
                vec![format!(
                    "snowkeep_bench_check_order_violations{{call=\"{call}\"}} {}",
                    c.order_violations
                )],
            );
            metric(
                "snowkeep_bench_check_short_streams",
                "gauge",
                "Finite streams that delivered fewer ids than asked.",
                vec![format!(
                    "snowkeep_bench_check_short_streams{{call=\"{call}\"}} {}",
                    c.short_streams
                )],
            );
            metric(
                "snowkeep_bench_check_missing_ids",
                "gauge",
                "Ids that short streams asked for and did not deliver.",
                vec![format!(
                    "snowkeep_bench_check_missing_ids{{call=\"{call}\"}} {}",
                    c.missing_ids
                )],
            );
        }
        out
    }

    /// A self-contained HTML page: the summary, the latency histogram as an
    /// inline SVG, percentiles, status codes, errors and the check.
    pub fn to_html(&self) -> String {
        let widest = self.widest_bucket();
        let (w, h, bar_h) = (640.0, 24.0 * self.histogram.len().max(1) as f64, 20.0);
        let mut svg = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{h}" role="img" aria-label="latency histogram">"#,
            w + 220.0
        );
        for (i, b) in self.histogram.iter().enumerate() {
            let y = i as f64 * 24.0;
            let len = b.count as f64 / widest as f64 * w;
            let _ = write!(
                svg,
                r##"<text x="0" y="{}" font-size="12">{:.3} ms</text><rect x="110" y="{y}" width="{len:.1}" height="{bar_h}" fill="#3b7dd8"/><text x="{:.1}" y="{}" font-size="12">{}</text>"##,
                y + 15.0,
                b.mark_ms,
                115.0 + len,
                y + 15.0,
                b.count
            );
        }
        svg.push_str("</svg>");
        let row = |k: &str, v: String| {
            format!(
                "<tr><th>{}</th><td>{}</td></tr>",
                escape_html(k),
                escape_html(&v)
            )
        };
        let mut summary = String::new();
        for (k, v) in [
            ("Call", self.call.clone()),
            ("Count", self.count.to_string()),
            ("Total", format!("{:.2} s", self.total_seconds)),
            ("Slowest", format!("{:.2} ms", self.slowest_ms)),
            ("Fastest", format!("{:.2} ms", self.fastest_ms)),
            ("Average", format!("{:.2} ms", self.average_ms)),
            ("Requests/sec", format!("{:.2}", self.rps)),
            ("Ids", self.ids.to_string()),
            ("Ids/sec", format!("{:.0}", self.ids_per_second)),
            (
                "Short streams",
                format!("{} ({} ids missing)", self.short_streams, self.missing_ids),
            ),
        ] {
            summary.push_str(&row(k, v));
        }
        let mut pct = String::new();
        for (name, _, v) in self.latency.quantiles() {
            pct.push_str(&row(&format!("p{name}"), format!("{v:.3} ms")));
        }
        let mut codes = String::new();
        for (c, n) in &self.status_codes {
            codes.push_str(&row(c, n.to_string()));
        }
        for (e, n) in &self.errors {
            codes.push_str(&row(e, n.to_string()));
        }
        let check = self.check.map_or(String::new(), |c| {
            format!(
                "<h2>Check</h2><p class=\"{}\">{}</p>",
                if c.passed() { "pass" } else { "fail" },
                escape_html(&c.summary())
            )
        });
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>snowkeep-bench: {title}</title>\
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}th,td{{padding:2px 12px;text-align:left;border-bottom:1px solid #ddd}}.pass{{color:#080}}.fail{{color:#b00}}</style></head>\
<body><h1>snowkeep-bench: {title}</h1><h2>Summary</h2><table>{summary}</table><h2>Response time histogram</h2>{svg}\
<h2>Latency distribution</h2><table>{pct}</table><h2>Status codes and errors</h2><table>{codes}</table>{check}</body></html>\n",
            title = escape_html(&self.call),
        )
    }
}

/// Ten buckets between the fastest and the slowest call.
fn buckets(h: &Histogram<u64>) -> Vec<Bucket> {
    if h.is_empty() {
        return Vec::new();
    }
    let (lo, hi) = (h.min(), h.max());
    let total = h.len() as f64;
    let step = ((hi - lo) as f64 / 10.0).max(1.0);
    let mut out = Vec::new();
    let mut prev: Option<u64> = None;
    for i in 1..=10 {
        let mark = if i == 10 {
            hi
        } else {
            lo + (step * i as f64) as u64
        };
        if prev.is_some_and(|p| mark <= p) {
            continue;
        }
        let from = prev.map_or(0, |p| p + 1);
        let count = h.count_between(from, mark);
        out.push(Bucket {
            mark_ms: h.highest_equivalent(mark) as f64 / 1000.0,
            count,
            frequency: count as f64 / total,
        });
        prev = Some(h.highest_equivalent(mark));
    }
    out
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for us in [100, 200, 300, 400, 1_000] {
            h.record(us).unwrap();
        }
        let codes = BTreeMap::from([("Ok".to_owned(), 4u64), ("Unavailable".to_owned(), 1)]);
        let errors = BTreeMap::from([("Unavailable: no lease <now>".to_owned(), 1u64)]);
        let check = CheckResult {
            ids: 400,
            duplicates: 0,
            order_violations: 0,
            short_streams: 0,
            missing_ids: 0,
        };
        let mut r = Report::new(
            "snowkeep.v1.IdService/NextIds",
            Duration::from_secs(2),
            400,
            &h,
            codes,
            errors,
            Some(check),
        );
        r.details = vec![
            CallRecord {
                offset_ms: 0.0,
                latency_us: 1_000,
                code: "Ok".into(),
            },
            CallRecord {
                offset_ms: 1.5,
                latency_us: 10_000,
                code: "Unavailable".into(),
            },
        ];
        r
    }

    #[test]
    fn summary_figures_are_exact() {
        let r = report();
        assert_eq!(r.count, 5);
        assert_eq!(r.rps, 2.5);
        assert_eq!(r.ids_per_second, 200.0);
        assert_eq!(r.fastest_ms, 0.1);
        assert_eq!(r.slowest_ms, 1.0);
        assert_eq!(r.average_ms, 0.4);
        assert_eq!(r.histogram.iter().map(|b| b.count).sum::<u64>(), 5);
        assert_eq!(r.histogram.last().unwrap().mark_ms, 1.0);
        assert!(!r.all_failed());
    }

    #[test]
    fn the_average_never_exceeds_the_slowest_above_the_exact_range() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        h.record(979_460).unwrap();
        let r = Report::new(
            "s",
            Duration::from_secs(1),
            0,
            &h,
            BTreeMap::new(),
            BTreeMap::new(),
            None,
        );
        assert!(
            r.average_ms <= r.slowest_ms,
            "{} > {}",
            r.average_ms,
            r.slowest_ms
        );
        assert!(
            r.fastest_ms <= r.average_ms,
            "{} > {}",
            r.fastest_ms,
            r.average_ms
        );
    }

    #[test]
    fn text_names_every_section_and_the_verdict() {
        let text = report().to_text();
        for part in [
            "Summary (snowkeep.v1.IdService/NextIds):",
            "Requests/sec:\t2.50",
            "Response time histogram:",
            "Latency distribution:\n  10 % in 0.10 ms",
            "99.9 % in 1.00 ms",
            "[Ok]\t4 responses",
            "[1]\tUnavailable: no lease <now>",
            "Check: 400 ids, 0 duplicates, 0 order violations: PASS",
        ] {
            assert!(text.contains(part), "missing {part:?} in\n{text}");
        }
    }

    #[test]
    fn short_streams_show_in_every_format() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        h.record(1_000).unwrap();
        let check = CheckResult {
            ids: 2000,
            duplicates: 0,
            order_violations: 0,
            short_streams: 1,
            missing_ids: 3000,
        };
        let mut r = Report::new(
            "stream",
            Duration::from_secs(1),
            2000,
            &h,
            BTreeMap::from([(SHORT_STREAM.to_owned(), 1u64)]),
            BTreeMap::new(),
            Some(check),
        );
        r.short_streams = 1;
        r.missing_ids = 3000;
        r.details = vec![CallRecord {
            offset_ms: 0.0,
            latency_us: 1_000,
            code: SHORT_STREAM.into(),
        }];
        assert!(r.all_failed());
        let text = r.to_text();
        for part in [
            "[ShortStream]\t1 responses",
            "Short streams:\t1 (3000 ids missing)",
            "Check: 2000 ids, 0 duplicates, 0 order violations, 1 short stream missing 3000 ids: FAIL",
        ] {
            assert!(text.contains(part), "missing {part:?} in\n{text}");
        }
        assert_eq!(
            r.to_csv(),
            "offset_ms,duration_ms,status\n0.000,1.000,ShortStream\n"
        );
        let prom = r.to_prometheus();
        for line in [
            "snowkeep_bench_calls_total{call=\"stream\",code=\"ShortStream\"} 1\n",
            "snowkeep_bench_check_short_streams{call=\"stream\"} 1\n",
            "snowkeep_bench_check_missing_ids{call=\"stream\"} 3000\n",
        ] {
            assert!(prom.contains(line), "missing {line:?} in\n{prom}");
        }
        let html = r.to_html();
        assert!(html.contains("<tr><th>Short streams</th><td>1 (3000 ids missing)</td></tr>"));
        assert!(html.contains("class=\"fail\""));
    }

    #[test]
    fn csv_has_one_row_per_call() {
        assert_eq!(
            report().to_csv(),
            "offset_ms,duration_ms,status\n0.000,1.000,Ok\n1.500,10.000,Unavailable\n"
        );
    }

    #[test]
    fn json_round_trips_the_figures() {
        let v: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(v["count"], 5);
        assert_eq!(v["status_codes"]["Unavailable"], 1);
        assert_eq!(v["latency"]["p50_ms"], 0.3);
        assert_eq!(v["check"]["duplicates"], 0);
        assert!(v.get("details").is_none());
    }

    #[test]
    fn prometheus_text_has_typed_series() {
        let text = report().to_prometheus();
        assert!(
            text.contains("# TYPE snowkeep_bench_calls_total counter\n"),
            "{text}"
        );
        assert!(text.contains(
            "snowkeep_bench_calls_total{call=\"snowkeep.v1.IdService/NextIds\",code=\"Unavailable\"} 1\n"
        ));
        assert!(text.contains(
            "snowkeep_bench_latency_seconds{call=\"snowkeep.v1.IdService/NextIds\",quantile=\"0.5\"} 0.0003\n"
        ), "{text}");
        assert!(text.contains(
            "snowkeep_bench_latency_seconds_count{call=\"snowkeep.v1.IdService/NextIds\"} 5\n"
        ));
        assert!(text.contains(
            "snowkeep_bench_check_duplicates{call=\"snowkeep.v1.IdService/NextIds\"} 0\n"
        ));
    }

    #[test]
    fn html_is_one_self_contained_page_with_the_histogram() {
        let html = report().to_html();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(html.matches("<rect ").count(), report().histogram.len());
        assert!(html.contains("no lease &lt;now&gt;"));
        assert!(!html.contains("<script") && !html.contains("src=") && !html.contains("href="));
        assert!(html.contains("class=\"pass\""));
    }
}
