//! The endpoint failover client: one etcd-client `Client` per endpoint, each
//! request under a timeout, moving on to the next endpoint when one fails
//! (see the module docs of [`super`]), and the mapping of etcd-client's
//! errors into [`StoreError`], which only this module looks inside.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, KeyValue, TlsOptions, Txn,
};
use tracing::{debug, warn};

use super::access::{refusal_of, EtcdAccess};
use super::witness::RevisionWitness;
use snowkeep_core::claim::{AccessProblem, StoreError};

/// Clients for each endpoint, moving to the next after a failure. Clones
/// share the position, so a dead member learnt by one user (the claim loop,
/// a Lease API call) is skipped by all.
#[derive(Clone)]
pub(super) struct Endpoints {
    clients: Vec<Client>,
    /// The endpoint URLs, in `clients` order (for logs).
    urls: Arc<[String]>,
    current: Arc<AtomicUsize>,
    /// Per endpoint: set once its client has authenticated.
    authenticated: Vec<Arc<tokio::sync::OnceCell<()>>>,
    /// The TLS and authentication settings (etcd's user and password, when
    /// its auth is on).
    access: Arc<EtcdAccess>,
    /// The highest revision of the transactions' answers, for the rollback
    /// check ([`super::witness`]).
    witness: Arc<RevisionWitness>,
}

/// True when `e` says the endpoint did not serve the request (refused, reset,
/// timed out, no leader behind it), so another member may; false for a
/// definite answer that every member would give (not found, invalid argument,
/// compacted, permission denied).
pub(super) fn endpoint_failed(e: &StoreError) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        StoreError::Timeout { .. } => return true,
        // A certificate problem may be one member's; credentials and
        // permissions are the cluster's.
        StoreError::AccessRefused { problem, .. } => {
            return matches!(
                problem,
                AccessProblem::ServerCertificate
                    | AccessProblem::ClientCertificate
                    | AccessProblem::ClientCertificateMissing
                    | AccessProblem::ClientCertificateExpired
                    | AccessProblem::TlsNotServed
            )
        }
        _ => {}
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
        StoreError::Request { source, .. } | StoreError::AccessRefused { source, .. } => {
            source.downcast_ref()
        }
        _ => None,
    }
}

/// An etcd client error as a [`StoreError::Request`] (what `?` did when
/// the store lived in the same crate as the error type).
pub(super) fn request_failed(e: etcd_client::Error) -> StoreError {
    StoreError::Request {
        store: "etcd",
        source: Box::new(e),
    }
}

impl Endpoints {
    /// Makes one lazy client per endpoint URL, with `access`'s TLS and
    /// credentials; no request is sent (with credentials, each endpoint's
    /// client authenticates before its first request, see
    /// [`Endpoints::call_at`]). Errors only for an unusable endpoint URL or
    /// TLS material tonic cannot load.
    pub(super) async fn connect(
        urls: &[String],
        timeout: Duration,
        access: &EtcdAccess,
    ) -> Result<Self, StoreError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            // HTTP/2 pings: a connection to a hung member fails within
            // 2 s + `timeout` even while only a stream uses it.
            .with_keep_alive(Duration::from_secs(2), timeout);
        if let Some(tls) = &access.tls {
            let mut config =
                TlsOptions::new().ca_certificate(Certificate::from_pem(tls.ca_pem.clone()));
            if let Some(identity) = &tls.client_identity {
                config = config.identity(Identity::from_pem(
                    identity.cert_pem.clone(),
                    identity.key_pem.clone(),
                ));
            }
            options = options.with_tls(config);
        }
        if access.credentials.is_some() {
            // etcd's tokens expire (`--auth-token-ttl`, 300 s by default for
            // simple tokens, measured from their last use): a request refused
            // with "invalid auth token" authenticates again and is retried
            // once. Streams opened later (keepalive, watch) go through the
            // same path.
            options = options.with_auto_token_refresh(true);
        }
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
            authenticated: clients
                .iter()
                .map(|_| Arc::new(tokio::sync::OnceCell::new()))
                .collect(),
            clients,
            urls: urls.into(),
            current: Arc::new(AtomicUsize::new(0)),
            access: Arc::new(access.clone()),
            witness: Arc::default(),
        })
    }

    /// Authenticates the client at `position` once (when credentials are
    /// configured): `Client::connect` with a user would authenticate at
    /// once, so a member down at start would fail the whole connect;
    /// authenticating on first use keeps the clients lazy. A failed attempt
    /// is retried by the next request. After that, etcd-client refreshes
    /// the token itself when etcd calls it invalid (expired).
    async fn authenticate(&self, position: usize) -> Result<(), etcd_client::Error> {
        let Some(credentials) = &self.access.credentials else {
            return Ok(());
        };
        let mut client = self.client_at(position);
        self.authenticated[position % self.authenticated.len()]
            .get_or_try_init(|| async move {
                client
                    .update_user(Some((
                        credentials.user.clone(),
                        credentials.password.clone(),
                    )))
                    .await
            })
            .await
            .map(|_| ())
    }

    /// The position now (an index modulo the number of endpoints).
    pub(super) fn position(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    fn client_at(&self, position: usize) -> Client {
        self.clients[position % self.clients.len()].clone()
    }

    /// The endpoint URLs, in order.
    pub(super) fn urls(&self) -> &[String] {
        &self.urls
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

    /// Reads the one key `key` (a linearizable get, with failover like
    /// [`Endpoints::call`]): its key-value when present (`None`: absent),
    /// and the answer's header revision (0 when it has no header).
    pub(super) async fn get_key(
        &self,
        op: &'static str,
        after: Duration,
        key: &str,
    ) -> Result<(Option<KeyValue>, i64), StoreError> {
        let mut resp = self
            .call(op, after, |mut c| {
                let key = key.to_owned();
                async move { c.get(key, None).await }
            })
            .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((resp.take_kvs().into_iter().next(), revision))
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
            let attempt = async {
                self.authenticate(position).await?;
                f(self.client_at(position)).await
            };
            match timed(op, after, attempt)
                .await
                .map_err(|e| self.refused(position, e))
            {
                Ok(answer) => {
                    if !failed.is_empty() {
                        warn!(op, failed = ?failed, now_using = self.url_at(position), "etcd endpoint failed; moved on to the next");
                    }
                    return Ok((answer, position));
                }
                Err(e) if endpoint_failed(&e) => {
                    debug!(op, endpoint = self.url_at(position), error = %snowkeep_core::DisplayChain(&e), "etcd endpoint failed; trying the next");
                    self.failed_at(position);
                    failed.push(format!(
                        "{}: {}",
                        self.url_at(position),
                        snowkeep_core::DisplayChain(&e)
                    ));
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(StoreError::Timeout { op, after }))
    }

    /// `e` as [`StoreError::AccessRefused`] when it is etcd refusing this
    /// server's TLS connection or credentials; otherwise `e` unchanged.
    fn refused(&self, position: usize, e: StoreError) -> StoreError {
        let problem = etcd_error(&e).and_then(|e| refusal_of(e, &self.access));
        match (problem, e) {
            (Some(problem), StoreError::Request { source, .. }) => StoreError::AccessRefused {
                endpoint: self.url_at(position).to_owned(),
                problem,
                source,
            },
            (_, e) => e,
        }
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
        let resp = self
            .call(op, after, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        if let Some(header) = resp.header() {
            self.witness.saw(header.revision());
        }
        Ok(resp)
    }

    /// The revision witness every transaction's answer feeds.
    pub(super) fn witness(&self) -> &RevisionWitness {
        &self.witness
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
        Ok(r) => r.map_err(request_failed),
        Err(_) => Err(StoreError::Timeout { op, after }),
    }
}
