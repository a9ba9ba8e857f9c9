//! Restores from early snapshots, which the index rule cannot see: the
//! runbook's restore (`scripts/etcd-snapshot restore`) marks every namespace
//! rolled-back before any server sees the data, and a server that lived
//! through a restore the script did not do notices that etcd went back below
//! a revision it saw. Either way nothing claims before a floor is confirmed,
//! and no id repeats after it.

use std::path::Path;
use std::time::Duration;

use snowkeep_client::StopReason;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::store::rollback::{
    assert_unique, field, first_renewal, get, ids_from, keep_issuing, start_client, ts,
    CLIENT_FLOOR, LEASES,
};
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, libfaketime, READY};

/// The index rule's slack: a snapshot at a revision this low is never seen
/// by it after a restore.
const INDEX_RULE_BLIND_BELOW: i64 = 20;

/// The hex SHA-256 of the file at `path`.
pub(crate) fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The revision of the snapshot file at `path`, as `etcdctl snapshot
/// status` reads it.
pub(crate) fn snapshot_revision(path: &Path) -> i64 {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "--write-out", "json"])
        .arg(path)
        .output()
        .expect("run etcdctl snapshot status");
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["revision"].as_i64().unwrap()
}

/// The reason `scripts/etcd-snapshot restore` writes into every record: the
/// snapshot's revision and sha256, never its file name (which may differ
/// from host to host).
pub(crate) fn marked_reason(snapshot: &Path) -> String {
    format!(
        "etcd was restored from a snapshot at revision {} (sha256 {}...) with scripts/etcd-snapshot restore: every write after it was taken is lost",
        snapshot_revision(snapshot),
        &sha256_of(snapshot)[..16]
    )
}

/// Takes a snapshot of `etcd` into `file` and returns its revision, which
/// must be low enough for the index rule to miss the restore.
async fn early_snapshot(etcd: &EtcdProcess, file: &Path) -> i64 {
    let (revision, _) = etcd.progress().await;
    etcd.snapshot_save(file);
    assert!(
        revision < INDEX_RULE_BLIND_BELOW,
        "the snapshot is at revision {revision}: not an early one"
    );
    revision
}

/// The value of the namespace record of `ns`.
async fn record(etcd: &EtcdProcess, ns: &str) -> String {
    get(etcd, &format!("/snowkeep/v1/ns/{ns}/layout"))
        .await
        .expect("namespace record")
}

/// The message a claimer refused on a rolled-back namespace logs.
fn refused_message(ns: &str) -> String {
    format!("namespace \"{ns}\" is rolled back since")
}

/// Confirms `floor` with a one-shot server; returns the confirmed floor (layout ms).
async fn confirm(etcd: &EtcdProcess, ns: &str, floor: &str) -> u64 {
    let mut confirm =
        ServerProcess::joining(&etcd.endpoint(), ns, &["--confirm-namespace-floor", floor]);
    assert_eq!(
        confirm.wait_exit(Duration::from_secs(20)).await.code(),
        Some(0),
        "log:\n{}",
        confirm.log()
    );
    let record = record(etcd, ns).await;
    assert_eq!(field(&record, "state"), "ok");
    field(&record, "floor_ms").parse().unwrap()
}

/// Issue 21, reproduction (a): a Lease API client acquires and renews after
/// an early snapshot; etcd is restored from it. A new server limited to the
/// client's machine id found it free (`fence_ms=0`) and issued under the
/// client's fence. Through the runbook's restore it is refused, and after
/// the floor no id repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_renewed_after_an_early_snapshot_is_not_shadowed_after_the_runbooks_restore()
{
    let ns = "early-client";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("early.db");
    let mut etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &LEASES);
    a.wait_serving(READY).await;
    let revision = early_snapshot(&etcd, &snapshot).await;

    let client = start_client(&a, ns).await;
    let machine_id = client.machine_ids()[0].get();
    let issuing = keep_issuing(client.clone(), Duration::from_secs(60));
    first_renewal(&a).await;
    let from_a = ids_from(&a, 2000).await;

    etcd.restore(&snapshot).await;
    let record_now = record(&etcd, ns).await;
    assert_eq!(field(&record_now, "state"), "rolled-back");
    assert_eq!(
        field(&record_now, "rolled_back_reason"),
        marked_reason(&snapshot)
    );
    eprintln!(
        "snapshot at revision {revision}; restored: {:?}",
        etcd.progress().await
    );

    // A server limited to the client's machine id claims nothing: exit 1.
    let range = format!("{machine_id}..{}", machine_id + 1);
    let mut n = ServerProcess::joining(&etcd.endpoint(), ns, &["--machine-id-range", &range]);
    n.assert_exits(Duration::from_secs(15), 1, &refused_message(ns))
        .await;
    // The client stops at its next Check, A stops issuing.
    eventually("the client to stop", Duration::from_secs(10), || async {
        client.stopped().is_some()
    })
    .await;
    assert_eq!(client.stopped(), Some(StopReason::NamespaceRolledBack));
    let from_client = issuing.await.unwrap();
    assert!(!from_client.is_empty());
    eventually("A to stop serving", Duration::from_secs(15), || async {
        a.health().await == Some(ServingStatus::NotServing)
    })
    .await;
    assert_eq!(
        a.next_ids(1).await.unwrap_err().code(),
        tonic::Code::Unavailable
    );

    // After the floor, the client's machine id issues only above it. D is a
    // server started once the floor (2 min ahead) has passed: its wall
    // clock runs 130 s ahead, so the test does not wait the 2 min out (the
    // wiped-etcd and older-snapshot tests in rollback.rs do, with servers
    // that wait for the floor by themselves).
    let floor = confirm(&etcd, ns, CLIENT_FLOOR).await;
    let d = server_with_clock(
        &etcd,
        ns,
        &dir.path().join("offset"),
        "+130",
        &["--machine-id-range", &range],
    );
    d.wait_serving(READY).await;
    assert_eq!(d.machine_id().await, u32::from(machine_id));
    let from_d = ids_from(&d, 10_000).await;
    assert!(from_d.iter().all(|&id| ts(id) > floor));
    let total = assert_unique(&[("A", &from_a), ("client", &from_client), ("D", &from_d)]);
    assert_eq!(total, 2000 + from_client.len() + 10_000);
}

/// Spawns a server joining `ns` whose wall clock runs `offset_s` seconds
/// off (libfaketime; `"-20"` is 20 s behind), the monotonic clock real;
/// `offset` is libfaketime's offset file.
fn server_with_clock(
    etcd: &EtcdProcess,
    ns: &str,
    offset: &Path,
    offset_s: &str,
    extra: &[&str],
) -> ServerProcess {
    std::fs::write(offset, offset_s).unwrap();
    let endpoint = etcd.endpoint();
    let mut args = vec![
        "--etcd-endpoints",
        &endpoint,
        "--namespace",
        ns,
        "--lease-ttl",
        "2s",
        "--outage-budget",
        "2s",
    ];
    args.extend_from_slice(extra);
    let lib = libfaketime();
    ServerProcess::spawn_env(
        &args,
        &[
            ("LD_PRELOAD", &lib),
            ("FAKETIME_TIMESTAMP_FILE", offset.to_str().unwrap()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    )
}

/// Issue 21, reproduction (b): a snapshot early in a new namespace's life,
/// then many fence writes; the holder crashes, etcd is restored, a successor
/// whose clock runs 20 s behind starts. The namespace stayed `ok` and the
/// successor issued the holder's ids again. Through the runbook's restore it
/// is refused, and after the floor no id repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_20s_behind_never_reissues_a_crashed_holders_ids_after_the_runbooks_restore() {
    let ns = "early-holder";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("early.db");
    let offset = dir.path().join("offset");
    let mut etcd = EtcdProcess::start().await;
    let mut a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    a.wait_serving(READY).await;
    let revision = early_snapshot(&etcd, &snapshot).await;

    // 35 writes and more after the snapshot: fence advances while A issues.
    let mut from_a = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while etcd.progress().await.0 < revision + 35 {
        assert!(tokio::time::Instant::now() < deadline, "35 fence writes");
        from_a.extend(ids_from(&a, 1000).await);
        // A pace, so the ids of a long run fit in memory.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before_crash = etcd.progress().await.0;
    from_a.extend(ids_from(&a, 2000).await);
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10)).await;

    etcd.restore(&snapshot).await;
    let (restored_revision, applied) = etcd.progress().await;
    eprintln!("snapshot at revision {revision}, {before_crash} before the crash; restored: revision {restored_revision}, applied index {applied}");
    let record_now = record(&etcd, ns).await;
    assert_eq!(field(&record_now, "state"), "rolled-back");
    assert_eq!(
        field(&record_now, "rolled_back_reason"),
        marked_reason(&snapshot)
    );

    // The successor, 20 s behind, claims nothing: exit 1.
    let mut b = server_with_clock(&etcd, ns, &offset, "-20", &[]);
    b.assert_exits(Duration::from_secs(15), 1, &refused_message(ns))
        .await;

    // Above the floor it issues, none of A's ids again.
    let floor = confirm(&etcd, ns, "+5s").await;
    let c = server_with_clock(&etcd, ns, &offset, "-20", &["--max-fence-wait", "1m"]);
    c.wait_serving(Duration::from_secs(90)).await;
    let from_c = ids_from(&c, 20_000).await;
    assert!(from_c.iter().all(|&id| ts(id) > floor));
    let total = assert_unique(&[("A", &from_a), ("C", &from_c)]);
    assert_eq!(total, from_a.len() + 20_000);
}

/// A restore done with `etcdctl snapshot restore` itself (not the script)
/// from an early snapshot: the index rule cannot see it, but a live server
/// remembers a higher revision than etcd now answers with. It marks the
/// namespace and stops issuing, and its Lease API client's Check reports the
/// rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_server_and_its_client_notice_a_raw_restore_of_an_early_snapshot() {
    let ns = "raw-early";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("early.db");
    let mut etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &LEASES);
    a.wait_serving(READY).await;
    let revision = early_snapshot(&etcd, &snapshot).await;
    let client = start_client(&a, ns).await;
    let issuing = keep_issuing(client.clone(), Duration::from_secs(60));
    first_renewal(&a).await;
    ids_from(&a, 2000).await;

    // Paused over the restore, so that the record can be seen unmarked
    // first (A marks it within a second of etcd's return).
    a.signal("STOP");
    etcd.restore_raw(&snapshot).await;
    let (restored_revision, applied) = etcd.progress().await;
    eprintln!("snapshot at revision {revision}; restored: revision {restored_revision}, applied index {applied}");
    assert_eq!(field(&record(&etcd, ns).await, "state"), "ok", "not marked");
    a.signal("CONT");

    eventually(
        "A to mark the namespace",
        Duration::from_secs(15),
        || async {
            // The log line comes just before the marking transaction.
            a.log()
                .contains("etcd lost writes: marking the namespace rolled back")
                && field(&record(&etcd, ns).await, "state") == "rolled-back"
        },
    )
    .await;
    let marked = record(&etcd, ns).await;
    assert_eq!(field(&marked, "state"), "rolled-back");
    let reason = field(&marked, "rolled_back_reason");
    let expected_tail = " this server saw before: etcd was restored from an older snapshot";
    assert!(
        reason.starts_with("etcd revision ") && reason.ends_with(expected_tail),
        "{reason}"
    );
    eventually("A to stop serving", Duration::from_secs(15), || async {
        a.health().await == Some(ServingStatus::NotServing)
    })
    .await;
    assert_eq!(
        a.next_ids(1).await.unwrap_err().code(),
        tonic::Code::Unavailable
    );
    eventually("the client to stop", Duration::from_secs(10), || async {
        client.stopped().is_some()
    })
    .await;
    assert_eq!(client.stopped(), Some(StopReason::NamespaceRolledBack));
    assert!(!issuing.await.unwrap().is_empty());
    let mut n = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    n.assert_exits(Duration::from_secs(15), 1, &refused_message(ns))
        .await;
}

/// The last net, for a raw restore no running server lived through: the
/// index rule sees a snapshot whose revision is well above the new raft log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_server_sees_a_raw_restore_of_a_late_snapshot_by_the_index_rule() {
    let ns = "raw-late";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("late.db");
    let mut etcd = EtcdProcess::start().await;
    let mut a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    a.wait_serving(READY).await;
    let mut other = etcd.client().await;
    for i in 0..40 {
        other
            .put(format!("/other-app/{i}"), "x", None)
            .await
            .unwrap();
    }
    etcd.snapshot_save(&snapshot);
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10)).await;
    etcd.restore_raw(&snapshot).await;

    let mut n = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    n.assert_exits(Duration::from_secs(15), 1, &refused_message(ns))
        .await;
    let marked = record(&etcd, ns).await;
    let reason = field(&marked, "rolled_back_reason");
    assert!(
        reason.starts_with("etcd revision ")
            && reason.ends_with("+ slack 16: etcd was restored from an older snapshot"),
        "{reason}"
    );
}

/// A raw restore of an early snapshot that a live server sleeps through
/// (SIGSTOP) while other writers push etcd's revision back above every
/// revision it saw: comparing revisions cannot tell any more, and the index
/// rule cannot see an early snapshot. But the server's fence key is now at a
/// mod revision below the one the server wrote it at, which only a restore
/// does: its next fence write marks the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_server_sees_its_fence_gone_back_after_the_revision_climbed_past_it() {
    let ns = "raw-overtaken";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("early.db");
    let mut etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(
        &etcd.endpoint(),
        ns,
        &["--outage-budget", "2s", "--lease-ttl", "30s"],
    );
    a.wait_serving(READY).await;
    let revision = early_snapshot(&etcd, &snapshot).await;
    // Busy for a while: A raises its fence (every second) above the snapshot.
    for _ in 0..200 {
        a.next_ids(100).await.expect("NextIds");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.signal("STOP");
    let (seen, _) = etcd.progress().await;
    assert!(seen > revision + 1, "A wrote nothing since the snapshot");

    etcd.restore_raw(&snapshot).await;
    let mut other = etcd.client().await;
    for i in 0..(seen - revision + 20) {
        other
            .put(format!("/other-app/{i}"), "x", None)
            .await
            .unwrap();
    }
    let (climbed, applied) = etcd.progress().await;
    eprintln!("snapshot at {revision}, A saw up to {seen}; restored and climbed to {climbed} at applied index {applied}");
    assert!(climbed > seen);
    assert_eq!(field(&record(&etcd, ns).await, "state"), "ok", "not marked");
    a.signal("CONT");

    eventually(
        "A to mark the namespace",
        Duration::from_secs(20),
        || async {
            let _ = a.next_ids(10).await;
            a.log()
                .contains("etcd lost writes: marking the namespace rolled back")
                && field(&record(&etcd, ns).await, "state") == "rolled-back"
        },
    )
    .await;
    let marked = record(&etcd, ns).await;
    assert_eq!(field(&marked, "state"), "rolled-back");
    let reason = field(&marked, "rolled_back_reason");
    assert!(
        reason.contains("this server wrote it at: etcd was restored from an older snapshot"),
        "{reason}"
    );
    eventually("A to stop serving", Duration::from_secs(15), || async {
        a.health().await == Some(ServingStatus::NotServing)
    })
    .await;
}

/// A snapshot copied with its time kept (`cp -p`, `rsync -t`, `tar`) over an
/// older one of the same name is older than that one's marked copy: the
/// runbook's restore tells them apart by content and restores the snapshot
/// it was given, not the other one's marked data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runbooks_restore_never_reuses_the_marked_copy_of_another_snapshot() {
    let ns = "remarked";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("nightly.db");
    let mut etcd = EtcdProcess::start().await;
    let mut a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    a.wait_serving(READY).await;
    etcd.snapshot_save(&snapshot);
    etcd.snapshot_mark(&snapshot);
    let marked_at = std::fs::metadata(dir.path().join("nightly.db.marked"))
        .unwrap()
        .modified()
        .unwrap();

    // A later snapshot, with a time from before the marking, takes the name.
    let mut other = etcd.client().await;
    other.put("/other-app/later", "x", None).await.unwrap();
    let later = dir.path().join("later.db");
    etcd.snapshot_save(&later);
    std::fs::File::options()
        .write(true)
        .open(&later)
        .unwrap()
        .set_modified(marked_at - Duration::from_secs(3600))
        .unwrap();
    std::fs::rename(&later, &snapshot).unwrap();
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10)).await;

    etcd.restore(&snapshot).await;
    assert_eq!(
        get(&etcd, "/other-app/later").await.as_deref(),
        Some("x"),
        "restored the data of the snapshot marked before"
    );
    let marked = record(&etcd, ns).await;
    assert_eq!(field(&marked, "state"), "rolled-back");
    assert_eq!(
        field(&marked, "rolled_back_reason"),
        marked_reason(&snapshot)
    );
}
