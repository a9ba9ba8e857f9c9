//! Export, import and restore against hostile or stale input, from outside
//! testing: an import never revives a revoked key, never lowers a fence,
//! and a restore with authentication on can finish.

use std::time::Duration;

use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::auth::{admin, ids, AuthCluster};
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, lease_client, requester};
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::READY;

use pb::Permission::Ids;

/// `RevokeKey` revokes a key for good, and a revoked key is the answer to a
/// leaked one. `import --replace` of an export taken before the revocation
/// (restoring last night's backup) used to write the old record over the
/// revoked one and bring the key back on every server. The stored record
/// now keeps what tightens it: revoked if either copy is, the earlier
/// expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_replace_of_an_older_export_keeps_a_revoked_key_revoked() {
    let c = AuthCluster::start("brkrevive").await;
    let (leaked, record) = c.create_key(&[Ids], &[], 0).await;
    let next = pb::NextIdsRequest {
        count: 1,
        ..Default::default()
    };
    assert!(ids(&c.a, Some(&leaked)).await.next_ids(next).await.is_ok());
    let backup = admin(&c.a, Some(&c.admin_key))
        .await
        .export(pb::ExportRequest {})
        .await
        .unwrap()
        .into_inner()
        .document;
    admin(&c.a, Some(&c.admin_key))
        .await
        .revoke_key(pb::RevokeKeyRequest {
            id: record.id.clone(),
        })
        .await
        .unwrap();
    let refused = ids(&c.a, Some(&leaked)).await.next_ids(next).await;
    assert_eq!(refused.unwrap_err().code(), Code::Unauthenticated);

    admin(&c.a, Some(&c.admin_key))
        .await
        .import(pb::ImportRequest {
            document: backup,
            replace: true,
            lead_ms: 0,
        })
        .await
        .expect("import --replace");
    // The stored record (which every server's watch follows) stays revoked.
    let listed = admin(&c.b, Some(&c.admin_key))
        .await
        .list_keys(pb::ListKeysRequest {})
        .await
        .unwrap()
        .into_inner()
        .keys;
    let stored = listed.iter().find(|k| k.id == record.id).unwrap();
    assert!(stored.revoked, "{stored:?}");
    // GetInfo takes any valid key (and does not depend on the claim, which
    // the replace import's raised fences take away for a moment).
    let after = pb::info_service_client::InfoServiceClient::with_interceptor(
        c.b.channel().await,
        snowkeep_test_support::auth::bearer(Some(&leaked)),
    )
    .get_info(pb::GetInfoRequest {})
    .await
    .map(|r| r.into_inner().instance_id);
    assert!(
        matches!(&after, Err(s) if s.code() == Code::Unauthenticated),
        "the revoked key {} works again after import --replace: {after:?}",
        record.id
    );
}

/// A document that names a machine id twice used to restore the last entry
/// (a map collect), not the highest: with [{id, F}, {id, 0}] a requester's
/// fence F (its lease plus 60 s ahead) came back as the import's clock plus
/// the lead, so a server claiming it could stamp below what a still-running
/// embedded client may stamp. Anything named twice is now INVALID_ARGUMENT,
/// and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_of_a_document_naming_a_machine_id_twice_is_refused() {
    let mut etcd = EtcdProcess::start().await;
    let ns = "brkdup";
    let mut server = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    server.wait_serving(READY).await;
    let grant = lease_client(&server)
        .await
        .acquire(acquire(ns, &requester(9), 1, None))
        .await
        .unwrap()
        .into_inner();
    let m = grant.machine_ids[0].machine_id;
    let mut adm = pb::admin_service_client::AdminServiceClient::new(server.channel().await);
    let document = adm
        .export(pb::ExportRequest {})
        .await
        .unwrap()
        .into_inner()
        .document;
    let mut doc: serde_json::Value = serde_json::from_str(&document).unwrap();
    let fences = doc["namespaces"][0]["fences"].as_array_mut().unwrap();
    assert!(fences
        .iter()
        .any(|f| f["machine_id"] == m && f["fence_ms"].as_u64() > Some(0)));
    fences.push(serde_json::json!({"machine_id": m, "fence_ms": 0}));
    let crafted = serde_json::to_string(&doc).unwrap();

    server.signal("KILL");
    server.wait_exit(Duration::from_secs(10)).await;
    etcd.wipe().await;
    let fresh = ServerProcess::joining(&etcd.endpoint(), ns, &["--wait-for-namespace"]);
    let result = snowkeep_test_support::auth::import_when_ready(&fresh, None, &crafted).await;
    let refused = result.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(
        refused.message(),
        format!("the document names namespace \"{ns}\": fence of machine id {m} twice: an export names each once; fix or re-export the document")
    );
    // Nothing was written: the namespace is still missing.
    let stored = etcd
        .client()
        .await
        .get(
            format!("/snowkeep/v1/ns/{ns}/"),
            Some(
                snowkeep_etcd::etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(stored.count(), 0);
}

/// The restore in operations.md ("Backup, export and import") with
/// `--auth on`: a server waiting for its namespace (`--wait-for-namespace`)
/// must take the import that creates it. Its API keys (and the bootstrap
/// admin key) used to load only after the namespace opened, so every
/// AdminService call was UNAVAILABLE and the restore could never finish;
/// they now load as soon as etcd answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_a_server_waiting_for_its_namespace_takes_the_import_that_creates_it() {
    use snowkeep_test_support::auth::{admin, random_key};
    let mut etcd = EtcdProcess::start().await;
    let ns = "brkwaitauth";
    let dir = tempfile::tempdir().unwrap();
    let admin_key = random_key("kbootstrap02");
    let file = dir.path().join("admin.key");
    std::fs::write(&file, format!("{admin_key}\n")).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let auth = ["--auth", "on", "--bootstrap-admin-key-file", &file];
    let mut first = ServerProcess::on_etcd(&etcd.endpoint(), ns, &auth);
    first.wait_serving(READY).await;
    let document = loop {
        match admin(&first, Some(&admin_key))
            .await
            .export(pb::ExportRequest {})
            .await
        {
            Ok(r) => break r.into_inner().document,
            Err(e) if e.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("export: {e:?}"),
        }
    };
    first.signal("TERM");
    first.wait_exit(Duration::from_secs(15)).await;
    etcd.wipe().await;

    let mut flags = vec!["--wait-for-namespace"];
    flags.extend(auth);
    let waiting = ServerProcess::joining(&etcd.endpoint(), ns, &flags);
    snowkeep_test_support::auth::import_when_ready(&waiting, Some(&admin_key), &document)
        .await
        .expect("Import through a server waiting for its namespace with --auth on");
}
