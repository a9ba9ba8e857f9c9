//! Faults against the outage budget: fences now stand up to 1.5 outage
//! budgets (90 s by default) ahead of the clock, so every path that starts a
//! new holder must still start above the old holder's fence, and must not
//! give up on a machine id whose fence is merely far ahead.

use std::time::Duration;

use etcd_client::GetOptions;
use snowkeep_client::Layout;

use crate::support::etcd::EtcdProcess;
use crate::support::eventually;
use crate::support::server::ServerProcess;

/// A busy holder killed with SIGKILL leaves its fence up to 90 s ahead. Its
/// restart under the same --instance-id, on a range with no other machine
/// id, must wait for that fence (NOT_SERVING meanwhile), as it did when
/// fences stood 3 s ahead, not exit blaming the host's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_restarted_on_its_only_machine_id_waits_instead_of_exiting() {
    let etcd = EtcdProcess::start().await;
    let args = ["--instance-id", "pod-0", "--machine-id-range", "3..4"];
    let mut first = ServerProcess::on_etcd(&etcd.endpoint(), "crash", &args);
    first.wait_serving(Duration::from_secs(20)).await;
    assert_eq!(first.next_ids(100).await.unwrap().len(), 100);
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;

    let mut again = ServerProcess::on_etcd(&etcd.endpoint(), "crash", &args);
    // It waits out the killed process's 2 s lease first, then claims.
    eventually(
        "the restart claims after the old lease",
        Duration::from_secs(20),
        || {
            let log = again.log();
            async move {
                log.contains("waiting for the clock to pass")
                    || log.contains("snowkeep-server stopped")
            }
        },
    )
    .await;
    assert!(
        again.is_running(),
        "the restart exited instead of waiting for its machine id's fence; log:\n{}",
        again.log()
    );
}

/// A namespace wiped (etcdctl del --prefix) and created again while a holder
/// is stopped (SIGSTOP: it cannot see the wipe): the new holder of the same
/// machine id must stamp above the stopped holder's persisted fence, which
/// the stopped holder may still stamp up to when it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_and_recreated_namespace_starts_above_a_stopped_holders_fence() {
    let etcd = EtcdProcess::start().await;
    let args = ["--machine-id-range", "5..6", "--outage-budget", "10s"];
    let old = ServerProcess::on_etcd(&etcd.endpoint(), "wiped", &args);
    old.wait_serving(Duration::from_secs(20)).await;
    assert_eq!(old.next_ids(100).await.unwrap().len(), 100);
    let mut client = etcd.client().await;
    let fence_key = "/snowkeep/v1/ns/wiped/fence/00005";
    let fence: u64 = {
        let resp = client.get(fence_key, None).await.unwrap();
        let kv = resp.kvs().first().expect("the holder's fence key");
        std::str::from_utf8(kv.value())
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    old.signal("STOP");
    client
        .delete(
            "/snowkeep/v1/ns/wiped/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let left = client
        .get(
            "/snowkeep/v1/ns/wiped/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count();
    assert_eq!(left, 0, "the namespace is wiped");

    let new = ServerProcess::on_etcd(&etcd.endpoint(), "wiped", &args);
    new.wait_serving(Duration::from_secs(60)).await;
    let id = new.next_ids(1).await.unwrap()[0];
    let stamped = Layout::default().decode(id).unwrap();
    old.signal("CONT");
    assert_eq!(stamped.machine_id.get(), 5);
    assert!(
        stamped.timestamp.get() > fence,
        "the new holder stamped {} ms, at or below the stopped holder's fence {fence} ms; log:\n{}",
        stamped.timestamp.get(),
        new.log()
    );
}
