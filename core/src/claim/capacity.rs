//! The capacity gauges (`snowkeep_namespace_machine_ids{state="held"|"free"}`),
//! kept by a task of their own beside the claim loop: read every
//! [`CAPACITY_REFRESH`], and at once whenever this instance starts or stops
//! issuing, so a claim shows without waiting for the next refresh.

use std::future::Future;
use std::time::Duration;

use snowkeep_client::Grant;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{Capacity, StoreError};
use crate::metrics as m;

/// Namespace capacity is read from the store this often.
pub const CAPACITY_REFRESH: Duration = Duration::from_secs(5);

/// Where the capacity of a namespace range is read.
pub trait CapacitySource: Send {
    /// Machine ids of the range and how many have a holder; a retryable
    /// error when the store cannot be asked.
    fn read(&mut self) -> impl Future<Output = Result<Capacity, StoreError>> + Send;
}

/// Refreshes the capacity gauges of `namespace` from `source` until
/// `shutdown`: every [`CAPACITY_REFRESH`], and whenever `grant` (the first
/// generator slot's) turns from none to some or back. A failed read leaves
/// the gauges as they are.
pub async fn run(
    mut source: impl CapacitySource,
    namespace: String,
    mut grant: watch::Receiver<Option<Grant>>,
    shutdown: CancellationToken,
) {
    let held = metrics::gauge!(m::NAMESPACE_MACHINE_IDS, "namespace" => namespace.clone(), "state" => "held");
    let free =
        metrics::gauge!(m::NAMESPACE_MACHINE_IDS, "namespace" => namespace, "state" => "free");
    let mut issuing = grant.borrow_and_update().is_some();
    loop {
        match source.read().await {
            Ok(c) => {
                held.set(f64::from(c.held));
                free.set(f64::from(c.free()));
            }
            Err(e) => debug!(error = %crate::DisplayChain(&e), "capacity read failed"),
        }
        let next = tokio::time::Instant::now() + CAPACITY_REFRESH;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next) => break,
                changed = grant.changed() => {
                    if changed.is_err() {
                        // The claim loop is gone: keep the time-based refresh.
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep_until(next) => break,
                        }
                    }
                    let now = grant.borrow_and_update().is_some();
                    if now != issuing {
                        issuing = now;
                        break;
                    }
                }
            }
        }
    }
}
