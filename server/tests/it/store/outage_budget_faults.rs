//! Faults against the outage budget: fences now stand up to 1.5 outage
//! budgets (90 s by default) ahead of the clock, so every path that starts a
//! new holder must still start above the old holder's fence, and must not
//! give up on a machine id whose fence is merely far ahead.

use std::time::Duration;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::eventually;
use snowkeep_test_support::server::ServerProcess;

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
    // It waits out the killed process's 2 s lease first, then claims its
    // own machine id back and waits for the fence it left (up to 1.5
    // budgets, beyond --max-fence-wait).
    eventually(
        "the restart to wait for its own fence, or to stop",
        Duration::from_secs(20),
        || {
            let log = again.log();
            async move {
                log.contains("waiting for the clock to pass the claimed machine ids' floor")
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

/// An idle server keeps its whole outage budget. It serves one call, stays
/// idle for longer than a fence lead (1.5 budgets, past the fence its first
/// claim wrote), and etcd is then SIGSTOPped just after one of its fence
/// writes: a call every 200 ms over the budget must all be served, and the
/// remaining-budget gauge must say the time left to the fence, counting down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_serves_an_etcd_stall_for_its_whole_budget() {
    const BUDGET: Duration = Duration::from_secs(4);
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "idle", &["--outage-budget", "4s"]);
    server.wait_serving(Duration::from_secs(20)).await;
    assert_eq!(server.next_ids(1).await.unwrap().len(), 1);
    // The idle spell is the scenario itself, not a wait for a condition: the
    // fence the claim wrote (6 s ahead then) is behind the clock by its end.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let writes = "snowkeep_fence_advances_total{result=\"ok\"}";
    let before = server.metric(writes).await;
    // Every idle holder writes once per half budget (2 s): stall etcd just
    // after one, when the fence stands about 1.5 budgets ahead.
    eventually(
        "an idle server's fence write",
        Duration::from_secs(6),
        || async { server.metric(writes).await > before },
    )
    .await;
    etcd.pause();
    let stalled = tokio::time::Instant::now();
    let gauge = "snowkeep_outage_budget_remaining_seconds{namespace=\"idle\"}";
    let at_start = server.metric(gauge).await;
    assert!(
        (4.0..=6.0).contains(&at_start),
        "remaining budget at the start of the stall: {at_start}"
    );
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let (mut served, mut refused) = (0, Vec::new());
    loop {
        let at = tick.tick().await;
        if at.duration_since(stalled) >= BUDGET {
            break;
        }
        match tokio::time::timeout(Duration::from_secs(1), server.next_ids(1)).await {
            Ok(Ok(ids)) if ids.len() == 1 => served += 1,
            other => refused.push(format!("{other:?}")),
        }
    }
    let later = server.metric(gauge).await;
    let elapsed = stalled.elapsed().as_secs_f64();
    etcd.resume();
    assert_eq!(
        (served, refused),
        (20, Vec::<String>::new()),
        "log:\n{}",
        server.log()
    );
    // Counting down with the clock, to within the gauge's 0.5 s refresh.
    assert!(
        later < at_start && ((at_start - later) - elapsed).abs() <= 0.6,
        "gauge {at_start} at the start, {later} after {elapsed} s"
    );
}

/// A stable instance killed with SIGKILL and restarted at once gets its
/// machine id back, although other machine ids are free and its fence stands
/// further ahead than --max-fence-wait: it waits for its own fence (up to 1.5
/// budgets), and says so in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_stable_instance_restarted_at_once_gets_its_machine_id_back() {
    let etcd = EtcdProcess::start().await;
    let endpoint = etcd.endpoint();
    // Fences 8 to 12 s ahead; a successor would wait 1 s at most. A 4 s
    // lease leaves the restart time to find its predecessor's holder key.
    let args = [
        "--etcd-endpoints",
        &endpoint,
        "--namespace",
        "stable",
        "--create-namespace",
        "--lease-ttl",
        "4s",
        "--instance-id",
        "pod-1",
        "--machine-id-range",
        "0..8",
        "--outage-budget",
        "8s",
        "--max-fence-wait",
        "1s",
    ];
    let mut first = ServerProcess::spawn(&args);
    first.wait_serving(Duration::from_secs(20)).await;
    let held = first.machine_id().await;
    assert_eq!(first.next_ids(10).await.unwrap().len(), 10);
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;

    let again = ServerProcess::spawn(&args);
    again.wait_serving(Duration::from_secs(30)).await;
    assert_eq!(again.machine_id().await, held, "log:\n{}", again.log());
    let log = again.log();
    assert!(
        log.contains("claiming its machine id first, and waiting for its fence")
            && log.contains("waiting for the clock to pass the claimed machine ids' floor")
            && !log.contains("did not get back the machine id"),
        "log:\n{log}"
    );
}
