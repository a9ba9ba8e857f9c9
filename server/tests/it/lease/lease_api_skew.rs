//! Client clocks cannot page anyone: only requesters the server knows (they
//! hold machine ids and presented their lease token) are recorded, and what
//! is recorded is clamped to a day either way.

use std::time::Duration;

use snowkeep_client::{Clock, SystemClock};
use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, lease_client, release, renew, requester};
use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);
/// Ten years, in ms.
const DECADE_MS: u64 = 10 * 365 * 86_400_000;

fn series(name: &str, labels: &str) -> String {
    format!("{name}{{namespace=\"clamp\",{labels}}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_known_requesters_clocks_are_recorded_and_extreme_ones_are_clamped() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "clamp", &[]);
    server.wait_serving(READY).await;
    let mut api = lease_client(&server).await;
    let metric = |name: &'static str, labels: &'static str| {
        let server = &server;
        async move { server.metric(&series(name, labels)).await }
    };
    let client_count = || metric("snowkeep_clock_skew_seconds_count", "source=\"client\"");

    // A stranger's Renew with a bogus clock: answered "you hold nothing",
    // recorded nowhere.
    let grant = api
        .renew(renew("clamp", &requester(400), "", Some(0)))
        .await
        .unwrap()
        .into_inner();
    assert!(grant.machine_ids.is_empty());
    assert_eq!(client_count().await, 0.0);

    // A holder's first Acquire is judged, not recorded (it is not known yet):
    // a clock a decade ahead is refused (either way past the threshold), one
    // in step is granted, and neither lands anywhere. A wrong token is
    // refused and recorded nowhere either.
    let who = requester(401);
    let far_ahead = SystemClock.unix_ms() + DECADE_MS;
    let refused = api
        .acquire(acquire("clamp", &who, 1, Some(far_ahead)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(client_count().await, 0.0);
    let token = api
        .acquire(acquire("clamp", &who, 1, Some(SystemClock.unix_ms())))
        .await
        .unwrap()
        .into_inner()
        .lease_token;
    assert_eq!(client_count().await, 0.0);
    let refused = api
        .renew(renew("clamp", &who, &"00".repeat(32), Some(far_ahead)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(client_count().await, 0.0);

    // Its Renew with its token is recorded: clamped to one day, and counted.
    api.renew(renew("clamp", &who, &token, Some(far_ahead)))
        .await
        .unwrap();
    assert_eq!(client_count().await, 1.0);
    assert_eq!(
        metric("snowkeep_clock_skew_seconds_sum", "source=\"client\"").await,
        86_400.0
    );
    assert_eq!(
        metric("snowkeep_clock_skew_clamped_total", "source=\"client\"").await,
        1.0
    );
    for over in ["over=\"half_threshold\"", "over=\"threshold\""] {
        assert_eq!(
            metric("snowkeep_client_clock_skew_requesters", over).await,
            1.0
        );
    }

    // A NextIds caller time of 2^64 − 1 is clamped the same way.
    let ids = server
        .ids()
        .await
        .next_ids(pb::NextIdsRequest {
            count: 1,
            client_time_unix_ms: u64::MAX,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(ids.len(), 1);
    assert_eq!(
        metric("snowkeep_clock_skew_seconds_sum", "source=\"caller\"").await,
        86_400.0
    );
    assert_eq!(
        metric("snowkeep_clock_skew_clamped_total", "source=\"caller\"").await,
        1.0
    );

    // Its Release forgets it.
    let released = api
        .release(release("clamp", &who, &token, &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, 1);
    for over in ["over=\"half_threshold\"", "over=\"threshold\""] {
        assert_eq!(
            metric("snowkeep_client_clock_skew_requesters", over).await,
            0.0
        );
    }
}
