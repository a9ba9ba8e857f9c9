//! Findings of the break session on snowkeepctl. Each test here FAILS on
//! the code it was written against; see its comment for why.

use std::process::Command;

use snowkeep_client::Requester;

use crate::support::lease::{acquire, lease_api_server};

fn snowkeepctl(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args(args)
        .env_remove("SNOWKEEP_ENDPOINT")
        .env_remove("SNOWKEEP_API_KEY")
        .env_remove("SNOWKEEP_API_KEY_FILE")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run snowkeepctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `snowkeepctl requesters` prints each requester's start time with
/// `humantime::format_rfc3339_millis`, which fails (and `to_string`
/// panics) after the year 9999. The start time is whatever the requester
/// sent in its Acquire (only 0 is refused), so any Lease API client can
/// make the administrator's listing crash (exit 101) and hide every
/// requester of the namespace, itself included. The same `utc` crashes
/// `decode` with a late `--epoch`, and `key list` formats expiries the
/// same way. Out-of-range times should print as numbers (or `-`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requester_with_a_far_future_start_time_crashes_snowkeepctl_requesters() {
    let ns = "brkctl";
    let (_etcd, server, mut api) = lease_api_server(ns).await;
    let who = Requester {
        host_id: "mallory".into(),
        pid: 1,
        // Year 11476.
        start_unix_ms: 300_000_000_000_000,
        nonce: "0000000000000001".into(),
    };
    api.acquire(acquire(ns, &who, 1, None)).await.unwrap();
    let url = server.url();
    let (code, stdout, stderr) =
        snowkeepctl(&["--endpoint", &url, "requesters", "--namespace", ns]);
    assert_eq!(
        code,
        Some(0),
        "snowkeepctl requesters:\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stdout.contains("mallory"), "{stdout}");
    let (code, _, stderr) = snowkeepctl(&[
        "decode",
        "9223372036854775807",
        "--layout",
        "41/12/10",
        "--epoch",
        "9999-01-01T00:00:00Z",
    ]);
    assert_ne!(code, Some(101), "decode panicked: {stderr}");
}
