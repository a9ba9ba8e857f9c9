//! Findings of the break session on authentication, quotas and the
//! administration service. Each test here FAILS on the code it was written
//! against; see the commit message and the test's comment for why.

use std::collections::BTreeSet;
use std::time::Duration;

use snowkeep_proto::v1 as pb;
use tonic::Code;

use crate::support::auth::{lease, AuthCluster};
use crate::support::lease::{acquire, requester};

use pb::Permission::Lease;

/// Machine ids of `ns` whose holder key names a Lease API requester (the
/// ground truth of what is pinned, whatever the requester records say).
async fn requester_held_ids(c: &AuthCluster) -> BTreeSet<u32> {
    let prefix = format!("/snowkeep/v1/ns/{}/holder/", c.ns);
    let resp = c
        .etcd
        .client()
        .await
        .get(
            prefix.clone(),
            Some(etcd_client::GetOptions::new().with_prefix()),
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

/// The quota promise (operations.md, "Quotas"): "one key cannot pin more
/// machine ids than its quota". Concurrent Acquires of ONE requester
/// identity (same host, pid, start and nonce, no token) all pass the
/// "record exists?" check before the first commits; claim_new then writes
/// the requester record, token and the key holding without guarding that
/// they do not exist, so each winner overwrites the previous one's holding
/// (`keyholds/<key>/<ns>/<requester>` = its own count). The quota loop's
/// retry counts again (it sees only the latest holding) and claims again.
/// The machine ids of the overwritten grants stay held on their own etcd
/// leases (10 min) and are counted nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_one_requester_pin_more_than_the_key_quota() {
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
    let pinned = requester_held_ids(&c).await;
    assert!(
        pinned.len() <= quota as usize,
        "a key with quota {quota} pins {} machine ids ({pinned:?}); {granted} granted in answers",
        pinned.len()
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
    use crate::support::auth::admin;
    use sha2::{Digest, Sha256};
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
    crate::support::eventually(
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
