//! The single-instance store holds the machine ids an operator assigns with
//! `--machine-id-range` (the first `--machine-ids` of it), so single-instance servers
//! with disjoint ranges never issue equal ids.

use std::collections::HashSet;
use std::time::Duration;

use snowkeep_client::Layout;

use snowkeep_test_support::server::ServerProcess;

/// `calls` NextIds of 100,000 ids each.
async fn take(server: &ServerProcess, calls: usize) -> Vec<u64> {
    let mut ids = Vec::with_capacity(calls * 100_000);
    for _ in 0..calls {
        ids.extend(server.next_ids(100_000).await.expect("NextIds"));
    }
    ids
}

fn machine_ids_of(ids: &[u64]) -> HashSet<u16> {
    ids.iter()
        .map(|&id| Layout::default().decode(id).unwrap().machine_id.get())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_single_instance_servers_with_disjoint_ranges_issue_no_equal_ids() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ServerProcess::spawn(&[
        "--state-dir",
        dir_a.path().to_str().unwrap(),
        "--machine-id-range",
        "5..6",
    ]);
    let b = ServerProcess::spawn(&[
        "--state-dir",
        dir_b.path().to_str().unwrap(),
        "--machine-id-range",
        "7..100",
        "--machine-ids",
        "2",
    ]);
    a.wait_serving(Duration::from_secs(15)).await;
    b.wait_serving(Duration::from_secs(15)).await;

    let held = |info: snowkeep_proto::v1::GetInfoResponse| -> Vec<u32> {
        info.held.iter().map(|h| h.machine_id).collect()
    };
    assert_eq!(held(a.info().await), vec![5]);
    assert_eq!(held(b.info().await), vec![7, 8]);
    let (ca, cb) = (a.capacity().await, b.capacity().await);
    assert_eq!(
        (ca.total, ca.held, ca.free, ca.range_start, ca.range_end),
        (1, 1, 0, 5, 6)
    );
    assert_eq!(
        (cb.total, cb.held, cb.free, cb.range_start, cb.range_end),
        (2, 2, 0, 7, 9)
    );

    let (from_a, from_b) = tokio::join!(take(&a, 2), take(&b, 2));
    assert_eq!(from_a.len(), 200_000);
    assert_eq!(from_b.len(), 200_000);
    let set_a: HashSet<u64> = from_a.iter().copied().collect();
    let set_b: HashSet<u64> = from_b.iter().copied().collect();
    assert_eq!(set_a.len(), 200_000, "server A repeated an id");
    assert_eq!(set_b.len(), 200_000, "server B repeated an id");
    assert_eq!(
        set_a.intersection(&set_b).count(),
        0,
        "equal ids across servers"
    );
    assert_eq!(machine_ids_of(&from_a), HashSet::from([5]));
    // 100,000 ids per call are more than one millisecond's sequence, so B's
    // calls use both of its machine ids.
    assert_eq!(machine_ids_of(&from_b), HashSet::from([7, 8]));
    assert!(a
        .log()
        .contains("running on the single-instance store with machine ids 5..6"));
    assert!(b
        .log()
        .contains("running on the single-instance store with machine ids 7..9"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_another_range_keeps_each_machine_ids_fence_apart() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    let mut first = ServerProcess::spawn(&["--state-dir", dir, "--machine-id-range", "3..4"]);
    first.wait_serving(Duration::from_secs(15)).await;
    let last = *first.next_ids(10).await.unwrap().last().unwrap();
    first.signal("TERM");
    assert_eq!(
        first.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0)
    );
    let text = std::fs::read_to_string(state.path().join("default.state")).unwrap();
    let released = Layout::default().decode(last).unwrap().timestamp.get();
    assert!(
        text.ends_with(&format!("fence_ms 3 {released}\n")),
        "the release lowers machine id 3's own fence to its last timestamp:\n{text}"
    );

    let second = ServerProcess::spawn(&["--state-dir", dir, "--machine-id-range", "4..5"]);
    second.wait_serving(Duration::from_secs(15)).await;
    let info = second.info().await;
    assert_eq!(info.held.len(), 1);
    assert_eq!(info.held[0].machine_id, 4);
    let id = second.next_ids(1).await.unwrap()[0];
    assert_eq!(Layout::default().decode(id).unwrap().machine_id.get(), 4);
    drop(second);
    let text = std::fs::read_to_string(state.path().join("default.state")).unwrap();
    assert!(
        text.contains(&format!("fence_ms 3 {released}\n")) && text.contains("fence_ms 4 "),
        "machine id 3's fence is kept while 4 runs:\n{text}"
    );
}
