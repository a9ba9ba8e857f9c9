//! One unreadable key breaks one thing, and says which: it quarantines its
//! own machine id, is counted in `snowkeep_corrupt_keys_total`, and is named
//! in full in the log.

use std::time::Duration;

use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, ids_of, lease_client, release, renew, requester};
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);

/// A server on `ns` owning machine ids 20..24, with a lease TTL long enough
/// that it never claims again during a test (a claim reads the pool, which
/// would count the corrupt key once more).
async fn server_of_four(etcd: &EtcdProcess, ns: &str) -> ServerProcess {
    let server = ServerProcess::spawn(&[
        "--etcd-endpoints",
        &etcd.endpoint(),
        "--namespace",
        ns,
        "--create-namespace",
        "--lease-ttl",
        "10s",
        "--machine-id-range",
        "20..24",
    ]);
    server.wait_serving(READY).await;
    server
}

fn corrupt_fences(ns: &str) -> String {
    format!("snowkeep_corrupt_keys_total{{namespace=\"{ns}\",kind=\"fence\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_fence_on_a_free_machine_id_breaks_nothing_else() {
    let etcd = EtcdProcess::start().await;
    let server = server_of_four(&etcd, "garbage").await;
    let mut api = lease_client(&server).await;
    let (a, b) = (requester(300), requester(301));
    let grant_a = api
        .acquire(acquire("garbage", &a, 1, None))
        .await
        .unwrap()
        .into_inner();
    let grant_b = api
        .acquire(acquire("garbage", &b, 1, None))
        .await
        .unwrap()
        .into_inner();
    let mut held = vec![server.machine_id().await];
    held.extend(ids_of(&grant_a));
    held.extend(ids_of(&grant_b));
    let free = (20..24).find(|id| !held.contains(id)).unwrap();
    assert_eq!(server.metric(&corrupt_fences("garbage")).await, 0.0);
    // Garbage in the free machine id's fence.
    let key = format!("/snowkeep/v1/ns/garbage/fence/{free:05}");
    etcd.client()
        .await
        .put(key.clone(), "not-a-number", None)
        .await
        .unwrap();

    // Every other requester's Renew and Release work.
    let renewed = api
        .renew(renew("garbage", &a, &grant_a.lease_token, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids_of(&renewed), ids_of(&grant_a));
    let b_id = grant_b.machine_ids[0].machine_id;
    let released = api
        .release(release("garbage", &b, &grant_b.lease_token, &[(b_id, 1)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, 1);
    // A claim passes the quarantined id by: the next requester gets the id
    // B released, and the one after finds nothing free.
    let c = api
        .acquire(acquire("garbage", &requester(302), 1, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids_of(&c), ids_of(&grant_b));
    let full = api
        .acquire(acquire("garbage", &requester(303), 1, None))
        .await
        .unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted);
    // Counted once per pool read (the two claims), and named in full.
    assert_eq!(server.metric(&corrupt_fences("garbage")).await, 2.0);
    let log = server.log();
    assert!(
        log.contains("quarantining a machine id whose fence is unreadable")
            && log.contains(&format!("key={key}")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_fence_of_its_own_fails_only_that_requesters_renewal_and_names_the_key() {
    let etcd = EtcdProcess::start().await;
    let server = server_of_four(&etcd, "own").await;
    let mut api = lease_client(&server).await;
    let (a, b) = (requester(310), requester(311));
    let grant_a = api
        .acquire(acquire("own", &a, 1, None))
        .await
        .unwrap()
        .into_inner();
    let grant_b = api
        .acquire(acquire("own", &b, 1, None))
        .await
        .unwrap()
        .into_inner();
    let id = grant_a.machine_ids[0].machine_id;
    let key = format!("/snowkeep/v1/ns/own/fence/{id:05}");
    let mut client = etcd.client().await;
    client.put(key.clone(), "garbage", None).await.unwrap();

    // A's own fence cannot be kept from going down: its Renew is refused,
    // naming the key.
    let refused = api
        .renew(renew("own", &a, &grant_a.lease_token, None))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Internal);
    assert_eq!(
        refused.message(),
        format!("unreadable value at {key}: \"garbage\"")
    );
    // B is not touched by it.
    let renewed = api
        .renew(renew("own", &b, &grant_b.lease_token, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids_of(&renewed), ids_of(&grant_b));
    // A can still give its machine ids back; the unreadable fence stays as
    // it is, so its machine id stays out of use.
    let released = api
        .release(release("own", &a, &grant_a.lease_token, &[(id, 1)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, 1);
    let fence = client.get(key.clone(), None).await.unwrap();
    assert_eq!(fence.kvs()[0].value(), b"garbage");
    let holder = client
        .get(format!("/snowkeep/v1/ns/own/holder/{id:05}"), None)
        .await
        .unwrap();
    assert!(holder.kvs().is_empty());
    // One free id (the fourth of 20..24) plus A's quarantined one: one more
    // requester fits, the next does not.
    api.acquire(acquire("own", &requester(312), 1, None))
        .await
        .unwrap();
    let full = api
        .acquire(acquire("own", &requester(313), 1, None))
        .await
        .unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted);
    // Counted by A's Renew and Release, then by the two claims.
    assert_eq!(server.metric(&corrupt_fences("own")).await, 4.0);
    assert!(server.log().contains(&format!("key={key}")));
}
