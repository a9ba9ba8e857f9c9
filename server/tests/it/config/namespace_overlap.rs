//! Ids are unique within one namespace only: a server warns at start about
//! every other namespace of its etcd that can issue the same ids.

use std::time::Duration;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::eventually;
use snowkeep_test_support::server::ServerProcess;

const CHECKED: &str =
    "checked the other namespaces of this etcd for machine ids that overlap this server's range";

async fn checked(server: &ServerProcess) {
    eventually(
        "the namespace overlap check",
        Duration::from_secs(10),
        || async { server.log().contains(CHECKED) },
    )
    .await;
}

fn warnings(server: &ServerProcess) -> Vec<String> {
    server
        .log()
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("ids are unique within one namespace only"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_namespace_with_an_overlapping_range_is_warned_about() {
    let etcd = EtcdProcess::start().await;
    let low = ["--machine-id-range", "0..8"];
    let alpha = ServerProcess::on_etcd(&etcd.endpoint(), "alpha", &low);
    alpha.wait_serving(Duration::from_secs(20)).await;
    checked(&alpha).await;
    assert_eq!(warnings(&alpha), Vec::<String>::new(), "alpha was alone");

    let beta = ServerProcess::on_etcd(&etcd.endpoint(), "beta", &low);
    checked(&beta).await;
    let warned = warnings(&beta);
    assert_eq!(warned.len(), 1, "{warned:#?}");
    let layout = "41/12/10@1767225600000";
    assert!(
        warned[0].contains(&format!(
            "namespace \"alpha\" on this etcd has the same bit layout ({layout}) as namespace \"beta\" ({layout}) and has used 1 of the machine ids of this server's range 0..8: ids are unique within one namespace only, so these two namespaces can issue equal ids; give them disjoint --machine-id-range values"
        )),
        "{}",
        warned[0]
    );
    beta.wait_serving(Duration::from_secs(20)).await;
    assert_eq!(
        beta.metric("snowkeep_namespace_overlaps{namespace=\"beta\"}")
            .await,
        1.0
    );

    // A disjoint range, or another bit layout, is no overlap.
    let gamma = ServerProcess::on_etcd(&etcd.endpoint(), "gamma", &["--machine-id-range", "8..16"]);
    let delta = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "delta",
        &["--machine-id-range", "0..8", "--layout", "40/13/10"],
    );
    for quiet in [&gamma, &delta] {
        checked(quiet).await;
        assert_eq!(warnings(quiet), Vec::<String>::new());
    }
    gamma.wait_serving(Duration::from_secs(20)).await;
    let scraped = snowkeep_test_support::server::scrape(gamma.metrics_port).await;
    assert!(
        scraped
            .lines()
            .any(|l| l == "snowkeep_namespace_overlaps{namespace=\"gamma\"} 0"),
        "{scraped}"
    );
}
