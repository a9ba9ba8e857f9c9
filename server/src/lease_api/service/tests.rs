//! The handler over a double of its store ([`fake::Requesters`]): the
//! clock-skew refusal, token retries, key quotas and the audit trail, with
//! the exact codes, messages and events a client and an operator see.

use std::sync::Arc;
use std::time::Duration;

use snowkeep_client::ManualClock;
use snowkeep_core::api_key::KeyScope;
use snowkeep_core::lease::records::{KeyQuota, LeaseToken, RequesterAbout, RequesterId};
use snowkeep_proto::v1 as pb;
use snowkeep_proto::v1::lease_service_server::LeaseService;
use tokio::sync::broadcast::error::TryRecvError;
use tonic::{Code, Request};

use super::fake::{Call, Connected, Requesters, INCARNATION};
use super::*;
use crate::audit::{self, AuditEvent, CallerKey, Who};

/// The server's wall clock in every test, ms since the Unix epoch.
const NOW: u64 = 1_800_000_000_000;

/// First lease 10 min, renewed 1 h, skew threshold 10 min.
const CONFIG: LeaseApiConfig = LeaseApiConfig {
    first_lease: Duration::from_secs(600),
    renewed_lease: Duration::from_secs(3600),
    skew_threshold: Duration::from_secs(600),
};

fn handler() -> (LeaseHandler<Requesters>, Requesters) {
    let store = Requesters::default();
    let handler = LeaseHandler::reaching(Connected(store.clone()), CONFIG, ManualClock::new(NOW));
    (handler, store)
}

fn requester(nonce: &str) -> pb::Requester {
    pb::Requester {
        host_id: "host-1".into(),
        pid: 42,
        start_unix_ms: NOW - 1000,
        nonce: nonce.into(),
    }
}

const NONCE: &str = "00112233445566778899aabbccddeeff";

/// The id of the requester with [`NONCE`].
fn id() -> RequesterId {
    match convert::requester_id(Some(&requester(NONCE))) {
        Ok(id) => id,
        Err(e) => panic!("the test requester is refused: {e}"),
    }
}

/// The token whose 64 hex digits are `hex`; `None` for any other text.
fn token(hex: &str) -> Option<LeaseToken> {
    convert::lease_token(hex).ok().flatten()
}

fn acquire(namespace: &str, count: u32, token: &str, client: u64) -> Request<pb::AcquireRequest> {
    Request::new(pb::AcquireRequest {
        namespace: namespace.into(),
        requester: Some(requester(NONCE)),
        count,
        lease_token: token.into(),
        client_time_unix_ms: Some(client),
        supports_layout_shapes: false,
    })
}

fn release(namespace: &str, token: &str) -> Request<pb::ReleaseRequest> {
    Request::new(pb::ReleaseRequest {
        namespace: namespace.into(),
        requester: Some(requester(NONCE)),
        lease_token: token.into(),
        ..Default::default()
    })
}

/// Audit events recorded for `namespace` since `rx` subscribed (other tests
/// record too, each in its own namespace). Panics when the receiver lagged:
/// events were lost, so what is left proves nothing.
fn events(
    rx: &mut tokio::sync::broadcast::Receiver<AuditEvent>,
    namespace: &str,
) -> Vec<AuditEvent> {
    std::iter::from_fn(|| match rx.try_recv() {
        Ok(e) => Some(e),
        Err(TryRecvError::Lagged(lost)) => panic!("the audit receiver lagged: {lost} events lost"),
        Err(TryRecvError::Empty | TryRecvError::Closed) => None,
    })
    .filter(|e| e.namespace == namespace)
    .collect()
}

fn event(action: &'static str, namespace: &str, subject: &str, result: &str) -> AuditEvent {
    let tag = convert::requester_id(Some(&requester(NONCE))).map(|r| r.tag());
    AuditEvent {
        unix_ms: NOW,
        action,
        who: Who::default(),
        requester: tag.unwrap_or_default(),
        namespace: namespace.into(),
        subject: subject.into(),
        result: result.into(),
    }
}

/// A client that does not say it honours time units and short layouts (one
/// from before them) is refused in a js53 namespace before any claim: it
/// would stamp ms where the namespace counts 10 ms ticks. One that says so
/// is served, and old clients keep working in 63-bit, 1 ms namespaces.
#[tokio::test]
async fn an_acquire_in_a_shaped_layout_needs_a_client_that_supports_it() {
    let (h, store) = handler();
    let refused = h
        .acquire(acquire("js53-orders", 1, "", NOW))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert_eq!(
        refused,
        Some((
            Code::FailedPrecondition,
            "namespace layout 39/6/8@1767225600000/10ms counts its timestamp in 10 ms ticks or has fewer than 63 bits, and this client did not set AcquireRequest.supports_layout_shapes: a client from before layouts had units would mint ids a newer holder mints too; upgrade the client (snowkeep-client, or set the field once the client reads Layout.time_unit_ms)".to_owned()
        ))
    );
    assert_eq!(store.book().calls(), ["layout"]);
    let mut shaped = acquire("js53-orders", 1, "", NOW);
    shaped.get_mut().supports_layout_shapes = true;
    let grant = h.acquire(shaped).await.unwrap();
    assert_eq!(ids(grant.get_ref()), vec![0]);
    let (h, _) = handler();
    let old = h.acquire(acquire("orders", 1, "", NOW)).await.unwrap();
    assert_eq!(ids(old.get_ref()), vec![0]);
}

#[tokio::test]
async fn an_acquire_from_a_clock_behind_by_more_than_the_threshold_is_refused_before_claiming() {
    let (h, store) = handler();
    let mut rx = audit::subscribe();
    let refused = h
        .acquire(acquire("skew-behind", 1, "", NOW - 900_000))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert_eq!(
        refused,
        Some((
            Code::FailedPrecondition,
            "client clock is 15m behind the server, over the 10m threshold: sync this host with NTP (chrony/ntpd), then retry".to_owned()
        ))
    );
    assert_eq!(store.book().calls(), ["layout", "admit"]);
    assert_eq!(
        events(&mut rx, "skew-behind"),
        [event(
            "lease.acquire",
            "skew-behind",
            "",
            "FailedPrecondition"
        )]
    );
}

#[tokio::test]
async fn an_acquire_from_a_clock_ahead_by_more_than_the_threshold_is_refused() {
    let (h, store) = handler();
    let refused = h
        .acquire(acquire("skew-ahead", 1, "", NOW + 1_200_000))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert_eq!(
        refused,
        Some((
            Code::FailedPrecondition,
            "client clock is 20m ahead of the server, over the 10m threshold: sync this host with NTP (chrony/ntpd), then retry".to_owned()
        ))
    );
    assert_eq!(store.book().calls(), ["layout", "admit"]);
}

#[tokio::test]
async fn a_clock_within_the_threshold_is_served_and_its_skew_stored_with_the_requester() {
    let (h, store) = handler();
    let grant = h.acquire(acquire("skew-fine", 2, "", NOW - 599_000)).await;
    assert_eq!(grant.map(|g| ids(g.get_ref())).ok(), Some(vec![0, 1]));
    assert_eq!(store.book().calls(), ["layout", "admit", "acquire"]);
    assert_eq!(
        store.book().about(&id()).and_then(|a| a.skew_ms),
        Some(599_000)
    );
}

fn ids(grant: &pb::LeaseGrant) -> Vec<u32> {
    grant.machine_ids.iter().map(|m| m.machine_id).collect()
}

#[tokio::test]
async fn a_retry_with_the_token_gets_the_same_ids_and_only_then_is_its_clock_recorded() {
    let (h, _store) = handler();
    let client = NOW - 400_000; // over half the 10 min threshold
    let first = h.acquire(acquire("retry", 2, "", client)).await.ok();
    let first = first.map(Response::into_inner).unwrap_or_default();
    assert_eq!(
        (ids(&first), first.namespace_incarnation),
        (vec![0, 1], INCARNATION)
    );
    assert_eq!(first.lease_token.len(), 64);
    assert_eq!(
        lock(&h.skews).count("retry", Duration::from_secs(600)),
        (0, 0)
    );
    let again = h
        .acquire(acquire("retry", 2, &first.lease_token, client))
        .await
        .ok();
    let again = again.map(Response::into_inner).unwrap_or_default();
    assert_eq!(
        (ids(&again), again.lease_token),
        (vec![0, 1], first.lease_token)
    );
    assert_eq!(
        lock(&h.skews).count("retry", Duration::from_secs(600)),
        (1, 0)
    );
}

#[tokio::test]
async fn a_retry_without_the_token_is_refused_and_audited_as_refused() {
    let (h, store) = handler();
    let mut rx = audit::subscribe();
    let _first = h.acquire(acquire("no-token", 1, "", NOW)).await.ok();
    let refused = h
        .acquire(acquire("no-token", 1, "", NOW))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert_eq!(
        refused,
        Some((
            Code::PermissionDenied,
            "permission denied for this requester's lease: no lease_token was sent. Send the lease_token that this requester's Acquire returned; a process without it must start over as a new requester (a new nonce). Machine ids whose grant was lost free themselves when their lease ends".to_owned()
        ))
    );
    assert_eq!(
        store.book().calls(),
        ["layout", "admit", "acquire"].repeat(2)
    );
    assert_eq!(
        events(&mut rx, "no-token"),
        [
            event("lease.acquire", "no-token", "machine_ids 0", "ok"),
            event("lease.acquire", "no-token", "", "PermissionDenied"),
        ]
    );
}

#[tokio::test]
async fn a_malformed_token_is_refused_before_the_store_and_the_audit_trail() {
    let (h, store) = handler();
    let mut rx = audit::subscribe();
    let acquired = h.acquire(acquire("bad-token", 1, "xyz", NOW)).await;
    let released = h.release(release("bad-token", "xyz")).await;
    let message =
        "invalid lease_token: send the 64 hex digits that Acquire returned, or leave it empty";
    for refused in [acquired.err(), released.err()] {
        let refused = refused.map(|s| (s.code(), s.message().to_owned()));
        assert_eq!(refused, Some((Code::InvalidArgument, message.to_owned())));
    }
    assert!(store.book().calls().is_empty());
    assert_eq!(events(&mut rx, "bad-token"), []);
}

/// An Acquire made with API key `k-quota` whose quota is `max`.
fn with_key(mut request: Request<pb::AcquireRequest>, max: u32) -> Request<pb::AcquireRequest> {
    request.extensions_mut().insert(CallerKey("k-quota".into()));
    request
        .extensions_mut()
        .insert(std::sync::Arc::new(KeyScope {
            key_id: "k-quota".into(),
            namespaces: Vec::new(),
            permissions: Vec::new(),
            max_lease_machine_ids: max,
        }));
    request
}

/// The quota each Acquire passed to the store, in order.
fn quotas(store: &Requesters) -> Vec<Option<KeyQuota>> {
    let book = store.book();
    let quota = |call: &Call| match call {
        Call::Acquire { quota, .. } => Some(quota.clone()),
        _ => None,
    };
    book.received.iter().filter_map(quota).collect()
}

#[tokio::test]
async fn an_acquire_over_the_keys_quota_is_refused_with_nothing_claimed() {
    let (h, store) = handler();
    let mut rx = audit::subscribe();
    let first = h.acquire(with_key(acquire("quota", 2, "", NOW), 2)).await;
    assert_eq!(first.map(|g| ids(g.get_ref())).ok(), Some(vec![0, 1]));
    let quota = KeyQuota {
        key_id: "k-quota".into(),
        max: 2,
    };
    let mut other = acquire("quota", 1, "", NOW);
    other.get_mut().requester = Some(requester("ffeeddccbbaa99887766554433221100"));
    let refused = h
        .acquire(with_key(other, 2))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert_eq!(
        refused,
        Some((
            Code::ResourceExhausted,
            "key k-quota holds 2 of its 2 machine ids; asking for 1 would exceed its quota; release some, or use a key with a larger quota (snowkeepctl key create --max-lease-machine-ids N; a key's quota never changes)".to_owned()
        ))
    );
    assert_eq!(quotas(&store), [Some(quota.clone()), Some(quota)]);
    assert_eq!(store.book().held_ids(), [0, 1]);
    let results: Vec<(String, String)> = events(&mut rx, "quota")
        .into_iter()
        .map(|e| (e.who.key_id, e.result))
        .collect();
    assert_eq!(
        results,
        [
            ("k-quota".to_owned(), "ok".to_owned()),
            ("k-quota".to_owned(), "ResourceExhausted".to_owned())
        ]
    );
}

#[tokio::test]
async fn an_acquire_without_a_key_carries_no_quota() {
    let (h, store) = handler();
    let _grant = h.acquire(acquire("no-quota", 3, "", NOW)).await;
    assert_eq!(quotas(&store), [None]);
    assert_eq!(
        store.book().about(&id()).map(|a| a.key_id.as_str()),
        Some("")
    );
}

fn renew(namespace: &str, token: &str) -> Request<pb::RenewRequest> {
    Request::new(pb::RenewRequest {
        namespace: namespace.into(),
        requester: Some(requester(NONCE)),
        lease_token: token.into(),
        namespace_incarnation: INCARNATION,
        ..Default::default()
    })
}

fn check(namespace: &str, token: &str, machine_ids: Vec<u32>) -> Request<pb::CheckRequest> {
    Request::new(pb::CheckRequest {
        namespace: namespace.into(),
        requester: Some(requester(NONCE)),
        lease_token: token.into(),
        namespace_incarnation: INCARNATION,
        machine_ids,
    })
}

/// Check's answer for a lease that stands with `remaining_ms` left.
fn valid(remaining_ms: u64) -> pb::CheckResponse {
    pb::CheckResponse {
        valid: true,
        reason: pb::LeaseCheckReason::Valid as i32,
        remaining_ms,
        detail: "the lease stands".into(),
    }
}

#[tokio::test]
async fn acquire_and_release_are_audited_and_renew_check_and_capacity_are_not() {
    let (h, store) = handler();
    let mut rx = audit::subscribe();
    let ns = "audited";
    let grant = h.acquire(acquire(ns, 2, "", NOW)).await.ok();
    let token = grant
        .map(|g| g.into_inner().lease_token)
        .unwrap_or_default();
    let renewed = h.renew(renew(ns, &token)).await;
    assert_eq!(renewed.map(|g| ids(g.get_ref())).ok(), Some(vec![0, 1]));
    let checked = h.check(check(ns, &token, vec![0, 1])).await;
    assert_eq!(
        checked.map(Response::into_inner).ok(),
        Some(valid(3_600_000))
    );
    let capacity = h
        .capacity(Request::new(pb::CapacityRequest {
            namespace: ns.into(),
        }))
        .await;
    assert!(capacity.is_ok());
    let wrong = h.release(release(ns, &"0".repeat(64))).await;
    assert_eq!(wrong.err().map(|s| s.code()), Some(Code::PermissionDenied));
    let released = h.release(release(ns, &token)).await;
    assert_eq!(released.map(|r| r.get_ref().released).ok(), Some(2));
    assert_eq!(
        store.book().calls(),
        ["layout", "admit", "acquire", "renew", "check", "capacity", "release", "release"]
    );
    assert_eq!(store.book().received[3..], passed(ns, &token));
    assert_eq!(
        events(&mut rx, ns),
        [
            event("lease.acquire", ns, "machine_ids 0,1", "ok"),
            event("lease.release", ns, "", "PermissionDenied"),
            event("lease.release", ns, "released 2", "ok"),
        ]
    );
}

/// What the calls after the Acquire of
/// `acquire_and_release_are_audited_and_renew_check_and_capacity_are_not`
/// pass to the store: the namespace, requester, token (the wrong one, then
/// the grant's), incarnation and machine ids each was given.
fn passed(ns: &str, granted: &str) -> [Call; 5] {
    let release = |token: Option<LeaseToken>| Call::Release {
        namespace: ns.into(),
        layout: None,
        requester: id(),
        last_used: std::collections::HashMap::new(),
        token,
    };
    [
        Call::Renew {
            namespace: ns.into(),
            requester: id(),
            duration: CONFIG.renewed_lease,
            token: token(granted),
            incarnation: INCARNATION,
        },
        Call::Check {
            namespace: ns.into(),
            requester: id(),
            token: token(granted),
            incarnation: INCARNATION,
            machine_ids: vec![0, 1],
        },
        Call::Capacity(ns.into()),
        release(token(&"0".repeat(64))),
        release(token(granted)),
    ]
}

#[tokio::test]
async fn an_acquire_passes_the_store_its_namespace_requester_count_and_description() {
    let (h, store) = handler();
    let _grant = h.acquire(acquire("passed", 3, "", NOW - 2000)).await;
    let about = RequesterAbout {
        host_id: "host-1".into(),
        pid: 42,
        start_unix_ms: NOW - 1000,
        skew_ms: Some(2000),
        key_id: String::new(),
    };
    let want = [
        Call::Layout("passed".into()),
        Call::Admit("passed".into()),
        Call::Acquire {
            namespace: "passed".into(),
            layout: snowkeep_client::Layout::default(),
            requester: id(),
            count: 3,
            duration: CONFIG.first_lease,
            token: None,
            quota: None,
            about,
        },
    ];
    assert_eq!(store.book().received, want);
}

#[tokio::test]
async fn a_check_answers_valid_for_the_live_lease_and_refuses_a_wrong_token() {
    let (h, _store) = handler();
    let ns = "checked";
    let grant = h.acquire(acquire(ns, 2, "", NOW)).await.ok();
    let token = grant
        .map(|g| g.into_inner().lease_token)
        .unwrap_or_default();
    let live = h.check(check(ns, &token, vec![1, 0])).await;
    assert_eq!(live.map(Response::into_inner).ok(), Some(valid(600_000)));
    let wrong = h.check(check(ns, &"0".repeat(64), vec![0, 1])).await;
    assert_eq!(
        wrong.err().map(|s| (s.code(), s.message().to_owned())),
        Some((
            Code::PermissionDenied,
            "permission denied for this requester's lease: the lease_token does not match. Send the lease_token that this requester's Acquire returned; a process without it must start over as a new requester (a new nonce). Machine ids whose grant was lost free themselves when their lease ends".to_owned()
        ))
    );
}

#[tokio::test]
async fn a_renew_of_a_requester_holding_nothing_is_an_empty_grant_whatever_its_token() {
    let (h, store) = handler();
    let renewed = h.renew(renew("renew-nothing", &"0".repeat(64))).await;
    let grant = renewed.map(Response::into_inner).ok();
    let answer = grant.map(|g| {
        let gone = g.gone_reason == pb::LeaseCheckReason::LeaseGone as i32;
        (ids(&g), g.lease_token, gone, g.namespace_incarnation)
    });
    assert_eq!(answer, Some((vec![], String::new(), true, INCARNATION)));
    assert_eq!(store.book().calls(), ["renew"]);
    assert_eq!(
        lock(&h.skews).count("renew-nothing", Duration::from_secs(600)),
        (0, 0)
    );
}

#[tokio::test]
async fn a_retry_with_another_count_is_already_exists_and_keeps_the_first_grant() {
    let (h, store) = handler();
    let first = h.acquire(acquire("recount", 2, "", NOW - 1000)).await.ok();
    let token = first
        .map(|g| g.into_inner().lease_token)
        .unwrap_or_default();
    let refused = h
        .acquire(acquire("recount", 3, &token, NOW - 2000))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert_eq!(
        refused,
        Some((
            Code::AlreadyExists,
            "requester already holds 2 machine ids but asked for 3; Release them first or Acquire 2".to_owned()
        ))
    );
    let again = h.acquire(acquire("recount", 2, &token, NOW - 3000)).await;
    assert_eq!(again.map(|g| ids(g.get_ref())).ok(), Some(vec![0, 1]));
    assert_eq!(store.book().held_ids(), [0, 1]);
    // The description stored by the first Acquire is kept, as in etcd.
    assert_eq!(
        store.book().about(&id()).and_then(|a| a.skew_ms),
        Some(1000)
    );
}

/// Never connected: the store did not answer yet.
struct NotConnected;

impl Reach<Requesters> for NotConnected {
    fn reach(&self) -> Result<Option<Requesters>, ApiError> {
        Err(ApiError::StoreNotConnected)
    }
}

/// The single-instance store: no Lease API.
struct SingleInstance;

impl Reach<Requesters> for SingleInstance {
    fn reach(&self) -> Result<Option<Requesters>, ApiError> {
        Ok(None)
    }
}

#[tokio::test]
async fn without_a_connected_etcd_store_calls_are_refused_as_the_store_says() {
    let clock: SharedClock = ManualClock::new(NOW);
    let unconnected = LeaseHandler::reaching(NotConnected, CONFIG, Arc::clone(&clock));
    let single = LeaseHandler::reaching(SingleInstance, CONFIG, clock);
    let codes = [
        unconnected
            .acquire(acquire("unreached", 1, "", NOW))
            .await
            .err()
            .map(|s| s.code()),
        single
            .acquire(acquire("unreached", 1, "", NOW))
            .await
            .err()
            .map(|s| s.code()),
    ];
    assert_eq!(
        codes,
        [Some(Code::Unavailable), Some(Code::FailedPrecondition)]
    );
}
