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
        let mut out = Exposition {
            text: String::new(),
            call: &call,
        };
        out.family(
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
        out.single(
            "snowkeep_bench_ids_total",
            "counter",
            "Ids received.",
            self.ids,
        );
        out.single(
            "snowkeep_bench_duration_seconds",
            "gauge",
            "Wall time of the run.",
            self.total_seconds,
        );
        out.single(
            "snowkeep_bench_requests_per_second",
            "gauge",
            "Calls per second over the run.",
            self.rps,
        );
        out.family(
            "snowkeep_bench_latency_seconds",
            "summary",
            "Per-call latency.",
            self.latency_summary(&call),
        );
        if let Some(c) = &self.check {
            out.check(c);
        }
        out.text
    }

    /// The lines of the latency summary: its quantiles, sum and count.
    fn latency_summary(&self, call: &str) -> Vec<String> {
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
        lines
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

/// Prometheus text being written, for the run's `call` label (escaped).
struct Exposition<'a> {
    text: String,
    call: &'a str,
}

impl Exposition<'_> {
    /// A metric family: its `# HELP` and `# TYPE` lines, then `lines`.
    fn family(&mut self, name: &str, kind: &str, help: &str, lines: Vec<String>) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for l in lines {
            let _ = writeln!(self.text, "{l}");
        }
    }

    /// A family of one series, labelled with the call only.
    fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        let line = format!("{name}{{call=\"{}\"}} {value}", self.call);
        self.family(name, kind, help, vec![line]);
    }

    /// The checker's figures, one gauge each.
    fn check(&mut self, c: &CheckResult) {
        self.single(
            "snowkeep_bench_check_duplicates",
            "gauge",
            "Duplicate ids found by the checker.",
            c.duplicates,
        );
        self.single(
            "snowkeep_bench_check_order_violations",
            "gauge",
            "Ids not above the one before them in the same call.",
            c.order_violations,
        );
        self.single(
            "snowkeep_bench_check_short_streams",
            "gauge",
            "Finite streams that delivered fewer ids than asked.",
            c.short_streams,
        );
        self.single(
            "snowkeep_bench_check_missing_ids",
            "gauge",
            "Ids that short streams asked for and did not deliver.",
            c.missing_ids,
        );
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
mod tests;
