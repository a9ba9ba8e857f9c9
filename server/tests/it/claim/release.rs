//! SIGTERM: drain, lower the fence to the last timestamp used, delete the
//! holder key, revoke the lease; a restart with the same instance id serves at
//! once on the same machine id.

use std::time::Duration;

use snowkeep_client::{Layout, MachineId};

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_so_a_restart_with_the_same_instance_id_serves_at_once() {
    let etcd = EtcdProcess::start().await;
    let args = ["--instance-id", "stable-a"];
    let mut first = ServerProcess::on_etcd(&etcd.endpoint(), "release", &args);
    first.wait_serving(Duration::from_secs(20)).await;
    let machine_id = first.machine_id().await;
    let ids = first.next_ids(5000).await.expect("NextIds");
    let layout = Layout::default();
    let last_ts = layout.decode(*ids.last().unwrap()).unwrap().timestamp;

    first.signal("TERM");
    let status = first.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(0), "log:\n{}", first.log());

    let mut etcd_client = etcd.client().await;
    let ns = "/snowkeep/v1/ns/release";
    let holder = etcd_client
        .get(format!("{ns}/holder/{machine_id:05}"), None)
        .await
        .unwrap();
    assert!(holder.kvs().is_empty(), "holder key must be deleted");
    let fence = etcd_client
        .get(format!("{ns}/fence/{machine_id:05}"), None)
        .await
        .unwrap();
    assert_eq!(
        fence.kvs()[0].value_str().unwrap(),
        last_ts.get().to_string(),
        "fence lowered to the last timestamp used"
    );
    assert!(
        etcd_client.leases().await.unwrap().leases().is_empty(),
        "lease revoked"
    );

    let second = ServerProcess::on_etcd(&etcd.endpoint(), "release", &args);
    second.wait_serving(Duration::from_secs(20)).await;
    assert_eq!(second.machine_id().await, machine_id);
    assert_eq!(second.metric("snowkeep_fence_waits_total").await, 0.0);
    assert!(
        !second.log().contains("waiting for the clock"),
        "log:\n{}",
        second.log()
    );
    let next = second.next_ids(1).await.expect("NextIds")[0];
    let decoded = layout.decode(next).unwrap();
    assert_eq!(decoded.machine_id, MachineId(machine_id as u16));
    assert!(
        decoded.timestamp > last_ts,
        "{:?} must be above {:?}",
        decoded.timestamp,
        last_ts
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_machine_ids_under_one_lease_spread_batches_and_release_together() {
    let etcd = EtcdProcess::start().await;
    let mut server = ServerProcess::on_etcd(&etcd.endpoint(), "four", &["--machine-ids", "4"]);
    server.wait_serving(Duration::from_secs(20)).await;
    let info = server.info().await;
    let mut held: Vec<u32> = info.held.iter().map(|h| h.machine_id).collect();
    held.sort();
    held.dedup();
    assert_eq!(held.len(), 4, "{info:?}");

    let layout = Layout::default();
    // 100,000 ids: more than one ms of one machine id, so spread over all four.
    let batch = server.next_ids(100_000).await.expect("NextIds");
    assert_eq!(batch.len(), 100_000);
    assert!(batch.windows(2).all(|w| w[0] < w[1]), "batch not ascending");
    let mut used: Vec<u32> = batch
        .iter()
        .map(|&id| u32::from(layout.decode(id).unwrap().machine_id.get()))
        .collect();
    used.sort();
    used.dedup();
    assert_eq!(used, held);

    // A stream stays on one machine id and ascends across batches.
    let mut stream = server
        .ids()
        .await
        .stream_ids(snowkeep_proto::v1::StreamIdsRequest {
            total: 50_000,
            batch_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut streamed = Vec::new();
    while let Some(b) = stream.message().await.unwrap() {
        streamed.extend(b.ids);
    }
    assert_eq!(streamed.len(), 50_000);
    assert!(
        streamed.windows(2).all(|w| w[0] < w[1]),
        "stream not ascending"
    );

    // The last timestamp stamped on each machine id, to compare with the fences.
    let mut last_ts = std::collections::HashMap::new();
    for id in batch.iter().chain(&streamed) {
        let d = layout.decode(*id).unwrap();
        let e = last_ts
            .entry(u32::from(d.machine_id.get()))
            .or_insert(d.timestamp);
        *e = (*e).max(d.timestamp);
    }
    server.signal("TERM");
    assert_eq!(
        server.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0)
    );
    let mut client = etcd.client().await;
    for machine_id in held {
        let ns = "/snowkeep/v1/ns/four";
        let holder = client
            .get(format!("{ns}/holder/{machine_id:05}"), None)
            .await
            .unwrap();
        assert!(holder.kvs().is_empty(), "holder {machine_id} not deleted");
        let fence = client
            .get(format!("{ns}/fence/{machine_id:05}"), None)
            .await
            .unwrap();
        assert_eq!(
            fence.kvs()[0].value_str().unwrap(),
            last_ts[&machine_id].get().to_string(),
            "fence of {machine_id} lowered to its last timestamp"
        );
    }
    assert!(
        client.leases().await.unwrap().leases().is_empty(),
        "lease revoked"
    );
}
