//! Claims read the pool (holder, fence, last-holder and requester keys) in
//! bounded pages at one revision, whatever else the namespace holds.

use std::time::Duration;

use snowkeep_proto::v1 as pb;

use crate::support::etcd::EtcdProcess;
use crate::support::lease::{acquire, lease_client, release, renew, requester};
use crate::support::server::ServerProcess;

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
            Some(etcd_client::GetOptions::new().with_prefix()),
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
        let ops: Vec<etcd_client::TxnOp> = chunk
            .iter()
            .map(|id| {
                etcd_client::TxnOp::put(
                    format!("/snowkeep/v1/ns/paged/holder/{id:05}"),
                    format!("other:{id}"),
                    None,
                )
            })
            .collect();
        client
            .txn(etcd_client::Txn::new().and_then(ops))
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
