//! gRPC health follows the *issuance* condition, not "process up": SERVING
//! exactly while the generator holds a grant (docs/design.md), NOT_SERVING from the
//! moment shutdown starts. The `snowkeep_issuance_ready` gauge mirrors it.
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

/// Follows issuance until `shutdown`, then reports NOT_SERVING for good. The
/// claim loop publishes every machine id's grant together, so the first
/// slot's channel (`grants`) signals every change.
pub async fn follow_issuance(
    reporter: HealthReporter,
    mut grants: watch::Receiver<Option<Grant>>,
    generators: Arc<GeneratorSet>,
    namespace: String,
    shutdown: CancellationToken,
) {
    reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
        .await;
    loop {
        let status = if generators.is_ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        set(&reporter, status, &namespace).await;
        // Grants change on lease events; the clock reaching a fence that was
        // not raised, or stepping back, changes readiness without one.
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = grants.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(RECHECK) => {}
        }
    }
    set(&reporter, ServingStatus::NotServing, &namespace).await;
    reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::NotServing)
        .await;
}
