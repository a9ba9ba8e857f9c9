//! The [`ClaimStore`] contract as executable clauses, one function each, so
//! every store is held to the same rules: the claim loop's test double (in
//! this crate's tests), the single-instance store (this crate's tests) and
//! the etcd store (the server's integration tests, against real etcd).
//!
//! A clause takes stores a caller opened on a namespace of its own whose
//! range holds exactly `slots` machine ids, the number each store claims,
//! so a claim after a release or an abandon must take the same machine ids
//! again. A clause panics, naming the rule, when the store breaks it.
//!
//! Where each rule comes from: the safety invariant of docs/design.md (a
//! machine id has one holder; a holder stamps only above its floor, the
//! previous holder's fence; a release lowers a fence to the last timestamp
//! stamped) and the method documents of [`ClaimStore`].

use snowkeep_client::Millis;
use std::collections::BTreeSet;

use super::{Claim, ClaimStore, StoreError};

/// How far clauses raise fences above a claim's floors, layout ms: a few
/// seconds, so that a store which does not claim machine ids fenced further
/// ahead of its clock than its longest fence wait (the etcd store's
/// `--max-fence-wait`) still claims them back when the floors were near the
/// clock; callers give such a store a wait of at least a minute.
const RAISE_MS: u64 = 5_000;

/// Claims, panicking with the clause's name on an error. The claim future
/// is boxed: a store's (the etcd store's) is large in a debug build, and
/// nested inside a clause's it overflows a test thread's stack.
async fn claimed<S: ClaimStore>(store: &mut S, clause: &str) -> Claim<S::Lease> {
    Box::pin(store.claim())
        .await
        .unwrap_or_else(|e| panic!("{clause}: claim failed: {e}"))
}

/// Every fence raised by `by` ms (never below its floor: a holder never
/// lowers a fence it holds).
fn raised<L>(claim: &Claim<L>, by: u64) -> Vec<Millis> {
    claim
        .held
        .iter()
        .map(|h| Millis(h.fence.max(h.floor).get() + by))
        .collect()
}

/// The floors of a claim, by machine id.
fn floors<L>(claim: &Claim<L>) -> Vec<(u16, u64)> {
    let mut f: Vec<_> = claim
        .held
        .iter()
        .map(|h| (h.machine_id.get(), h.floor.get()))
        .collect();
    f.sort_unstable();
    f
}

/// A claim holds exactly `slots` distinct machine ids, and each starts with
/// its fence at or above its floor: at the floor, or above it when the claim
/// itself persisted a higher fence (the etcd store's never-used machine ids,
/// whose fence keys it creates at the value of a first raise).
pub async fn claim_holds_distinct_machine_ids_fenced_at_or_above_their_floor<S: ClaimStore>(
    store: &mut S,
    slots: usize,
) {
    let clause = "a claim holds `slots` distinct machine ids, fence >= floor";
    let claim = claimed(store, clause).await;
    assert_eq!(claim.held.len(), slots, "{clause}: {:?}", claim.held);
    let distinct: BTreeSet<u16> = claim.held.iter().map(|h| h.machine_id.get()).collect();
    assert_eq!(distinct.len(), slots, "{clause}: {:?}", claim.held);
    for h in &claim.held {
        assert!(h.fence >= h.floor, "{clause}: {h:?}");
    }
    store.abandon(&claim).await;
}

/// The fences a claim reports are persisted with it: abandoned at once, with
/// no fence written since, the next claim of the same machine ids has them
/// as its floors. A store that reported a fence above what it holds would
/// let the next holder stamp below what the first one was granted.
pub async fn the_fences_a_claim_reports_are_the_next_claims_floors<S: ClaimStore>(store: &mut S) {
    let clause = "the fences a claim reports are the next claim's floors";
    let first = claimed(store, clause).await;
    store.abandon(&first).await;
    let second = claimed(store, clause).await;
    let mut expected: Vec<(u16, u64)> = first
        .held
        .iter()
        .map(|h| (h.machine_id.get(), h.fence.get()))
        .collect();
    expected.sort_unstable();
    assert_eq!(floors(&second), expected, "{clause}");
    store.abandon(&second).await;
}

/// Fences a holder persisted are the floors of the next claim of the same
/// machine ids, after the claim is abandoned (which leaves fences as they
/// are): a new holder stamps only above what the old one may have stamped.
pub async fn persisted_fences_are_the_next_claims_floors<S: ClaimStore>(store: &mut S) {
    let clause = "persisted fences are the next claim's floors";
    let first = claimed(store, clause).await;
    let fences = raised(&first, RAISE_MS);
    store
        .advance_fences(&first, &fences)
        .await
        .unwrap_or_else(|e| panic!("{clause}: advance_fences failed: {e}"));
    store.abandon(&first).await;
    let second = claimed(store, clause).await;
    let expected: Vec<(u16, u64)> = {
        let mut e: Vec<_> = first
            .held
            .iter()
            .zip(&fences)
            .map(|(h, f)| (h.machine_id.get(), f.get()))
            .collect();
        e.sort_unstable();
        e
    };
    assert_eq!(floors(&second), expected, "{clause}");
    store.abandon(&second).await;
}

/// A release lowers each fence to the last timestamp the holder stamped, so
/// the next claim's floors are those timestamps (not the higher fences).
pub async fn a_release_leaves_the_last_used_timestamps_as_floors<S: ClaimStore>(store: &mut S) {
    let clause = "a release lowers each fence to the last timestamp used";
    let first = claimed(store, clause).await;
    store
        .advance_fences(&first, &raised(&first, RAISE_MS))
        .await
        .unwrap_or_else(|e| panic!("{clause}: advance_fences failed: {e}"));
    let last_used = raised(&first, 5);
    store
        .release(&first, &last_used)
        .await
        .unwrap_or_else(|e| panic!("{clause}: release failed: {e}"));
    let second = claimed(store, clause).await;
    let mut expected: Vec<(u16, u64)> = first
        .held
        .iter()
        .zip(&last_used)
        .map(|(h, f)| (h.machine_id.get(), f.get()))
        .collect();
    expected.sort_unstable();
    assert_eq!(floors(&second), expected, "{clause}");
    store.abandon(&second).await;
}

/// While one store holds every machine id of the range, another store's
/// claim is refused with [`StoreError::NoFreeMachineId`]; `None` for a
/// store that refuses a second holder before any claim (the single-instance
/// store's lock), which is the same rule kept earlier.
pub async fn a_held_machine_id_is_not_claimed_by_another_store<S: ClaimStore>(
    holder: &mut S,
    other: Option<&mut S>,
) {
    let clause = "a held machine id is not claimed by another store";
    let claim = claimed(holder, clause).await;
    if let Some(other) = other {
        match other.claim().await {
            Err(StoreError::NoFreeMachineId { .. }) => {}
            Err(e) => panic!("{clause}: refused, but not as NoFreeMachineId: {e}"),
            Ok(c) => panic!(
                "{clause}: claimed {:?} while {:?} held them",
                c.held, claim.held
            ),
        }
    }
    holder.abandon(&claim).await;
}

/// A claim with a deadline renews to a deadline no earlier than the
/// claim's (a renewal is sent after the claim, and a deadline is a send
/// time plus the TTL); a claim without one is never renewed (the loop does
/// not ask).
pub async fn a_renewal_moves_the_deadline_ahead<S: ClaimStore>(store: &mut S) {
    let clause = "a renewal never moves the deadline back";
    let claim = claimed(store, clause).await;
    if let Some(before) = claim.deadline {
        let deadline = store
            .renew(&claim)
            .await
            .unwrap_or_else(|e| panic!("{clause}: renew failed: {e}"));
        assert!(
            deadline >= before,
            "{clause}: {deadline:?} is before {before:?}"
        );
    }
    store.abandon(&claim).await;
}

/// A store that says it never claims other machine ids
/// ([`ClaimStore::may_claim_others`] false) claims the same ones every time,
/// and counts them as its own fences.
pub async fn a_store_that_claims_the_same_ids_says_so<S: ClaimStore>(store: &mut S) {
    let clause = "may_claim_others() false means the same machine ids every time";
    let first = claimed(store, clause).await;
    store.abandon(&first).await;
    let second = claimed(store, clause).await;
    if !store.may_claim_others() {
        assert_eq!(second.machine_ids(), first.machine_ids(), "{clause}");
        let own: Vec<u16> = second.own_fences.iter().map(|m| m.get()).collect();
        assert_eq!(own, second.machine_ids(), "{clause}");
    }
    store.abandon(&second).await;
}
