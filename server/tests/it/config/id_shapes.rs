//! A namespace created with the JavaScript-safe layout (`--layout js53`,
//! 39/6/8 bits in 10 ms ticks) on real etcd: every id is at most 2^53 − 1,
//! survives a JavaScript number, ascends, decodes back to its fields, and a
//! successor after a kill issues only new ids; the namespace keeps its layout.

use std::collections::HashSet;
use std::time::Duration;

use snowkeep_client::{Layout, MachineId};
use snowkeep_proto::v1 as pb;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);
const JS53: &str = "39/6/8@1767225600000/10ms";

/// `total` ids from one stream, asked with their texts: each text is the
/// 11-character Crockford base32 form of its id.
async fn stream(server: &ServerProcess, total: u64) -> Vec<u64> {
    let mut stream = server
        .ids()
        .await
        .stream_ids(pb::StreamIdsRequest {
            total,
            batch_size: 256,
            format: pb::IdFormat::CrockfordBase32.into(),
        })
        .await
        .expect("StreamIds")
        .into_inner();
    let mut ids = Vec::new();
    while let Some(batch) = stream.message().await.expect("a batch") {
        assert_eq!(batch.texts.len(), batch.ids.len());
        for (id, text) in batch.ids.iter().zip(&batch.texts) {
            assert_eq!(text.len(), 11, "{text}");
            assert_eq!(snowkeep_client::text_id::decode(text, 53), Ok(*id));
        }
        ids.extend(batch.ids);
    }
    ids
}

/// Checks every id of one holder: at most 2^53 − 1, exact as a double,
/// strictly ascending, of `machine_id`.
fn check_js_safe(ids: &[u64], machine_id: MachineId) {
    let layout = Layout::js53();
    for w in ids.windows(2) {
        assert!(w[0] < w[1], "not ascending: {} then {}", w[0], w[1]);
    }
    for &id in ids {
        assert!(id < 1 << 53, "id {id} is above 2^53 - 1");
        assert_eq!(id as f64 as u64, id, "id {id} does not survive a double");
        let decoded = layout.decode(id).expect("a 53-bit id");
        assert_eq!(decoded.machine_id, machine_id, "id {id}");
        assert_eq!(decoded.timestamp.get() % 10, 0, "id {id}: not a tick start");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_js53_namespace_serves_javascript_safe_ids_that_decode_and_stay_unique() {
    let etcd = EtcdProcess::start().await;
    let mut first = ServerProcess::on_etcd(&etcd.endpoint(), "js", &["--layout", "js53"]);
    first.wait_serving(READY).await;
    let info = first.info().await;
    assert_eq!(
        info.layout,
        Some(pb::Layout {
            timestamp_bits: 39,
            machine_bits: 6,
            sequence_bits: 8,
            epoch_unix_ms: 1_767_225_600_000,
            time_unit_ms: 10,
        })
    );
    let record = etcd
        .client()
        .await
        .get("/snowkeep/v1/ns/js/layout", None)
        .await
        .unwrap();
    let record = record.kvs()[0].value_str().unwrap().to_owned();
    assert!(record.starts_with(&format!("layout {JS53}\n")), "{record}");

    let held = MachineId(u16::try_from(first.machine_id().await).unwrap());
    let mut ids = first.next_ids(1_000).await.expect("NextIds");
    assert_eq!(ids.len(), 1_000);
    ids.extend(stream(&first, 30_000).await);
    assert_eq!(ids.len(), 31_000);
    check_js_safe(&ids, held);

    // DecodeId answers the fields the layout gives.
    let mut info_client = pb::info_service_client::InfoServiceClient::new(first.channel().await);
    let last = *ids.last().unwrap();
    let d = Layout::js53().decode(last).unwrap();
    let got = info_client
        .decode_id(pb::DecodeIdRequest {
            id: 0,
            text: snowkeep_client::text_id::encode(last, 53),
        })
        .await
        .expect("DecodeId")
        .into_inner();
    assert_eq!(
        (
            got.timestamp_ms,
            got.unix_ms,
            got.machine_id,
            u64::from(got.sequence)
        ),
        (
            d.timestamp.get(),
            1_767_225_600_000 + d.timestamp.get(),
            u32::from(held.get()),
            d.sequence
        )
    );
    let refused = info_client
        .decode_id(pb::DecodeIdRequest {
            id: 1 << 53,
            text: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        format!("id 9007199254740992 is above 9007199254740991, the largest id of the namespace's layout {JS53} (53 bits)")
    );

    // Killed and replaced: the successor's ids are new.
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;
    let second = ServerProcess::joining(&etcd.endpoint(), "js", &["--layout", "js53"]);
    second.wait_serving(READY).await;
    let held = MachineId(u16::try_from(second.machine_id().await).unwrap());
    let after = stream(&second, 5_000).await;
    check_js_safe(&after, held);
    let seen: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(after.iter().filter(|id| seen.contains(id)).count(), 0);

    // A server of the js53 namespace (64 machine ids) counts another
    // namespace's capacity in that namespace's own layout (4,096).
    let wide = ServerProcess::on_etcd(&etcd.endpoint(), "wide", &[]);
    wide.wait_serving(READY).await;
    let mut admin = pb::admin_service_client::AdminServiceClient::new(second.channel().await);
    let capacity = |name: &str| pb::GetNamespaceCapacityRequest {
        namespace: name.into(),
    };
    let got = admin
        .get_namespace_capacity(capacity("wide"))
        .await
        .unwrap();
    let c = got.into_inner().capacity.unwrap();
    assert_eq!(
        (c.total, c.held, c.range_start, c.range_end),
        (4096, 1, 0, 4096)
    );
    let got = admin.get_namespace_capacity(capacity("js")).await.unwrap();
    let c = got.into_inner().capacity.unwrap();
    assert_eq!((c.total, c.range_end), (64, 64));

    // The namespace keeps its layout: a server with the default one refuses.
    let mut other = ServerProcess::joining(&etcd.endpoint(), "js", &[]);
    other
        .assert_exits(
            Duration::from_secs(20),
            64,
            &format!("namespace \"js\" has layout {JS53} in the store but this instance is configured with 41/12/10@1767225600000"),
        )
        .await;
}
