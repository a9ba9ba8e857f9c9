//! The report's formats against a small run's figures.

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
    assert!(text
        .contains("snowkeep_bench_check_duplicates{call=\"snowkeep.v1.IdService/NextIds\"} 0\n"));
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
