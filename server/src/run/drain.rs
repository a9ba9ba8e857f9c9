//! The ordered stop: wait for a signal (or the claim or the server to stop
//! by itself), drain the calls in flight within the grace period, and only
//! then release the machine ids (bounded by [`RELEASE_TIMEOUT`]).

use std::time::Duration;

use snowkeep_core::claim::StoreError;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::ServeError;
use crate::limits::calls::CallLimits;
use crate::limits::conn::OpenConnections;

/// Bound on the release at shutdown (release txn + lease revoke).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a claim task ends with.
type ClaimResult = Result<Result<(), StoreError>, JoinError>;
/// What the gRPC server task ends with.
type ServerResult = Result<Result<(), tonic::transport::Error>, JoinError>;

/// A serving server: the claim task, the gRPC server task, and what the
/// stop reads and cancels.
pub(super) struct Running {
    /// The claim task (on the lease runtime).
    pub(super) lease_task: JoinHandle<Result<(), StoreError>>,
    /// The gRPC server.
    pub(super) server: JoinHandle<Result<(), tonic::transport::Error>>,
    /// Cancelled once no call can stamp ids any more: the claim gives its
    /// machine ids back.
    pub(super) release: CancellationToken,
    /// The gRPC calls in progress.
    pub(super) call_limits: CallLimits,
    /// The gRPC connections open.
    pub(super) open_connections: OpenConnections,
}

impl Running {
    /// Waits for `shutdown` (cancelling it when the claim or the server
    /// stops first), drains for up to `grace_period`, then releases; the
    /// claim's error first, then the server's.
    pub(super) async fn stop(
        mut self,
        shutdown: &CancellationToken,
        grace_period: Duration,
    ) -> Result<(), ServeError> {
        let (mut lease_result, mut server_result) = (None, None);
        // Biased: when a signal cancels `shutdown` and the server, told by the
        // same token, has already finished draining, this is still a shutdown
        // (and is logged as a drain), not a server that stopped by itself.
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {}
            r = &mut self.lease_task => { lease_result = Some(r); shutdown.cancel(); }
            r = &mut self.server => { server_result = Some(r); shutdown.cancel(); }
        }
        // Health is NOT_SERVING and the listener closed; wait for in-flight calls.
        let server_result = match server_result {
            Some(r) => r,
            None => self.drain(grace_period).await,
        };
        // Only now may the machine id be given back: every call that could
        // stamp ids under it is done.
        self.release.cancel();
        let lease_result = match lease_result {
            Some(r) => r,
            None => self.released().await,
        };
        lease_result??;
        server_result??;
        Ok(())
    }

    /// Waits up to `grace_period` for the server to finish its calls, then
    /// aborts it.
    async fn drain(&mut self, grace_period: Duration) -> ServerResult {
        match tokio::time::timeout(grace_period, &mut self.server).await {
            Ok(r) => {
                info!("in-flight requests drained gracefully");
                r
            }
            Err(_) => {
                let (calls, connections) =
                    (self.call_limits.in_progress(), self.open_connections.get());
                if calls > 0 {
                    warn!(grace_period = ?grace_period, calls, connections, "drain timed out; aborting the calls still in progress");
                } else {
                    info!(grace_period = ?grace_period, connections, "no call in progress; closing the connections whose clients did not answer the HTTP/2 shutdown");
                }
                self.server.abort();
                Ok(Ok(()))
            }
        }
    }

    /// Waits up to [`RELEASE_TIMEOUT`] for the claim to give its machine
    /// ids back.
    async fn released(&mut self) -> ClaimResult {
        match tokio::time::timeout(RELEASE_TIMEOUT, &mut self.lease_task).await {
            Ok(r) => r,
            Err(_) => {
                error!("release did not finish in time; the machine id frees itself when its lease expires");
                Ok(Ok(()))
            }
        }
    }
}
