//! Export, wipe, import: the restored namespace is accepted by the servers,
//! and no id issued before the export is issued again. Import refuses an
//! etcd that holds snowkeep state, and documents it cannot read.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use snowkeep_client::Layout;
use snowkeep_proto::v1 as pb;
use tonic::transport::Channel;
use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::READY;

type Admin = pb::admin_service_client::AdminServiceClient<Channel>;

const API_KEY: &str = "/snowkeep/v1/apikeys/k1";
const API_KEY_VALUE: &str = r#"{"id":"k1","description":"copied verbatim","permissions":["ids"],"secret_sha256":"0000000000000000000000000000000000000000000000000000000000000000"}"#;

async fn export(server: &ServerProcess) -> String {
    Admin::new(server.channel().await)
        .export(pb::ExportRequest {})
        .await
        .expect("Export")
        .into_inner()
        .document
}

/// Issues `calls` × 500 ids from `server`.
async fn issue(server: &ServerProcess, calls: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for _ in 0..calls {
        ids.extend(server.next_ids(500).await.expect("NextIds"));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_wipe_import_issues_no_id_again() {
    let mut etcd = EtcdProcess::start().await;
    let ns = "exp-restore";
    let mut client = etcd.client().await;
    client.put(API_KEY, API_KEY_VALUE, None).await.unwrap();
    let mut servers = ServerProcess::serving(2, &etcd.endpoint(), ns).await;
    let mut before = Vec::new();
    for s in &servers {
        before.extend(issue(s, 4).await);
    }
    let document = export(&servers[0]).await;
    let doc: serde_json::Value = serde_json::from_str(&document).unwrap();
    assert_eq!(doc["format"], "snowkeep-state");
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["namespaces"].as_array().unwrap().len(), 1);
    assert_eq!(doc["namespaces"][0]["name"], ns);
    assert_eq!(doc["namespaces"][0]["layout"], "41/12/10@1767225600000");
    assert_eq!(doc["namespaces"][0]["fences"].as_array().unwrap().len(), 2);
    assert_eq!(
        doc["api_keys"],
        serde_json::json!([{"key": API_KEY, "value": API_KEY_VALUE}])
    );
    // Holders and leases are live state: not exported.
    for s in &servers {
        let instance = s.info().await.instance_id;
        assert!(!document.contains(&instance), "{document}");
    }

    for s in &mut servers {
        s.signal("TERM");
        s.wait_exit(Duration::from_secs(15)).await;
    }
    etcd.wipe().await;

    // A server waits for its namespace and answers the administration
    // service meanwhile; the import restores it.
    let first = ServerProcess::joining(&etcd.endpoint(), ns, &["--wait-for-namespace"]);
    let imported = snowkeep_test_support::auth::import_when_ready(&first, None, &document)
        .await
        .expect("Import");
    assert_eq!(
        imported,
        pb::ImportResponse {
            namespaces: 1,
            fences: 2,
            keys: 1,
            // 1.5 × the test servers' 2 s outage budget.
            lead_ms: 3_000,
        }
    );
    let mut client = etcd.client().await;
    let key = client.get(API_KEY, None).await.unwrap();
    assert_eq!(key.kvs()[0].value_str().unwrap(), API_KEY_VALUE);

    first.wait_serving(READY).await;
    let second = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    second.wait_serving(READY).await;
    let mut after = Vec::new();
    for s in [&first, &second] {
        after.extend(issue(s, 4).await);
    }
    let seen: HashSet<u64> = before.iter().copied().collect();
    assert_eq!(seen.len(), before.len());
    assert!(
        after.iter().all(|id| !seen.contains(id)),
        "an id issued before the export was issued again"
    );
    let layout = Layout::default();
    let mut highest: HashMap<u16, u64> = HashMap::new();
    for id in &before {
        let d = layout.decode(*id).unwrap();
        let h = highest.entry(d.machine_id.get()).or_default();
        *h = (*h).max(*id);
    }
    for id in &after {
        let m = layout.decode(*id).unwrap().machine_id.get();
        if let Some(h) = highest.get(&m) {
            assert!(id > h, "id {id} of machine id {m} is not above {h}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_refuses_state_and_unreadable_documents() {
    let etcd = EtcdProcess::start().await;
    let ns = "exp-refuse";
    let servers = ServerProcess::serving(1, &etcd.endpoint(), ns).await;
    let document = export(&servers[0]).await;
    let mut admin = Admin::new(servers[0].channel().await);
    let import = |document: String, replace: bool| pb::ImportRequest {
        document,
        replace,
        lead_ms: 0,
    };
    let e = admin
        .import(import(document.clone(), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("--replace"), "{}", e.message());

    let e = admin
        .import(import("{\"format\": ".into(), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("line 1, column 11"), "{}", e.message());

    let newer = document.replace("\"version\": 1", "\"version\": 99");
    let e = admin.import(import(newer, false)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("version 99"), "{}", e.message());

    // With replace, fences are raised, never lowered, and the server issues on.
    let mut fences_before = HashMap::new();
    let doc: serde_json::Value = serde_json::from_str(&document).unwrap();
    for f in doc["namespaces"][0]["fences"].as_array().unwrap() {
        fences_before.insert(
            f["machine_id"].as_u64().unwrap(),
            f["fence_ms"].as_u64().unwrap(),
        );
    }
    let r = admin
        .import(import(document, true))
        .await
        .expect("Import with replace")
        .into_inner();
    assert_eq!((r.namespaces, r.keys), (1, 0));
    let after: serde_json::Value = serde_json::from_str(&export(&servers[0]).await).unwrap();
    for f in after["namespaces"][0]["fences"].as_array().unwrap() {
        let m = f["machine_id"].as_u64().unwrap();
        assert!(f["fence_ms"].as_u64().unwrap() >= fences_before[&m]);
    }
    servers[0].wait_serving(READY).await;
    assert_eq!(servers[0].next_ids(10).await.unwrap().len(), 10);
}
