//! What the Lease API costs etcd: O(1) keys and one lease per requester that
//! holds machine ids, and nothing for anyone else.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use snowkeep_client::{Clock, Requester, SystemClock};
use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, lease_client, release, renew};
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);

/// Every key in etcd and every lease.
async fn everything(etcd: &EtcdProcess) -> (BTreeSet<String>, BTreeSet<i64>) {
    let mut client = etcd.client().await;
    let keys = client
        .get(
            "",
            Some(
                snowkeep_etcd::etcd_client::GetOptions::new()
                    .with_all_keys()
                    .with_keys_only(),
            ),
        )
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect();
    let leases = client
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    (keys, leases)
}

fn stranger(i: u64) -> Requester {
    Requester {
        host_id: format!("flood-{}", i % 97),
        pid: 1 + (i % 65_000) as u32,
        start_unix_ms: 1_700_000_000_000 + i,
        nonce: format!("{:032x}", rand::random::<u128>()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_calls_from_unknown_requesters_leave_etcd_as_it_was() {
    let etcd = EtcdProcess::start().await;
    // A 10 s TTL: the load must not cost the server its own lease (that
    // would change the lease list for a reason of its own).
    let server = ServerProcess::spawn(&[
        "--etcd-endpoints",
        &etcd.endpoint(),
        "--namespace",
        "flood",
        "--create-namespace",
        "--lease-ttl",
        "10s",
    ]);
    server.wait_serving(READY).await;
    let (keys_before, leases_before) = everything(&etcd).await;
    assert_eq!(leases_before.len(), 1, "the server's own lease");

    let api = lease_client(&server).await;
    let now = SystemClock.unix_ms();
    let client_times = [0, u64::MAX, now - 3_600_000, now + 31_536_000_000];
    let wrong = "cd".repeat(32);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let workers: Vec<_> = (0..64)
        .map(|_| {
            let mut api = api.clone();
            let next = next.clone();
            let wrong = wrong.clone();
            tokio::spawn(async move {
                let mut codes = [0u32; 3];
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= 10_000 {
                        return codes;
                    }
                    let who = stranger(i);
                    let time = client_times[(i / 4) as usize % client_times.len()];
                    let token = if i % 8 < 4 { "" } else { wrong.as_str() };
                    match i % 4 {
                        0 | 1 => {
                            let grant = api
                                .renew(renew("flood", &who, token, Some(time)))
                                .await
                                .unwrap()
                                .into_inner();
                            assert!(grant.machine_ids.is_empty(), "{grant:?}");
                            assert_eq!((grant.expires_in_ms, grant.lease_token.as_str()), (0, ""));
                            codes[0] += 1;
                        }
                        2 => {
                            let released = api
                                .release(release("flood", &who, token, &[(0, time), (4095, 0)]))
                                .await
                                .unwrap()
                                .into_inner();
                            assert_eq!(released.released, 0);
                            codes[1] += 1;
                        }
                        _ => {
                            // A clock an hour behind: refused before anything is claimed.
                            let refused = api
                                .acquire(acquire("flood", &who, 1, Some(now - 3_600_000)))
                                .await
                                .unwrap_err();
                            assert_eq!(refused.code(), Code::FailedPrecondition);
                            codes[2] += 1;
                        }
                    }
                }
            })
        })
        .collect();
    let mut codes = [0u32; 3];
    for w in workers {
        for (total, n) in codes.iter_mut().zip(w.await.unwrap()) {
            *total += n;
        }
    }
    let took = started.elapsed();
    assert_eq!(codes, [5_000, 2_500, 2_500]);
    eprintln!("10,000 Lease API calls from unknown requesters took {took:?}");

    // etcd holds exactly what it held: not one key, not one lease more.
    let (keys_after, leases_after) = everything(&etcd).await;
    assert_eq!(keys_after, keys_before);
    assert_eq!(leases_after, leases_before);
    // Nothing was recorded of their clocks.
    assert_eq!(
        server
            .metric("snowkeep_clock_skew_seconds_count{namespace=\"flood\",source=\"client\"}")
            .await,
        0.0
    );
    assert_eq!(
        server
            .metric("snowkeep_client_clock_skew_requesters{namespace=\"flood\",over=\"threshold\"}")
            .await,
        0.0
    );
    assert_eq!(
        server.metric("snowkeep_clock_skew_rejections_total").await,
        2_500.0
    );
    // Claims still work: a new server serves, a new requester gets a machine id.
    let newcomer = ServerProcess::on_etcd(&etcd.endpoint(), "flood", &[]);
    newcomer.wait_serving(READY).await;
    let grant = lease_client(&newcomer)
        .await
        .acquire(acquire("flood", &stranger(20_000), 1, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 1);
}
