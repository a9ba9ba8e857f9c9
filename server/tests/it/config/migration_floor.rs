//! A namespace created with a migration floor (`--floor-after-id`) on real
//! etcd issues only ids above the largest id an earlier generator could have
//! issued: a Leaf-style and a Sonyflake-style maximum at a cut-over two
//! seconds ahead. Every way the floor cannot be met exits 64 and writes
//! nothing.

use std::time::Duration;

use snowkeep_client::{Clock, SystemClock};

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(30);
const LEAF_EPOCH: u64 = 1_288_834_974_657;
const SONYFLAKE_EPOCH: u64 = 1_409_529_600_000;

/// Leaf's largest id at `cutover` (Unix ms): 41 bits of ms since its epoch,
/// then 10 worker and 12 sequence bits, all set.
fn leaf_max(cutover: u64) -> u64 {
    ((cutover - LEAF_EPOCH) << 22) | 0x3f_ffff
}

/// Sonyflake's largest id at `cutover`: 39 bits of 10 ms ticks since its
/// epoch, then 8 sequence and 16 machine bits, all set.
fn sonyflake_max(cutover: u64) -> u64 {
    (((cutover - SONYFLAKE_EPOCH) / 10) << 24) | 0xff_ffff
}

/// The namespace record's `floor_ms` line, `None` without a record.
async fn stored_floor(etcd: &EtcdProcess, namespace: &str) -> Option<u64> {
    let key = format!("/snowkeep/v1/ns/{namespace}/layout");
    let got = etcd.client().await.get(key, None).await.unwrap();
    let value = got.kvs().first()?.value_str().unwrap().to_owned();
    let line = value.lines().find(|l| l.starts_with("floor_ms "))?;
    Some(line["floor_ms ".len()..].parse().unwrap())
}

/// Starts a server creating `namespace` with `layout` above `after_id` of
/// `from`, takes 5,000 ids and checks each is above `after_id`; returns the
/// server.
async fn serves_above(
    etcd: &EtcdProcess,
    namespace: &str,
    layout: &str,
    after_id: u64,
    from: &str,
) -> ServerProcess {
    let id = after_id.to_string();
    let args = [
        "--layout",
        layout,
        "--floor-after-id",
        &id,
        "--floor-layout",
        from,
    ];
    let server = ServerProcess::on_etcd(&etcd.endpoint(), namespace, &args);
    server.wait_serving(READY).await;
    let mut ids = Vec::new();
    while ids.len() < 5_000 {
        ids.extend(server.next_ids(1_000).await.expect("NextIds"));
    }
    let below: Vec<u64> = ids.iter().copied().filter(|&i| i <= after_id).collect();
    assert_eq!(below, Vec::<u64>::new(), "ids at or below {after_id}");
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_with_a_migration_floor_issues_only_ids_above_the_old_maximum() {
    let etcd = EtcdProcess::start().await;
    let cutover = SystemClock.unix_ms() + 2_000;

    // Leaf: the same epoch and shift, so the floor is the cut-over's ms.
    let leaf = leaf_max(cutover);
    let leaf_layout = "41/12/10@1288834974657";
    let first = serves_above(
        &etcd,
        "from-leaf",
        leaf_layout,
        leaf,
        "41/10/12@1288834974657",
    )
    .await;
    assert_eq!(stored_floor(&etcd, "from-leaf").await, Some(leaf >> 22));
    assert_eq!(leaf >> 22, cutover - LEAF_EPOCH);
    // A second server with the same flags finds the floor in place.
    let id = leaf.to_string();
    let args = [
        "--layout",
        leaf_layout,
        "--floor-after-id",
        &id,
        "--floor-layout",
        "41/10/12@1288834974657",
    ];
    let second = ServerProcess::on_etcd(&etcd.endpoint(), "from-leaf", &args);
    second.wait_serving(READY).await;
    // A higher migration floor on the existing namespace is refused.
    let higher = (leaf + (1_000 << 22)).to_string();
    let args = ["--layout", leaf_layout, "--floor-after-id", &higher];
    let mut refused = ServerProcess::on_etcd(&etcd.endpoint(), "from-leaf", &args);
    refused
        .assert_exits(READY, 64, "namespace \"from-leaf\" exists with floor ")
        .await;
    assert!(
        refused.log().contains("below the migration floor"),
        "{}",
        refused.log()
    );
    drop((first, second));

    // Sonyflake: another epoch, unit and field order; only the integers count.
    let sony = sonyflake_max(cutover);
    serves_above(
        &etcd,
        "from-sonyflake",
        "41/12/10@1409529600000",
        sony,
        "39/16/8@1409529600000/10ms",
    )
    .await;
    assert_eq!(
        stored_floor(&etcd, "from-sonyflake").await,
        Some(sony >> 22)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_floor_that_cannot_be_met_exits_64_and_writes_nothing() {
    let etcd = EtcdProcess::start().await;
    let leaf = leaf_max(SystemClock.unix_ms()).to_string();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--floor-after-id", "9007199254740992", "--floor-layout", "js53"],
            "--floor-after-id 9007199254740992 does not fit --floor-layout 39/6/8@1767225600000/10ms: its largest id is 9007199254740991 (53 bits)",
        ),
        (
            &["--layout", "js53", "--floor-after-id", &leaf, "--floor-layout", "41/10/12@1288834974657"],
            "--layout 39/6/8@1767225600000/10ms cannot express an id above",
        ),
        (
            &["--floor-after-id", &leaf],
            "more than --max-fence-wait 10s: this namespace could not issue before then; choose an epoch at or before ",
        ),
        (
            &["--floor-after-id", "1", "--floor-layout", "41/12/10/5ms"],
            "time unit \"5ms\" is not supported",
        ),
    ];
    for (i, (args, says)) in cases.iter().enumerate() {
        let namespace = format!("refused-{i}");
        let mut server = ServerProcess::on_etcd(&etcd.endpoint(), &namespace, args);
        server.assert_exits(READY, 64, says).await;
        assert_eq!(stored_floor(&etcd, &namespace).await, None, "case {i}");
    }
    // Without --create-namespace there is nothing to set it on.
    let mut joining =
        ServerProcess::joining(&etcd.endpoint(), "refused-x", &["--floor-after-id", "1"]);
    joining
        .assert_exits(
            READY,
            64,
            "--floor-after-id applies when the namespace is created",
        )
        .await;
}
