//! Claims straight through the etcd store (no gRPC): a storm of concurrent
//! claimers, and crash-restarts that abandon their leases.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use snowkeep_client::{Layout, Millis, SystemClock};
use snowkeep_core::claim::StoreError;
use snowkeep_etcd::{EtcdSettings, EtcdStore};

use crate::claim::settings::claimer_settings;
use snowkeep_test_support::etcd::EtcdProcess;

fn settings(
    etcd: &EtcdProcess,
    namespace: &str,
    instance: usize,
    range: std::ops::Range<u32>,
) -> EtcdSettings {
    claimer_settings(etcd, namespace, &format!("claimer-{instance}"), range)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_claimers_get_distinct_machine_ids() {
    let etcd = EtcdProcess::start().await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let mut s = settings(&etcd, "storm", i, 0..4096);
        // Nothing renews these leases: a 2 s lease can run out while a
        // loaded machine still works through 200 claims, and a claimer then
        // rightly takes a machine id whose lease ended. Long enough here.
        s.lease_ttl = Duration::from_secs(20);
        tasks.push(tokio::spawn(async move {
            let mut store = EtcdStore::connect(s, Layout::default(), SystemClock::shared())
                .await
                .unwrap();
            let t0 = tokio::time::Instant::now();
            let claim = store.claim().await.unwrap();
            (claim.held[0], t0.elapsed(), store)
        }));
    }
    let mut ids = HashSet::new();
    let mut took = Vec::new();
    let mut stores = Vec::new();
    for t in tasks {
        let (held, d, store) = t.await.unwrap();
        assert!(
            ids.insert(held.machine_id),
            "machine id {} claimed twice",
            held.machine_id
        );
        // A new namespace: every fence key is counted, so each first claim
        // starts at the namespace floor (0), none a fence horizon ahead,
        // however many claims count their block at once.
        assert_eq!(held.floor, Millis(0), "machine id {}", held.machine_id);
        took.push(d);
        stores.push(store);
    }
    assert_eq!(ids.len(), 200);
    took.sort();
    eprintln!(
        "claim storm: 200 claimers, p50 {:?}, p99 {:?}, max {:?}",
        took[99], took[197], took[199]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_crash_restarts_never_exhaust_the_pool() {
    // Each restart is a new instance id (host:pid:random changes on restart)
    // whose predecessor died without releasing: its lease simply stops being
    // renewed. 1,000 restarts at ~80/s over 384 machine ids only succeed if
    // expired leases give their machine ids back.
    let etcd = EtcdProcess::start().await;
    let mut claims_per_id: HashMap<u16, u32> = HashMap::new();
    let pace = Duration::from_millis(12);
    for i in 0..1000 {
        let t0 = tokio::time::Instant::now();
        let mut store = EtcdStore::connect(
            settings(&etcd, "restarts", i, 0..384),
            Layout::default(),
            SystemClock::shared(),
        )
        .await
        .unwrap();
        match store.claim().await {
            Ok(claim) => {
                *claims_per_id
                    .entry(claim.held[0].machine_id.get())
                    .or_default() += 1
            }
            Err(e @ StoreError::NoFreeMachineId { .. }) => panic!("restart {i}: {e}"),
            Err(e) => panic!("restart {i}: unexpected {e}"),
        }
        drop(store); // kill -9: no release, the lease is left to expire
        tokio::time::sleep_until(t0 + pace).await;
    }
    assert_eq!(claims_per_id.values().sum::<u32>(), 1000);
    assert!(claims_per_id.len() <= 384);
    assert!(claims_per_id.values().any(|&n| n > 1));
}
