//! The marking of `scripts/etcd-snapshot restore`: every value it writes
//! comes from the snapshot, so the members of a cluster restored on several
//! hosts get identical data; its etcd binds no port, so markings never race
//! for one; and its restore record keeps a namespace created after the
//! snapshot from being created again without a floor.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, UNIX_EPOCH};

use crate::store::restore::{marked_reason, sha256_of, snapshot_revision};
use crate::store::rollback::{assert_unique, field, get, ids_from, ts, FLOOR_WAIT};
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::READY;

/// Runs `scripts/etcd-snapshot mark FILE`.
fn mark(file: &Path) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/etcd-snapshot");
    Command::new(script)
        .arg("mark")
        .arg(file)
        .output()
        .expect("run scripts/etcd-snapshot mark")
}

/// `file` copied into a directory `host` of its own under `dir`, as on
/// another host.
fn copy_to_host(dir: &Path, host: &str, file: &Path) -> PathBuf {
    let to = dir.join(host);
    std::fs::create_dir(&to).unwrap();
    let copy = to.join(file.file_name().unwrap());
    std::fs::copy(file, &copy).unwrap();
    copy
}

/// `unix_ms` as the script writes `rolled_back_at`: RFC 3339, whole seconds.
fn rfc3339(unix_ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

/// The same snapshot marked on two "hosts" at once gives byte-identical
/// marked files (before, each marking drew its own time, incarnation and
/// loopback ports, the last of which etcd keeps in the member id), and both
/// markings succeed side by side. What the marking wrote is what the
/// snapshot says: `rolled_back_at` is the namespace's newest fence, an
/// older version's record gets an incarnation drawn from the snapshot's
/// sha256, and the restore record names the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marking_one_snapshot_on_two_hosts_at_once_gives_identical_files() {
    let ns = "marked-twice";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("nightly.db");
    let mut etcd = EtcdProcess::start().await;
    let mut a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    a.wait_serving(READY).await;
    ids_from(&a, 1000).await;
    let layout = "41/12/10@1767225600000";
    let mut other = etcd.client().await;
    other
        .put("/snowkeep/v1/ns/plain/layout", layout, None)
        .await
        .unwrap();
    etcd.snapshot_save(&snapshot);
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10)).await;

    let first = copy_to_host(dir.path(), "host-1", &snapshot);
    let second = copy_to_host(dir.path(), "host-2", &snapshot);
    let (one, two) = std::thread::scope(|s| {
        let one = s.spawn(|| mark(&first));
        let two = s.spawn(|| mark(&second));
        (one.join().unwrap(), two.join().unwrap())
    });
    for out in [&one, &two] {
        assert!(out.status.success(), "{out:?}");
    }
    let marked = |f: &Path| sha256_of(&f.with_extension("db.marked"));
    assert_eq!(marked(&first), marked(&second));

    etcd.restore(&first).await;
    let sha = sha256_of(&snapshot);
    let revision = snapshot_revision(&snapshot);
    assert_eq!(
        get(&etcd, "/snowkeep/v1/restored").await.as_deref(),
        Some(format!("sha256 {sha}\nrevision {revision}\n").as_str())
    );
    let record = get(&etcd, &format!("/snowkeep/v1/ns/{ns}/layout"))
        .await
        .unwrap();
    assert_eq!(field(&record, "state"), "rolled-back");
    assert_eq!(
        field(&record, "rolled_back_reason"),
        marked_reason(&snapshot)
    );
    let epoch: u64 = field(&record, "layout")
        .split_once('@')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let fences = etcd
        .client()
        .await
        .get(
            format!("/snowkeep/v1/ns/{ns}/fence/"),
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let newest: u64 = fences
        .kvs()
        .iter()
        .map(|kv| kv.value_str().unwrap().parse::<u64>().unwrap())
        .max()
        .expect("a fence in the snapshot");
    assert_eq!(field(&record, "rolled_back_at"), rfc3339(epoch + newest));

    let plain = get(&etcd, "/snowkeep/v1/ns/plain/layout").await.unwrap();
    let seed = format!("{sha} /snowkeep/v1/ns/plain/layout");
    let incarnation = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(seed.as_bytes());
        digest[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert_eq!(
        plain,
        format!(
            "layout {layout}\nincarnation {incarnation}\nstate rolled-back\nacknowledged_gap 0\nfloor_ms 0\nrolled_back_at {}\nrolled_back_reason {}\n",
            rfc3339(1_767_225_600_000),
            marked_reason(&snapshot)
        )
    );
}

/// The refusal of a creation without a floor on a restored etcd.
fn needs_floor(ns: &str, endpoint: &str, snapshot: &Path) -> String {
    format!(
        "namespace {ns:?} does not exist in etcd at {endpoint}, which was restored from a snapshot (sha256 {}, revision {}): the namespace may have been created after that snapshot and issued ids the restore lost, so it is not created without a timestamp floor above them. Choose the floor (docs/operations.md#choosing-the-floor) and create it once with --create-namespace --confirm-namespace-floor, like +48h1m: see docs/operations.md#restoring-etcd-from-a-snapshot",
        sha256_of(snapshot),
        snapshot_revision(snapshot)
    )
}

/// A namespace created after the snapshot does not exist after the restore,
/// and the snapshot holds no record of it to mark. Before, a server with
/// `--create-namespace` created it again with every fence at 0 and issued
/// the lost namespace's ids again. The restore record makes that creation
/// exit 64 until the operator gives a floor; above the floor, no id repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_created_after_the_snapshot_is_created_again_only_with_a_floor() {
    let ns = "after-snapshot";
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("nightly.db");
    let mut etcd = EtcdProcess::start().await;
    let endpoint = etcd.endpoint();
    let mut a = ServerProcess::on_etcd(&endpoint, "before-snapshot", &[]);
    a.wait_serving(READY).await;
    etcd.snapshot_save(&snapshot);

    let mut b = ServerProcess::on_etcd(&endpoint, ns, &[]);
    b.wait_serving(READY).await;
    let from_b = ids_from(&b, 5000).await;
    for s in [&mut a, &mut b] {
        s.signal("KILL");
        s.wait_exit(Duration::from_secs(10)).await;
    }
    etcd.restore(&snapshot).await;
    assert_eq!(
        get(&etcd, &format!("/snowkeep/v1/ns/{ns}/layout")).await,
        None
    );

    let refusal = needs_floor(ns, &endpoint, &snapshot);
    let mut serving = ServerProcess::on_etcd(&endpoint, ns, &[]);
    serving
        .assert_exits(Duration::from_secs(15), 64, &refusal)
        .await;
    let mut one_shot = ServerProcess::joining(&endpoint, ns, &["--create-namespace-only"]);
    one_shot
        .assert_exits(Duration::from_secs(15), 64, &refusal)
        .await;
    assert_eq!(
        get(&etcd, &format!("/snowkeep/v1/ns/{ns}/layout")).await,
        None
    );

    // The operator's floor: B stamped at most 3 s ahead (its 2 s budget).
    let mut create = ServerProcess::joining(
        &endpoint,
        ns,
        &[
            "--create-namespace-only",
            "--confirm-namespace-floor",
            "+5s",
        ],
    );
    assert_eq!(
        create.wait_exit(Duration::from_secs(20)).await.code(),
        Some(0),
        "log:\n{}",
        create.log()
    );
    let record = get(&etcd, &format!("/snowkeep/v1/ns/{ns}/layout"))
        .await
        .unwrap();
    assert_eq!(field(&record, "state"), "ok");
    let floor: u64 = field(&record, "floor_ms").parse().unwrap();
    let last_of_b = from_b.iter().map(|&id| ts(id)).max().unwrap();
    assert!(floor > last_of_b, "floor {floor}, B's last {last_of_b}");

    let c = ServerProcess::joining(&endpoint, ns, &FLOOR_WAIT);
    c.wait_serving(Duration::from_secs(60)).await;
    let from_c = ids_from(&c, 10_000).await;
    assert!(from_c.iter().all(|&id| ts(id) > floor));
    assert_eq!(assert_unique(&[("B", &from_b), ("C", &from_c)]), 15_000);
}
