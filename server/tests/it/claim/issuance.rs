//! Two servers on one namespace: distinct machine ids, unique ascending ids.

use std::collections::HashSet;
use std::time::Duration;

use snowkeep_client::{Layout, MachineId};
use snowkeep_proto::v1 as pb;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_namespace_hold_different_machine_ids() {
    let etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "two-servers", &[]);
    let b = ServerProcess::on_etcd(&etcd.endpoint(), "two-servers", &[]);
    a.wait_serving(READY).await;
    b.wait_serving(READY).await;
    let (ma, mb) = (a.machine_id().await, b.machine_id().await);
    assert_ne!(ma, mb);
    let layout = Layout::default();
    for (server, machine_id) in [(&a, ma), (&b, mb)] {
        let ids = server.next_ids(50).await.expect("NextIds");
        assert_eq!(ids.len(), 50);
        for id in ids {
            assert_eq!(
                layout.decode(id).unwrap().machine_id,
                MachineId(machine_id as u16)
            );
        }
    }
}

async fn stream_all(server: &ServerProcess, total: u64) -> Vec<u64> {
    let mut stream = server
        .ids()
        .await
        .stream_ids(pb::StreamIdsRequest {
            total,
            batch_size: 10_000,
            ..Default::default()
        })
        .await
        .expect("StreamIds")
        .into_inner();
    let mut ids = Vec::with_capacity(total as usize);
    while let Some(batch) = stream.message().await.expect("stream message") {
        ids.extend(batch.ids);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_ids_across_two_servers_are_unique_and_ascending() {
    let etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "million", &[]);
    let b = ServerProcess::on_etcd(&etcd.endpoint(), "million", &[]);
    a.wait_serving(READY).await;
    b.wait_serving(READY).await;
    let (from_a, from_b) = tokio::join!(stream_all(&a, 450_000), stream_all(&b, 450_000));
    // Plus unary batches from both, interleaved.
    let mut unary = Vec::new();
    for i in 0..100 {
        let server = if i % 2 == 0 { &a } else { &b };
        let batch = server.next_ids(1000).await.expect("NextIds");
        assert!(
            batch.windows(2).all(|w| w[0] < w[1]),
            "unary batch not ascending"
        );
        unary.extend(batch);
    }
    assert_eq!(from_a.len(), 450_000);
    assert_eq!(from_b.len(), 450_000);
    assert!(
        from_a.windows(2).all(|w| w[0] < w[1]),
        "stream from a not ascending"
    );
    assert!(
        from_b.windows(2).all(|w| w[0] < w[1]),
        "stream from b not ascending"
    );
    let all: HashSet<u64> = from_a
        .iter()
        .chain(&from_b)
        .chain(&unary)
        .copied()
        .collect();
    assert_eq!(all.len(), 1_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_ids_rejects_a_count_outside_its_range() {
    let etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "bad-count", &[]);
    a.wait_serving(READY).await;
    for count in [0, 100_001] {
        let err = a.next_ids(count).await.expect_err("must be rejected");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            err.message(),
            format!("count must be between 1 and 100000, got {count}")
        );
    }
    assert_eq!(
        a.next_ids(100_000)
            .await
            .expect("the maximum is allowed")
            .len(),
        100_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_another_layout_refuses_to_start() {
    let etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "layouts", &[]);
    a.wait_serving(READY).await;
    let mut b = ServerProcess::on_etcd(&etcd.endpoint(), "layouts", &["--layout", "40/13/10"]);
    let status = b.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(64));
    assert!(
        b.log().contains("has layout 41/12/10@1767225600000 in the store but this instance is configured with 40/13/10@1767225600000"),
        "log:\n{}",
        b.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requests_are_counted_by_method_and_final_code() {
    let etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "grpc-metrics", &[]);
    a.wait_serving(READY).await;
    for _ in 0..3 {
        a.next_ids(10).await.unwrap();
    }
    assert_eq!(
        a.next_ids(0).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let mut stream = a
        .ids()
        .await
        .stream_ids(pb::StreamIdsRequest {
            total: 5000,
            batch_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while stream.message().await.unwrap().is_some() {}
    let series = |method: &str, code: &str| {
        format!(
            r#"snowkeep_grpc_requests_total{{service="snowkeep.v1.IdService",method="{method}",protocol="grpc",code="{code}"}}"#
        )
    };
    assert_eq!(a.metric(&series("NextIds", "OK")).await, 3.0);
    assert_eq!(a.metric(&series("NextIds", "INVALID_ARGUMENT")).await, 1.0);
    assert_eq!(a.metric(&series("StreamIds", "OK")).await, 1.0);
    let in_flight = r#"snowkeep_grpc_requests_in_flight{service="snowkeep.v1.IdService",method="NextIds",protocol="grpc"}"#;
    assert_eq!(a.metric(in_flight).await, 0.0);
    let count = r#"snowkeep_grpc_request_duration_seconds_count{service="snowkeep.v1.IdService",method="NextIds",protocol="grpc"}"#;
    assert_eq!(a.metric(count).await, 4.0);
}
