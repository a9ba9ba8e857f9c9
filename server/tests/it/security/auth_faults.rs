//! Regression tests for findings of outside testing on authentication,
//! quotas and the administration service. Each test failed on the code it
//! was written against; its comment says what it found and what now holds.

use std::collections::BTreeSet;
use std::time::Duration;

use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::auth::{lease, AuthCluster};
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, ids_of, lease_client, renew, requester};
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::READY;

use pb::Permission::Lease;

/// Machine ids of `ns` whose holder key names a Lease API requester (the
/// ground truth of what is pinned, whatever the requester records say).
async fn requester_held_ids(etcd: &EtcdProcess, ns: &str) -> BTreeSet<u32> {
    let prefix = format!("/snowkeep/v1/ns/{ns}/holder/");
    let resp = etcd
        .client()
        .await
        .get(
            prefix.clone(),
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .filter(|kv| kv.value().starts_with(b"requester/"))
        .map(|kv| {
            std::str::from_utf8(&kv.key()[prefix.len()..])
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// Regression test (outside testing; the quota promise of operations.md,
/// "Quotas": one key cannot pin more machine ids than its quota).
/// Concurrent Acquires of ONE requester identity (same host, pid, start and
/// nonce, no token) all passed the "record exists?" check before the first
/// committed, and the grant transaction wrote the requester record, token
/// and the key holding without requiring them absent, so each winner
/// overwrote the previous one's holding and the overwritten grants' machine
/// ids stayed held on their own etcd leases, counted nowhere (9 pinned under
/// quota 4). Now the grant commits only while the requester has no record,
/// token or holding; the others give their claims back and are refused as
/// Acquires without the winner's lease token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_one_requester_never_pin_more_than_the_key_quota() {
    let c = AuthCluster::start("brkquota").await;
    let quota = 4;
    let (key, _) = c.create_key(&[Lease], &[], quota).await;
    let (a, b) = (lease(&c.a, Some(&key)).await, lease(&c.b, Some(&key)).await);
    let who = requester(4_242);
    let mut calls = Vec::new();
    for i in 0..16 {
        let mut api = if i % 2 == 0 { a.clone() } else { b.clone() };
        let req = acquire(&c.ns, &who, 2, None);
        calls.push(tokio::spawn(async move { api.acquire(req).await }));
    }
    let mut granted = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(g) => granted += g.into_inner().machine_ids.len(),
            Err(s) => assert!(
                matches!(
                    s.code(),
                    Code::ResourceExhausted | Code::Unavailable | Code::PermissionDenied
                ),
                "{s:?}"
            ),
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pinned = requester_held_ids(&c.etcd, &c.ns).await;
    assert!(
        pinned.len() <= quota as usize,
        "a key with quota {quota} pins {} machine ids ({pinned:?}); {granted} granted in answers",
        pinned.len()
    );
}

/// The same kind without an API key (no quota): concurrent Acquires of one
/// requester identity through two servers each overwrote the previous
/// winner's record and token, and every overwritten grant's machine ids
/// stayed held on its own lease (10 min) with no record to renew or release
/// them. Exactly one grant is held now; every other Acquire is refused as
/// one without that grant's lease token, and gave its claim back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_one_requester_without_a_key_leave_one_grant_held() {
    let ns = "brkonegrant";
    let etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    a.wait_serving(READY).await;
    let b = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    b.wait_serving(READY).await;
    let (api_a, api_b) = (lease_client(&a).await, lease_client(&b).await);
    let who = requester(4_343);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let mut api = if i % 2 == 0 {
                api_a.clone()
            } else {
                api_b.clone()
            };
            let req = acquire(ns, &who, 2, None);
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                api.acquire(req).await
            })
        })
        .collect();
    let mut grants = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(g) => grants.push(g.into_inner()),
            Err(s) => assert!(
                matches!(s.code(), Code::PermissionDenied | Code::Unavailable),
                "{s:?}"
            ),
        }
    }
    assert_eq!(
        grants.len(),
        1,
        "concurrent Acquires of one requester were each granted: {:?}",
        grants.iter().map(ids_of).collect::<Vec<_>>()
    );
    let grant = grants.pop().unwrap();
    let granted: BTreeSet<u32> = ids_of(&grant).into_iter().collect();
    assert_eq!(granted.len(), 2);
    assert_eq!(
        requester_held_ids(&etcd, ns).await,
        granted,
        "the machine ids held in etcd are not exactly the one grant's"
    );
    // The grant answered is the one in etcd: its token renews it.
    let renewed = api_a
        .clone()
        .renew(renew(ns, &who, &grant.lease_token, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ids_of(&renewed).into_iter().collect::<BTreeSet<_>>(),
        granted
    );
}

/// An admin key scoped to one namespace used to administer every namespace
/// (evict anywhere, mint cluster-wide keys): AdminService checked only the
/// `admin` permission. Administration is cluster-wide, so CreateKey now
/// refuses namespaces on an admin key, and a scoped admin key that reaches
/// etcd some other way (an edited import, a hand-written record) gets
/// PERMISSION_DENIED on every administration call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_key_cannot_be_scoped_to_a_namespace() {
    use sha2::{Digest, Sha256};
    use snowkeep_test_support::auth::admin;
    let c = AuthCluster::start("brkadminns").await;
    let refused = admin(&c.a, Some(&c.admin_key))
        .await
        .create_key(pb::CreateKeyRequest {
            description: "admin of orders only".into(),
            expires_unix_ms: 0,
            namespaces: vec!["orders".into()],
            permissions: vec![pb::Permission::Admin as i32],
            max_lease_machine_ids: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused
            .message()
            .starts_with("an admin key cannot be limited to namespaces"),
        "{refused:?}"
    );

    // A scoped admin record written straight into etcd.
    let secret = "s".repeat(64);
    let hash: String = Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let record = serde_json::json!({
        "id": "kscoped",
        "namespaces": ["orders"],
        "permissions": ["admin"],
        "secret_sha256": hash,
    });
    c.etcd
        .client()
        .await
        .put("/snowkeep/v1/apikeys/kscoped", record.to_string(), None)
        .await
        .unwrap();
    let scoped = format!("kscoped.{secret}");
    let mut api = admin(&c.a, Some(&scoped)).await;
    // Known to the server once its watch delivered the record.
    snowkeep_test_support::eventually(
        "the scoped key to be known",
        Duration::from_secs(10),
        || {
            let mut api = api.clone();
            async move {
                api.list_keys(pb::ListKeysRequest {})
                    .await
                    .is_err_and(|s| s.code() == Code::PermissionDenied)
            }
        },
    )
    .await;
    let minted = api
        .create_key(pb::CreateKeyRequest {
            description: "minted by a key scoped to orders".into(),
            expires_unix_ms: 0,
            namespaces: vec![],
            permissions: vec![pb::Permission::Ids as i32, pb::Permission::Admin as i32],
            max_lease_machine_ids: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(minted.code(), Code::PermissionDenied);
    assert_eq!(
        minted.message(),
        "API key kscoped is limited to namespaces [\"orders\"], but administration acts on the whole cluster: use an admin key without namespaces"
    );
    let evicted = api
        .evict(pb::EvictRequest {
            namespace: c.ns.clone(),
            machine_id: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(evicted.code(), Code::PermissionDenied);
}
