//! The `ClaimStore` contract (`snowkeep_core::claim::conformance`) on the
//! etcd store against a real etcd, clause by clause, each in a namespace of
//! its own whose range holds exactly the two machine ids a store claims.
//! The same clauses run on the single-instance store and on the claim
//! loop's test double in snowkeep-core's unit tests.

use std::time::Duration;

use snowkeep_client::{Layout, SystemClock};
use snowkeep_core::claim::conformance as c;
use snowkeep_etcd::{EtcdSettings, EtcdStore};

use snowkeep_test_support::etcd::EtcdProcess;

use crate::claim::settings::claimer_settings;

/// A store of instance id `instance` claiming both machine ids of
/// `namespace`'s range 0..2 (the namespace is created on connect), with a
/// minute's fence wait so fences a few seconds ahead are claimed back.
async fn store(etcd: &EtcdProcess, namespace: &str, instance: &str) -> EtcdStore {
    let settings = EtcdSettings {
        machine_ids: 2,
        lease_ttl: Duration::from_secs(10),
        max_fence_wait: Duration::from_secs(60),
        ..claimer_settings(etcd, namespace, instance, 0..2)
    };
    Box::pin(EtcdStore::connect(
        settings,
        Layout::default(),
        SystemClock::shared(),
    ))
    .await
    .unwrap()
}

// Each clause and each connect is boxed: the etcd store's futures are large
// in a debug build (its claim path alone takes over a megabyte of stack to
// poll), and inline in one test's future they overflow the test thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_store_keeps_the_claim_store_contract() {
    let etcd = EtcdProcess::start().await;
    let mut s = store(&etcd, "c1", "a").await;
    Box::pin(c::claim_holds_distinct_machine_ids_fenced_at_or_above_their_floor(&mut s, 2)).await;
    // A fresh namespace: the claim creates both fence keys, one fence
    // horizon past the clock, and reports those fences.
    let mut s = store(&etcd, "c7", "a").await;
    Box::pin(c::the_fences_a_claim_reports_are_the_next_claims_floors(
        &mut s,
    ))
    .await;
    let mut s = store(&etcd, "c2", "a").await;
    Box::pin(c::persisted_fences_are_the_next_claims_floors(&mut s)).await;
    let mut s = store(&etcd, "c3", "a").await;
    Box::pin(c::a_release_leaves_the_last_used_timestamps_as_floors(
        &mut s,
    ))
    .await;
    let mut holder = store(&etcd, "c4", "a").await;
    let mut other = store(&etcd, "c4", "b").await;
    Box::pin(c::a_held_machine_id_is_not_claimed_by_another_store(
        &mut holder,
        Some(&mut other),
    ))
    .await;
    let mut s = store(&etcd, "c5", "a").await;
    Box::pin(c::a_renewal_moves_the_deadline_ahead(&mut s)).await;
    let mut s = store(&etcd, "c6", "a").await;
    Box::pin(c::a_store_that_claims_the_same_ids_says_so(&mut s)).await;
}
