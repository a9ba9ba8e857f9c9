//! snowkeepctl against hostile cluster state, from outside testing: what a
//! Lease API client can store must never crash the administrator's tools.

use std::process::Command;

use snowkeep_client::Requester;

use snowkeep_test_support::lease::{acquire, lease_api_server};

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

/// The start time is whatever a requester sent in its Acquire (only 0 is
/// refused). RFC 3339 ends with the year 9999, and formatting a later time
/// used to panic snowkeepctl (exit 101), hiding every requester of the
/// namespace. Such times now print as numbers: in `requesters`, in `decode`
/// with a late `--epoch`, and in `key list`'s expiries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requester_with_a_far_future_start_time_is_listed_not_a_crash() {
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
