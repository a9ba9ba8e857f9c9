//! Claims read the pool (holder, fence, last-holder and requester keys) in
//! bounded pages at one revision, whatever else the namespace holds; a
//! claim reads a window of a few blocks, and the whole pool only when the
//! window has no machine id to take without a wait.

use std::ops::Range;
use std::time::Duration;

use snowkeep_client::{Clock, Layout, Millis, SystemClock};
use snowkeep_etcd::{EtcdSettings, EtcdStore};
use snowkeep_proto::v1 as pb;

use crate::claim::settings::claimer_settings;
use snowkeep_test_support::etcd::{metrics_text, EtcdProcess};
use snowkeep_test_support::lease::{acquire, lease_client, release, renew, requester};
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);

/// A server in namespace `big` on a 10 s lease: writing 5 MiB into etcd can
/// stall it for longer than the usual 2 s test TTL on a loaded machine, and
/// this test is about paged reads, not about riding out a stall.
fn server_in_big(etcd: &EtcdProcess) -> ServerProcess {
    ServerProcess::spawn(&[
        "--etcd-endpoints",
        &etcd.endpoint(),
        "--namespace",
        "big",
        "--create-namespace",
        "--lease-ttl",
        "10s",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_work_when_the_namespace_holds_more_than_one_response_can_carry() {
    let etcd = EtcdProcess::start().await;
    let first = server_in_big(&etcd);
    first.wait_serving(READY).await;
    let first_id = first.machine_id().await;
    // 5 MiB of other keys under the namespace (an older version's skew keys,
    // say): more than etcd-client decodes in one response (4 MiB).
    let mut client = etcd.client().await;
    let blob = "x".repeat(100 * 1024);
    for i in 0..52 {
        client
            .put(
                format!("/snowkeep/v1/ns/big/skew/junk-{i:03}"),
                blob.clone(),
                None,
            )
            .await
            .unwrap();
    }
    let whole = client
        .get(
            "/snowkeep/v1/ns/big/",
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await;
    assert!(
        whole.is_err(),
        "one read of the whole prefix must be too big"
    );
    // A server claims; a requester acquires, renews and releases.
    let second = server_in_big(&etcd);
    second.wait_serving(READY).await;
    assert_ne!(second.machine_id().await, first_id);
    let mut api = lease_client(&second).await;
    let who = requester(500);
    let grant = api
        .acquire(acquire("big", &who, 2, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 2);
    let renewed = api
        .renew(renew("big", &who, &grant.lease_token, None))
        .await
        .unwrap()
        .into_inner();
    let ids = |g: &pb::LeaseGrant| {
        g.machine_ids
            .iter()
            .map(|m| (m.machine_id, m.floor_ms))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&renewed), ids(&grant));
    let released = api
        .release(release("big", &who, &grant.lease_token, &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_more_keys_than_one_page_is_read_whole() {
    let etcd = EtcdProcess::start().await;
    let first = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "paged",
        &["--machine-id-range", "1400..1401"],
    );
    first.wait_serving(READY).await;
    // 1,300 machine ids held by others: more holder keys than a page (1,024).
    let mut client = etcd.client().await;
    for chunk in (0..1_300u32).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<snowkeep_etcd::etcd_client::TxnOp> = chunk
            .iter()
            .map(|id| {
                snowkeep_etcd::etcd_client::TxnOp::put(
                    format!("/snowkeep/v1/ns/paged/holder/{id:05}"),
                    format!("other:{id}"),
                    None,
                )
            })
            .collect();
        client
            .txn(snowkeep_etcd::etcd_client::Txn::new().and_then(ops))
            .await
            .unwrap();
    }
    // The only free id of 0..1301 is 1300: a claim that saw every page goes
    // straight to it, without losing a race on a held one.
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "paged",
        &["--machine-id-range", "0..1301"],
    );
    server.wait_serving(READY).await;
    assert_eq!(server.machine_id().await, 1300);
    assert!(
        !server.log().contains("claim lost a race"),
        "{}",
        server.log()
    );
}

/// A store of instance id `claimer` in `namespace` (created on connect)
/// claiming one machine id of the default layout's 4,096.
async fn store_in(etcd: &EtcdProcess, namespace: &str) -> EtcdStore {
    store_of(etcd, namespace, 0..4096).await
}

/// [`store_in`], claiming one machine id of `range`.
async fn store_of(etcd: &EtcdProcess, namespace: &str, range: Range<u32>) -> EtcdStore {
    let settings = EtcdSettings {
        lease_ttl: Duration::from_secs(10),
        stable_instance: true,
        ..claimer_settings(etcd, namespace, "claimer", range)
    };
    EtcdStore::connect(settings, Layout::default(), SystemClock::shared())
        .await
        .unwrap()
}

/// Fills `namespace` straight in etcd: every machine id of 0..4096 has a
/// fence key (`fence(id)`), and all but `free(id)` a holder key of another
/// instance, on no lease.
async fn fill_pool(
    etcd: &EtcdProcess,
    namespace: &str,
    free: impl Fn(u32) -> bool,
    fence: impl Fn(u32) -> u64,
) {
    let mut client = etcd.client().await;
    for chunk in (0..4096u32).collect::<Vec<_>>().chunks(64) {
        let mut ops = Vec::new();
        for &id in chunk {
            ops.push(snowkeep_etcd::etcd_client::TxnOp::put(
                format!("/snowkeep/v1/ns/{namespace}/fence/{id:05}"),
                fence(id).to_string(),
                None,
            ));
            if !free(id) {
                ops.push(snowkeep_etcd::etcd_client::TxnOp::put(
                    format!("/snowkeep/v1/ns/{namespace}/holder/{id:05}"),
                    format!("other:{id}"),
                    None,
                ));
            }
        }
        client
            .txn(snowkeep_etcd::etcd_client::Txn::new().and_then(ops))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_a_nearly_full_pool_reads_two_blocks_not_the_pool() {
    let etcd = EtcdProcess::start().await;
    let mut store = store_in(&etcd, "full").await;
    // 4,032 of 4,096 machine ids held; one free per block of 64 (id 5 of
    // it), released long ago (fence 1 ms).
    fill_pool(&etcd, "full", |id| id % 64 == 5, |_| 1).await;
    let claim = store.claim().await.unwrap();
    assert_eq!(claim.held[0].machine_id.get() % 64, 5);
    assert_eq!(claim.held[0].floor, Millis(1));
    // The window: two blocks of 63 holder and 64 fence keys each, and the
    // fence-count root. After the claim, the check for an older twin reads
    // this instance id's one claim record and its holder key. Reading the
    // pool whole would take 8,129 keys.
    assert_eq!(store.claim_keys_read(), 2 * (63 + 64) + 1 + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_takes_a_machine_id_without_a_wait_from_beyond_its_window() {
    let etcd = EtcdProcess::start().await;
    let mut store = store_in(&etcd, "waits").await;
    let now = Layout::default()
        .to_layout_ms(SystemClock.unix_ms())
        .unwrap();
    // One free machine id per block (id 5 of it): fenced 5 s ahead (within
    // the 10 s fence wait) in blocks 0 to 62, long past (1 ms) only in
    // block 63. A window that misses block 63 holds only ids that need a
    // wait, so the claim reads the whole pool and takes 4,037 all the same.
    let free_id = 63 * 64 + 5;
    fill_pool(
        &etcd,
        "waits",
        |id| id % 64 == 5,
        |id| if id == free_id { 1 } else { now.get() + 5_000 },
    )
    .await;
    let claim = store.claim().await.unwrap();
    assert_eq!(claim.held[0].machine_id.get(), 4037);
    assert_eq!(claim.held[0].floor, Millis(1));
}

/// Range reads etcd has served (its `etcd_mvcc_range_total`): every get,
/// alone or in a transaction.
async fn etcd_range_reads(etcd: &EtcdProcess) -> u64 {
    let text = metrics_text(format!("{}/metrics", etcd.endpoint())).await;
    text.lines()
        .find_map(|l| l.strip_prefix("etcd_mvcc_range_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("etcd_mvcc_range_total in etcd's metrics") as u64
}

/// Holder keys of other instances for `ids` in `namespace`, each on
/// `lease` (0: none).
async fn hold(etcd: &EtcdProcess, namespace: &str, ids: Range<u32>, lease: impl Fn(u32) -> i64) {
    let mut client = etcd.client().await;
    for id in ids {
        let options = match lease(id) {
            0 => None,
            l => Some(snowkeep_etcd::etcd_client::PutOptions::new().with_lease(l)),
        };
        client
            .put(
                format!("/snowkeep/v1/ns/{namespace}/holder/{id:05}"),
                format!("other:{id}"),
                options,
            )
            .await
            .unwrap();
    }
}

/// A range 0..64 held by 64 etcd leases: 63 of them for an hour, and the
/// one with the highest lease id (1000) ending within the fence lead (3 s),
/// with 200 more holder keys of another range beside it. The refused claim
/// reads block 0 alone (64 holder keys and the fence-count root), and the
/// question how soon a holder's lease ends finds the ending lease among
/// all 64 (not only the first few ids) without reading a key again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_range_finds_its_ending_lease_among_all_without_reading_the_pool_again() {
    let etcd = EtcdProcess::start().await;
    let mut store = store_of(&etcd, "ending", 0..64).await;
    let mut client = etcd.client().await;
    for lease in 1..=63 {
        let options = snowkeep_etcd::etcd_client::LeaseGrantOptions::new().with_id(lease);
        client.lease_grant(3_600, Some(options)).await.unwrap();
    }
    let options = snowkeep_etcd::etcd_client::LeaseGrantOptions::new().with_id(1_000);
    client.lease_grant(3, Some(options)).await.unwrap();
    // Machine id 40 on lease 1000; the others on leases 1 to 63, in order.
    let lease = |id: u32| match id {
        40 => 1_000,
        _ if id < 40 => i64::from(id) + 1,
        _ => i64::from(id),
    };
    hold(&etcd, "ending", 0..64, lease).await;

    let refused = store.claim().await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        r#"no free machine id in namespace "ending": all 64 machine ids of range 0..64 are held"#
    );
    assert_eq!(store.claim_keys_read(), 64 + 1);
    let reads = etcd_range_reads(&etcd).await;
    let left = store.holder_lease_end().await.unwrap();
    assert!(
        left.is_some_and(|l| l <= Duration::from_secs(3)),
        "{left:?}"
    );
    assert_eq!(etcd_range_reads(&etcd).await, reads);
}

/// A range whose holders' leases all run for an hour: nothing ends within
/// the fence lead, so there is nothing to wait for, until one of them is
/// revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_range_of_live_long_leases_has_no_ending_lease() {
    let etcd = EtcdProcess::start().await;
    let mut store = store_of(&etcd, "live", 0..64).await;
    let mut client = etcd.client().await;
    for lease in 1..=64 {
        let options = snowkeep_etcd::etcd_client::LeaseGrantOptions::new().with_id(lease);
        client.lease_grant(3_600, Some(options)).await.unwrap();
    }
    hold(&etcd, "live", 0..64, |id| i64::from(id) + 1).await;
    assert!(store.claim().await.is_err());
    assert_eq!(store.holder_lease_end().await.unwrap(), None);
    // One of them revoked since the read: it ended, so a machine id is
    // about to be free (its key went with it).
    client.lease_revoke(64).await.unwrap();
    assert_eq!(
        store.holder_lease_end().await.unwrap(),
        Some(Duration::ZERO)
    );
}

/// A narrow range (100..110, inside block 1) in a namespace whose other
/// ranges are busy: its claim reads block 1 alone, never the other
/// servers' keys: 54 holder keys of block 1 beside the range, the
/// fence-count root, and after the claim its own record and holder key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrow_range_reads_its_own_blocks_not_the_namespaces_pool() {
    let etcd = EtcdProcess::start().await;
    let mut store = store_of(&etcd, "shared", 100..110).await;
    hold(&etcd, "shared", 0..100, |_| 0).await;
    hold(&etcd, "shared", 110..1_000, |_| 0).await;
    let claim = store.claim().await.unwrap();
    assert!((100..110).contains(&claim.held[0].machine_id.get()));
    assert_eq!(store.claim_keys_read(), (100 - 64) + (128 - 110) + 1 + 2);
}

/// etcd frozen while the refused claim asks about the holders' leases: the
/// answer is an error the claim loop retries (never "nothing ends soon",
/// which would end a first claim with exit 1), and asked again once etcd
/// answers, it finds the ending lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_question_etcd_does_not_answer_is_an_error_not_nothing_ending() {
    let etcd = EtcdProcess::start().await;
    let mut store = store_of(&etcd, "frozen", 0..64).await;
    let mut client = etcd.client().await;
    let options = snowkeep_etcd::etcd_client::LeaseGrantOptions::new().with_id(7);
    client.lease_grant(3, Some(options)).await.unwrap();
    hold(&etcd, "frozen", 0..64, |_| 7).await;
    assert!(store.claim().await.is_err());
    etcd.pause();
    let asked = store.holder_lease_end().await;
    etcd.resume();
    let err = asked.unwrap_err();
    assert!(
        matches!(
            err,
            snowkeep_core::claim::StoreError::Timeout {
                op: "lease ttl",
                ..
            }
        ),
        "{err}"
    );
    let left = store.holder_lease_end().await.unwrap();
    assert!(
        left.is_some_and(|l| l <= Duration::from_secs(3)),
        "{left:?}"
    );
}
