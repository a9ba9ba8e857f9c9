//! The `RequesterStore` contract (`snowkeep_core::lease::conformance`) on
//! etcd's `RequesterLeases` against a real etcd, one test per clause, each
//! in a namespace of its own whose range is exactly the clauses'
//! `0..MACHINE_IDS`. The same clauses run on the Lease API handler's double
//! in the server's unit tests (`lease_api::service::conformance`), so the
//! double cannot drift from etcd.

use std::time::Duration;

use snowkeep_client::{Layout, SystemClock};
use snowkeep_core::lease::conformance::{self as c, MACHINE_IDS};
use snowkeep_etcd::requesters::RequesterLeases;
use snowkeep_etcd::{EtcdSettings, EtcdStore};

use snowkeep_test_support::etcd::EtcdProcess;

use crate::claim::settings::claimer_settings;

/// The Lease API's store on `namespace` (created on connect) of range
/// `0..MACHINE_IDS`, none of it claimed: the server's own store only opens
/// the namespace, it never claims here. A minute's fence wait, so a
/// released machine id fenced a lease ahead is granted again.
async fn requesters(etcd: &EtcdProcess, namespace: &str) -> RequesterLeases {
    let settings = EtcdSettings {
        max_fence_wait: Duration::from_secs(60),
        ..claimer_settings(etcd, namespace, "server", 0..MACHINE_IDS)
    };
    let store = Box::pin(EtcdStore::connect(
        settings,
        Layout::default(),
        SystemClock::shared(),
    ))
    .await
    .unwrap();
    RequesterLeases::new(&store)
}

/// One test per clause: etcd started, the clause boxed (etcd's futures are
/// large in a debug build and overflow a test thread's stack inline).
macro_rules! clause {
    ($($clause:ident in $ns:literal;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $clause() {
            let etcd = EtcdProcess::start().await;
            let mut store = requesters(&etcd, $ns).await;
            Box::pin(c::$clause(&mut store, $ns)).await;
        }
    )*};
}

clause! {
    an_acquire_grants_distinct_machine_ids_with_a_new_token in "rc1";
    a_retry_with_the_token_returns_the_same_grant in "rc2";
    a_retry_with_another_count_is_a_count_mismatch in "rc3";
    an_acquire_without_the_token_is_refused in "rc4";
    a_full_range_is_no_free_machine_id in "rc5";
    a_quota_that_would_be_exceeded_is_refused_with_nothing_claimed in "rc6";
    a_retry_of_held_ids_is_not_refused_for_the_quota in "rc7";
    a_renewal_extends_the_lease_and_raises_the_fences in "rc8";
    a_renewal_with_a_wrong_token_is_refused in "rc9";
    a_renewal_of_a_requester_holding_nothing_is_empty in "rc10";
    a_release_counts_and_frees_the_machine_ids in "rc11";
    a_release_with_a_wrong_token_is_refused in "rc12";
    a_check_finds_the_live_lease_and_refuses_a_wrong_token in "rc13";
    a_wrong_incarnation_is_gone_and_zero_skips_it in "rc14";
    capacity_counts_the_range_and_the_held_machine_ids in "rc15";
}
