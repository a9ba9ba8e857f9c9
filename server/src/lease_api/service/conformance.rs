//! The `RequesterStore` contract (`snowkeep_core::lease::conformance`) on
//! the handler's double, one test per clause, each on a double of its own
//! whose range is exactly the clauses' `0..MACHINE_IDS`. The same clauses
//! run on etcd's `RequesterLeases` in the server's integration tests
//! (`tests/it/lease/requester_conformance.rs`), so the double the handler's
//! tests rely on cannot drift from etcd.

use snowkeep_core::lease::conformance::{self as c, MACHINE_IDS};

use super::fake::Requesters;

/// The namespace every clause runs in (the double keeps one).
const NS: &str = "conformance";

/// A double granting machine ids `0..MACHINE_IDS`, nothing held.
fn double() -> Requesters {
    Requesters::with_range(0..MACHINE_IDS as u16)
}

/// One test per clause, on a fresh double.
macro_rules! clause {
    ($($clause:ident;)*) => {$(
        #[tokio::test]
        async fn $clause() {
            c::$clause(&mut double(), NS).await;
        }
    )*};
}

clause! {
    an_acquire_grants_distinct_machine_ids_with_a_new_token;
    a_retry_with_the_token_returns_the_same_grant;
    a_retry_with_another_count_is_a_count_mismatch;
    an_acquire_without_the_token_is_refused;
    a_full_range_is_no_free_machine_id;
    a_quota_that_would_be_exceeded_is_refused_with_nothing_claimed;
    a_retry_of_held_ids_is_not_refused_for_the_quota;
    a_renewal_extends_the_lease_and_raises_the_fences;
    a_renewal_with_a_wrong_token_is_refused;
    a_renewal_of_a_requester_holding_nothing_is_empty;
    a_release_counts_and_frees_the_machine_ids;
    a_release_with_a_wrong_token_is_refused;
    a_check_finds_the_live_lease_and_refuses_a_wrong_token;
    a_wrong_incarnation_is_gone_and_zero_skips_it;
    capacity_counts_the_range_and_the_held_machine_ids;
}
