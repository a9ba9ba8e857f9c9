//! The endpoint failover client: one etcd-client `Client` per endpoint, each
//! request under a timeout, moving on to the next endpoint when one fails
//! (see the module docs of [`super`]), and the mapping of etcd-client's
//! errors into [`StoreError`], which only this module looks inside.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, Txn};
use tracing::{debug, warn};

use crate::claim::StoreError;

/// Clients for each endpoint, moving to the next after a failure. Clones
/// share the position, so a dead member learnt by one user (the claim loop,
/// a Lease API call) is skipped by all.
#[derive(Clone)]
pub(super) struct Endpoints {
    clients: Vec<Client>,
    /// The endpoint URLs, in `clients` order (for logs).
    urls: Arc<[String]>,
    current: Arc<AtomicUsize>,
}

/// True when `e` says the endpoint did not serve the request (refused, reset,
/// timed out, no leader behind it), so another member may; false for a
/// definite answer that every member would give (not found, invalid argument,
/// compacted, permission denied).
pub(super) fn endpoint_failed(e: &StoreError) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    if let StoreError::Timeout { .. } = e {
        return true;
    }
    let Some(e) = etcd_error(e) else {
        return false;
    };
    match e {
        E::GRpcStatus(status) => !matches!(
            status.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::Unimplemented
        ),
        E::LeaseKeepAliveError(msg) => !msg.contains("not found"),
        E::InvalidArgs(_) | E::InvalidUri(_) | E::Utf8Error(_) | E::InvalidMetadataValue(_) => {
            false
        }
        _ => true,
    }
}

/// True when `e` is etcd saying the lease does not exist (any more).
pub(super) fn lease_not_found(e: &StoreError) -> bool {
    match etcd_error(e) {
        Some(etcd_client::Error::GRpcStatus(s)) => {
            s.code() == tonic::Code::NotFound && s.message().contains("lease not found")
        }
        Some(etcd_client::Error::LeaseKeepAliveError(msg)) => msg.contains("not found"),
        _ => false,
    }
}

/// The etcd-client error behind `e`, if it is one.
pub(super) fn etcd_error(e: &StoreError) -> Option<&etcd_client::Error> {
    match e {
        StoreError::Request { source, .. } => source.downcast_ref(),
        _ => None,
    }
}

impl From<etcd_client::Error> for StoreError {
    fn from(e: etcd_client::Error) -> Self {
        StoreError::Request {
            store: "etcd",
            source: Box::new(e),
        }
    }
}

impl Endpoints {
    /// Makes one lazy client per endpoint URL; no request is sent.
    pub(super) async fn connect(urls: &[String], timeout: Duration) -> Result<Self, StoreError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            // HTTP/2 pings: a connection to a hung member fails within
            // 2 s + `timeout` even while only a stream uses it.
            .with_keep_alive(Duration::from_secs(2), timeout);
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            clients.push(
                timed(
                    "connect",
                    timeout,
                    Client::connect([url], Some(options.clone())),
                )
                .await?,
            );
        }
        Ok(Self {
            clients,
            urls: urls.into(),
            current: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The position now (an index modulo the number of endpoints).
    pub(super) fn position(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    pub(super) fn client_at(&self, position: usize) -> Client {
        self.clients[position % self.clients.len()].clone()
    }

    pub(super) fn url_at(&self, position: usize) -> &str {
        &self.urls[position % self.urls.len()]
    }

    /// Moves off the endpoint at `position` after it failed, unless another
    /// user already moved: several users failing on one dead member move the
    /// shared position once, not once each (which could cycle back onto it).
    pub(super) fn failed_at(&self, position: usize) {
        let _ = self.current.compare_exchange(
            position,
            position.wrapping_add(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Runs one request, each attempt under `after`: on the current endpoint
    /// first, then on each next endpoint while the endpoints fail (at most one
    /// attempt per endpoint, so at most `after` × endpoints in all). Returns
    /// the answer, or a definite error at once, or the last endpoint's error.
    pub(super) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        after: Duration,
        f: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_at(op, after, f).await.map(|(answer, _)| answer)
    }

    /// How many keys lie in `[start, end)`: one count-only range read (no
    /// values travel), with failover like [`Endpoints::call`].
    pub(super) async fn count(
        &self,
        op: &'static str,
        after: Duration,
        start: String,
        end: String,
    ) -> Result<i64, StoreError> {
        let resp = self
            .call(op, after, |mut c| {
                let (start, end) = (start.clone(), end.clone());
                async move {
                    c.get(
                        start,
                        Some(GetOptions::new().with_range(end).with_count_only()),
                    )
                    .await
                }
            })
            .await?;
        Ok(resp.count())
    }

    /// [`Endpoints::call`], also returning the position that answered.
    pub(super) async fn call_at<T, F, Fut>(
        &self,
        op: &'static str,
        after: Duration,
        mut f: F,
    ) -> Result<(T, usize), StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let start = self.position();
        let mut failed: Vec<String> = Vec::new();
        let mut last = None;
        for k in 0..self.clients.len() {
            let position = start.wrapping_add(k);
            match timed(op, after, f(self.client_at(position))).await {
                Ok(answer) => {
                    if !failed.is_empty() {
                        warn!(op, failed = ?failed, now_using = self.url_at(position), "etcd endpoint failed; moved on to the next");
                    }
                    return Ok((answer, position));
                }
                Err(e) if endpoint_failed(&e) => {
                    debug!(op, endpoint = self.url_at(position), error = %crate::DisplayChain(&e), "etcd endpoint failed; trying the next");
                    self.failed_at(position);
                    failed.push(format!(
                        "{}: {}",
                        self.url_at(position),
                        crate::DisplayChain(&e)
                    ));
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(StoreError::Timeout { op, after }))
    }

    /// Runs one transaction, like [`Endpoints::call`]. A retried transaction
    /// may find its own earlier commit: its guard must then fail or hold
    /// harmlessly, and the caller must recognise it.
    pub(super) async fn txn(
        &self,
        op: &'static str,
        after: Duration,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, StoreError> {
        self.call(op, after, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Revokes `lease_id`, failing over like [`Endpoints::call`]; a lease
    /// that is already gone (an earlier attempt revoked it, or it expired)
    /// counts as revoked.
    pub(super) async fn revoke(&self, after: Duration, lease_id: i64) -> Result<(), StoreError> {
        match self
            .call("lease revoke", after, |mut c| async move {
                c.lease_revoke(lease_id).await
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if lease_not_found(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Runs one etcd request under the timeout.
pub(super) async fn timed<T>(
    op: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(after, fut).await {
        Ok(r) => r.map_err(StoreError::from),
        Err(_) => Err(StoreError::Timeout { op, after }),
    }
}
