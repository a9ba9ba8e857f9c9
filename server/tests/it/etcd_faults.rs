//! etcd going away: issuance stops within the lease TTL, and resumes once etcd
//! is back, without restarting the servers.

use std::collections::HashSet;
use std::time::Duration;

use tonic::Code;

use crate::support::etcd::EtcdProcess;
use crate::support::eventually;
use crate::support::server::ServerProcess;

const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_etcd_stops_issuance_within_the_ttl_and_it_resumes_after() {
    let mut etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "etcd-down", &[]);
    let b = ServerProcess::on_etcd(&etcd.endpoint(), "etcd-down", &[]);
    a.wait_serving(Duration::from_secs(20)).await;
    b.wait_serving(Duration::from_secs(20)).await;
    let mut seen: HashSet<u64> = HashSet::new();
    for s in [&a, &b] {
        seen.extend(s.next_ids(1000).await.expect("NextIds before the fault"));
    }
    let (mut ca, mut cb) = (a.ids().await, b.ids().await);

    etcd.kill();
    let started = tokio::time::Instant::now();
    for (name, client) in [("a", &mut ca), ("b", &mut cb)] {
        eventually(&format!("server {name} to refuse"), TTL * 3, || {
            let mut c = client.clone();
            async move {
                matches!(
                    c.next_ids(snowkeep_proto::v1::NextIdsRequest { count: 1, ..Default::default() }).await,
                    Err(s) if s.code() == Code::Unavailable
                )
            }
        })
        .await;
    }
    let stopped_after = started.elapsed();
    // The deadline counts from the last keepalive *sent* before the kill, so
    // issuance must stop no later than one TTL after it (plus polling slack).
    assert!(
        stopped_after <= TTL + Duration::from_millis(500),
        "stopped only after {stopped_after:?}"
    );
    assert_eq!(
        a.health().await,
        Some(tonic_health::pb::health_check_response::ServingStatus::NotServing)
    );

    etcd.restart().await;
    a.wait_serving(Duration::from_secs(30)).await;
    b.wait_serving(Duration::from_secs(30)).await;
    for s in [&a, &b] {
        for id in s.next_ids(1000).await.expect("NextIds after etcd is back") {
            assert!(seen.insert(id), "id {id} issued twice");
        }
    }
    assert_eq!(seen.len(), 4000);
    let (mut a, mut b) = (a, b);
    assert!(
        a.is_running() && b.is_running(),
        "servers must recover without a restart"
    );
    for s in [&a, &b] {
        assert_eq!(
            s.metric(r#"snowkeep_lease_losses_total{reason="deadline"}"#)
                .await,
            1.0
        );
        assert_eq!(
            s.metric(r#"snowkeep_lease_losses_total{reason="expired"}"#)
                .await,
            0.0
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
    assert_eq!(
        capacity.message(),
        "this server is not connected to etcd yet; retry shortly or on another snowkeep server"
    );
    etcd.restart().await;
    server.wait_serving(Duration::from_secs(30)).await;
    assert_eq!(server.next_ids(10).await.unwrap().len(), 10);
}
