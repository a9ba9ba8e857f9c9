//! Two live processes with one `--instance-id`: the newcomer stops (exit 64)
//! and the running one keeps serving undisturbed; a stable instance
//! restarting after a crash still gets its machine id back.

use std::collections::HashSet;
use std::time::Duration;

use snowkeep_client::{Layout, SystemClock};
use snowkeep_etcd::{EtcdSettings, EtcdStore};

use crate::claim::settings::claimer_settings;
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;

fn duplicate_message(machine_id: u32, instance_id: &str) -> String {
    format!("another live process holds machine id {machine_id} under the same instance id \"{instance_id}\": two live processes must never share an --instance-id; give each its own (the pod name, say), or stop the other one first")
}

fn machine_ids_of(ids: &[u64]) -> HashSet<u16> {
    ids.iter()
        .map(|&id| Layout::default().decode(id).unwrap().machine_id.get())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_process_with_one_instance_id_stops_and_the_first_keeps_serving() {
    let etcd = EtcdProcess::start().await;
    let mut first = ServerProcess::on_etcd(&etcd.endpoint(), "twins", &["--instance-id", "pod-0"]);
    first.wait_serving(Duration::from_secs(20)).await;
    let machine_id = first.machine_id().await;
    let mut ids = first.next_ids(10_000).await.unwrap();

    let t0 = tokio::time::Instant::now();
    let mut second = ServerProcess::on_etcd(&etcd.endpoint(), "twins", &["--instance-id", "pod-0"]);
    let status = second.wait_exit(Duration::from_secs(20)).await;
    let took = t0.elapsed();
    assert_eq!(status.code(), Some(64), "log:\n{}", second.log());
    let log = second.log();
    assert!(
        log.contains(&duplicate_message(machine_id, "pod-0")),
        "log:\n{log}"
    );
    assert!(
        !log.contains("issuing"),
        "the newcomer never issued:\n{log}"
    );
    // The first holder raises its fence every 1.5 s (half the 3 s horizon),
    // which is how the newcomer sees it alive: well inside one lease TTL (2 s)
    // plus the 2 s slack, plus start-up.
    assert!(took < Duration::from_secs(8), "decided after {took:?}");
    eprintln!("duplicate instance id: the newcomer exited 64 after {took:?}");

    // The first process never noticed: same machine id, still serving.
    assert!(first.is_running());
    assert_eq!(first.machine_id().await, machine_id);
    ids.extend(first.next_ids(10_000).await.unwrap());
    let first_log = first.log();
    assert!(!first_log.contains("lease lost"), "log:\n{first_log}");
    let distinct: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 20_000, "no equal ids");
    assert_eq!(machine_ids_of(&ids), HashSet::from([machine_id as u16]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stable_instance_restarting_after_a_crash_gets_its_machine_id_back() {
    let etcd = EtcdProcess::start().await;
    let mut crashed =
        ServerProcess::on_etcd(&etcd.endpoint(), "phoenix", &["--instance-id", "pod-1"]);
    crashed.wait_serving(Duration::from_secs(20)).await;
    let machine_id = crashed.machine_id().await;
    let mut ids = crashed.next_ids(10_000).await.unwrap();
    crashed.signal("KILL");
    crashed.wait_exit(Duration::from_secs(5)).await;

    let t0 = tokio::time::Instant::now();
    let restarted =
        ServerProcess::on_etcd(&etcd.endpoint(), "phoenix", &["--instance-id", "pod-1"]);
    // Its predecessor's lease ends within the 2 s TTL; then it waits out the
    // predecessor's fence, at most one 3 s horizon.
    restarted.wait_serving(Duration::from_secs(15)).await;
    let took = t0.elapsed();
    assert_eq!(restarted.machine_id().await, machine_id);
    assert!(restarted.log().contains(
        "the previous holder under this instance id is gone; claiming its machine id first"
    ));
    ids.extend(restarted.next_ids(10_000).await.unwrap());
    let distinct: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 20_000, "no equal ids");
    assert_eq!(machine_ids_of(&ids), HashSet::from([machine_id as u16]));
    eprintln!("crash restart under the same instance id: serving after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_processes_started_together_with_one_instance_id_exactly_one_stops() {
    let etcd = EtcdProcess::start().await;
    let mut servers = [
        ServerProcess::on_etcd(&etcd.endpoint(), "together", &["--instance-id", "pod-2"]),
        ServerProcess::on_etcd(&etcd.endpoint(), "together", &["--instance-id", "pod-2"]),
    ];
    let stopped = snowkeep_test_support::eventually(
        "one of the two to exit",
        Duration::from_secs(20),
        || {
            let running = servers
                .iter_mut()
                .map(|s| s.is_running())
                .filter(|&r| r)
                .count();
            async move { running < 2 }
        },
    )
    .await;
    let (gone, kept) = if servers[0].is_running() {
        (1, 0)
    } else {
        (0, 1)
    };
    let status = servers[gone].wait_exit(Duration::from_secs(1)).await;
    assert_eq!(status.code(), Some(64), "log:\n{}", servers[gone].log());
    assert!(
        servers[gone]
            .log()
            .contains("under the same instance id \"pod-2\": two live processes must never share an --instance-id"),
        "log:\n{}",
        servers[gone].log()
    );
    servers[kept].wait_serving(Duration::from_secs(15)).await;
    assert!(servers[kept].is_running());
    let ids = servers[kept].next_ids(1_000).await.unwrap();
    assert_eq!(ids.iter().copied().collect::<HashSet<_>>().len(), 1_000);
    eprintln!("simultaneous start: one stopped after {stopped:?}");
}

/// A store of the stable instance id `pod-0` in namespace `own`, claiming
/// `machine_ids` of 0..4096 on a 2 s etcd lease that nothing renews.
async fn pod_store(etcd: &EtcdProcess, machine_ids: u32) -> EtcdStore {
    let settings = EtcdSettings {
        machine_ids,
        stable_instance: true,
        ..claimer_settings(etcd, "own", "pod-0", 0..4096)
    };
    EtcdStore::connect(settings, Layout::default(), SystemClock::shared())
        .await
        .unwrap()
}

/// A crashed process of `pod-0` held one machine id; its successor claims
/// two. Only the one it takes back is its own fence, waited for up to a
/// fence lead; the other keeps --max-fence-wait (the claim loop decides by
/// `Claim::own_fences`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_machine_id_taken_back_after_a_crash_counts_as_its_own_fence() {
    let etcd = EtcdProcess::start().await;
    let mut crashed = pod_store(&etcd, 1).await;
    let before = crashed.claim().await.unwrap();
    assert_eq!(before.own_fences, Vec::new());
    let own = before.held[0].machine_id;
    // Never renewed: the lease ends within its 2 s TTL, as a crash's does.
    let mut successor = pod_store(&etcd, 2).await;
    let claim = successor.claim().await.unwrap();
    let ids: Vec<_> = claim.held.iter().map(|h| h.machine_id).collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], own, "{ids:?}");
    assert_ne!(ids[1], own);
    assert_eq!(claim.own_fences, vec![own]);
    drop(crashed);
}
