//! etcd going away: a busy server issues on below its persisted fences for
//! its outage budget, stops cleanly at them, and resumes once etcd is back,
//! without restarting.

use std::collections::HashSet;
use std::time::Duration;

use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::eventually;
use snowkeep_test_support::server::ServerProcess;

/// The servers' outage budget: fences between 3 s and 4.5 s ahead while busy.
const BUDGET: Duration = Duration::from_secs(3);
/// The farthest ahead a fence can be: 1.5 budgets.
const LEAD: Duration = Duration::from_millis(4_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_etcd_leaves_busy_servers_issuing_for_their_budget_then_they_stop_at_the_fence() {
    let mut etcd = EtcdProcess::start().await;
    let budget = format!("{}s", BUDGET.as_secs());
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "etcd-down", &["--outage-budget", &budget]);
    a.wait_serving(Duration::from_secs(20)).await;
    let b = ServerProcess::joining(&etcd.endpoint(), "etcd-down", &["--outage-budget", &budget]);
    b.wait_serving(Duration::from_secs(20)).await;
    let pids = (a.pid(), b.pid());
    let mut seen: HashSet<u64> = HashSet::new();
    for s in [&a, &b] {
        seen.extend(s.next_ids(1000).await.expect("NextIds before the fault"));
    }
    let (mut ca, mut cb) = (a.ids().await, b.ids().await);
    // Both busy for a while, so each keeps its fences a budget ahead.
    for _ in 0..100 {
        for c in [&mut ca, &mut cb] {
            let ids = c
                .next_ids(snowkeep_proto::v1::NextIdsRequest {
                    count: 10,
                    ..Default::default()
                })
                .await
                .expect("NextIds while etcd is up")
                .into_inner()
                .ids;
            seen.extend(ids);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    etcd.kill();
    let killed = tokio::time::Instant::now();
    // Calls every 20 ms on both servers: each issues on until its clock
    // reaches the lowest fence, then refuses.
    let mut refused_at = [None, None];
    while refused_at.iter().any(Option::is_none) && killed.elapsed() < LEAD * 2 {
        for (i, c) in [&mut ca, &mut cb].into_iter().enumerate() {
            if refused_at[i].is_some() {
                continue;
            }
            match c
                .next_ids(snowkeep_proto::v1::NextIdsRequest {
                    count: 10,
                    ..Default::default()
                })
                .await
            {
                Ok(r) => {
                    for id in r.into_inner().ids {
                        assert!(seen.insert(id), "id {id} issued twice");
                    }
                }
                Err(s) => {
                    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                    assert!(
                        s.message().contains("clock reached the persisted fence"),
                        "{s:?}"
                    );
                    refused_at[i] = Some(killed.elapsed());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (name, at) in ["a", "b"].into_iter().zip(refused_at) {
        let at = at.unwrap_or_else(|| panic!("server {name} never stopped"));
        // Never before the budget, less the slack of a raise that comes
        // due while the loop is in a renewal (its request timeout, 500 ms for
        // a 2 s TTL, plus a fence write); never after the farthest fence
        // (plus polling slack).
        assert!(
            at >= BUDGET - Duration::from_millis(600) && at <= LEAD + Duration::from_millis(500),
            "server {name} stopped {at:?} after etcd died (budget {BUDGET:?}, lead {LEAD:?})"
        );
    }
    // Health turns at the fence (pinned to the millisecond by the health
    // follower's own test); here, only that it does, whatever the load.
    for s in [&a, &b] {
        eventually(
            "health to say NOT_SERVING",
            Duration::from_secs(2),
            || async {
                s.health().await
                    == Some(tonic_health::pb::health_check_response::ServingStatus::NotServing)
            },
        )
        .await;
    }

    etcd.restart().await;
    a.wait_serving(Duration::from_secs(30)).await;
    b.wait_serving(Duration::from_secs(30)).await;
    let before = seen.len();
    for s in [&a, &b] {
        for id in s.next_ids(1000).await.expect("NextIds after etcd is back") {
            assert!(seen.insert(id), "id {id} issued twice");
        }
    }
    assert_eq!(seen.len(), before + 2000);
    let (mut a, mut b) = (a, b);
    assert!(
        a.is_running() && b.is_running() && (a.pid(), b.pid()) == pids,
        "servers must recover without a restart"
    );
    for s in [&a, &b] {
        assert_eq!(
            s.metric(r#"snowkeep_lease_losses_total{reason="deadline"}"#)
                .await,
            0.0,
            "the lease deadline no longer stops a server"
        );
        // A fence write in flight when etcd came back may commit with its
        // answer lost; the next write takes it as the server's own.
        assert_eq!(
            s.metric(r#"snowkeep_lease_losses_total{reason="holder_changed"}"#)
                .await,
            0.0,
            "an unanswered fence write of the server's own read as tampering"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_before_etcd_waits_for_it() {
    let mut etcd = EtcdProcess::start().await;
    etcd.kill();
    let mut server = ServerProcess::on_etcd(&etcd.endpoint(), "late-etcd", &[]);
    eventually(
        "the server to report etcd unreachable",
        Duration::from_secs(10),
        || async { server.log().contains("etcd is not reachable yet; retrying") },
    )
    .await;
    assert!(server.is_running(), "log:\n{}", server.log());
    // It answers meanwhile: not serving, and calls refused with a reason.
    assert_eq!(
        server.health().await,
        Some(tonic_health::pb::health_check_response::ServingStatus::NotServing)
    );
    assert_eq!(
        server.next_ids(1).await.unwrap_err().code(),
        Code::Unavailable
    );
    let capacity =
        snowkeep_proto::v1::info_service_client::InfoServiceClient::new(server.channel().await)
            .get_capacity(snowkeep_proto::v1::GetCapacityRequest {})
            .await
            .unwrap_err();
    assert_eq!(capacity.code(), Code::Unavailable);
    // Before it has read the cluster's security mode from etcd, a server
    // serves nothing a key may guard (docs/operations.md, "API keys").
    assert_eq!(
        capacity.message(),
        "this server has not read the cluster's security mode from etcd yet, so it cannot tell whether this call needs an API key; retry shortly or on another server"
    );
    etcd.restart().await;
    server.wait_serving(Duration::from_secs(30)).await;
    assert_eq!(server.next_ids(10).await.unwrap().len(), 10);
}
