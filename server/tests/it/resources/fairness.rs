//! Request load must not take the CPU that the claim loop needs: many
//! unbounded one-id-per-message streams, read as fast as the client can, run
//! for three short fence leads while the server keeps raising its fence, renewing
//! its lease and answering a small `NextIds` with exactly the ids asked for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use snowkeep_proto::v1 as pb;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;

/// Open streams: more than one connection carries (`--http2-max-concurrent-streams`
/// 64 by default), so they are spread over `CONNECTIONS` connections.
const STREAMS: usize = 150;
const CONNECTIONS: usize = 3;
/// A short fence lead (1.5 × a 1 s outage budget, raised once per 0.5 s
/// while busy), so three of them pass quickly and a claim loop held up for
/// a fraction of one lets issuance reach the fence.
const HORIZON: Duration = Duration::from_millis(1_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_loop_keeps_its_fences_ahead_under_150_one_id_streams() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "fair",
        &[
            "--outage-budget",
            "1s",
            "--max-open-streams",
            "200",
            "--max-concurrent-calls",
            "256",
        ],
    );
    server.wait_serving(Duration::from_secs(20)).await;

    let received = Arc::new(AtomicU64::new(0));
    let ended = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(server.ids().await);
    }
    // Opened all at once before any is read: opened one by one, each open
    // would queue behind the streams already being read.
    let opens = (0..STREAMS).map(|i| {
        let mut client = clients[i % CONNECTIONS].clone();
        async move {
            client
                .stream_ids(pb::StreamIdsRequest {
                    total: 0,
                    batch_size: 1,
                    ..Default::default()
                })
                .await
                .expect("StreamIds opens")
                .into_inner()
        }
    });
    let streams = futures_util::future::join_all(opens).await;
    let mut readers = Vec::new();
    for mut stream in streams {
        let (received, ended) = (received.clone(), ended.clone());
        readers.push(tokio::spawn(async move {
            loop {
                match stream.message().await {
                    Ok(Some(batch)) => {
                        received.fetch_add(batch.ids.len() as u64, Ordering::Relaxed);
                    }
                    _ => {
                        ended.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }
        }));
    }

    // The load itself: it must run for three horizons, the time a stalled
    // claim loop needs to let issuance reach a fence it did not raise.
    let before = received.load(Ordering::Relaxed);
    tokio::time::sleep(3 * HORIZON).await;
    let during = received.load(Ordering::Relaxed) - before;

    let ids = server.next_ids(100).await;
    let errors = server
        .metric("snowkeep_fence_advances_total{result=\"error\"}")
        .await;
    let renewal_errors = server
        .metric("snowkeep_lease_renewals_total{result=\"error\"}")
        .await;
    let fence_refusals = server
        .metric("snowkeep_issuance_refusals_total{namespace=\"fair\",reason=\"fence_reached\"}")
        .await;
    let streams_ended = ended.load(Ordering::Relaxed);
    for r in &readers {
        r.abort();
    }
    let log = server.log();

    assert!(during > 0, "the streams delivered no id under load");
    let ids = ids.unwrap_or_else(|s| panic!("NextIds under load: {s:?}; log:\n{log}"));
    assert_eq!(ids.len(), 100, "log:\n{log}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(errors, 0.0, "fence advances failed; log:\n{log}");
    assert_eq!(renewal_errors, 0.0, "lease renewals failed; log:\n{log}");
    assert_eq!(
        fence_refusals, 0.0,
        "issuance reached its fence; log:\n{log}"
    );
    assert_eq!(streams_ended, 0, "streams ended under load; log:\n{log}");
}
