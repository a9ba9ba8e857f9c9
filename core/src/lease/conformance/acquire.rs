//! The clauses of [`RequesterStore::acquire`]: a first grant, retries
//! with and without the token, a full range and a key's quota.

use std::collections::BTreeSet;

use super::{acquire, acquired, assert_refused, check, floors, ids, now, quota, requester};
use super::{layout_of, token_of, Ask, FIRST, MACHINE_IDS};
use crate::claim::StoreError;
use crate::lease::records::{LeaseCheck, LeaseToken, RequesterStore, FENCE_MARGIN};

/// An Acquire grants `count` distinct machine ids of the range for the
/// asked duration in the namespace's layout, with a new 64-hex-digit token
/// (not `known`: nothing was proved yet), each fence at least the lease's
/// expiry plus [`FENCE_MARGIN`] and never below its floor.
pub async fn an_acquire_grants_distinct_machine_ids_with_a_new_token<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "an acquire grants `count` distinct machine ids with a new token";
    let layout = layout_of(store, ns, clause).await;
    let before = now(&layout);
    let r = requester("grant");
    let grant = acquired(store, ns, Ask::new(&r, 2), clause).await;
    let distinct: BTreeSet<u16> = ids(&grant).into_iter().collect();
    assert_eq!(distinct.len(), 2, "{clause}: {:?}", grant.held);
    assert!(
        distinct.iter().all(|&id| u32::from(id) < MACHINE_IDS),
        "{clause}: {distinct:?} outside 0..{MACHINE_IDS}"
    );
    assert_eq!(token_of(&grant, clause).to_hex().len(), 64, "{clause}");
    assert_eq!(
        (grant.duration, grant.layout, grant.known),
        (FIRST, layout, false),
        "{clause}"
    );
    let expiry = before.saturating_add(FIRST + FENCE_MARGIN);
    for h in &grant.held {
        assert!(
            h.fence >= expiry,
            "{clause}: {h:?} fenced before {expiry:?}"
        );
        assert!(h.fence >= h.floor, "{clause}: {h:?} fenced below its floor");
    }
}

/// An Acquire retry presenting the token gets the same machine ids with the
/// same floors and the same token back, `known` (it proved it held them),
/// for at least the asked duration.
pub async fn a_retry_with_the_token_returns_the_same_grant<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "an acquire retry with the token returns the same ids and token";
    let r = requester("retry");
    let first = acquired(store, ns, Ask::new(&r, 2), clause).await;
    let token = token_of(&first, clause);
    let ask = Ask {
        token: Some(&token),
        ..Ask::new(&r, 2)
    };
    let again = acquired(store, ns, ask, clause).await;
    assert_eq!(floors(&again), floors(&first), "{clause}");
    assert_eq!(again.token, Some(token), "{clause}");
    assert!(again.known, "{clause}: a retry with the token is known");
    assert!(again.duration >= FIRST, "{clause}: {:?}", again.duration);
}

/// An Acquire retry presenting the token but asking for another number of
/// machine ids is [`StoreError::CountMismatch`] with both numbers, and
/// changes nothing (a retry with the right count still gets them).
pub async fn a_retry_with_another_count_is_a_count_mismatch<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "an acquire retry with another count is CountMismatch";
    let r = requester("recount");
    let first = acquired(store, ns, Ask::new(&r, 2), clause).await;
    let token = token_of(&first, clause);
    let with_token = |count| Ask {
        token: Some(&token),
        ..Ask::new(&r, count)
    };
    match acquire(store, ns, with_token(1)).await {
        Err(StoreError::CountMismatch { held: 2, asked: 1 }) => {}
        other => panic!("{clause}: not CountMismatch {{ held: 2, asked: 1 }}: {other:?}"),
    }
    let again = acquired(store, ns, with_token(2), clause).await;
    assert_eq!(ids(&again), ids(&first), "{clause}");
}

/// A second Acquire of a requester that holds machine ids, without its
/// token or with another, is [`StoreError::TokenRefused`] and changes
/// nothing: the holder's token still gets the same machine ids back.
pub async fn an_acquire_without_the_token_is_refused<S: RequesterStore>(store: &mut S, ns: &str) {
    let clause = "a second acquire without the token is TokenRefused";
    let r = requester("tokenless");
    let first = acquired(store, ns, Ask::new(&r, 2), clause).await;
    let token = token_of(&first, clause);
    let refused = acquire(store, ns, Ask::new(&r, 2)).await;
    assert_refused(refused, clause, "an acquire without a token");
    let wrong = LeaseToken::generate();
    let ask = Ask {
        token: Some(&wrong),
        ..Ask::new(&r, 2)
    };
    assert_refused(acquire(store, ns, ask).await, clause, "a wrong token");
    let ask = Ask {
        token: Some(&token),
        ..Ask::new(&r, 2)
    };
    let again = acquired(store, ns, ask, clause).await;
    assert_eq!(ids(&again), ids(&first), "{clause}");
}

/// While one requester holds every machine id of the range, another's
/// Acquire is [`StoreError::NoFreeMachineId`] naming the namespace and the
/// range.
pub async fn a_full_range_is_no_free_machine_id<S: RequesterStore>(store: &mut S, ns: &str) {
    let clause = "an acquire in a full range is NoFreeMachineId";
    let all = requester("all");
    let grant = acquired(store, ns, Ask::new(&all, MACHINE_IDS), clause).await;
    let every: Vec<u16> = (0..MACHINE_IDS).map(|id| id as u16).collect();
    assert_eq!(ids(&grant), every, "{clause}");
    match acquire(store, ns, Ask::new(&requester("late"), 1)).await {
        Err(StoreError::NoFreeMachineId {
            namespace,
            capacity: MACHINE_IDS,
            start: 0,
            end: MACHINE_IDS,
        }) if namespace == ns => {}
        other => panic!("{clause}: not NoFreeMachineId of 0..{MACHINE_IDS}: {other:?}"),
    }
}

/// A new claim that would take an API key's holdings over its quota is
/// [`StoreError::KeyQuotaExceeded`] with the holdings, quota and ask, and
/// nothing is claimed: the refused requester holds nothing, and the
/// machine id it asked for is still free for another.
pub async fn a_quota_that_would_be_exceeded_is_refused_with_nothing_claimed<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "a quota that would be exceeded is KeyQuotaExceeded, nothing claimed";
    let q = quota(2);
    let (first, second) = (requester("quota-1"), requester("quota-2"));
    let with_quota = |r, count| Ask {
        quota: Some(&q),
        ..Ask::new(r, count)
    };
    acquired(store, ns, with_quota(&first, 2), clause).await;
    match acquire(store, ns, with_quota(&second, 1)).await {
        Err(StoreError::KeyQuotaExceeded {
            key_id,
            held: 2,
            max: 2,
            asked: 1,
        }) if key_id == "k" => {}
        other => panic!("{clause}: not KeyQuotaExceeded {{ k, 2, 2, 1 }}: {other:?}"),
    }
    let found = check(store, ns, &second, None, 0, &[]).await;
    assert!(
        matches!(found, Ok(LeaseCheck::LeaseGone)),
        "{clause}: the refused requester holds something: {found:?}"
    );
    let last = acquired(store, ns, Ask::new(&requester("free"), 1), clause).await;
    assert_eq!(last.held.len(), 1, "{clause}");
}

/// An Acquire retry of machine ids already held is never refused for the
/// key's quota, even when the key's holdings are at the quota.
pub async fn a_retry_of_held_ids_is_not_refused_for_the_quota<S: RequesterStore>(
    store: &mut S,
    ns: &str,
) {
    let clause = "an acquire retry of held ids is not refused for the quota";
    let q = quota(2);
    let r = requester("quota-retry");
    let ask = Ask {
        quota: Some(&q),
        ..Ask::new(&r, 2)
    };
    let first = acquired(store, ns, ask, clause).await;
    let token = token_of(&first, clause);
    let ask = Ask {
        token: Some(&token),
        quota: Some(&q),
        ..Ask::new(&r, 2)
    };
    let again = acquired(store, ns, ask, clause).await;
    assert_eq!(ids(&again), ids(&first), "{clause}");
}
