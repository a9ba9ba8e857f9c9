//! The single-instance store: a fence ahead of the clock in its state
//! file is waited out when near, refused when far.

use std::time::Duration;

use snowkeep_client::{Clock, Layout, Millis, SystemClock};

use snowkeep_test_support::server::ServerProcess;

fn write_state(dir: &std::path::Path, fence: Millis) {
    std::fs::write(
        dir.join("default.state"),
        format!(
            "namespace default\nlayout {}\nfence_ms {}\n",
            Layout::default(),
            fence.get()
        ),
    )
    .unwrap();
}

fn now_ms() -> Millis {
    Layout::default()
        .to_layout_ms(SystemClock.unix_ms())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_out_a_fence_slightly_ahead_of_the_clock() {
    let state = tempfile::tempdir().unwrap();
    let fence = Millis(now_ms().get() + 1500);
    write_state(state.path(), fence);
    let server = ServerProcess::spawn(&["--state-dir", state.path().to_str().unwrap()]);
    server.wait_serving(Duration::from_secs(15)).await;
    let id = server.next_ids(1).await.expect("NextIds")[0];
    assert!(Layout::default().decode(id).unwrap().timestamp > fence);
    assert_eq!(server.metric("snowkeep_fence_waits_total").await, 1.0);
    assert!(server
        .log()
        .contains("waiting for the clock to pass the claimed machine ids' floor"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_fence_an_hour_ahead_of_the_clock() {
    let state = tempfile::tempdir().unwrap();
    write_state(state.path(), Millis(now_ms().get() + 3_600_000));
    let mut server = ServerProcess::spawn(&["--state-dir", state.path().to_str().unwrap()]);
    let status = server.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(1));
    let log = server.log();
    assert!(
        log.contains("ahead of the clock, more than --max-fence-wait 10s"),
        "log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_state_dir_refuses_to_start() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    let first = ServerProcess::spawn(&["--state-dir", dir]);
    first.wait_serving(Duration::from_secs(15)).await;
    let mut second = ServerProcess::spawn(&["--state-dir", dir]);
    assert_eq!(
        second.wait_exit(Duration::from_secs(15)).await.code(),
        Some(1)
    );
    let log = second.log();
    assert!(
        log.contains("is locked by another snowkeep process"),
        "log:\n{log}"
    );
    // The advice must never be a second single-instance server elsewhere without
    // its own machine ids: it would issue equal ids.
    assert!(
        log.contains("give this one its own --state-dir and a --machine-id-range disjoint from every other single-instance server's")
            && log.contains("--etcd-endpoints"),
        "log:\n{log}"
    );
}
