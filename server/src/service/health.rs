//! gRPC health follows the *issuance* condition, not "process up": SERVING
//! exactly while a call would issue (docs/design.md): from the moment a grant
//! arrives or the clock passes its floor, to the moment the grant goes or the
//! clock passes its fence or lease deadline; NOT_SERVING from the moment
//! shutdown starts. The `snowkeep_issuance_ready` gauge mirrors it.
//!
//! `snowkeep.v1.InfoService` alone answers "process up": SERVING from start
//! until shutdown, whatever issuance does. It is the liveness probe's service,
//! so an etcd outage or a clock step makes pods unready, never restarted.

use std::sync::Arc;

use snowkeep_client::{GeneratorSet, Grant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::metrics as m;

/// How often readiness is re-checked between grant changes.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// The health service name that means "the process is up" (liveness).
pub const LIVENESS_SERVICE: &str = "snowkeep.v1.InfoService";

/// Service names whose status follows issuance: "" (the whole server) and IdService.
const SERVICES: [&str; 2] = ["", "snowkeep.v1.IdService"];

async fn set(reporter: &HealthReporter, status: ServingStatus, namespace: &str) {
    for s in SERVICES {
        reporter.set_service_status(s, status).await;
    }
    let ready = if status == ServingStatus::Serving {
        1.0
    } else {
        0.0
    };
    metrics::gauge!(m::ISSUANCE_READY, "namespace" => namespace.to_owned()).set(ready);
}

/// Follows issuance until `shutdown`, then reports NOT_SERVING for good.
/// `grants` holds every machine id slot's channel (at least one): a change
/// on any of them is looked at, whichever order the claim loop sends them in.
pub async fn follow_issuance(
    reporter: HealthReporter,
    mut grants: Vec<watch::Receiver<Option<Grant>>>,
    generators: Arc<GeneratorSet>,
    namespace: String,
    shutdown: CancellationToken,
) {
    assert!(!grants.is_empty(), "health follows at least one slot");
    reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
        .await;
    loop {
        // Grants change on lease events; the clock passing a fence that was
        // not raised (or a floor, or the lease deadline) changes readiness
        // without one, so the follower also wakes at the next such edge.
        // What has no edge to wait for (a wall-clock step, whether a raise
        // can be asked for) is looked at again every RECHECK. The edge is
        // read before readiness: an edge passed in between leaves a short
        // wake, never a stale status for RECHECK.
        let wake = generators
            .readiness_holds_for()
            .map_or(RECHECK, |edge| edge.min(RECHECK));
        let status = if generators.is_ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        set(&reporter, status, &namespace).await;
        let changed =
            futures_util::future::select_all(grants.iter_mut().map(|g| Box::pin(g.changed())));
        tokio::select! {
            _ = shutdown.cancelled() => break,
            (changed, _, _) = changed => if changed.is_err() { break },
            _ = tokio::time::sleep(wake) => {}
        }
    }
    set(&reporter, ServingStatus::NotServing, &namespace).await;
    reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::NotServing)
        .await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use snowkeep_client::{Generator, GeneratorMetrics, Layout, MachineId, Millis, TokioClock};
    use tokio::time::Instant;
    use tokio_stream::StreamExt;
    use tonic_health::pb::health_check_response::ServingStatus as Wire;
    use tonic_health::pb::health_server::Health;
    use tonic_health::pb::HealthCheckRequest;

    use super::*;

    /// The clock (layout ms) when each case starts.
    const START: Millis = Millis(10_000);

    /// Follows issuance of one generator per grant (each on its own slot) on
    /// tokio's paused time, from `START`, while `meanwhile` runs with each
    /// slot's sender; returns each change of the whole server's status with
    /// the time since the start, until the status has changed once.
    async fn turns_of<F, Fut>(grants: Vec<Grant>, meanwhile: F) -> Vec<(Wire, Duration)>
    where
        F: FnOnce(Vec<watch::Sender<Option<Grant>>>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let layout = Layout::default();
        let clock = TokioClock::new(layout.to_unix_ms(START));
        let (senders, receivers): (Vec<_>, Vec<_>) =
            grants.into_iter().map(|g| watch::channel(Some(g))).unzip();
        let generators = receivers
            .iter()
            .map(|rx| {
                let metrics = GeneratorMetrics::default();
                Generator::new(
                    layout,
                    clock.clone(),
                    rx.clone(),
                    Duration::from_millis(100),
                    metrics,
                )
            })
            .collect();
        let reporter = HealthReporter::new();
        let service = tonic_health::server::HealthService::from_health_reporter(reporter.clone());
        let shutdown = CancellationToken::new();
        let set = GeneratorSet::new(generators);
        let began = Instant::now();
        tokio::spawn(follow_issuance(
            reporter,
            receivers,
            set,
            "ns".into(),
            shutdown.clone(),
        ));
        let request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        let mut updates = service.watch(request).await.expect("watch").into_inner();
        let mut seen: Vec<(Wire, Duration)> = Vec::new();
        // The reporter starts SERVING; what counts is what the follower sets.
        tokio::task::yield_now().await;
        tokio::spawn(meanwhile(senders));
        while let Some(update) = updates.next().await {
            let status = update.expect("a status").status();
            if seen.last().is_none_or(|(last, _)| *last != status) {
                seen.push((status, began.elapsed()));
            }
            if seen.len() == 2 {
                break;
            }
        }
        shutdown.cancel();
        seen
    }

    /// [`turns_of`] one grant, left as it is.
    async fn turns(grant: Grant) -> Vec<(Wire, Duration)> {
        turns_of(vec![grant], |senders| async move {
            // Held, never sent on: a dropped sender ends the follower.
            let _held = senders;
            std::future::pending::<()>().await;
        })
        .await
    }

    fn grant(floor: u64, fence: u64, deadline: Option<Duration>) -> Grant {
        Grant {
            machine_id: MachineId(1),
            floor: Millis(floor),
            fence: Millis(fence),
            deadline: deadline.map(|d| (Instant::now() + d).into_std()),
        }
    }

    /// Health turns the moment calls start or stop being refused, not at
    /// its next periodic look (every 250 ms): 1 ms after the clock reads
    /// the fence, at the lease deadline, at the first stamp above the floor.
    #[tokio::test(start_paused = true)]
    async fn health_turns_at_the_millisecond_the_clock_passes_a_fence_a_deadline_or_a_floor() {
        use Wire::{NotServing, Serving};
        let ms = Duration::from_millis;
        assert_eq!(
            turns(grant(9_000, 11_000, None)).await,
            [(Serving, ms(0)), (NotServing, ms(1_001))],
            "the fence"
        );
        assert_eq!(
            turns(grant(9_000, 20_000, Some(ms(700)))).await,
            [(Serving, ms(0)), (NotServing, ms(700))],
            "the lease deadline"
        );
        assert_eq!(
            turns(grant(10_500, 20_000, None)).await,
            [(NotServing, ms(0)), (Serving, ms(501))],
            "the floor"
        );
    }

    /// A grant change on any slot is looked at, in whatever order the slots
    /// are sent: the first slot's grant withdrawn, then 10 ms later the
    /// second's, turns health at 10 ms (watching only the first slot, it
    /// turned at its next look, 250 ms).
    #[tokio::test(start_paused = true)]
    async fn health_turns_when_any_slots_grant_changes() {
        use Wire::{NotServing, Serving};
        let ms = Duration::from_millis;
        let both = vec![grant(9_000, 20_000, None), grant(9_000, 20_000, None)];
        let seen = turns_of(both, |senders| async move {
            senders[0].send_replace(None);
            tokio::time::sleep(ms(10)).await;
            senders[1].send_replace(None);
            std::future::pending::<()>().await;
        })
        .await;
        assert_eq!(seen, [(Serving, ms(0)), (NotServing, ms(10))]);
    }
}
