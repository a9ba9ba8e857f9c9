//! Input the administration service and the Lease API refuse before they
//! write or log anything: an import's fence past its layout, an API key
//! outside its id, a lead that would fence every machine id for good, and
//! request strings with control characters. What does reach the audit trail
//! (a holder written into etcd by hand) is escaped in the server's plain log
//! and in `snowkeepctl audit tail`.

use std::process::{Command, Stdio};
use std::time::Duration;

use snowkeep_etcd::etcd_client::GetOptions;
use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, lease_client, release, requester};
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

type Admin = pb::admin_service_client::AdminServiceClient<tonic::transport::Channel>;

/// Every key and value under `/snowkeep/`.
async fn everything(etcd: &EtcdProcess) -> Vec<(String, String)> {
    let got = etcd
        .client()
        .await
        .get("/snowkeep/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    got.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect()
}

fn import(document: String, lead_ms: u64) -> pb::ImportRequest {
    pb::ImportRequest {
        document,
        replace: true,
        lead_ms,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_refuses_a_fence_past_the_layout_a_key_outside_its_id_and_an_endless_lead() {
    let etcd = EtcdProcess::start().await;
    let ns = "imp-check";
    let server = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    server.wait_serving(READY).await;
    let mut admin = Admin::new(server.channel().await);
    let document = admin
        .export(pb::ExportRequest {})
        .await
        .unwrap()
        .into_inner()
        .document;
    let mut doc: serde_json::Value = serde_json::from_str(&document).unwrap();
    let machine_id = doc["namespaces"][0]["fences"][0]["machine_id"].clone();
    let before = everything(&etcd).await;

    let mut fenced = doc.clone();
    fenced["namespaces"][0]["fences"][0]["fence_ms"] = serde_json::json!(1u64 << 63);
    let e = admin
        .import(import(fenced.to_string(), 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(
        e.message(),
        format!("namespace \"imp-check\": the fence of machine id {machine_id} is 9223372036854775808 ms, above the last timestamp of layout 41/12/10@1767225600000 (2199023255551 ms): a machine id fenced there could never be used again; fix or re-export the document")
    );

    let escape = "/snowkeep/v1/apikeys/../../ns/default/fence/00009";
    doc["api_keys"] = serde_json::json!([{
        "key": escape,
        "value": format!(
            r#"{{"id":"../../ns/default/fence/00009","description":"","permissions":["admin"],"secret_sha256":"{}"}}"#,
            "0".repeat(64)
        ),
    }]);
    let e = admin.import(import(doc.to_string(), 0)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(
        e.message(),
        "api key \"/snowkeep/v1/apikeys/../../ns/default/fence/00009\" is not /snowkeep/v1/apikeys/<id> with a key id of 1 to 64 characters of A-Z a-z 0-9 _ -; nothing was imported"
    );

    let e = admin
        .import(import(document.clone(), u64::MAX))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().starts_with(&format!(
            "namespace \"imp-check\": a lead of {} ms puts every fence past the last timestamp of layout 41/12/10@1767225600000 (2199023255551 ms, ",
            u64::MAX
        )),
        "{}",
        e.message()
    );
    // Nothing was written by any of them.
    assert_eq!(everything(&etcd).await, before);
}

/// True when `text` has a byte a terminal acts on: any control byte but
/// the newline ending each line.
fn has_control_byte(text: &[u8]) -> bool {
    text.iter().any(|&b| (b < 0x20 && b != b'\n') || b == 0x7f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_calls_with_control_characters_are_refused_before_the_audit_trail() {
    let etcd = EtcdProcess::start().await;
    let ns = "audit-input";
    let server = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    server.wait_serving(READY).await;
    let mut api = lease_client(&server).await;
    let who = requester(1_767_225_600_000);
    let forged = "x\n2026-12-01T00:00:00.000000Z  INFO snowkeep::audit: audit action=\"key.revoke\" forged\x1b[2J\x07\r";
    let e = api
        .acquire(acquire(forged, &who, 1, None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .starts_with("invalid namespace \"x\\n2026-12-01T"),
        "{}",
        e.message()
    );
    let token = "ab".repeat(32);
    let e = api
        .release(release(forged, &who, &token, &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let mut admin = Admin::new(server.channel().await);
    let e = admin
        .revoke_key(pb::RevokeKeyRequest {
            id: "k1\nforged\x1b[2J".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // A valid Acquire: its audit line shows the trail is written.
    let grant = api
        .acquire(acquire(ns, &who, 1, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 1);
    eventually(
        "the valid Acquire's audit line",
        Duration::from_secs(10),
        || {
            let log = server.log();
            async move { log.contains("action=\"lease.acquire\"") }
        },
    )
    .await;
    let log = server.log();
    let audit: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(": snowkeep::audit: audit unix_ms="))
        .collect();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0].contains("namespace=audit-input"), "{}", audit[0]);
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-12-01T00:00:00.000000Z")),
        "{log}"
    );
    assert!(!has_control_byte(log.as_bytes()), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_with_control_characters_is_escaped_in_the_log_and_in_audit_tail() {
    let etcd = EtcdProcess::start().await;
    let ns = "audit-escape";
    let server = ServerProcess::on_etcd(&etcd.endpoint(), ns, &[]);
    server.wait_serving(READY).await;
    let own = server.machine_id().await;
    let target = if own == 4000 { 4001 } else { 4000 };
    let holder = format!("/snowkeep/v1/ns/{ns}/holder/{target:05}");
    let evil = "evil\x1b[2J\x07\r\nforged";
    let mut tail = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args(["--endpoint", &server.url(), "audit", "tail", "--count", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut client = etcd.client().await;
    let mut admin = Admin::new(server.channel().await);
    // Evict until the follower, subscribed at some point, has seen one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tail.try_wait().unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "audit tail did not exit"
        );
        client.put(holder.clone(), evil, None).await.unwrap();
        let evicted = admin
            .evict(pb::EvictRequest {
                namespace: ns.into(),
                machine_id: target,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(evicted.holder, evil);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = tail.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!has_control_byte(&out.stdout), "{:?}", out.stdout);
    let line = String::from_utf8(out.stdout).unwrap();
    assert!(
        line.contains(" admin.evict key=- peer=127.0.0.1:"),
        "{line}"
    );
    assert!(
        line.ends_with(&format!(
            " requester=- namespace=audit-escape subject=\"machine_id={target} holder=evil\\u{{1b}}[2J\\u{{7}}\\r\\nforged machine_ids=[{target}]\" result=ok\n"
        )),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1, "{line}");
    // snowkeepctl evict's table and sentence escape the holder too.
    client.put(holder.clone(), evil, None).await.unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args(["--endpoint", &server.url(), "evict", "--namespace", ns])
        .arg(target.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!has_control_byte(&out.stdout), "{:?}", out.stdout);
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(
        shown.contains("\nevicted evil\\u{1b}[2J\\u{7}\\r\\nforged from machine ids "),
        "{shown}"
    );
    let log = server.log();
    assert!(!has_control_byte(log.as_bytes()), "{log:?}");
    assert!(
        log.contains(&format!(
            "subject=machine_id={target} holder=evil\\u{{1b}}[2J\\u{{7}}\\r\\nforged machine_ids=[{target}]"
        )),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_create_refuses_a_namespace_the_cluster_does_not_have() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "keys-ns", &[]);
    server.wait_serving(READY).await;
    let create = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
            .args([
                "--endpoint",
                &server.url(),
                "--output",
                "json",
                "key",
                "create",
            ])
            .args(["--description", "orders", "--permission", "ids"])
            .args(["--namespace", "keys-ns", "--namespace", "keys-typo"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = create(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "snowkeepctl: namespace \"keys-typo\" does not exist in this cluster (snowkeepctl namespaces lists them): check the spelling, or pass --allow-missing-namespace for a namespace created later\n"
    );
    assert!(out.stdout.is_empty());
    let mut admin = Admin::new(server.channel().await);
    let keys = admin
        .list_keys(pb::ListKeysRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys.keys.len(), 0, "no key was created: {keys:?}");

    let out = create(&["--allow-missing-namespace"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "snowkeepctl: warning: namespace \"keys-typo\" does not exist in this cluster yet: the key works there once it is created\n"
    );
    let key: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        key["namespaces"],
        serde_json::json!(["keys-ns", "keys-typo"])
    );
    let keys = admin
        .list_keys(pb::ListKeysRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys.keys.len(), 1);
}
