//! Every state command of `snowkeepctl` against a live cluster, JSON output
//! checked value by value; `decode` offline.

use std::process::Command;

use snowkeep_client::{Clock, Layout, SystemClock};
use snowkeep_proto::v1 as pb;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, lease_client, requester};
use snowkeep_test_support::server::ServerProcess;

/// Runs snowkeepctl with `args` against `server` (JSON output); returns
/// exit success, stdout and stderr.
fn ctl(server: Option<&ServerProcess>, args: &[&str]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"));
    if let Some(s) = server {
        c.args(["--endpoint", &s.url()]);
    }
    let out = c
        .args(["--output", "json"])
        .args(args)
        .env_remove("SNOWKEEP_NAMESPACE")
        .output()
        .expect("run snowkeepctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(server: Option<&ServerProcess>, args: &[&str]) -> serde_json::Value {
    let (ok, out, err) = ctl(server, args);
    assert!(ok, "snowkeepctl {args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

#[test]
fn decode_works_offline() {
    // 41/12/10 at the default epoch: timestamp 1000, machine id 5, sequence 5.
    let d = json(None, &["decode", "4194309125", "--layout", "41/12/10"]);
    // The id is a string: JSON numbers lose 64-bit precision in JavaScript.
    assert_eq!(d["id"], "4194309125");
    assert_eq!(d["timestamp_ms"], 1000);
    assert_eq!(d["unix_ms"], 1_767_225_601_000u64);
    assert_eq!(d["utc"], "2026-01-01T00:00:01.000Z");
    assert_eq!(d["machine_id"], 5);
    assert_eq!(d["sequence"], 5);
    let d = json(
        None,
        &[
            "decode",
            "4194309125",
            "--layout",
            "41/12/10",
            "--epoch",
            "0",
        ],
    );
    assert_eq!(d["utc"], "1970-01-01T00:00:01.000Z");
    assert_eq!(d["id"], "4194309125");
    let (ok, _, err) = ctl(None, &["decode", "1", "--layout", "41/12"]);
    assert!(!ok);
    assert!(err.contains("--layout"), "{err}");
}

#[test]
fn decode_reads_an_id_as_its_text_too() {
    let by_number = json(None, &["decode", "4194309125"]);
    assert_eq!(by_number["text"], "0000003X00505");
    let by_text = json(None, &["decode", "0000003x00505"]);
    assert_eq!(by_text, by_number);
    // Digits only are the number, unless --text.
    assert_eq!(json(None, &["decode", "0000000000010"])["id"], "10");
    assert_eq!(
        json(None, &["decode", "--text", "0000000000010"])["id"],
        "32"
    );
    let (ok, _, err) = ctl(None, &["decode", "0000003U00505"]);
    assert!(!ok);
    assert!(
        err.contains(
            "id text \"0000003U00505\" has 'U' at position 8, which is not a Crockford base32 \
             digit"
        ),
        "{err}"
    );
}

/// Runs snowkeepctl with `args` with its stdout closed before it writes (as
/// `snowkeepctl … | head` once head has its lines): (exit code, stderr).
fn ctl_closed_stdout(server: Option<&ServerProcess>, args: &[&str]) -> (Option<i32>, String) {
    use std::io::Read;
    let mut c = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"));
    if let Some(s) = server {
        c.args(["--endpoint", &s.url()]);
    }
    let mut child = c
        .args(args)
        .env_remove("SNOWKEEP_NAMESPACE")
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run snowkeepctl");
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (child.wait().unwrap().code(), err)
}

/// A closed stdout is a normal end: exit 0 and nothing on stderr, never
/// the "failed printing to stdout: Broken pipe" panic.
#[test]
fn a_closed_stdout_ends_quietly() {
    for args in [
        &["decode", "4194309125", "--layout", "41/12/10"][..],
        &["--output", "json", "decode", "4194309125"],
        &["key", "generate"],
    ] {
        assert_eq!(
            ctl_closed_stdout(None, args),
            (Some(0), String::new()),
            "{args:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_command_runs_against_a_live_cluster() {
    let etcd = EtcdProcess::start().await;
    let ns = "ctl-state";
    let servers = ServerProcess::serving(1, &etcd.endpoint(), ns).await;
    let s = &servers[0];
    let info = s.info().await;
    let mine = info.held[0].machine_id;

    let list = json(Some(s), &["namespaces"]);
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["name"], ns);
    assert_eq!(list[0]["layout"]["machine_bits"], 12);
    assert_eq!(list[0]["layout"]["epoch_unix_ms"], 1_767_225_600_000u64);
    assert_eq!(list[0]["capacity"]["held"], 1);
    assert_eq!(list[0]["capacity"]["total"], 4096);

    // Default namespace: the server's own.
    let ids = json(Some(s), &["machine-ids"]);
    assert_eq!(ids["namespace"], ns);
    let rows = ids["machine_ids"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["machine_id"], mine);
    assert_eq!(rows[0]["holder"], info.instance_id.as_str());
    assert_eq!(
        ctl_closed_stdout(Some(s), &["machine-ids"]),
        (Some(0), String::new())
    );

    let who = requester(1_700_000_000_000);
    let grant = lease_client(s)
        .await
        .acquire(acquire(ns, &who, 1, None))
        .await
        .expect("Acquire")
        .into_inner();
    let reqs = json(Some(s), &["requesters", "--namespace", ns]);
    let reqs = reqs["requesters"].as_array().unwrap();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["host_id"], "test-host");
    assert_eq!(reqs[0]["pid"], 4242);
    assert_eq!(reqs[0]["start_unix_ms"], 1_700_000_000_000u64);
    assert_eq!(
        reqs[0]["machine_ids"],
        serde_json::json!([grant.machine_ids[0].machine_id])
    );

    let c = json(Some(s), &["capacity"]);
    assert_eq!(c["namespace"], ns);
    assert_eq!(
        (c["held"].as_u64(), c["free"].as_u64()),
        (Some(2), Some(4094))
    );

    // Evict: a free id fails, the requester's id succeeds.
    let free = (0..4096u32)
        .find(|m| *m != mine && *m != grant.machine_ids[0].machine_id)
        .unwrap()
        .to_string();
    let (ok, _, err) = ctl(Some(s), &["evict", "--namespace", ns, &free]);
    assert!(!ok);
    assert!(err.contains("has no holder"), "{err}");
    // Without --namespace: the server's own, as machine-ids.
    let requester_id = grant.machine_ids[0].machine_id.to_string();
    let e = json(Some(s), &["evict", &requester_id]);
    assert_eq!(e["namespace"], ns);
    assert_eq!(
        e["holder"],
        format!("requester:{}", reqs[0]["requester_hash"].as_str().unwrap())
    );
    assert_eq!(
        e["machine_ids"],
        serde_json::json!([grant.machine_ids[0].machine_id])
    );
    // The requester's fence runs its 10 min lease plus 60 s ahead.
    let wait = e["successor_wait_ms"].as_u64().unwrap();
    assert!((600_000..=660_000).contains(&wait), "{e}");
    let reqs = json(Some(s), &["requesters", "--namespace", ns]);
    assert_eq!(reqs["requesters"], serde_json::json!([]));

    // Export to a file, import it back with --replace.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.json");
    let file = file.to_str().unwrap();
    let (ok, out, err) = ctl(Some(s), &["export", "--file", file]);
    assert!(ok, "{err}");
    assert!(out.is_empty());
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(doc["namespaces"][0]["name"], ns);
    let (ok, _, err) = ctl(Some(s), &["import", "--file", file]);
    assert!(!ok);
    assert!(
        err.starts_with("snowkeepctl: FAILED_PRECONDITION: "),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let r = json(Some(s), &["import", "--file", file, "--replace"]);
    assert_eq!(r["namespaces"], 1);
    assert_eq!(r["keys"], 0);
    assert_eq!(r["lead_ms"], 3_000);
    let _ = pb::ExportRequest {};
}

/// `namespaces` shows how long each namespace's layout has left, from
/// snowkeepctl's clock: `layout_end_unix_ms` exactly (the server's
/// `Layout::end_unix_ms`), and years of 365 days rounded down to a tenth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_show_the_years_each_layout_has_left() {
    let etcd = EtcdProcess::start().await;
    let servers = ServerProcess::serving(1, &etcd.endpoint(), "long-lived").await;
    let s = &servers[0];
    // A second namespace whose 40/12/11 layout ends 200 days from now:
    // 0.547 years, shown as 0.5.
    let (short, flag) = crate::telemetry::lifetime::layout_ending_in(200);
    let mut create = ServerProcess::joining(
        &etcd.endpoint(),
        "short-lived",
        &["--create-namespace-only", "--layout", &flag],
    );
    assert!(create
        .wait_exit(std::time::Duration::from_secs(20))
        .await
        .success());

    let before = SystemClock.unix_ms();
    let list = json(Some(s), &["namespaces"]);
    let after = SystemClock.unix_ms();
    let by_name = |name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {list}"))
            .clone()
    };
    let short_row = by_name("short-lived");
    assert_eq!(short_row["layout_end_unix_ms"], short.end_unix_ms());
    assert_eq!(short_row["layout_remaining_years"], serde_json::json!(0.5));
    // The default layout: 41 bits from 2026-01-01, over 68 years from now.
    let long = Layout::default().end_unix_ms();
    let long_row = by_name("long-lived");
    assert_eq!(long_row["layout_end_unix_ms"], long);
    let tenths = |now: u64| (long - now) / (365 * 86_400_000 / 10);
    let years = long_row["layout_remaining_years"].as_f64().unwrap();
    assert!(
        [tenths(before), tenths(after)]
            .iter()
            .any(|t| (*t as f64 / 10.0 - years).abs() < 1e-9),
        "{years} years, not {} or {}",
        tenths(before),
        tenths(after)
    );

    // The table: a YEARS LEFT column, 0.5 on the short-lived row.
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args(["--endpoint", &s.url(), "namespaces"])
        .env_remove("SNOWKEEP_OUTPUT")
        .output()
        .expect("run snowkeepctl");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    let header = table.lines().find(|l| l.contains("NAMESPACE")).unwrap();
    assert!(header.contains("YEARS LEFT"), "{table}");
    let row = table.lines().find(|l| l.contains("short-lived")).unwrap();
    let cells: Vec<&str> = row.split(['│', '┆']).map(str::trim).collect();
    assert_eq!(cells[cells.len() - 2], "0.5", "{table}");
}
