//! A backup and restore of a large state with the servers' default message
//! size limits: 14,000 fences make a document of over 1 MiB, more than one
//! Export message may carry (`--max-send-message-size` 1 MiB) and far more
//! than one Import message (`--max-recv-message-size` 16 KiB), and their
//! last holders (long instance ids) more than one etcd answer (4 MiB).
//! snowkeepctl streams both ways, the export reads etcd in pages, and every
//! fence and last holder comes back exactly.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use snowkeep_client::{Clock, Layout, SystemClock};
use snowkeep_etcd::etcd_client::{GetOptions, Txn, TxnOp};
use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::READY;

const NS: &str = "exp-large";
/// 16,384 machine ids: room for 14,000 fences.
const LAYOUT: &str = "39/14/10";
const FENCES: u16 = 14_000;

fn ctl(server: &ServerProcess, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args(["--endpoint", &server.url(), "--output", "json"])
        .args(args)
        .output()
        .expect("run snowkeepctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every key and value under `prefix`, read in pages (one answer of the
/// etcd client carries at most 4 MiB), keyed by the rest of the key.
async fn under(etcd: &EtcdProcess, prefix: &str) -> BTreeMap<String, String> {
    let mut client = etcd.client().await;
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let mut from = prefix.as_bytes().to_vec();
    let mut out = BTreeMap::new();
    loop {
        let page = client
            .get(
                from.clone(),
                Some(GetOptions::new().with_range(end.clone()).with_limit(2_000)),
            )
            .await
            .unwrap();
        for kv in page.kvs() {
            let key = kv.key_str().unwrap()[prefix.len()..].to_owned();
            out.insert(key, kv.value_str().unwrap().to_owned());
        }
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return out,
        }
    }
}

/// Every fence key of the namespace: machine id to fence.
async fn fences(etcd: &EtcdProcess) -> BTreeMap<u16, u64> {
    under(etcd, &format!("/snowkeep/v1/ns/{NS}/fence/"))
        .await
        .into_iter()
        .map(|(m, f)| (m.parse().unwrap(), f.parse().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fourteen_thousand_fences_round_trip_through_snowkeepctl_with_default_limits() {
    let mut etcd = EtcdProcess::start().await;
    let mut server = ServerProcess::on_etcd(&etcd.endpoint(), NS, &["--layout", LAYOUT]);
    server.wait_serving(READY).await;
    let own = u16::try_from(server.machine_id().await).unwrap();
    // Fences 10 days ahead, each its own value, written straight into etcd
    // for machine ids nobody holds.
    let layout: Layout = LAYOUT.parse().unwrap();
    let now = layout.to_layout_ms(SystemClock.unix_ms()).unwrap().get();
    let ahead = now + 10 * 86_400_000;
    let want: BTreeMap<u16, u64> = (0..)
        .filter(|&m| m != own)
        .take(usize::from(FENCES))
        .map(|m| (m, ahead + u64::from(m)))
        .collect();
    let mut client = etcd.client().await;
    let entries: Vec<(&u16, &u64)> = want.iter().collect();
    for batch in entries.chunks(100) {
        let puts: Vec<TxnOp> = batch
            .iter()
            .map(|(m, f)| {
                TxnOp::put(
                    format!("/snowkeep/v1/ns/{NS}/fence/{m:05}"),
                    f.to_string(),
                    None,
                )
            })
            .collect();
        client.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    // Each with a last holder of a long instance id: the namespace then
    // holds over 4 MiB, more than one etcd answer carries.
    let holder = |m: u16| format!("host-{m:05}-{}", "x".repeat(300));
    for batch in entries.chunks(100) {
        let puts: Vec<TxnOp> = batch
            .iter()
            .map(|(m, _)| {
                TxnOp::put(
                    format!("/snowkeep/v1/ns/{NS}/last/{m:05}"),
                    holder(**m),
                    None,
                )
            })
            .collect();
        client.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    let before = fences(&etcd).await;
    assert_eq!(before.len(), usize::from(FENCES) + 1);

    // One Export message cannot carry it with the default 1 MiB limit.
    let unary = pb::admin_service_client::AdminServiceClient::new(server.channel().await)
        .export(pb::ExportRequest {})
        .await;
    let e = match unary {
        Ok(r) => panic!(
            "Export sent {} bytes in one message",
            r.get_ref().document.len()
        ),
        Err(e) => e,
    };
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().ends_with(" bytes, over this server's limit of 1048576 bytes (--max-send-message-size); ask for less per call"),
        "{}",
        e.message()
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.json");
    let file = file.to_str().unwrap();
    // A --timeout far below what the export takes: export and import allow
    // at least 10 minutes.
    let (ok, _, err) = ctl(&server, &["--timeout", "200ms", "export", "--file", file]);
    assert!(ok, "snowkeepctl export: {err}");
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.len() > 1 << 20, "{} bytes", text.len());
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let exported: BTreeMap<u16, u64> = doc["namespaces"][0]["fences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let m = u16::try_from(f["machine_id"].as_u64().unwrap()).unwrap();
            (m, f["fence_ms"].as_u64().unwrap())
        })
        .collect();
    // The server raises its own fence while it holds it (every half
    // budget, idle or not): that one may only have moved up.
    let mut exported = exported;
    let mut expected = before.clone();
    let (own_now, own_before) = (exported.remove(&own), expected.remove(&own));
    assert!(own_now >= own_before, "{own_now:?} < {own_before:?}");
    assert_eq!(exported, expected);

    server.signal("TERM");
    server.wait_exit(Duration::from_secs(15)).await;
    etcd.wipe().await;
    let restored = ServerProcess::joining(
        &etcd.endpoint(),
        NS,
        &["--layout", LAYOUT, "--wait-for-namespace"],
    );
    // Retried while the new server has not reached etcd yet.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut earlier = Vec::new();
    let out = loop {
        let (ok, out, err) = ctl(&restored, &["import", "--file", file]);
        if ok {
            break out;
        }
        assert!(
            tokio::time::Instant::now() < deadline
                && (err.contains("UNAVAILABLE") || err.contains("connect")),
            "snowkeepctl import: {err}\nearlier attempts: {earlier:#?}"
        );
        earlier.push(err);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        answer,
        serde_json::json!({"namespaces": 1, "fences": 14_001, "keys": 0, "lead_ms": 3_000})
    );
    let lasts = under(&etcd, &format!("/snowkeep/v1/ns/{NS}/last/")).await;
    assert_eq!(lasts.len(), usize::from(FENCES));
    for (m, value) in &lasts {
        assert_eq!(*value, holder(m.parse().unwrap()), "machine id {m}");
    }
    let after = fences(&etcd).await;
    assert_eq!(after.len(), usize::from(FENCES) + 1);
    for (m, f) in &want {
        assert_eq!(after[m], *f, "machine id {m}");
    }
    // The server's own fence, behind the clock, was raised to the import's floor.
    assert!(after[&own] >= before[&own]);
    restored.wait_serving(READY).await;
}
