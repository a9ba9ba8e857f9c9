//! etcd state that is lost (wiped) or rolled back (restored from an older
//! snapshot) must never cost a duplicate: the namespace is created
//! deliberately, a restore is detected and refused until an operator confirms
//! a floor, and embedded clients learn through `LeaseService.Check`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use snowkeep_client::{
    EmbeddedConfig, EmbeddedGenerator, Layout, Requester, StopReason, SystemClock,
};
use snowkeep_proto::v1 as pb;
use tokio::task::JoinHandle;
use tonic_health::pb::health_check_response::ServingStatus;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, check_request, lease_client, release};
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

/// The Lease API's leases here: a first lease of 1 min (the shortest allowed)
/// and a renewed one of 50 s. A client's fence then runs at most 1 min + the
/// 60 s margin = 2 min ahead, and its renewals are 25 s apart, so the check
/// interval is what tells it first.
pub(crate) const LEASES: [&str; 4] = [
    "--first-lease-duration",
    "1m",
    "--renewed-lease-duration",
    "50s",
];
/// The floor the runbook prescribes for these leases: the longest lease plus
/// the 60 s margin, so above every fence a client may still be issuing under.
pub(crate) const CLIENT_FLOOR: &str = "+2m";
/// A server that must claim right at that floor waits up to this.
pub(crate) const FLOOR_WAIT: [&str; 2] = ["--max-fence-wait", "3m"];
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

pub(crate) fn ts(id: u64) -> u64 {
    Layout::default().decode(id).unwrap().timestamp.get()
}

/// An embedded generator on `server` that checks every [`CHECK_INTERVAL`].
pub(crate) async fn start_client(server: &ServerProcess, ns: &str) -> Arc<EmbeddedGenerator> {
    let config = EmbeddedConfig {
        acquire_attempts: Some(1),
        check_interval: CHECK_INTERVAL,
        request_timeout: Duration::from_secs(2),
        ..EmbeddedConfig::new(server.url(), ns)
    };
    let generator = EmbeddedGenerator::start(config, SystemClock::shared())
        .await
        .unwrap();
    Arc::new(generator)
}

/// Issues from `generator` (200 ids every 2 ms, at most `within`) until it
/// stops for good; returns every id it issued.
pub(crate) fn keep_issuing(
    generator: Arc<EmbeddedGenerator>,
    within: Duration,
) -> JoinHandle<Vec<u64>> {
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let until = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < until && generator.stopped().is_none() {
            if let Ok(batch) = generator.next_ids(200).await {
                ids.extend(batch);
            }
            // A pace, so the ids of a long run fit in memory.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        ids
    })
}

/// `count` ids from `server` in batches of 1000.
pub(crate) async fn ids_from(server: &ServerProcess, count: usize) -> Vec<u64> {
    let mut ids = Vec::with_capacity(count);
    while ids.len() < count {
        ids.extend(server.next_ids(1000).await.expect("NextIds"));
    }
    assert_eq!(ids.len(), count);
    ids
}

/// Asserts no id appears twice across `parts`; returns how many there are.
pub(crate) fn assert_unique(parts: &[(&str, &[u64])]) -> usize {
    let total: usize = parts.iter().map(|(_, ids)| ids.len()).sum();
    let unique: HashSet<u64> = parts
        .iter()
        .flat_map(|(_, ids)| ids.iter().copied())
        .collect();
    let sizes: Vec<(&str, usize)> = parts.iter().map(|(n, ids)| (*n, ids.len())).collect();
    assert_eq!(unique.len(), total, "equal ids among {sizes:?}");
    total
}

pub(crate) async fn get(etcd: &EtcdProcess, key: &str) -> Option<String> {
    let resp = etcd.client().await.get(key, None).await.unwrap();
    resp.kvs()
        .first()
        .map(|kv| kv.value_str().unwrap().to_owned())
}

/// One `name value` line of the namespace record.
pub(crate) fn field<'a>(record: &'a str, name: &str) -> &'a str {
    record
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in the record:\n{record}"))
}

/// The fence of `machine_id` in `ns`, layout ms.
pub(crate) async fn fence(etcd: &EtcdProcess, ns: &str, machine_id: u16) -> u64 {
    get(etcd, &format!("/snowkeep/v1/ns/{ns}/fence/{machine_id:05}"))
        .await
        .expect("fence key")
        .parse()
        .unwrap()
}

/// A series of the server's gRPC request counter for a Lease API method.
fn lease_calls(method: &str) -> String {
    format!(
        r#"snowkeep_grpc_requests_total{{service="snowkeep.v1.LeaseService",method="{method}",protocol="grpc",code="OK"}}"#
    )
}

/// Waits until `server` has answered one Renew (the client's first, right
/// after start).
pub(crate) async fn first_renewal(server: &ServerProcess) {
    eventually("the client's first Renew", READY, || async {
        server.metric(&lease_calls("Renew")).await == 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_etcd_stops_its_clients_and_is_recreated_only_on_purpose_above_their_fences() {
    let ns = "wiped";
    let mut etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &LEASES);
    a.wait_serving(READY).await;
    let client = start_client(&a, ns).await;
    let machine_id = client.machine_ids()[0].get();
    let issuing = keep_issuing(client.clone(), Duration::from_secs(60));
    first_renewal(&a).await;
    let from_a = ids_from(&a, 2000).await;
    let client_fence = fence(&etcd, ns, machine_id).await;

    // etcd loses everything: same ports, empty data.
    etcd.wipe().await;
    let back = tokio::time::Instant::now();

    // The client learns through Check, before its next Renew (25 s away).
    eventually("the client to stop", Duration::from_secs(5), || async {
        client.stopped().is_some()
    })
    .await;
    let stopped_after = back.elapsed();
    assert_eq!(client.stopped(), Some(StopReason::NamespaceGone));
    assert_eq!(a.metric(&lease_calls("Renew")).await, 1.0, "no Renew since");
    assert!(a.metric(&lease_calls("Check")).await >= 1.0);
    eprintln!("client stopped {stopped_after:?} after etcd came back empty");
    let from_client = issuing.await.unwrap();
    assert!(!from_client.is_empty());

    // A new server does not create the namespace by itself.
    let mut b = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    assert_eq!(b.wait_exit(Duration::from_secs(15)).await.code(), Some(64));
    let expected = format!(
        "namespace \"wiped\" does not exist in etcd at {}: if it is new, create it once with --create-namespace-only (or start one server with --create-namespace); if etcd lost its state (wiped or restored from a backup), do not create it again: see docs/operations.md#when-etcd-lost-its-data",
        etcd.endpoint()
    );
    assert!(b.log().contains(&expected), "log:\n{}", b.log());
    assert_eq!(get(&etcd, "/snowkeep/v1/ns/wiped/layout").await, None);
    // A lost its lease with the data; it waits for the namespace, unready.
    eventually("A to stop serving", Duration::from_secs(10), || async {
        a.health().await == Some(ServingStatus::NotServing)
    })
    .await;

    // The operator recreates it, fenced past every client's fence.
    let mut setup = ServerProcess::joining(
        &etcd.endpoint(),
        ns,
        &[
            "--create-namespace",
            "--confirm-namespace-floor",
            CLIENT_FLOOR,
        ],
    );
    assert_eq!(
        setup.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0),
        "log:\n{}",
        setup.log()
    );
    let record = get(&etcd, "/snowkeep/v1/ns/wiped/layout").await.unwrap();
    assert_eq!(field(&record, "state"), "ok");
    let floor: u64 = field(&record, "floor_ms").parse().unwrap();
    assert!(
        floor > client_fence,
        "floor {floor} <= client fence {client_fence}"
    );
    // A server that would not wait that long says so and exits 1.
    let mut impatient = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    assert_eq!(
        impatient.wait_exit(Duration::from_secs(15)).await.code(),
        Some(1)
    );
    assert!(
        impatient
            .log()
            .contains("namespace \"wiped\" is fenced until")
            && impatient.log().contains("more than --max-fence-wait 10s"),
        "log:\n{}",
        impatient.log()
    );

    // A server on the client's very machine id issues only above the floor.
    let range = format!("{machine_id}..{}", machine_id + 1);
    let c = ServerProcess::joining(
        &etcd.endpoint(),
        ns,
        &["--machine-id-range", &range, FLOOR_WAIT[0], FLOOR_WAIT[1]],
    );
    c.wait_serving(Duration::from_secs(200)).await;
    assert_eq!(c.machine_id().await, u32::from(machine_id));
    let from_c = ids_from(&c, 10_000).await;
    assert!(from_c.iter().all(|&id| ts(id) > floor));
    // A resumes by itself, without a restart.
    a.wait_serving(Duration::from_secs(60)).await;
    let from_a_after = ids_from(&a, 2000).await;

    let total = assert_unique(&[
        ("A before", &from_a),
        ("client", &from_client),
        ("C", &from_c),
        ("A after", &from_a_after),
    ]);
    assert_eq!(total, 2000 + from_client.len() + 10_000 + 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_restored_from_an_older_snapshot_is_refused_until_a_floor_is_confirmed() {
    let ns = "restored";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("before-the-client.db");
    let mut etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &LEASES);
    a.wait_serving(READY).await;
    // Some other use of this etcd, so the snapshot's revision is well above
    // the slack (16) the detection allows.
    let mut other = etcd.client().await;
    for i in 0..40 {
        other
            .put(format!("/other-app/{i}"), "x", None)
            .await
            .unwrap();
    }
    etcd.snapshot_save(&snapshot);

    // After the snapshot: a client acquires and renews, A issues.
    let client = start_client(&a, ns).await;
    let machine_id = client.machine_ids()[0].get();
    let issuing = keep_issuing(client.clone(), Duration::from_secs(60));
    first_renewal(&a).await;
    let from_a = ids_from(&a, 2000).await;
    let client_fence = fence(&etcd, ns, machine_id).await;

    // Restored with etcdctl itself, not the runbook's script: nothing is
    // marked, so the servers must see it themselves.
    etcd.restore_raw(&snapshot).await;
    let (revision, applied) = etcd.progress().await;
    eprintln!("restored: revision {revision}, raft applied index {applied}");

    // A (still running) finds the restore, marks the namespace, stops issuing.
    eventually(
        "A to mark the namespace",
        Duration::from_secs(10),
        || async {
            a.log()
                .contains("etcd lost writes: marking the namespace rolled back")
        },
    )
    .await;
    eventually("A to stop serving", Duration::from_secs(10), || async {
        a.health().await == Some(ServingStatus::NotServing)
    })
    .await;
    assert_eq!(
        a.next_ids(1).await.unwrap_err().code(),
        tonic::Code::Unavailable
    );
    let record = get(&etcd, "/snowkeep/v1/ns/restored/layout").await.unwrap();
    assert_eq!(field(&record, "state"), "rolled-back");
    let reason = field(&record, "rolled_back_reason");
    // A remembers a higher revision than the restored etcd answers with.
    assert!(
        reason.starts_with("etcd revision ")
            && reason
                .ends_with(" this server saw before: etcd was restored from an older snapshot"),
        "{reason}"
    );

    // The client stops at its next Check.
    eventually("the client to stop", Duration::from_secs(5), || async {
        client.stopped().is_some()
    })
    .await;
    assert_eq!(client.stopped(), Some(StopReason::NamespaceRolledBack));
    let from_client = issuing.await.unwrap();
    assert!(!from_client.is_empty());

    // A new server refuses (exit 1), naming the rollback and the runbook.
    let mut n = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    assert_eq!(n.wait_exit(Duration::from_secs(15)).await.code(), Some(1));
    let log = n.log();
    assert!(
        log.contains("namespace \"restored\" is rolled back since")
            && log.contains("no machine id is claimed in it until an operator confirms a timestamp floor with snowkeep-server --confirm-namespace-floor: see docs/operations.md#restoring-etcd-from-a-snapshot"),
        "log:\n{log}"
    );
    // The Lease API refuses Acquire the same way.
    let mut api = lease_client(&a).await;
    let refused = api
        .acquire(acquire(ns, &Requester::current(), 1, None))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("--confirm-namespace-floor"),
        "{refused:?}"
    );

    // The operator confirms a floor above every client's fence.
    let mut confirm = ServerProcess::joining(
        &etcd.endpoint(),
        ns,
        &["--confirm-namespace-floor", CLIENT_FLOOR],
    );
    assert_eq!(
        confirm.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0),
        "log:\n{}",
        confirm.log()
    );
    let record = get(&etcd, "/snowkeep/v1/ns/restored/layout").await.unwrap();
    assert_eq!(field(&record, "state"), "ok");
    let floor: u64 = field(&record, "floor_ms").parse().unwrap();
    assert!(
        floor > client_fence,
        "floor {floor} <= client fence {client_fence}"
    );
    let acknowledged: i64 = field(&record, "acknowledged_gap").parse().unwrap();
    assert!(acknowledged > 16, "acknowledged gap {acknowledged}");
    // Acquire waits for the floor too: retryable UNAVAILABLE until then.
    let early = api
        .acquire(acquire(ns, &Requester::current(), 1, None))
        .await
        .unwrap_err();
    assert_eq!(early.code(), tonic::Code::Unavailable);
    assert!(
        early
            .message()
            .contains("namespace \"restored\" is fenced until"),
        "{early:?}"
    );

    // A server on the client's machine id (free in the restored store) issues
    // only above the floor; A resumes by itself.
    let range = format!("{machine_id}..{}", machine_id + 1);
    let d = ServerProcess::joining(
        &etcd.endpoint(),
        ns,
        &["--machine-id-range", &range, FLOOR_WAIT[0], FLOOR_WAIT[1]],
    );
    d.wait_serving(Duration::from_secs(200)).await;
    assert_eq!(d.machine_id().await, u32::from(machine_id));
    let from_d = ids_from(&d, 10_000).await;
    assert!(from_d.iter().all(|&id| ts(id) > floor));
    a.wait_serving(Duration::from_secs(60)).await;
    let from_a_after = ids_from(&a, 2000).await;
    assert!(from_a_after.iter().all(|&id| ts(id) > floor));

    let total = assert_unique(&[
        ("A before", &from_a),
        ("client", &from_client),
        ("D", &from_d),
        ("A after", &from_a_after),
    ]);
    assert_eq!(total, 2000 + from_client.len() + 10_000 + 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_namespace_record_refuses_to_start_with_64_naming_the_key() {
    let etcd = EtcdProcess::start().await;
    let mut client = etcd.client().await;
    let cases = [
        (
            "banana",
            "banana",
            r#"unreadable namespace record at /snowkeep/v1/ns/banana/layout: "banana" (cannot parse layout "banana""#,
        ),
        (
            "halfway",
            "layout 41/12/10@1767225600000\nincarnation 00000000000000ff\nstate maybe\nacknowledged_gap 0\n",
            r#"unreadable namespace record at /snowkeep/v1/ns/halfway/layout: "layout 41/12/10@1767225600000\nincarnation 00000000000000ff\nstate maybe\nacknowledged_gap 0\n" (state "maybe" is neither ok nor rolled-back)"#,
        ),
    ];
    for (ns, value, message) in cases {
        let key = format!("/snowkeep/v1/ns/{ns}/layout");
        client.put(key.as_str(), value, None).await.unwrap();
        // Plain, and with --create-namespace: garbage is never overwritten.
        for extra in [&[][..], &["--create-namespace"][..]] {
            let mut s = ServerProcess::joining(&etcd.endpoint(), ns, extra);
            assert_eq!(
                s.wait_exit(Duration::from_secs(15)).await.code(),
                Some(64),
                "{ns} {extra:?}"
            );
            assert!(
                s.log().contains(message),
                "{ns} {extra:?}: log:\n{}",
                s.log()
            );
        }
        assert_eq!(get(&etcd, &key).await.as_deref(), Some(value));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_namespace_record_refuses_new_servers_while_a_holder_issues_on() {
    let ns = "deleted";
    let etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    a.wait_serving(READY).await;
    let before = ids_from(&a, 2000).await;
    let key = "/snowkeep/v1/ns/deleted/layout";
    let first = get(&etcd, key).await.unwrap();
    let mut client = etcd.client().await;
    assert_eq!(client.delete(key, None).await.unwrap().deleted(), 1);

    // A new server refuses; the Lease API does not know the namespace.
    let mut b = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    assert_eq!(b.wait_exit(Duration::from_secs(15)).await.code(), Some(64));
    assert!(
        b.log()
            .contains("namespace \"deleted\" does not exist in etcd at"),
        "log:\n{}",
        b.log()
    );
    let mut api = lease_client(&a).await;
    let unknown = api
        .acquire(acquire(ns, &Requester::current(), 1, None))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // A holds its machine id with its holder key and fence intact: it says
    // so once and issues on under it.
    eventually("A to notice", Duration::from_secs(10), || async {
        a.log().contains(
            "the namespace record is gone or unreadable; issuing on under the machine ids held",
        )
    })
    .await;
    assert_eq!(a.health().await, Some(ServingStatus::Serving));
    let during = ids_from(&a, 2000).await;
    assert_eq!(
        a.metric(r#"snowkeep_lease_losses_total{reason="rolled_back"}"#)
            .await,
        0.0
    );

    // The operator puts the namespace back on purpose; new servers start.
    let mut setup = ServerProcess::joining(&etcd.endpoint(), ns, &["--create-namespace-only"]);
    assert_eq!(
        setup.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0)
    );
    let second = get(&etcd, key).await.unwrap();
    assert_ne!(
        field(&second, "incarnation"),
        field(&first, "incarnation"),
        "a new incarnation"
    );
    let c = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    c.wait_serving(READY).await;
    let from_c = ids_from(&c, 2000).await;
    let after = ids_from(&a, 2000).await;
    let total = assert_unique(&[
        ("A before", &before),
        ("A during", &during),
        ("C", &from_c),
        ("A after", &after),
    ]);
    assert_eq!(total, 8000);
}

/// A server of the three-member cluster: a 5 s lease TTL rides out the
/// leader elections of a restart on a busy machine.
fn on_cluster(endpoints: &str, ns: &str, extra: &[&str]) -> ServerProcess {
    let mut args = vec![
        "--etcd-endpoints",
        endpoints,
        "--namespace",
        ns,
        "--lease-ttl",
        "5s",
    ];
    args.extend_from_slice(extra);
    ServerProcess::spawn(&args)
}

/// The runbook's restore section (docs/operations.md), step by step, with
/// its commands (scripts/etcd-snapshot, snowkeep-server flags), on a cluster
/// of three members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runbooks_restore_procedure_works_as_written() {
    let ns = "runbook";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("snowkeep.db");
    let mut etcd = EtcdProcess::cluster(3).await;
    let endpoints = etcd.endpoints();
    let a = on_cluster(&endpoints, ns, &["--create-namespace"]);
    a.wait_serving(READY).await;
    let mut other = etcd.client().await;
    for i in 0..40 {
        other
            .put(format!("/other-app/{i}"), "x", None)
            .await
            .unwrap();
    }
    // Backup: scripts/etcd-snapshot save ENDPOINT FILE.
    etcd.snapshot_save(&snapshot);
    assert!(std::fs::metadata(&snapshot).unwrap().len() > 0);
    // Writes the restore will lose: a Lease API grant after the snapshot.
    let mut api = lease_client(&a).await;
    let lost = api
        .acquire(acquire(ns, &Requester::current(), 1, None))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(lost.namespace_incarnation, 0);
    let before = ids_from(&a, 2000).await;

    // Restore: stop every member, scripts/etcd-snapshot restore into a new
    // data dir for each, start them.
    etcd.restore(&snapshot).await;

    // The script marked every namespace rolled-back: a new server exits 1,
    // the running one stops.
    let mut refused = on_cluster(&endpoints, ns, &[]);
    refused
        .assert_exits(Duration::from_secs(20), 1, "is rolled back since")
        .await;
    eventually("A to stop serving", Duration::from_secs(15), || async {
        a.health().await == Some(ServingStatus::NotServing)
    })
    .await;

    // Confirm: no embedded client ran, so the floor need only pass what the
    // servers may have stamped (a fence horizon, 3 s) with room for skew.
    let mut confirm = on_cluster(&endpoints, ns, &["--confirm-namespace-floor", "+10s"]);
    assert_eq!(
        confirm.wait_exit(Duration::from_secs(20)).await.code(),
        Some(0),
        "log:\n{}",
        confirm.log()
    );
    assert!(confirm.log().contains("confirmed the namespace floor"));
    let record = get(&etcd, "/snowkeep/v1/ns/runbook/layout").await.unwrap();
    let floor: u64 = field(&record, "floor_ms").parse().unwrap();

    // Servers resume on their own, and new ones start.
    a.wait_serving(Duration::from_secs(40)).await;
    let b = on_cluster(&endpoints, ns, &[]);
    b.wait_serving(Duration::from_secs(40)).await;
    let after_a = ids_from(&a, 2000).await;
    let after_b = ids_from(&b, 2000).await;
    assert!(after_a.iter().chain(&after_b).all(|&id| ts(id) > floor));
    let total = assert_unique(&[
        ("A before", &before),
        ("A after", &after_a),
        ("B", &after_b),
    ]);
    assert_eq!(total, 6000);
}

/// The hex SHA-256 of `who`'s identity: how etcd keys name a requester.
fn requester_hash(who: &Requester) -> String {
    use sha2::Digest;
    let identity = format!(
        "{}:{}:{}:{}",
        who.host_id, who.pid, who.start_unix_ms, who.nonce
    );
    sha2::Sha256::digest(identity.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_answers_by_reading_only() {
    let ns = "check";
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    server.wait_serving(READY).await;
    let mut api = lease_client(&server).await;
    let who = Requester::current();
    let grant = api
        .acquire(acquire(ns, &who, 2, None))
        .await
        .unwrap()
        .into_inner();
    let record = get(&etcd, "/snowkeep/v1/ns/check/layout").await.unwrap();
    assert_eq!(
        format!("{:016x}", grant.namespace_incarnation),
        field(&record, "incarnation")
    );
    let ids: Vec<u32> = grant.machine_ids.iter().map(|m| m.machine_id).collect();
    let inc = grant.namespace_incarnation;
    let token = grant.lease_token.as_str();
    assert_eq!(token.len(), 64);
    let checker = api.clone();
    let check = move |req: pb::CheckRequest| {
        let mut api = checker.clone();
        async move { api.check(req).await.unwrap().into_inner() }
    };
    // Every key Check reads, with its mod revision, and the etcd leases. The
    // requester's record and token key are named by the SHA-256 of its
    // identity.
    let mut watched = vec![
        "/snowkeep/v1/ns/check/layout".to_owned(),
        format!("/snowkeep/v1/ns/check/requester/{}", requester_hash(&who)),
        format!("/snowkeep/v1/ns/check/token/{}", requester_hash(&who)),
    ];
    for id in &ids {
        watched.push(format!("/snowkeep/v1/ns/check/holder/{id:05}"));
        watched.push(format!("/snowkeep/v1/ns/check/fence/{id:05}"));
    }
    let revisions = || {
        let (etcd, watched) = (&etcd, &watched);
        async move {
            let mut c = etcd.client().await;
            let mut revs = Vec::new();
            for key in watched {
                let resp = c.get(key.as_str(), None).await.unwrap();
                revs.push(resp.kvs().first().map(|kv| kv.mod_revision()));
            }
            (revs, c.leases().await.unwrap().leases().len())
        }
    };
    let before = revisions().await;
    assert!(before.0.iter().all(Option::is_some), "{before:?}");

    let valid = check(check_request(&who, token, ns, inc, ids.clone())).await;
    assert!(valid.valid);
    assert_eq!(valid.reason, pb::LeaseCheckReason::Valid as i32);
    assert!(
        (590_000..=600_000).contains(&valid.remaining_ms),
        "{valid:?}"
    );
    // Skipped comparisons are not failures.
    assert!(check(check_request(&who, token, ns, 0, vec![])).await.valid);
    let gone = |r: pb::CheckResponse| (r.valid, r.reason, r.remaining_ms);
    let namespace_gone = (false, pb::LeaseCheckReason::NamespaceGone as i32, 0);
    let lease_gone = (false, pb::LeaseCheckReason::LeaseGone as i32, 0);
    assert_eq!(
        gone(check(check_request(&who, token, ns, inc ^ 1, ids.clone())).await),
        namespace_gone
    );
    assert_eq!(
        gone(check(check_request(&who, token, "nowhere", 0, vec![])).await),
        namespace_gone
    );
    assert_eq!(
        gone(check(check_request(&who, token, ns, inc, vec![ids[0]])).await),
        lease_gone
    );
    let stranger = who.renewed_nonce();
    assert_eq!(
        gone(check(check_request(&stranger, "", ns, inc, vec![])).await),
        lease_gone
    );
    for _ in 0..50 {
        assert!(
            check(check_request(&who, token, ns, inc, ids.clone()))
                .await
                .valid
        );
    }
    // The token comes first: a missing or wrong one is refused like Renew's,
    // before anything else is read.
    for wrong in [String::new(), "00".repeat(32)] {
        let refused = api
            .check(check_request(&who, &wrong, ns, inc, ids.clone()))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    }
    // Reads only: every key as it was, no lease granted.
    assert_eq!(revisions().await, before);
    // Once released, the lease is gone; bad input is INVALID_ARGUMENT.
    api.release(release(ns, &who, token, &[])).await.unwrap();
    assert_eq!(
        gone(check(check_request(&who, token, ns, inc, ids.clone())).await),
        lease_gone
    );
    let bad = api
        .check(check_request(&who, token, "a/b", inc, vec![]))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_server_does_not_answer_checks_issues_on_below_its_fence() {
    let ns = "quiet";
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    server.wait_serving(READY).await;
    let client = start_client(&server, ns).await;
    first_renewal(&server).await;
    server.signal("STOP");
    // Several check intervals with no answer: no stop, ids keep coming.
    let issuing = keep_issuing(client.clone(), CHECK_INTERVAL * 4);
    let ids = issuing.await.unwrap();
    server.signal("CONT");
    assert_eq!(client.stopped(), None);
    assert!(ids.len() >= 1000, "{} ids", ids.len());
    assert_unique(&[("client", &ids)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_versions_plain_layout_serves_and_gets_an_incarnation_on_purpose() {
    let ns = "legacy";
    let key = "/snowkeep/v1/ns/legacy/layout";
    let etcd = EtcdProcess::start().await;
    let mut client = etcd.client().await;
    client
        .put(key, "41/12/10@1767225600000", None)
        .await
        .unwrap();
    let a = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    a.wait_serving(READY).await;
    let mut api = lease_client(&a).await;
    let acquire = |who: &Requester| snowkeep_test_support::lease::acquire(ns, who, 1, None);
    let old = api
        .acquire(acquire(&Requester::current()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(old.namespace_incarnation, 0, "no incarnation yet");
    assert_eq!(
        get(&etcd, key).await.as_deref(),
        Some("41/12/10@1767225600000")
    );

    let mut setup = ServerProcess::joining(&etcd.endpoint(), ns, &["--create-namespace-only"]);
    assert_eq!(
        setup.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0)
    );
    let record = get(&etcd, key).await.unwrap();
    assert_eq!(field(&record, "layout"), "41/12/10@1767225600000");
    assert_eq!(field(&record, "state"), "ok");
    let new = api
        .acquire(acquire(&Requester::current()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        format!("{:016x}", new.namespace_incarnation),
        field(&record, "incarnation")
    );
    assert_eq!(a.next_ids(1000).await.unwrap().len(), 1000);
}
