//! [`StateAdmin`] over a double of its store ([`fake::States`]): the
//! refusals of Evict and Import, with the exact codes and messages an
//! operator sees, and the audit events each call leaves.

use snowkeep_client::ManualClock;
use snowkeep_etcd::admin::{DOCUMENT_FORMAT, DOCUMENT_VERSION};
use tokio::sync::broadcast::error::TryRecvError;
use tonic::Code;

use super::fake::{Call, Connected, States};
use super::*;
use crate::audit::CallerKey;

/// The server's wall clock in every test, ms since the Unix epoch.
const NOW: u64 = 1_800_000_000_000;

fn admin() -> (StateAdmin<States>, States) {
    let store = States::default();
    (
        StateAdmin::reaching(Connected(store.clone()), ManualClock::new(NOW)),
        store,
    )
}

/// A request made with API key `key` (audit events name it).
fn by<T>(key: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.extensions_mut().insert(CallerKey(key.into()));
    request
}

/// The audit events of `key` since `rx` subscribed (other tests record
/// too, each with its own key). Panics when the receiver lagged: events
/// were lost, so what is left proves nothing.
fn events(rx: &mut tokio::sync::broadcast::Receiver<AuditEvent>, key: &str) -> Vec<AuditEvent> {
    std::iter::from_fn(|| match rx.try_recv() {
        Ok(e) => Some(e),
        Err(TryRecvError::Lagged(lost)) => panic!("the audit receiver lagged: {lost} events lost"),
        Err(TryRecvError::Empty | TryRecvError::Closed) => None,
    })
    .filter(|e| e.who.key_id == key)
    .collect()
}

/// `evict(namespace, machine_id)` as the store receives it.
fn evicted(namespace: &str, machine_id: u16) -> Call {
    Call::Evict {
        namespace: namespace.into(),
        machine_id,
    }
}

fn event(
    action: &'static str,
    key: &str,
    namespace: &str,
    subject: &str,
    result: &str,
) -> AuditEvent {
    AuditEvent {
        unix_ms: NOW,
        action,
        who: Who {
            key_id: key.into(),
            peer: String::new(),
        },
        requester: String::new(),
        namespace: namespace.into(),
        subject: subject.into(),
        result: result.into(),
    }
}

fn evict(namespace: &str, machine_id: u32) -> pb::EvictRequest {
    pb::EvictRequest {
        namespace: namespace.into(),
        machine_id,
    }
}

fn refusal<T>(result: Result<T, Status>) -> Option<(Code, String)> {
    result.err().map(|s| (s.code(), s.message().to_owned()))
}

#[tokio::test]
async fn an_eviction_outside_the_layout_is_refused_before_the_store_evicts() {
    let (admin, store) = admin();
    let mut rx = audit::subscribe();
    let got = admin
        .evict(by("k-evict-range", evict("orders", 4096)))
        .await;
    assert_eq!(
        refusal(got),
        Some((
            Code::InvalidArgument,
            "machine id 4096 is out of range: namespace \"orders\" has machine ids 0 to 4095"
                .to_owned()
        ))
    );
    assert_eq!(store.book().received, [Call::Layout("orders".into())]);
    assert_eq!(
        events(&mut rx, "k-evict-range"),
        [event(
            "admin.evict",
            "k-evict-range",
            "orders",
            "machine_id=4096",
            "InvalidArgument"
        )]
    );
}

#[tokio::test]
async fn evicting_a_machine_id_nobody_holds_is_not_found() {
    let (admin, store) = admin();
    let mut rx = audit::subscribe();
    let got = admin.evict(by("k-evict-free", evict("orders", 5))).await;
    assert_eq!(
        refusal(got),
        Some((
            Code::NotFound,
            "machine id 5 of namespace \"orders\" has no holder: nothing to evict".to_owned()
        ))
    );
    assert_eq!(
        store.book().received,
        [Call::Layout("orders".into()), evicted("orders", 5)]
    );
    assert_eq!(
        events(&mut rx, "k-evict-free"),
        [event(
            "admin.evict",
            "k-evict-free",
            "orders",
            "machine_id=5",
            "NotFound"
        )]
    );
}

#[tokio::test]
async fn evicting_in_an_unknown_namespace_is_not_found_and_a_malformed_name_is_not_audited() {
    let (admin, store) = admin();
    let mut rx = audit::subscribe();
    let unknown = admin.evict(by("k-evict-ns", evict("billing", 1))).await;
    assert_eq!(
        refusal(unknown),
        Some((
            Code::NotFound,
            "namespace \"billing\" does not exist: an operator creates it once with snowkeep-server --create-namespace (see docs/operations.md#creating-a-namespace)".to_owned()
        ))
    );
    let malformed = admin.evict(by("k-evict-ns", evict("Bad Name", 1))).await;
    assert_eq!(
        malformed.err().map(|s| s.code()),
        Some(Code::InvalidArgument)
    );
    assert_eq!(store.book().received, [Call::Layout("billing".into())]);
    assert_eq!(
        events(&mut rx, "k-evict-ns"),
        [event(
            "admin.evict",
            "k-evict-ns",
            "billing",
            "machine_id=1",
            "NotFound"
        )]
    );
}

#[tokio::test]
async fn an_eviction_answers_and_audits_the_holder_and_every_machine_id_of_its_lease() {
    let (admin, store) = admin();
    store.book().evicted = Some(Evicted {
        holder: "server-a".into(),
        machine_ids: vec![3, 4],
        successor_wait_ms: 1500,
    });
    let mut rx = audit::subscribe();
    let got = admin.evict(by("k-evict-ok", evict("orders", 3))).await;
    let got = got.map(Response::into_inner).ok();
    let want = pb::EvictResponse {
        holder: "server-a".into(),
        machine_ids: vec![3, 4],
        successor_wait_ms: 1500,
    };
    assert_eq!(got, Some(want));
    assert_eq!(
        store.book().received,
        [Call::Layout("orders".into()), evicted("orders", 3)]
    );
    assert_eq!(
        events(&mut rx, "k-evict-ok"),
        [event(
            "admin.evict",
            "k-evict-ok",
            "orders",
            "machine_id=3 holder=server-a machine_ids=[3, 4]",
            "ok"
        )]
    );
}

#[tokio::test]
async fn on_the_single_instance_store_evict_and_import_are_failed_precondition() {
    struct SingleInstance;
    impl Reach<States> for SingleInstance {
        fn reach(&self) -> Result<Option<States>, ApiError> {
            Ok(None)
        }
    }
    let admin = StateAdmin::reaching(SingleInstance, ManualClock::new(NOW));
    let message = "the single-instance store has no cluster state; run with --etcd-endpoints";
    let evicted = admin.evict(by("k-single", evict("orders", 1))).await;
    assert_eq!(
        refusal(evicted),
        Some((Code::FailedPrecondition, message.to_owned()))
    );
    let imported = admin
        .import(by("k-single", import(&document(), false)))
        .await;
    assert_eq!(
        refusal(imported),
        Some((Code::FailedPrecondition, message.to_owned()))
    );
}

/// An empty state document, as an export of an etcd without snowkeep
/// state writes it.
fn empty_state() -> StateDocument {
    StateDocument {
        format: DOCUMENT_FORMAT.into(),
        version: DOCUMENT_VERSION,
        exported_unix_ms: NOW,
        exported_at: "2027-01-15T08:00:00Z".into(),
        namespaces: Vec::new(),
        api_keys: Vec::new(),
    }
}

/// [`empty_state`] as JSON.
fn document() -> String {
    serde_json::to_string(&empty_state()).unwrap_or_default()
}

/// `import` of [`empty_state`] as the store receives it, with the
/// [`import`] request's 5000 ms lead.
fn imported(replace: bool) -> Call {
    Call::Import {
        document: empty_state(),
        replace,
        lead: Duration::from_millis(5000),
    }
}

fn import(document: &str, replace: bool) -> pb::ImportRequest {
    pb::ImportRequest {
        document: document.into(),
        replace,
        lead_ms: 5000,
    }
}

#[tokio::test]
async fn a_document_that_does_not_parse_is_refused_before_the_store_imports() {
    let (admin, store) = admin();
    let mut rx = audit::subscribe();
    let got = admin.import(by("k-import-bad", import("{", false))).await;
    assert_eq!(got.err().map(|s| s.code()), Some(Code::InvalidArgument));
    assert!(store.book().calls().is_empty());
    assert_eq!(
        events(&mut rx, "k-import-bad"),
        [event(
            "state.import",
            "k-import-bad",
            "",
            "replace=false",
            "InvalidArgument"
        )]
    );
}

#[tokio::test]
async fn each_import_refusal_of_the_store_has_its_code_and_message() {
    let cases = [
        (
            ImportError::Conflict("etcd already holds snowkeep state".into()),
            Code::FailedPrecondition,
        ),
        (
            ImportError::Contended("holders kept changing a key; run it again".into()),
            Code::Aborted,
        ),
        (
            ImportError::Invalid("a fence is outside its layout".into()),
            Code::InvalidArgument,
        ),
    ];
    for (error, code) in cases {
        let (admin, store) = admin();
        let message = error.to_string();
        store.book().import = Some(Err(error));
        let got = admin
            .import(by("k-import-refused", import(&document(), true)))
            .await;
        assert_eq!(refusal(got), Some((code, message)));
        assert_eq!(store.book().received, [imported(true)]);
    }
    let (admin, store) = admin();
    store.book().import = Some(Err(ImportError::Store(StoreError::Timeout {
        op: "import",
        after: Duration::from_secs(5),
    })));
    let got = admin
        .import(by("k-import-refused", import(&document(), true)))
        .await;
    assert_eq!(
        refusal(got),
        Some((
            Code::Unavailable,
            "etcd request import timed out after 5s".to_owned()
        ))
    );
}

#[tokio::test]
async fn an_import_is_audited_with_what_it_wrote_or_with_its_refusal() {
    let (admin, store) = admin();
    let mut rx = audit::subscribe();
    store.book().import = Some(Err(ImportError::Conflict(
        "etcd already holds snowkeep state".into(),
    )));
    let refused = admin
        .import(by("k-import-audit", import(&document(), false)))
        .await;
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(Code::FailedPrecondition)
    );
    store.book().import = Some(Ok(Imported {
        namespaces: 1,
        fences: 2,
        keys: 0,
        lead_ms: 5000,
    }));
    let done = admin
        .import(by("k-import-audit", import(&document(), true)))
        .await;
    let want = pb::ImportResponse {
        namespaces: 1,
        fences: 2,
        keys: 0,
        lead_ms: 5000,
    };
    assert_eq!(done.map(Response::into_inner).ok(), Some(want));
    assert_eq!(store.book().received, [imported(false), imported(true)]);
    assert_eq!(
        events(&mut rx, "k-import-audit"),
        [
            event(
                "state.import",
                "k-import-audit",
                "",
                "replace=false",
                "FailedPrecondition"
            ),
            event(
                "state.import",
                "k-import-audit",
                "",
                "namespaces=1 fences=2 keys=0 replace=true lead_ms=5000",
                "ok"
            ),
        ]
    );
}
