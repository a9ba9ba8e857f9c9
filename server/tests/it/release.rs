//! SIGTERM: drain, lower the fence to the last timestamp used, delete the
//! holder key, revoke the lease; a restart with the same instance id serves at
//! once on the same machine id.

use std::time::Duration;

use snowkeep_client::{Layout, MachineId};

use crate::support::etcd::EtcdProcess;
use crate::support::server::ServerProcess;

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
