//! An operator rewrites a namespace's record with another layout under
//! running servers: they stop, with exit code 64 and a log line naming both
//! layouts, and never issue an id under the new layout.

use std::time::Duration;

use snowkeep_client::{Layout, MachineId};

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_record_rewritten_with_another_layout_stops_the_server_with_64() {
    let etcd = EtcdProcess::start().await;
    let mut server = ServerProcess::on_etcd(&etcd.endpoint(), "relayout", &[]);
    server.wait_serving(Duration::from_secs(20)).await;
    let held = MachineId(u16::try_from(server.machine_id().await).unwrap());
    let mut ids = server.ids().await;

    let key = "/snowkeep/v1/ns/relayout/layout";
    let mut client = etcd.client().await;
    let record = client.get(key, None).await.unwrap();
    let record = record.kvs()[0].value_str().unwrap().to_owned();
    let old = "41/12/10@1767225600000";
    assert!(record.contains(old), "{record}");
    client
        .put(key, record.replace(old, "41/11/11@1767225600000"), None)
        .await
        .unwrap();

    // Every id the server still issues is of its own layout and machine id.
    let mut issued = Vec::new();
    let stopped = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let call = ids.next_ids(snowkeep_proto::v1::NextIdsRequest {
                count: 10,
                ..Default::default()
            });
            match call.await {
                Ok(r) => issued.extend(r.into_inner().ids),
                Err(_) if !server.is_running() => return,
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        stopped.is_ok(),
        "still running 10 s after the layout changed"
    );
    let status = server.wait_exit(Duration::from_secs(5)).await;
    let log = server.log();
    assert_eq!(status.code(), Some(64), "log:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("snowkeep-server stopped"))
        .unwrap_or_else(|| panic!("no stop line; log:\n{log}"));
    assert!(
        line.contains(
            "namespace \"relayout\" has layout 41/11/11@1767225600000 in the store but this \
             instance is configured with 41/12/10@1767225600000"
        ),
        "{line}"
    );
    let layout = Layout::default();
    for id in &issued {
        let decoded = layout.decode(*id).expect("a 63-bit id");
        assert_eq!(decoded.machine_id, held, "id {id}");
    }
}
