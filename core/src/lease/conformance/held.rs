//! The clauses on a held lease: [`RequesterStore::renew`],
//! [`RequesterStore::release`], [`RequesterStore::check`], the
//! incarnation rule, and [`RequesterStore::capacity`]. A refusal is
//! [`StoreError::TokenRefused`](crate::claim::StoreError::TokenRefused).

use std::time::Duration;

use super::RENEWED;
use super::{acquired, assert_refused, check, fences, floors, ids, release, renew, renewed};
use super::{incarnation_of, requester, token_of, unused, valid, Ask, FIRST, MACHINE_IDS};
use crate::claim::Capacity;
use crate::lease::records::{LeaseCheck, LeaseToken, Renewal, RequesterStore, StoreResult};

/// A Renew presenting the token extends the lease to the asked duration
/// (a Check then finds more left than the first lease had) and raises
/// every fence, keeping the machine ids and floors; the grant carries no
/// token, is `known`, and names the namespace's incarnation.
pub async fn a_renewal_extends_the_lease_and_raises_the_fences<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "a renewal with the token extends the lease and raises the fences";
    let incarnation = incarnation_of(store, ns, clause).await;
    let r = requester("renew");
    let first = acquired(store, ns, Ask::new(&r, 2), clause).await;
    let token = token_of(&first, clause);
    let (grant, found) = renewed(store, ns, &r, Some(&token), incarnation, clause).await;
    assert_eq!(found, incarnation, "{clause}");
    assert_eq!(floors(&grant), floors(&first), "{clause}");
    assert_eq!(
        (grant.duration, grant.token.is_none(), grant.known),
        (RENEWED, true, true),
        "{clause}"
    );
    for ((id, before), (_, after)) in fences(&first).into_iter().zip(fences(&grant)) {
        assert!(
            after > before,
            "{clause}: fence of {id} {before} -> {after}"
        );
    }
    let left = valid(
        check(store, ns, &r, Some(&token), incarnation, &[]).await,
        clause,
        "a check after the renewal",
    );
    assert!(left > FIRST, "{clause}: {left:?} left");
}

/// A Renew of a requester that holds machine ids, without its token or
/// with another, is `TokenRefused` and changes nothing: the
/// lease is still valid for its token.
pub async fn a_renewal_with_a_wrong_token_is_refused<S: RequesterStore>(store: &mut S, ns: &str) {
    let clause = "a renewal with a wrong token is TokenRefused";
    let r = requester("renew-wrong");
    let first = acquired(store, ns, Ask::new(&r, 1), clause).await;
    let token = token_of(&first, clause);
    let wrong = LeaseToken::generate();
    let refused = renew(store, ns, &r, Some(&wrong), 0).await;
    assert_refused(refused, clause, "a renewal with a wrong token");
    let refused = renew(store, ns, &r, None, 0).await;
    assert_refused(refused, clause, "a renewal without a token");
    let left = valid(
        check(store, ns, &r, Some(&token), 0, &[]).await,
        clause,
        "a check after the refusals",
    );
    assert!(
        left <= FIRST,
        "{clause}: the lease was extended to {left:?}"
    );
}

/// A Renew of a requester that holds nothing is granted, empty: no machine
/// ids, no token, not `known`.
pub async fn a_renewal_of_a_requester_holding_nothing_is_empty<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "a renewal of a requester holding nothing is an empty grant";
    let r = requester("nobody");
    let (grant, _) = renewed(store, ns, &r, None, 0, clause).await;
    assert_eq!(
        (grant.held.len(), grant.token.is_none(), grant.known),
        (0, true, false),
        "{clause}: {grant:?}"
    );
}

/// A Release presenting the token returns how many machine ids it
/// released, and frees them: another requester then gets the whole range,
/// each floor below the released grant's fence (a release lowers the
/// fences it is told the last timestamps of: here, nothing stamped above
/// the floors). A second Release, and one of a requester that never held
/// anything, return 0.
pub async fn a_release_counts_and_frees_the_machine_ids<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "a release returns how many it released and frees them";
    let r = requester("release");
    let first = acquired(store, ns, Ask::new(&r, MACHINE_IDS), clause).await;
    let token = token_of(&first, clause);
    let last_used = unused(&first);
    let released = Box::pin(store.release(ns, None, &r, &last_used, Some(&token))).await;
    assert_eq!(released.ok(), Some(MACHINE_IDS), "{clause}");
    let again = release(store, ns, &r, Some(&token)).await;
    assert_eq!(again.ok(), Some(0), "{clause}: a second release");
    let never = release(store, ns, &requester("never"), None).await;
    assert_eq!(never.ok(), Some(0), "{clause}: a requester holding nothing");
    let next = acquired(store, ns, Ask::new(&requester("next"), MACHINE_IDS), clause).await;
    assert_eq!(ids(&next), ids(&first), "{clause}");
    for ((id, floor), (_, fence)) in floors(&next).into_iter().zip(fences(&first)) {
        assert!(
            floor < fence,
            "{clause}: {id} floor {floor}, released at {fence}"
        );
    }
}

/// A Release of a requester that holds machine ids, without its token or
/// with another, is `TokenRefused` and keeps them held.
pub async fn a_release_with_a_wrong_token_is_refused<S: RequesterStore>(store: &mut S, ns: &str) {
    let clause = "a release with a wrong token is TokenRefused";
    let r = requester("release-wrong");
    let first = acquired(store, ns, Ask::new(&r, 1), clause).await;
    let token = token_of(&first, clause);
    let wrong = LeaseToken::generate();
    let refused = release(store, ns, &r, Some(&wrong)).await;
    assert_refused(refused, clause, "a release with a wrong token");
    assert_refused(release(store, ns, &r, None).await, clause, "no token");
    valid(
        check(store, ns, &r, Some(&token), 0, &[]).await,
        clause,
        "a check after the refusals",
    );
}

/// A Check presenting the token finds a live lease `Valid` with some of
/// its duration left, with or without its machine ids named; other machine
/// ids, or a requester that holds nothing, are `LeaseGone`; a wrong or
/// missing token is `TokenRefused`.
pub async fn a_check_finds_the_live_lease_and_refuses_a_wrong_token<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "a check is valid for the live lease and refuses a wrong token";
    let incarnation = incarnation_of(store, ns, clause).await;
    let r = requester("check");
    let first = acquired(store, ns, Ask::new(&r, 2), clause).await;
    let token = token_of(&first, clause);
    let named: Vec<u32> = ids(&first).into_iter().map(u32::from).collect();
    let left = valid(
        check(store, ns, &r, Some(&token), incarnation, &named).await,
        clause,
        "a check naming its machine ids",
    );
    assert!(left > Duration::ZERO && left <= FIRST, "{clause}: {left:?}");
    valid(
        check(store, ns, &r, Some(&token), 0, &[]).await,
        clause,
        "a check naming nothing",
    );
    let other = check(store, ns, &r, Some(&token), 0, &named[..1]).await;
    assert!(
        matches!(other, Ok(LeaseCheck::LeaseGone)),
        "{clause}: other machine ids: {other:?}"
    );
    let nobody = check(store, ns, &requester("no-one"), None, 0, &[]).await;
    assert!(
        matches!(nobody, Ok(LeaseCheck::LeaseGone)),
        "{clause}: a requester holding nothing: {nobody:?}"
    );
    let wrong = LeaseToken::generate();
    let refused = check(store, ns, &r, Some(&wrong), 0, &[]).await;
    assert_refused(refused, clause, "a check with a wrong token");
    assert_refused(check(store, ns, &r, None, 0, &[]).await, clause, "none");
}

/// A Renew or Check of another incarnation than the namespace's is gone
/// ([`Renewal::Gone`] / [`LeaseCheck::NamespaceGone`]) and renews nothing;
/// incarnation 0 skips the comparison.
pub async fn a_wrong_incarnation_is_gone_and_zero_skips_it<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "a wrong incarnation is Gone, 0 skips the comparison";
    let incarnation = incarnation_of(store, ns, clause).await;
    let r = requester("incarnation");
    let first = acquired(store, ns, Ask::new(&r, 1), clause).await;
    let token = token_of(&first, clause);
    let other = incarnation + 1;
    match renew(store, ns, &r, Some(&token), other).await {
        Ok(Renewal::Gone(LeaseCheck::NamespaceGone)) => {}
        found => panic!("{clause}: a renewal of another incarnation: {found:?}"),
    }
    let found = check(store, ns, &r, Some(&token), other, &[]).await;
    assert!(
        matches!(found, Ok(LeaseCheck::NamespaceGone)),
        "{clause}: a check of another incarnation: {found:?}"
    );
    let left = valid(
        check(store, ns, &r, Some(&token), 0, &[]).await,
        clause,
        "a check of incarnation 0",
    );
    assert!(
        left <= FIRST,
        "{clause}: a Gone renewal extended to {left:?}"
    );
    let (grant, found) = renewed(store, ns, &r, Some(&token), 0, clause).await;
    assert_eq!((ids(&grant), found), (ids(&first), incarnation), "{clause}");
}

/// Capacity counts the namespace's range: all [`MACHINE_IDS`] free at
/// first, then the ones a requester holds.
pub async fn capacity_counts_the_range_and_the_held_machine_ids<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "capacity counts the range and its held machine ids";
    let counted = |found: StoreResult<(Capacity, std::ops::Range<u32>)>| {
        found.unwrap_or_else(|e| panic!("{clause}: capacity failed: {e}"))
    };
    let empty = counted(Box::pin(store.capacity(ns)).await);
    let total = MACHINE_IDS;
    assert_eq!(empty, (Capacity { total, held: 0 }, 0..total), "{clause}");
    acquired(store, ns, Ask::new(&requester("counted"), 2), clause).await;
    let two = counted(Box::pin(store.capacity(ns)).await);
    assert_eq!(two, (Capacity { total, held: 2 }, 0..total), "{clause}");
}
