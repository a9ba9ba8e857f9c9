//! Faults against the outage budget: fences now stand up to 1.5 outage
//! budgets (90 s by default) ahead of the clock, so every path that starts a
//! new holder must still start above the old holder's fence, and must not
//! give up on a machine id whose fence is merely far ahead.

use std::time::Duration;

use crate::support::etcd::EtcdProcess;
use crate::support::eventually;
use crate::support::server::ServerProcess;

/// A busy holder killed with SIGKILL leaves its fence up to 90 s ahead. Its
/// restart under the same --instance-id, on a range with no other machine
/// id, must wait for that fence (NOT_SERVING meanwhile), as it did when
/// fences stood 3 s ahead, not exit blaming the host's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_restarted_on_its_only_machine_id_waits_instead_of_exiting() {
    let etcd = EtcdProcess::start().await;
    // The default 60 s budget: the busy holder's fence stands 60 to 90 s ahead.
    let args = [
        "--instance-id",
        "pod-0",
        "--machine-id-range",
        "3..4",
        "--outage-budget",
        "60s",
    ];
    let mut first = ServerProcess::on_etcd(&etcd.endpoint(), "crash", &args);
    first.wait_serving(Duration::from_secs(20)).await;
    assert_eq!(first.next_ids(100).await.unwrap().len(), 100);
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;

    let mut again = ServerProcess::on_etcd(&etcd.endpoint(), "crash", &args);
    // It waits out the killed process's 2 s lease first, then finds the
    // fence more than --max-fence-wait ahead and retries its claim.
    eventually(
        "the restart to retry its claim, or to stop",
        Duration::from_secs(20),
        || {
            let log = again.log();
            async move {
                log.contains("claim failed") && log.contains("more than --max-fence-wait 10s")
                    || log.contains("snowkeep-server stopped")
            }
        },
    )
    .await;
    assert!(
        again.is_running(),
        "the restart exited instead of waiting for its machine id's fence; log:\n{}",
        again.log()
    );
    assert_eq!(
        again.health().await,
        Some(tonic_health::pb::health_check_response::ServingStatus::NotServing)
    );
}
