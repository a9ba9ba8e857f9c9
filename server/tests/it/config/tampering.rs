//! Operator mistakes and damaged etcd state (the adversarial review's
//! findings): none may cost uniqueness, and none may wedge the namespace.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use snowkeep_client::{Clock, Layout, SystemClock};
use tokio::sync::Mutex;
use tonic_health::pb::health_check_response::ServingStatus;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::eventually;
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);

fn ts(id: u64) -> u64 {
    Layout::default().decode(id).unwrap().timestamp.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_holder_and_its_fence_under_a_live_holder_repeats_no_id() {
    let etcd = EtcdProcess::start().await;
    let only_five = ["--machine-id-range", "5..6"];
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "tamper", &only_five);
    a.wait_serving(READY).await;

    // A issues continuously while an operator deletes both of its keys and a
    // second server starts on the same (single) machine id.
    let from_a = Arc::new(Mutex::new(Vec::new()));
    let mut client_a = a.ids().await;
    let sink = from_a.clone();
    let issuing = tokio::spawn(async move {
        let until = tokio::time::Instant::now() + Duration::from_secs(6);
        while tokio::time::Instant::now() < until {
            if let Ok(r) = client_a
                .next_ids(snowkeep_proto::v1::NextIdsRequest {
                    count: 500,
                    ..Default::default()
                })
                .await
            {
                sink.lock().await.extend(r.into_inner().ids);
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut etcd_client = etcd.client().await;
    let deleted_at = Layout::default()
        .to_layout_ms(SystemClock.unix_ms())
        .unwrap()
        .get();
    etcd_client
        .delete("/snowkeep/v1/ns/tamper/holder/00005", None)
        .await
        .unwrap();
    etcd_client
        .delete("/snowkeep/v1/ns/tamper/fence/00005", None)
        .await
        .unwrap();
    // A notices (holder watch) and claims again; B races it for id 5. Either
    // may win; the loser waits (A) or, never having held an id, exits (B).
    let b = ServerProcess::on_etcd(&etcd.endpoint(), "tamper", &only_five);
    issuing.await.unwrap();
    let mut all: Vec<u64> = from_a.lock().await.clone();
    if b.health().await == Some(ServingStatus::Serving) {
        all.extend(b.next_ids(5000).await.unwrap());
    }

    // Unique, and nothing stamped between just after the deletion and one
    // fence horizon (3 s) later: whoever claimed id 5 again had no fence to go
    // by, so it started a whole horizon past its clock, beyond anything the
    // old holder could have been fenced for.
    let unique: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "an id was issued twice");
    let before = all.iter().filter(|&&id| ts(id) <= deleted_at + 500).count();
    let after = all.iter().filter(|&&id| ts(id) > deleted_at + 3000).count();
    assert!(before > 0 && after > 0, "before {before}, after {after}");
    assert_eq!(
        before + after,
        all.len(),
        "ids stamped inside the fence horizon after the deletion"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_fence_quarantines_its_machine_id_only() {
    let etcd = EtcdProcess::start().await;
    let mut client = etcd.client().await;
    // The namespace exists (a first server recorded its layout) ...
    let first = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "garbled",
        &["--machine-id-range", "9..10"],
    );
    first.wait_serving(READY).await;
    // ... and someone wrote garbage into another machine id's fence.
    client
        .put("/snowkeep/v1/ns/garbled/fence/00007", "not-a-number", None)
        .await
        .unwrap();
    let server =
        ServerProcess::on_etcd(&etcd.endpoint(), "garbled", &["--machine-id-range", "7..9"]);
    server.wait_serving(READY).await;
    assert_eq!(server.machine_id().await, 8);
    assert!(server
        .log()
        .contains("quarantining a machine id whose fence is unreadable"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_far_ahead_is_skipped_and_only_fatal_when_nothing_else_is_free() {
    let etcd = EtcdProcess::start().await;
    let first = ServerProcess::on_etcd(&etcd.endpoint(), "far", &["--machine-id-range", "9..10"]);
    first.wait_serving(READY).await;
    let hour_ahead = Layout::default()
        .to_layout_ms(SystemClock.unix_ms())
        .unwrap()
        .get()
        + 3_600_000;
    let mut client = etcd.client().await;
    client
        .put(
            "/snowkeep/v1/ns/far/fence/00007",
            hour_ahead.to_string(),
            None,
        )
        .await
        .unwrap();
    // id 7 is free but fenced an hour ahead; id 8 is free and usable.
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "far", &["--machine-id-range", "7..9"]);
    server.wait_serving(READY).await;
    assert_eq!(server.machine_id().await, 8);
    // With only id 7 in range there is nothing else: a clear error, exit 1.
    let mut only_seven =
        ServerProcess::on_etcd(&etcd.endpoint(), "far", &["--machine-id-range", "7..8"]);
    assert_eq!(
        only_seven.wait_exit(Duration::from_secs(15)).await.code(),
        Some(1)
    );
    assert!(
        only_seven.log().contains("machine id 7: fence")
            && only_seven.log().contains("more than --max-fence-wait 10s"),
        "log:\n{}",
        only_seven.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_not_serving_as_soon_as_calls_are_refused() {
    let etcd = EtcdProcess::start().await;
    // A 2 s outage budget: with etcd frozen, the busy server issues on
    // until the clock reaches its unraised fence (2 to 3 s ahead).
    let server = ServerProcess::spawn(&[
        "--etcd-endpoints",
        &etcd.endpoint(),
        "--namespace",
        "health",
        "--create-namespace",
        "--lease-ttl",
        "10s",
        "--outage-budget",
        "2s",
    ]);
    server.wait_serving(READY).await;
    etcd.pause();
    eventually("calls to be refused", Duration::from_secs(8), || async {
        matches!(server.next_ids(1).await, Err(s) if s.code() == tonic::Code::Unavailable)
    })
    .await;
    let refused = server.next_ids(1).await.unwrap_err();
    assert!(
        refused
            .message()
            .contains("clock reached the persisted fence"),
        "{refused:?}"
    );
    let took = eventually("health to follow", Duration::from_secs(2), || async {
        server.health().await == Some(ServingStatus::NotServing)
    })
    .await;
    assert!(
        took <= Duration::from_millis(400),
        "health lagged by {took:?}"
    );
    // Liveness (InfoService) stays SERVING: an unready pod is not restarted.
    assert_eq!(
        server.health_of("snowkeep.v1.InfoService").await,
        Some(ServingStatus::Serving)
    );
    etcd.resume();
    server.wait_serving(Duration::from_secs(30)).await;
}
