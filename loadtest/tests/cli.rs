//! The bench as a user runs it: the real `snowkeep-bench` binary against the
//! real `snowkeep-floor` test server (plain, descending, TLS), by reflection
//! and by `.proto` files, in every output format.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

struct Floor {
    child: Child,
    addr: String,
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn floor(extra: &[&str]) -> Floor {
    let addr = free_addr();
    let child = Command::new(env!("CARGO_BIN_EXE_snowkeep-floor"))
        .args(["--listen", &addr])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Floor { child, addr }
}

/// Runs the bench against `addr` (waiting up to 10 s for it) with `args`.
fn bench(addr: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snowkeep-bench"))
        .arg(addr)
        .args(["--wait-ready", "10s"])
        .args(args)
        .output()
        .unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The JSON report of a run that must have succeeded.
fn ok_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    json(out)
}

fn proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto")
}

#[test]
fn calls_any_method_by_reflection_with_a_json_request() {
    let f = floor(&[]);
    let out = bench(
        &f.addr,
        &[
            "--call",
            "snowkeep.v1.IdService/NextIds",
            "-d",
            r#"{"count": 5}"#,
            "-n",
            "10",
            "-c",
            "2",
            "-O",
            "json",
        ],
    );
    let v = ok_json(&out);
    assert_eq!(v["count"], 10);
    assert_eq!(v["ids"], 50);
    assert_eq!(v["status_codes"]["Ok"], 10);
    assert_eq!(v["call"], "snowkeep.v1.IdService/NextIds");
}

#[test]
fn server_streaming_by_reflection_counts_every_message() {
    let f = floor(&[]);
    let out = bench(
        &f.addr,
        &[
            "--call",
            "snowkeep.v1.IdService.StreamIds",
            "-d",
            r#"{"total": 2000, "batch_size": 500}"#,
            "-n",
            "3",
            "-c",
            "1",
            "-O",
            "json",
        ],
    );
    assert_eq!(ok_json(&out)["ids"], 6000);
}

#[test]
fn proto_files_replace_reflection_and_templates_vary_each_request() {
    let f = floor(&[]);
    let proto = proto_dir().join("snowkeep/v1/id.proto");
    let out = bench(
        &f.addr,
        &[
            "--proto",
            proto.to_str().unwrap(),
            "-i",
            proto_dir().to_str().unwrap(),
            "--call",
            "snowkeep.v1.IdService/NextIds",
            // Request 0 asks for 0 ids, which the server refuses.
            "-d",
            r#"{"count": {{.RequestNumber}}}"#,
            "-n",
            "4",
            "-c",
            "1",
            "-O",
            "json",
        ],
    );
    let v = ok_json(&out);
    assert_eq!(v["ids"], 1 + 2 + 3);
    assert_eq!(v["status_codes"]["Ok"], 3);
    assert_eq!(v["status_codes"]["InvalidArgument"], 1);
    assert_eq!(
        v["errors"]["InvalidArgument: count must be 1..=100000, got 0"],
        1
    );
}

#[test]
fn the_checker_catches_an_injected_duplicate_and_an_order_violation() {
    // The floor repeats 1..=count on every call: 3 calls of 5 ids hold 10 repeats.
    let f = floor(&[]);
    let out = bench(
        &f.addr,
        &[
            "--call", "unary", "--count", "5", "-n", "3", "-c", "1", "--check", "-O", "json",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let c = &json(&out)["check"];
    assert_eq!(
        (
            c["ids"].as_u64(),
            c["duplicates"].as_u64(),
            c["order_violations"].as_u64()
        ),
        (Some(15), Some(10), Some(0))
    );

    // Descending batches: 4 violations in a batch of 5, none repeated.
    let f = floor(&["--descending"]);
    let out = bench(
        &f.addr,
        &[
            "--call",
            "snowkeep.v1.IdService/NextIds",
            "-d",
            r#"{"count": 5}"#,
            "-n",
            "1",
            "--check",
            "-O",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let c = &json(&out)["check"];
    assert_eq!(
        (c["duplicates"].as_u64(), c["order_violations"].as_u64()),
        (Some(0), Some(4))
    );
}

#[test]
fn every_output_format() {
    let f = floor(&[]);
    let run = |format: &str| {
        let out = bench(
            &f.addr,
            &[
                "--call", "unary", "--count", "2", "-n", "6", "-c", "2", "-O", format,
            ],
        );
        assert!(
            out.status.success(),
            "{format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let summary = run("summary");
    assert!(
        summary.contains("Summary (unary):\n  Count:\t6\n"),
        "{summary}"
    );
    assert!(summary.contains("[Ok]\t6 responses"), "{summary}");
    let csv = run("csv");
    assert_eq!(csv.lines().count(), 7, "{csv}");
    assert_eq!(csv.lines().next(), Some("offset_ms,duration_ms,status"));
    assert!(csv.lines().skip(1).all(|l| l.ends_with(",Ok")), "{csv}");
    let html = run("html");
    assert!(
        html.starts_with("<!DOCTYPE html>") && html.contains("<svg"),
        "{html}"
    );
    let prom = run("prometheus");
    assert!(
        prom.contains("snowkeep_bench_calls_total{call=\"unary\",code=\"Ok\"} 6\n"),
        "{prom}"
    );
    assert!(
        prom.contains("snowkeep_bench_ids_total{call=\"unary\"} 12\n"),
        "{prom}"
    );
    let out_file = tempfile::NamedTempFile::new().unwrap();
    let out = bench(
        &f.addr,
        &[
            "--call",
            "unary",
            "-n",
            "1",
            "-O",
            "json",
            "-o",
            out_file.path().to_str().unwrap(),
        ],
    );
    assert!(out.status.success() && out.stdout.is_empty());
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_file.path()).unwrap()).unwrap();
    assert_eq!(v["count"], 1);
}

#[test]
fn tls_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, pem_key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, key.cert.pem()).unwrap();
    std::fs::write(&pem_key, key.signing_key.serialize_pem()).unwrap();
    let f = floor(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        pem_key.to_str().unwrap(),
    ]);
    let out = bench(
        &f.addr,
        &[
            "--cacert",
            cert.to_str().unwrap(),
            "--cname",
            "localhost",
            "--call",
            "unary",
            "--count",
            "3",
            "-n",
            "2",
            "-O",
            "json",
        ],
    );
    assert_eq!(ok_json(&out)["ids"], 6);
    // Plaintext against the TLS port fails every call, with exit code 1.
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeep-bench"))
        .args([&f.addr, "--call", "unary", "-n", "1", "--timeout", "2s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn a_rate_limit_spreads_the_calls() {
    let f = floor(&[]);
    let out = bench(
        &f.addr,
        &[
            "--call", "unary", "--rps", "40", "-n", "21", "-c", "4", "-O", "json",
        ],
    );
    assert!(out.status.success());
    let v = json(&out);
    assert_eq!(v["count"], 21);
    // 21 calls at 40/s are 20 gaps of 25 ms: at least 0.5 s.
    assert!(v["total_seconds"].as_f64().unwrap() >= 0.5, "{v}");
}

#[test]
fn an_unknown_method_names_the_known_ones_and_exits_1() {
    let f = floor(&[]);
    let out = bench(&f.addr, &["--call", "snowkeep.v1.IdService/Nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "method \"Nope\" not found in snowkeep.v1.IdService; known: NextIds, StreamIds"
        ),
        "{err}"
    );
}

#[test]
fn client_streaming_and_bidi_calls_send_a_json_array_of_messages() {
    let f = floor(&[]);
    let data = r#"[{"count": 2}, {"count": 3}]"#;
    let out = bench(
        &f.addr,
        &[
            "--call",
            "snowkeep.floor.v1.FloorService/CollectIds",
            "-d",
            data,
            "-n",
            "2",
            "-c",
            "1",
            "-O",
            "json",
        ],
    );
    let v = ok_json(&out);
    assert_eq!(
        (v["count"].as_u64(), v["ids"].as_u64()),
        (Some(2), Some(10))
    );
    let out = bench(
        &f.addr,
        &[
            "--call",
            "snowkeep.floor.v1.FloorService/EchoIds",
            "-d",
            data,
            "-n",
            "3",
            "-c",
            "1",
            "-O",
            "json",
        ],
    );
    let v = ok_json(&out);
    assert_eq!(
        (v["count"].as_u64(), v["ids"].as_u64()),
        (Some(3), Some(15))
    );
    // A single object is a stream of one message.
    let out = bench(
        &f.addr,
        &[
            "--call",
            "snowkeep.floor.v1.FloorService/CollectIds",
            "-d",
            r#"{"count": 4}"#,
            "-n",
            "1",
            "-O",
            "json",
        ],
    );
    assert_eq!(ok_json(&out)["ids"], 4);
}

/// Runs the bench with `args` only (no --wait-ready), with a 30 s limit.
fn bench_raw(args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("30")
        .arg(env!("CARGO_BIN_EXE_snowkeep-bench"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn rates_and_schedules_end_with_the_run_and_never_hang() {
    let f = floor(&[]);
    bench(&f.addr, &["--call", "unary", "-n", "1"]); // the floor is up
                                                     // One slot every 2 s within a 1 s run: the first call only, then -z ends it.
    let out = bench_raw(&[
        &f.addr, "--call", "unary", "--rps", "0.5", "-z", "1s", "-c", "3", "-O", "json",
    ]);
    let v = ok_json(&out);
    assert_eq!(v["count"], 1);
    assert!(v["total_seconds"].as_f64().unwrap() < 2.0, "{v}");
    // A rate falling to 0 in 1 s stops the calls then, well before -z (20 s).
    let out = bench_raw(&[
        &f.addr,
        "--call",
        "unary",
        "-z",
        "20s",
        "-c",
        "2",
        "--load-schedule",
        "line",
        "--load-start",
        "20",
        "--load-step",
        "-20",
        "-O",
        "json",
    ]);
    let v = ok_json(&out);
    let count = v["count"].as_u64().unwrap();
    // The line's integral is 10 calls; slots near the end are sparse.
    assert!((8..=12).contains(&count), "{v}");
    assert!(v["total_seconds"].as_f64().unwrap() < 5.0, "{v}");
    // A falling concurrency stops the workers above it; -n still ends the run.
    let out = bench_raw(&[
        &f.addr,
        "--call",
        "unary",
        "-n",
        "50",
        "--concurrency-schedule",
        "step",
        "--concurrency-start",
        "4",
        "--concurrency-step",
        "-1",
        "--concurrency-end",
        "1",
        "--concurrency-step-duration",
        "100ms",
        "-O",
        "json",
    ]);
    assert_eq!(ok_json(&out)["count"], 50);
}

#[test]
fn bad_arguments_exit_1_with_a_reason() {
    let f = floor(&[]);
    for (args, reason) in [
        (vec!["--bogus"], "unexpected argument"),
        (vec!["-n", "abc"], "invalid value"),
        (
            vec!["--concurrency-start", "0", "-n", "5"],
            "--concurrency-start must be at least 1",
        ),
        (vec!["-c", "20000", "-n", "1"], "at most 10000 are allowed"),
        (vec!["--rps", "1e-300", "-n", "5"], "below one call a day"),
        (
            vec!["-m", r#"{"x-a":"é"}"#, "-n", "1"],
            "must be printable ASCII",
        ),
    ] {
        let mut all = vec![f.addr.as_str(), "--call", "unary"];
        all.extend(args.iter().copied());
        let out = bench_raw(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(reason), "{args:?}: {err}");
    }
}

#[test]
fn a_server_that_never_answers_reflection_times_out() {
    // Accepts connections and never says a word.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming() {
            held.push(c);
        }
    });
    let out = bench_raw(&[&addr, "--call", "foo.Bar/Baz", "-n", "1", "-t", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("server reflection gave no answer within --timeout 1s"),
        "{err}"
    );
}

#[test]
fn a_stream_cut_short_fails_the_check_and_shows_in_the_status_distribution() {
    let stream = [
        "--call",
        "stream",
        "--count",
        "5000",
        "--batch-size",
        "5000",
        "-n",
        "1",
        "--check",
    ];
    // A whole stream passes.
    let f = floor(&[]);
    let mut args = stream.to_vec();
    args.extend(["-O", "json"]);
    let v = ok_json(&bench(&f.addr, &args));
    assert_eq!(v["status_codes"]["Ok"], 1);
    assert_eq!(
        (
            v["check"]["short_streams"].as_u64(),
            v["short_streams"].as_u64()
        ),
        (Some(0), Some(0))
    );

    // A server that ends the stream with OK after 2000 ids (snowkeep servers
    // did at shutdown): a failed call, and the check fails with exit code 2.
    let f = floor(&["--cut-streams-after", "2000"]);
    let out = bench(&f.addr, &args);
    assert_eq!(out.status.code(), Some(2));
    let v = json(&out);
    assert_eq!(v["status_codes"], serde_json::json!({"ShortStream": 1}));
    assert_eq!(
        v["errors"],
        serde_json::json!({"ShortStream: the server ended the stream with OK after 2000 of 5000 ids": 1})
    );
    assert_eq!(
        (v["short_streams"].as_u64(), v["missing_ids"].as_u64()),
        (Some(1), Some(3000))
    );
    let c = &v["check"];
    assert_eq!(
        (
            c["ids"].as_u64(),
            c["duplicates"].as_u64(),
            c["order_violations"].as_u64(),
            c["short_streams"].as_u64(),
            c["missing_ids"].as_u64()
        ),
        (Some(2000), Some(0), Some(0), Some(1), Some(3000))
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().last().unwrap(),
        "check: 2000 ids, 0 duplicates, 0 order violations, 1 short stream missing 3000 ids: FAIL"
    );
    // The summary says it too.
    let out = bench(&f.addr, &stream);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    for part in [
        "[ShortStream]\t1 responses",
        "Short streams:\t1 (3000 ids missing)",
        "[1]\tShortStream: the server ended the stream with OK after 2000 of 5000 ids",
        "Check: 2000 ids, 0 duplicates, 0 order violations, 1 short stream missing 3000 ids: FAIL",
    ] {
        assert!(text.contains(part), "missing {part:?} in\n{text}");
    }
    // The same stream called by name, with the request as JSON.
    let out = bench(
        &f.addr,
        &[
            "--call",
            "snowkeep.v1.IdService/StreamIds",
            "-d",
            r#"{"total": 5000, "batch_size": 5000}"#,
            "-n",
            "1",
            "--check",
            "-O",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let v = json(&out);
    assert_eq!(v["status_codes"], serde_json::json!({"ShortStream": 1}));
    assert_eq!(v["check"]["missing_ids"], 3000);

    // Ended with UNAVAILABLE after 2000 ids, as snowkeep-server does now: the
    // real code in the distribution, and still a failed check.
    let f = floor(&[
        "--cut-streams-after",
        "2000",
        "--cut-streams-with",
        "unavailable",
    ]);
    bench(&f.addr, &["--call", "unary", "-n", "1"]); // the floor is up
    let mut raw = vec![f.addr.as_str()];
    raw.extend(args.iter().copied());
    let out = bench_raw(&raw);
    assert_eq!(out.status.code(), Some(2));
    let v = json(&out);
    assert_eq!(v["status_codes"], serde_json::json!({"Unavailable": 1}));
    assert_eq!(
        v["errors"],
        serde_json::json!({"Unavailable: stream ended early: 2000 of 5000 ids sent; the floor cuts every stream after 2000 ids": 1})
    );
    assert_eq!(
        (
            v["check"]["short_streams"].as_u64(),
            v["check"]["missing_ids"].as_u64()
        ),
        (Some(1), Some(3000))
    );
}

/// Streams the server refuses outright (here an invalid batch size; against
/// snowkeep, a key without the ids permission) are failed calls, exit 1,
/// not a uniqueness check that failed on ids that never came (exit 2).
#[test]
fn refused_streams_exit_1_not_as_a_failed_check() {
    let f = floor(&[]);
    let out = bench(
        &f.addr,
        &[
            "--call",
            "stream",
            "--count",
            "100",
            "--batch-size",
            "4000000000",
            "-n",
            "2",
            "-c",
            "1",
            "--check",
            "--no-progress",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("every call failed"),
        "{out:?}"
    );
}
