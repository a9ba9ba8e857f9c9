//! The [`RequesterStore`] contract as executable clauses, one function each,
//! so every store is held to the same rules: the Lease API handler's test
//! double (the server's unit tests) and etcd's `RequesterLeases` (the
//! server's integration tests, against real etcd).
//!
//! A clause takes a store the caller opened on a namespace of its own,
//! created before the clause runs, whose range (the store's range cut to the
//! layout) is exactly `0..`[`MACHINE_IDS`] with no machine id held, so
//! "every machine id" and "the machine ids left" are known numbers. A clause
//! panics, naming the rule, when the store breaks it.
//!
//! Where each rule comes from: the method documents of [`RequesterStore`]
//! (the token rule of [`authorize`](super::records::authorize), retries,
//! quotas, renewals, releases, checks and incarnations) and
//! [`FENCE_MARGIN`](super::records::FENCE_MARGIN) (a fence is the lease's
//! expiry plus the margin).
//!
//! | module | clauses of |
//! | --- | --- |
//! | `acquire` | a first Acquire, its retries, a full range, a key's quota |
//! | `held` | Renew, Release, Check, the incarnation rule, Capacity |
//!
//! The clauses are re-exported here: callers name them
//! `conformance::<clause>`.

use std::collections::HashMap;
use std::time::Duration;

use snowkeep_client::{Clock, Layout, MachineId, Millis, SystemClock};

use super::records::{
    KeyQuota, LeaseCheck, LeaseToken, Renewal, RequesterAbout, RequesterGrant, RequesterId,
    RequesterStore, StoreResult,
};
use crate::claim::StoreError;

mod acquire;
mod held;

pub use acquire::*;
pub use held::*;

/// Machine ids in the range of every clause's namespace: `0..MACHINE_IDS`.
pub const MACHINE_IDS: u32 = 3;

/// The lease duration of a clause's Acquire.
const FIRST: Duration = Duration::from_secs(60);

/// The lease duration of a clause's Renew: longer than [`FIRST`], so a
/// renewal visibly extends the lease and raises the fences.
const RENEWED: Duration = Duration::from_secs(120);

/// The requester of identity `host:1:2:{nonce}`.
fn requester(nonce: &str) -> RequesterId {
    RequesterId::of(&format!("host:1:2:{nonce}"))
}

/// The quota of key `k` at `max` machine ids.
fn quota(max: u32) -> KeyQuota {
    KeyQuota {
        key_id: "k".into(),
        max,
    }
}

/// One Acquire's arguments besides the store and namespace.
struct Ask<'a> {
    requester: &'a RequesterId,
    count: u32,
    token: Option<&'a LeaseToken>,
    quota: Option<&'a KeyQuota>,
}

impl<'a> Ask<'a> {
    /// A first Acquire of `count` machine ids, without a token or quota.
    fn new(requester: &'a RequesterId, count: u32) -> Self {
        Self {
            requester,
            count,
            token: None,
            quota: None,
        }
    }
}

/// The namespace's layout, panicking with the clause's name on an error.
async fn layout_of<S: RequesterStore>(store: &mut S, ns: &str, clause: &str) -> Layout {
    Box::pin(store.layout(ns))
        .await
        .unwrap_or_else(|e| panic!("{clause}: layout failed: {e}"))
}

/// The namespace's incarnation ([`RequesterStore::admit`]).
async fn incarnation_of<S: RequesterStore>(store: &mut S, ns: &str, clause: &str) -> u64 {
    Box::pin(store.admit(ns))
        .await
        .unwrap_or_else(|e| panic!("{clause}: admit failed: {e}"))
}

/// An Acquire for [`FIRST`] in the namespace's layout. The future is boxed:
/// the etcd store's is large in a debug build, and nested inside a
/// clause's it overflows a test thread's stack.
async fn acquire<S: RequesterStore>(
    store: &mut S,
    ns: &str,
    ask: Ask<'_>,
) -> StoreResult<RequesterGrant> {
    let layout = Box::pin(store.layout(ns)).await?;
    let about = RequesterAbout::default();
    Box::pin(store.acquire(
        ns,
        layout,
        ask.requester,
        ask.count,
        FIRST,
        ask.token,
        ask.quota,
        &about,
    ))
    .await
}

/// [`acquire`], panicking with the clause's name on an error.
async fn acquired<S: RequesterStore>(
    store: &mut S,
    ns: &str,
    ask: Ask<'_>,
    clause: &str,
) -> RequesterGrant {
    acquire(store, ns, ask)
        .await
        .unwrap_or_else(|e| panic!("{clause}: acquire failed: {e}"))
}

/// A Renew for [`RENEWED`].
async fn renew<S: RequesterStore>(
    store: &mut S,
    ns: &str,
    requester: &RequesterId,
    token: Option<&LeaseToken>,
    incarnation: u64,
) -> StoreResult<Renewal> {
    Box::pin(store.renew(ns, requester, RENEWED, token, incarnation)).await
}

/// A Renew that must be granted: the grant and the incarnation.
async fn renewed<S: RequesterStore>(
    store: &mut S,
    ns: &str,
    requester: &RequesterId,
    token: Option<&LeaseToken>,
    incarnation: u64,
    clause: &str,
) -> (RequesterGrant, u64) {
    match renew(store, ns, requester, token, incarnation).await {
        Ok(Renewal::Granted { grant, incarnation }) => (grant, incarnation),
        other => panic!("{clause}: renew not granted: {other:?}"),
    }
}

/// A Release reporting no last timestamps.
async fn release<S: RequesterStore>(
    store: &mut S,
    ns: &str,
    requester: &RequesterId,
    token: Option<&LeaseToken>,
) -> StoreResult<u32> {
    Box::pin(store.release(ns, None, requester, &HashMap::new(), token)).await
}

/// The last timestamps of a holder that stamped nothing above its floors.
fn unused(grant: &RequesterGrant) -> HashMap<MachineId, Millis> {
    grant.held.iter().map(|h| (h.machine_id, h.floor)).collect()
}

/// A Check.
async fn check<S: RequesterStore>(
    store: &mut S,
    ns: &str,
    requester: &RequesterId,
    token: Option<&LeaseToken>,
    incarnation: u64,
    machine_ids: &[u32],
) -> StoreResult<LeaseCheck> {
    Box::pin(store.check(ns, requester, token, incarnation, machine_ids)).await
}

/// A grant's machine ids, in order.
fn ids(grant: &RequesterGrant) -> Vec<u16> {
    let mut ids: Vec<u16> = grant.held.iter().map(|h| h.machine_id.get()).collect();
    ids.sort_unstable();
    ids
}

/// A grant's `(machine id, floor)` pairs, in order.
fn floors(grant: &RequesterGrant) -> Vec<(u16, u64)> {
    let mut f: Vec<_> = grant
        .held
        .iter()
        .map(|h| (h.machine_id.get(), h.floor.get()))
        .collect();
    f.sort_unstable();
    f
}

/// A grant's `(machine id, fence)` pairs, in order.
fn fences(grant: &RequesterGrant) -> Vec<(u16, u64)> {
    let mut f: Vec<_> = grant
        .held
        .iter()
        .map(|h| (h.machine_id.get(), h.fence.get()))
        .collect();
    f.sort_unstable();
    f
}

/// The grant's token, which a first Acquire must hand out.
fn token_of(grant: &RequesterGrant, clause: &str) -> LeaseToken {
    grant
        .token
        .clone()
        .unwrap_or_else(|| panic!("{clause}: the grant has no token"))
}

/// Panics unless `result` is [`StoreError::TokenRefused`].
fn assert_refused<T: std::fmt::Debug>(result: StoreResult<T>, clause: &str, what: &str) {
    match result {
        Err(StoreError::TokenRefused { .. }) => {}
        other => panic!("{clause}: {what} is not TokenRefused: {other:?}"),
    }
}

/// The remaining time of a [`LeaseCheck::Valid`], panicking otherwise.
fn valid(found: StoreResult<LeaseCheck>, clause: &str, what: &str) -> Duration {
    match found {
        Ok(LeaseCheck::Valid { remaining }) => remaining,
        other => panic!("{clause}: {what} is not Valid: {other:?}"),
    }
}

/// The wall clock in `layout`'s ms, as the stores read it.
fn now(layout: &Layout) -> Millis {
    SystemClock.layout_ms(layout)
}
