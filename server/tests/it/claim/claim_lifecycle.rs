//! The claim lifecycle under faults (docs/design.md: the safety invariant and the claim lifecycle), with real etcd processes and
//! real servers.

use std::collections::HashSet;
use std::time::Duration;

use snowkeep_client::{Layout, MachineId, Millis};
use tonic_health::pb::health_check_response::ServingStatus;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::eventually;
use snowkeep_test_support::server::ServerProcess;

const TTL: Duration = Duration::from_secs(2);
const READY: Duration = Duration::from_secs(20);

fn decode(id: u64) -> snowkeep_client::DecodedId {
    Layout::default().decode(id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_key_deleted_by_an_operator_stops_issuance_within_500ms() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "deleted", &[]);
    server.wait_serving(READY).await;
    let machine_id = server.machine_id().await;
    let before = server.next_ids(1000).await.unwrap();

    let mut client = etcd.client().await;
    client
        .delete(
            format!("/snowkeep/v1/ns/deleted/holder/{machine_id:05}"),
            None,
        )
        .await
        .unwrap();
    let took = loss_seen(&server, "holder_changed").await;
    assert!(
        took <= Duration::from_millis(500),
        "loss seen after {took:?}"
    );
    assert_moved_off(&server, machine_id, &before).await;
}

/// Waits until `server` counts one lease loss for `reason`; returns how long.
async fn loss_seen(server: &ServerProcess, reason: &str) -> Duration {
    let series = format!(r#"snowkeep_lease_losses_total{{reason="{reason}"}}"#);
    eventually(
        &format!("a lease loss ({reason})"),
        Duration::from_secs(2),
        || async { server.metric(&series).await == 1.0 },
    )
    .await
}

/// After a loss, the server claims another machine id (the old one's fence is
/// ahead of the clock) and issues only there, never repeating an id.
async fn assert_moved_off(server: &ServerProcess, old: u32, before: &[u64]) {
    server.wait_serving(READY).await;
    let after = server.next_ids(1000).await.unwrap();
    assert!(after
        .iter()
        .all(|&id| u32::from(decode(id).machine_id.get()) != old));
    let all: HashSet<u64> = before.iter().chain(&after).copied().collect();
    assert_eq!(all.len(), before.len() + after.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_holder_after_a_crash_stamps_only_above_the_previous_fence() {
    let etcd = EtcdProcess::start().await;
    // One machine id in range, so the second server must take over the first's.
    let only_five = ["--machine-id-range", "5..6"];
    let mut first = ServerProcess::on_etcd(&etcd.endpoint(), "takeover", &only_five);
    first.wait_serving(READY).await;
    let last_of_first = *first.next_ids(5000).await.unwrap().last().unwrap();
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;

    let mut client = etcd.client().await;
    let fence_key = "/snowkeep/v1/ns/takeover/fence/00005";
    let holder_key = "/snowkeep/v1/ns/takeover/holder/00005";
    eventually("the crashed holder's lease to expire", TTL * 3, || {
        let mut c = client.clone();
        async move { c.get(holder_key, None).await.unwrap().kvs().is_empty() }
    })
    .await;
    let fence: u64 = client.get(fence_key, None).await.unwrap().kvs()[0]
        .value_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(decode(last_of_first).timestamp <= Millis(fence));

    let second = ServerProcess::on_etcd(&etcd.endpoint(), "takeover", &only_five);
    second.wait_serving(READY).await;
    let ids = second.next_ids(5000).await.unwrap();
    for id in &ids {
        let d = decode(*id);
        assert_eq!(d.machine_id, MachineId(5));
        assert!(
            d.timestamp > Millis(fence),
            "{:?} not above the crashed holder's fence {fence}",
            d.timestamp
        );
    }
    assert!(ids[0] > last_of_first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_range_refuses_the_next_instance_with_a_capacity_error() {
    let etcd = EtcdProcess::start().await;
    let range = ["--machine-id-range", "7..9"];
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "full", &range);
    let b = ServerProcess::on_etcd(&etcd.endpoint(), "full", &range);
    a.wait_serving(READY).await;
    b.wait_serving(READY).await;
    let mut held = vec![a.machine_id().await, b.machine_id().await];
    held.sort();
    assert_eq!(held, vec![7, 8]);
    let mut c = ServerProcess::on_etcd(&etcd.endpoint(), "full", &range);
    assert_eq!(c.wait_exit(Duration::from_secs(15)).await.code(), Some(1));
    assert!(
        c.log().contains(
            r#"no free machine id in namespace "full": all 2 machine ids of range 7..9 are held"#
        ),
        "log:\n{}",
        c.log()
    );
    assert_eq!(
        b.capacity().await,
        snowkeep_proto::v1::Capacity {
            namespace: "full".into(),
            total: 2,
            held: 2,
            free: 0,
            range_start: 7,
            range_end: 9,
        }
    );
    // The gauge is re-read every 5 s; `a` may have read it before `b` claimed.
    let series = |state: &str| {
        format!(r#"snowkeep_namespace_machine_ids{{namespace="full",state="{state}"}}"#)
    };
    eventually(
        "the capacity gauge to count both holders",
        Duration::from_secs(8),
        || async {
            a.metric(&series("held")).await == 2.0 && a.metric(&series("free")).await == 0.0
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_etcd_shorter_than_the_budget_never_stops_issuance_past_the_lease_ttl() {
    let etcd = EtcdProcess::start().await;
    // A 2 s lease TTL and a 6 s outage budget: the stall outlasts the lease
    // (etcd expires it when it wakes up), not the fences.
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "paused", &["--outage-budget", "6s"]);
    server.wait_serving(READY).await;
    let pid = server.pid();
    let mut all: HashSet<u64> = server.next_ids(1000).await.unwrap().into_iter().collect();
    let mut ids = server.ids().await;

    etcd.pause();
    let paused = tokio::time::Instant::now();
    let (mut ok, mut failed) = (0u32, Vec::new());
    while paused.elapsed() < TTL * 2 {
        match ids
            .next_ids(snowkeep_proto::v1::NextIdsRequest {
                count: 100,
                ..Default::default()
            })
            .await
        {
            Ok(r) => {
                ok += 1;
                for id in r.into_inner().ids {
                    assert!(all.insert(id), "id {id} issued twice");
                }
            }
            Err(s) => failed.push((paused.elapsed(), s)),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        failed.is_empty(),
        "{} calls failed during a {:?} stall, first: {:?}",
        failed.len(),
        TTL * 2,
        failed.first()
    );
    assert!(ok > 50, "only {ok} calls in {:?}", TTL * 2);
    assert_eq!(server.health().await, Some(ServingStatus::Serving));
    etcd.resume();

    // etcd may expire the lease as it wakes up: then the server stops
    // (UNAVAILABLE, briefly) and claims again. Either way it issues again
    // within the bound, and nothing it issues repeats an id.
    let resumed = tokio::time::Instant::now();
    let after = loop {
        match server.next_ids(1000).await {
            Ok(ids) => break ids,
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                assert!(
                    resumed.elapsed() < Duration::from_secs(30),
                    "no NextIds within 30 s of the resume: {s:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(after.len(), 1000);
    for id in after {
        assert!(all.insert(id), "id {id} issued twice");
    }
    let mut server = server;
    assert!(
        server.is_running() && server.pid() == pid,
        "recovered without a restart"
    );
    assert_eq!(
        server
            .metric(r#"snowkeep_lease_losses_total{reason="deadline"}"#)
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dead_member_of_three_does_not_interrupt_issuance() {
    let mut etcd = EtcdProcess::cluster(3).await;
    // Killing the leader costs an election (about a second, more on a loaded
    // 2-core machine) on top of the keepalive retries: a 5 s TTL rides it out,
    // where the other tests' 2 s TTL leaves too little margin.
    let ttl = Duration::from_secs(5);
    let server = ServerProcess::spawn(&[
        "--etcd-endpoints",
        &etcd.endpoints(),
        "--namespace",
        "three",
        "--create-namespace",
        "--lease-ttl",
        "5s",
    ]);
    server.wait_serving(READY).await;
    let mut ids = server.ids().await;
    // The store starts on the first endpoint: kill exactly that member.
    etcd.kill_member(0);
    let until = tokio::time::Instant::now() + ttl * 2;
    let (mut ok, mut failed) = (0u32, Vec::new());
    while tokio::time::Instant::now() < until {
        match ids
            .next_ids(snowkeep_proto::v1::NextIdsRequest {
                count: 100,
                ..Default::default()
            })
            .await
        {
            Ok(_) => ok += 1,
            Err(s) => failed.push(s),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        failed.is_empty(),
        "{} calls failed, first: {:?}; log:\n{}",
        failed.len(),
        failed.first(),
        server.log()
    );
    assert!(ok > 100, "only {ok} calls in {:?}", ttl * 2);
    for reason in ["deadline", "expired", "revoked", "holder_changed"] {
        let series = format!(r#"snowkeep_lease_losses_total{{reason="{reason}"}}"#);
        assert_eq!(server.metric(&series).await, 0.0, "{reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ranges_and_a_clock_before_the_epoch_refuse_to_start_with_64() {
    let etcd = EtcdProcess::start().await;
    let cases: [(&[&str], &str); 4] = [
        (
            &["--machine-id-range", "4000..5000"],
            r#"invalid --machine-id-range (SNOWKEEP_MACHINE_ID_RANGE) "4000..5000": use START..END with START < END <= 4096"#,
        ),
        (
            &["--layout", "41/12/10@4102444800000"],
            "before the layout epoch 4102444800000: fix the clock, or give --layout an epoch in the past",
        ),
        (
            // 37 timestamp bits from 1970 ran out in 1974.
            &["--layout", "37/16/10@0"],
            "layout 37/16/10@0 ran out of timestamps at 137438953471 ms since the Unix epoch",
        ),
        (&["--on-lease-lost", "die"], "invalid value 'die' for '--on-lease-lost <ON_LEASE_LOST>'"),
    ];
    for (args, message) in cases {
        let mut s = ServerProcess::on_etcd(&etcd.endpoint(), "refuse", args);
        assert_eq!(
            s.wait_exit(Duration::from_secs(15)).await.code(),
            Some(64),
            "{args:?}"
        );
        assert!(s.log().contains(message), "{args:?}: log:\n{}", s.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_revoked_by_an_operator_stops_issuance_at_once_and_it_claims_again() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "revoked", &[]);
    server.wait_serving(READY).await;
    let machine_id = server.machine_id().await;
    let before = server.next_ids(1000).await.unwrap();
    let mut client = etcd.client().await;
    let holder = client
        .get(
            format!("/snowkeep/v1/ns/revoked/holder/{machine_id:05}"),
            None,
        )
        .await
        .unwrap();
    client.lease_revoke(holder.kvs()[0].lease()).await.unwrap();
    // Revoking deletes the holder key (seen by the watch) and makes the next
    // keepalive answer "not found": whichever comes first is the one loss.
    let took = eventually("one lease loss", Duration::from_secs(2), || async {
        let mut total = 0.0;
        for reason in ["holder_changed", "expired", "revoked", "deadline"] {
            total += server
                .metric(&format!(
                    r#"snowkeep_lease_losses_total{{reason="{reason}"}}"#
                ))
                .await;
        }
        total == 1.0
    })
    .await;
    assert!(
        took <= Duration::from_millis(500),
        "loss seen after {took:?}"
    );
    assert_moved_off(&server, machine_id, &before).await;
    // The server recovered by itself, and nothing was at risk: the loss is a
    // warning, never an error.
    let log = server.log();
    let losses: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("machine-id lease lost"))
        .collect();
    assert_eq!(losses.len(), 1, "{log}");
    assert!(
        losses[0].contains(" WARN ")
            && losses[0].contains("machine-id lease lost; issuance stopped, claiming again"),
        "{}",
        losses[0]
    );
    assert!(!log.contains(" ERROR "), "{log}");
}

/// A server whose whole range is held by a frozen holder (SIGSTOPped, its
/// etcd lease counting down) waits for that lease to end, NOT_SERVING,
/// instead of exiting 1 at once (a crash loop under Kubernetes), then claims
/// the machine id and serves above the frozen holder's fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_held_by_an_ending_lease_is_waited_for_not_exited_on() {
    let etcd = EtcdProcess::start().await;
    let range = ["--machine-id-range", "3..4"];
    let frozen = ServerProcess::on_etcd(&etcd.endpoint(), "ending", &range);
    frozen.wait_serving(READY).await;
    let before = frozen.next_ids(10).await.unwrap();
    frozen.signal("STOP");

    let mut newcomer = ServerProcess::joining(&etcd.endpoint(), "ending", &range);
    eventually("the newcomer to find the range full", READY, || {
        let log = newcomer.log();
        async move { log.contains("no free machine id") }
    })
    .await;
    assert!(newcomer.is_running(), "log:\n{}", newcomer.log());
    assert_eq!(newcomer.health().await, Some(ServingStatus::NotServing));
    // The frozen holder's 2 s lease ends; its fence stands at most 3 s ahead.
    newcomer.wait_serving(READY).await;
    assert_eq!(newcomer.machine_id().await, 3);
    let after = newcomer.next_ids(10).await.unwrap();
    assert!(
        decode(after[0]).timestamp > decode(*before.last().unwrap()).timestamp,
        "{after:?} after {before:?}"
    );
    frozen.signal("CONT");
}
