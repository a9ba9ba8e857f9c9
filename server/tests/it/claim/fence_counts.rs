//! Fence counts: a machine id without a fence key starts at the namespace
//! floor when the namespace's count shows no fence key was ever deleted, and
//! one fence horizon ahead when it cannot (a deleted key, an older
//! namespace, a namespace created over leftover keys). Straight through the
//! etcd store, against real etcd.

use std::time::Duration;

use snowkeep_client::{Clock, Layout, Millis, SystemClock};
use snowkeep_core::claim::HeldId;
use snowkeep_etcd::etcd_client::GetOptions;
use snowkeep_etcd::namespace::{FloorSpec, NamespaceSetup};
use snowkeep_etcd::Claim;
use snowkeep_etcd::{keys, EtcdSettings, EtcdStore};

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::READY;

const HORIZON_MS: u64 = 3000;

fn settings(etcd: &EtcdProcess, namespace: &str, range: std::ops::Range<u32>) -> EtcdSettings {
    EtcdSettings {
        endpoints: vec![etcd.endpoint()],
        access: Default::default(),
        namespace: namespace.into(),
        instance_id: format!("counter-{}-{}", range.start, rand_suffix()),
        lease_ttl: Duration::from_secs(10),
        machine_id_range: range,
        machine_ids: 1,
        stable_instance: false,
        fence_horizon: Duration::from_millis(HORIZON_MS),
        max_fence_wait: Duration::from_secs(10),
        request_timeout: Duration::from_secs(5),
        advertise_address: None,
        namespace_setup: NamespaceSetup {
            create: true,
            confirm_floor: None,
            migration_floor: None,
        },
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn now_ms() -> u64 {
    Layout::default()
        .to_layout_ms(SystemClock.unix_ms())
        .unwrap()
        .get()
}

/// Claims one machine id of `range` in `namespace` (creating the namespace
/// if `create`); returns it, the layout ms just before and just after the
/// claim, and the store (which holds it while it lives).
async fn claim(
    etcd: &EtcdProcess,
    namespace: &str,
    range: std::ops::Range<u32>,
    create: bool,
) -> (HeldId, u64, u64, EtcdStore, Claim) {
    let mut s = settings(etcd, namespace, range);
    s.namespace_setup.create = create;
    let mut store = EtcdStore::connect(s, Layout::default(), SystemClock::shared())
        .await
        .unwrap();
    let before = now_ms();
    let claim = store.claim().await.unwrap();
    let after = now_ms();
    (claim.held[0], before, after, store, claim)
}

async fn value(etcd: &EtcdProcess, key: &str) -> Option<String> {
    let mut client = etcd.client().await;
    let resp = client.get(key, None).await.unwrap();
    resp.kvs()
        .first()
        .map(|kv| kv.value_str().unwrap().to_owned())
}

/// The creation markers of fence-count block `block`.
async fn markers(etcd: &EtcdProcess, namespace: &str, block: u16) -> i64 {
    let prefix = format!("{}/{block:04}/", keys::fence_count_root(namespace));
    let mut client = etcd.client().await;
    client
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count()
}

/// Asserts `floor` is the conservative floor of a claim made between layout
/// ms `before` and `after`: one fence horizon past the claimer's clock.
fn assert_conservative(floor: Millis, before: u64, after: u64) {
    assert!(
        (before + HORIZON_MS..=after + HORIZON_MS).contains(&floor.get()),
        "floor {} not within [{}, {}]",
        floor.get(),
        before + HORIZON_MS,
        after + HORIZON_MS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_namespace_claims_never_used_ids_at_its_floor() {
    let etcd = EtcdProcess::start().await;
    let (held, before, after, _store, _claim) = claim(&etcd, "fresh", 5..6, true).await;
    // The namespace floor (0), not a fence horizon past the clock.
    assert_eq!(held.machine_id.get(), 5);
    assert_eq!(held.floor, Millis(0));
    // Created with the claim: the fence key, at the fence a first raise
    // would write (one horizon past the clock), so the first grant needs no
    // write of its own; and one marker.
    assert_conservative(held.fence, before, after);
    assert_eq!(
        value(&etcd, &keys::fence("fresh", held.machine_id)).await,
        Some(held.fence.get().to_string())
    );
    assert_eq!(
        value(&etcd, &keys::fence_count_root("fresh")).await,
        Some("base 0\nabsent_floor_ms 0\n".to_owned())
    );
    assert_eq!(markers(&etcd, "fresh", 0).await, 1);
    assert_eq!(
        value(&etcd, &keys::fence_count_block("fresh", 0)).await,
        None
    );

    // Created with a confirmed floor: claims start exactly there.
    let mut s = settings(&etcd, "floored", 0..1);
    s.namespace_setup.confirm_floor = Some(FloorSpec::After(Duration::from_secs(1)));
    EtcdStore::connect(s, Layout::default(), SystemClock::shared())
        .await
        .unwrap();
    let record = value(&etcd, &keys::layout("floored")).await.unwrap();
    let floor: u64 = record
        .lines()
        .find_map(|l| l.strip_prefix("floor_ms "))
        .unwrap()
        .parse()
        .unwrap();
    let (held, ..) = claim(&etcd, "floored", 0..1, false).await;
    assert_eq!(held.floor, Millis(floor));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_in_a_new_namespace_serves_without_waiting_for_a_fence() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "quick", &[]);
    server.wait_serving(READY).await;
    assert_eq!(server.metric("snowkeep_fence_waits_total").await, 0.0);
    assert!(
        !server.log().contains("waiting for the clock"),
        "log:\n{}",
        server.log()
    );
    assert_eq!(server.next_ids(10).await.unwrap().len(), 10);
    // A second server, once the first holds a machine id, likewise.
    let second = ServerProcess::joining(&etcd.endpoint(), "quick", &[]);
    second.wait_serving(READY).await;
    assert_eq!(second.metric("snowkeep_fence_waits_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_fence_costs_its_next_claimer_a_horizon_and_re_bases_its_block() {
    let etcd = EtcdProcess::start().await;
    let (first, ..) = claim(&etcd, "deleted", 5..6, true).await;
    assert_eq!(first.floor, Millis(0));
    // An operator deletes the holder and fence keys of the held machine id 5.
    let mut client = etcd.client().await;
    client
        .delete(keys::holder("deleted", first.machine_id), None)
        .await
        .unwrap();
    client
        .delete(keys::fence("deleted", first.machine_id), None)
        .await
        .unwrap();
    // Its next claimer cannot tell the key was ever written from the key
    // alone; the count (1 created, 0 left) says it was: a horizon ahead.
    let (again, before, after, _b, _claim_b) = claim(&etcd, "deleted", 5..6, false).await;
    assert_eq!(again.machine_id.get(), 5);
    assert_conservative(again.floor, before, after);
    assert_eq!(
        value(&etcd, &keys::fence("deleted", again.machine_id)).await,
        Some(again.floor.get().to_string())
    );
    // The block is re-based: 1 key present after 2 markers, and that floor
    // for its machine ids without a fence key from now on.
    assert_eq!(markers(&etcd, "deleted", 0).await, 2);
    assert_eq!(
        value(&etcd, &keys::fence_count_block("deleted", 0)).await,
        Some(format!("base -1\nabsent_floor_ms {}\n", again.floor.get()))
    );
    // Another never-used machine id of block 0 (0..64) starts there, ...
    let (six, ..) = claim(&etcd, "deleted", 6..7, false).await;
    assert_eq!(six.floor, again.floor);
    // ... one of block 1 (64..128) at the namespace floor.
    let (other_block, ..) = claim(&etcd, "deleted", 64..65, false).await;
    assert_eq!(other_block.floor, Millis(0));
    assert_eq!(
        value(&etcd, &keys::fence_count_block("deleted", 1)).await,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_id_without_its_fence_keeps_its_block_conservative() {
    let etcd = EtcdProcess::start().await;
    let (first, ..) = claim(&etcd, "held", 5..6, true).await;
    // Only the fence key goes: machine id 5 is still held.
    let mut client = etcd.client().await;
    client
        .delete(keys::fence("held", first.machine_id), None)
        .await
        .unwrap();
    // Twice a horizon ahead, and the block is not re-based in between:
    // its holder may still be stamping up to a fence nobody can read.
    for id in [6, 7] {
        let (held, before, after, ..) = claim(&etcd, "held", id..id + 1, false).await;
        assert!(
            (before + HORIZON_MS..=after + HORIZON_MS).contains(&held.floor.get()),
            "machine id {id}: floor {} not within [{}, {}]",
            held.floor.get(),
            before + HORIZON_MS,
            after + HORIZON_MS
        );
        assert_eq!(
            value(&etcd, &keys::fence_count_block("held", 0)).await,
            None
        );
    }
    assert_eq!(markers(&etcd, "held", 0).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_namespace_is_counted_from_its_first_claim_in_each_block() {
    let etcd = EtcdProcess::start().await;
    // An older version's namespace: a plain layout record and two fences,
    // no fence count.
    let mut client = etcd.client().await;
    client
        .put(keys::layout("old"), "41/12/10@1767225600000", None)
        .await
        .unwrap();
    for id in [1u16, 2] {
        client
            .put(
                keys::fence("old", snowkeep_client::MachineId(id)),
                "123",
                None,
            )
            .await
            .unwrap();
    }
    let (held, before, after, ..) = claim(&etcd, "old", 3..4, false).await;
    assert_conservative(held.floor, before, after);
    // Counted now: base 2 + 1 marker = the 3 fence keys present.
    assert_eq!(
        value(&etcd, &keys::fence_count_block("old", 0)).await,
        Some(format!("base 2\nabsent_floor_ms {}\n", held.floor.get()))
    );
    assert_eq!(markers(&etcd, "old", 0).await, 1);
    assert_eq!(value(&etcd, &keys::fence_count_root("old")).await, None);
    // The block's next never-used machine id starts at that floor, not a
    // horizon past a later clock.
    let (next, ..) = claim(&etcd, "old", 4..5, false).await;
    assert_eq!(next.floor, held.floor);
    // Another block is counted from its own first claim, a horizon ahead.
    let (other, before, after, ..) = claim(&etcd, "old", 64..65, false).await;
    assert_conservative(other.floor, before, after);
    assert_eq!(
        value(&etcd, &keys::fence_count_block("old", 1)).await,
        Some(format!("base 0\nabsent_floor_ms {}\n", other.floor.get()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_created_over_leftover_keys_is_not_counted_from_zero() {
    let etcd = EtcdProcess::start().await;
    // A record deleted by hand; its fence keys are still there.
    let mut client = etcd.client().await;
    client
        .put(
            keys::fence("leftover", snowkeep_client::MachineId(9)),
            "5",
            None,
        )
        .await
        .unwrap();
    let (held, before, after, ..) = claim(&etcd, "leftover", 10..11, true).await;
    assert_eq!(
        value(&etcd, &keys::fence_count_root("leftover")).await,
        None
    );
    assert_conservative(held.floor, before, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_key_written_by_hand_costs_its_block_one_horizon() {
    let etcd = EtcdProcess::start().await;
    let (first, ..) = claim(&etcd, "byhand", 5..6, true).await;
    assert_eq!(first.floor, Millis(0));
    // A fence key for machine id 7 that no claim created (and one that is
    // no machine id at all): more keys than the count of block 0.
    let mut client = etcd.client().await;
    for key in [
        keys::fence("byhand", snowkeep_client::MachineId(7)),
        format!(
            "{}-note",
            keys::fence("byhand", snowkeep_client::MachineId(9))
        ),
    ] {
        client.put(key, "5", None).await.unwrap();
    }
    let (held, before, after, ..) = claim(&etcd, "byhand", 8..9, false).await;
    assert_conservative(held.floor, before, after);
    // Re-based on the 4 keys present after 2 markers, so the next one of
    // the block starts at that floor, and trusts the count again.
    assert_eq!(
        value(&etcd, &keys::fence_count_block("byhand", 0)).await,
        Some(format!("base 2\nabsent_floor_ms {}\n", held.floor.get()))
    );
    let (next, ..) = claim(&etcd, "byhand", 10..11, false).await;
    assert_eq!(next.floor, held.floor);
}
