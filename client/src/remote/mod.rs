//! `RemoteClient`: calls `IdService` on several snowkeep servers, choosing
//! them round-robin and skipping one whose last attempt failed (ejected for a
//! backoff), and retrying a retryable failure (UNAVAILABLE, a transport
//! error, a server at its limits: the codes `ClientError::is_retryable`
//! retries) on the next server with jittered backoff within a retry budget,
//! so one server going away costs a retry, not a failed call. [`IdPool`]
//! prefetches in the background so `next_id()` is a local pop.
//! [`RemoteClient::stream`] resumes a stream that ended early on another
//! server; [`IdStream`] is one server's part, counted, so a stream that ends
//! before its total is an error, never a short success. The rules are the
//! client contract every official client follows (`conformance/README.md`).

mod choice;
mod pool;
mod resume;
mod stream;

use std::sync::Arc;
use std::time::Duration;

use snowkeep_proto::v1 as pb;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::api_key::{KeyedChannel, SendApiKey};
use tracing::debug;

pub use pool::{IdPool, PoolConfig};
pub use resume::ResumingStream;
pub use stream::IdStream;

use crate::backoff::Backoff;
use crate::error::{is_retryable_code, ClientError};
use crate::layout::{DecodedId, Layout};
use choice::Choice;

/// The TLS settings `build` takes: [`crate::tls::ClientTls`] with the `tls`
/// feature, nothing to give without it.
#[cfg(feature = "tls")]
type TlsSettings = crate::tls::ClientTls;
#[cfg(not(feature = "tls"))]
type TlsSettings = std::convert::Infallible;

/// The largest `count` of one `NextIds` call (and `batch_size` of a
/// stream): the server's limit, checked before any call.
pub const MAX_COUNT: u32 = 100_000;

/// The most ids one [`RemoteClient::stream`] asks for: 2^63 − 1, every id a
/// 63-bit layout holds.
pub const MAX_TOTAL: u64 = i64::MAX as u64;

/// Settings of a remote client.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Most attempts per call across servers; the default (`u32::MAX`)
    /// leaves the bound to `retry_budget`.
    pub attempts: u32,
    /// First delay after every server failed once in a round; doubles each
    /// round up to `max_backoff`, each delay scaled by a random factor in
    /// [0.8, 1.2]. Also how long a failed server is first skipped (ejected).
    pub backoff: Duration,
    /// Largest delay between rounds, and longest ejection.
    pub max_backoff: Duration,
    /// Timeout of one attempt (capped by the budget left), and the longest
    /// a stream may go without a batch before it counts as failed.
    pub request_timeout: Duration,
    /// The whole time a call may spend retrying: no attempt starts and no
    /// backoff ends after it; the call then fails with the last retryable
    /// error. A stream's budget starts again whenever a batch arrives.
    pub retry_budget: Duration,
    /// The API key sent with every call (a cluster that requires API keys
    /// needs one with the `ids` permission); `None` sends none.
    pub api_key: Option<crate::ApiKey>,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            attempts: u32::MAX,
            backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            retry_budget: Duration::from_secs(10),
            api_key: None,
        }
    }
}

/// One call's retry budget: when it ends, and the last retryable failure
/// within it, which the call reports once the budget is spent. A stream
/// keeps one across its parts and starts a new one whenever a batch arrives.
#[derive(Debug)]
pub(crate) struct Budget {
    end: Instant,
    last: Option<tonic::Status>,
}

impl Budget {
    /// Whether the budget's end has not come yet.
    pub(crate) fn open(&self) -> bool {
        Instant::now() < self.end
    }

    /// The time left until the budget's end (zero once it has come).
    pub(crate) fn left(&self) -> Duration {
        self.end.saturating_duration_since(Instant::now())
    }

    /// An attempt's deadline: the smaller of `request_timeout` and the
    /// budget left, and whether the budget is the smaller (the attempt is
    /// then cut short by it; see [`Budget::fail`]).
    pub(crate) fn attempt_timeout(&self, request_timeout: Duration) -> (Duration, bool) {
        let left = self.left();
        (left.min(request_timeout), left < request_timeout)
    }

    /// Whether a wait of `delay` from now would end after the budget.
    pub(crate) fn outlasted_by(&self, delay: Duration) -> bool {
        Instant::now() + delay >= self.end
    }

    /// Records a retryable failure; false when it was not kept. `cut` says
    /// the attempt's timeout was the budget left rather than
    /// `request_timeout`: its `DEADLINE_EXCEEDED` then keeps the failure
    /// before it as the one to report.
    pub(crate) fn fail(&mut self, status: tonic::Status, cut: bool) -> bool {
        if cut && status.code() == tonic::Code::DeadlineExceeded && self.last.is_some() {
            return false;
        }
        self.last = Some(status);
        true
    }

    /// The error of a spent budget: its last retryable failure.
    pub(crate) fn spent(&mut self) -> tonic::Status {
        self.last.take().unwrap_or_else(|| {
            tonic::Status::deadline_exceeded("the retry budget was spent before any attempt")
        })
    }
}

/// One server: its `IdService` and `InfoService` over one channel.
#[derive(Debug, Clone)]
struct Server {
    ids: pb::id_service_client::IdServiceClient<KeyedChannel>,
    info: pb::info_service_client::InfoServiceClient<KeyedChannel>,
}

/// A client of several snowkeep servers. Cheap to clone: clones share the
/// connections, the round-robin cursor and the servers' health.
#[derive(Debug, Clone)]
pub struct RemoteClient {
    servers: Vec<Server>,
    choice: Arc<Choice>,
    layout: Arc<tokio::sync::OnceCell<Layout>>,
    config: RemoteConfig,
}

/// `host:port` with a port of 1 to 65535, after an optional `http://` or
/// `https://`; the endpoint as tonic takes it (`http://` added).
fn endpoint_uri(endpoint: &str) -> Result<String, ClientError> {
    let bad = || ClientError::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
    };
    let (scheme, rest) = match endpoint.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest),
        Some(_) => return Err(bad()),
        None => ("http", endpoint),
    };
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    if host.is_empty() || host.contains('/') || !port_ok {
        return Err(bad());
    }
    Ok(format!("{scheme}://{rest}"))
}

impl RemoteClient {
    /// A client of `endpoints` (`host:port` or `http://host:port`);
    /// connections open lazily.
    ///
    /// # Errors
    /// [`ClientError::NoServers`] for an empty list,
    /// [`ClientError::InvalidEndpoint`] for one that is not `host:port`.
    pub fn new(endpoints: &[String], config: RemoteConfig) -> Result<Self, ClientError> {
        Self::build(endpoints, config, None)
    }

    /// A client of `endpoints` (`https://host:port`) over TLS with `tls`;
    /// connections open lazily (a TLS failure shows on the first call).
    ///
    /// # Errors
    /// As [`RemoteClient::new`], and [`ClientError::Tls`] for settings
    /// tonic refuses.
    #[cfg(feature = "tls")]
    pub fn new_with_tls(
        endpoints: &[String],
        config: RemoteConfig,
        tls: &crate::tls::ClientTls,
    ) -> Result<Self, ClientError> {
        Self::build(endpoints, config, Some(tls))
    }

    fn build(
        endpoints: &[String],
        config: RemoteConfig,
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))] tls: Option<&TlsSettings>,
    ) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoServers);
        }
        let servers = endpoints
            .iter()
            .map(|e| {
                #[allow(unused_mut)]
                let mut endpoint = Endpoint::from_shared(endpoint_uri(e)?)
                    .map_err(|_| ClientError::InvalidEndpoint {
                        endpoint: e.clone(),
                    })?
                    .connect_timeout(config.request_timeout)
                    .tcp_nodelay(true);
                #[cfg(feature = "tls")]
                if let Some(tls) = tls {
                    endpoint = tls.apply(endpoint)?;
                }
                Ok(Server::over(endpoint.connect_lazy(), &config))
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        Ok(Self {
            choice: Arc::new(Choice::new(
                servers.len(),
                config.backoff,
                config.max_backoff,
            )),
            servers,
            layout: Default::default(),
            config,
        })
    }

    /// A client of every address `name:port` resolves to (a Kubernetes
    /// headless Service, for example). Resolved once, now.
    pub async fn from_dns(
        name: &str,
        port: u16,
        config: RemoteConfig,
    ) -> Result<Self, ClientError> {
        let addrs = tokio::net::lookup_host((name, port))
            .await
            .map_err(|source| ClientError::Resolve {
                name: name.to_owned(),
                source,
            })?;
        let endpoints: Vec<String> = addrs.map(|a| format!("http://{a}")).collect();
        Self::new(&endpoints, config)
    }

    /// The settings this client was built with.
    pub fn config(&self) -> &RemoteConfig {
        &self.config
    }

    /// A retry budget that starts now.
    pub(crate) fn budget_from_now(&self) -> Budget {
        Budget {
            end: Instant::now() + self.config.retry_budget,
            last: None,
        }
    }

    /// Runs `call` on servers chosen by [`Choice`] until it succeeds, a
    /// non-retryable status comes back, or `budget` (or `attempts`) is
    /// spent; backs off once every server failed in a round. Returns the
    /// answer and the index of the server that gave it.
    ///
    /// A spent budget fails with the budget's last retryable status. An
    /// attempt the budget's end cut short (its timeout was the budget left,
    /// not `request_timeout`) ran out of budget, not of server time: when it
    /// times out, the failure before it stays the one reported.
    async fn with_retries<T, F, Fut>(
        &self,
        budget: &mut Budget,
        mut call: F,
    ) -> Result<(T, usize), ClientError>
    where
        F: FnMut(Server) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff =
            Backoff::new(self.config.backoff, self.config.max_backoff).with_jitter(0.2);
        for attempt in 0..self.config.attempts.max(1) {
            if !budget.open() {
                break;
            }
            let i = self.choice.pick();
            let (timeout, cut) = budget.attempt_timeout(self.config.request_timeout);
            let answer = tokio::time::timeout(timeout, call(self.servers[i].clone())).await;
            let status = match answer {
                Ok(Ok(r)) => {
                    self.choice.succeeded(i);
                    return Ok((r.into_inner(), i));
                }
                Ok(Err(status)) => status,
                Err(_) => tonic::Status::deadline_exceeded(format!("no answer within {timeout:?}")),
            };
            if !is_retryable_code(status.code()) {
                return Err(ClientError::Status(status));
            }
            self.choice.failed(i);
            debug!(server = i, attempt, code = ?status.code(), "retrying on the next server");
            budget.fail(status, cut);
            // The next server is a different one: only back off once every
            // server has been tried in this round.
            if ((attempt + 1) as usize).is_multiple_of(self.choice.len()) {
                let delay = backoff.next_delay();
                if budget.outlasted_by(delay) {
                    break;
                }
                tokio::time::sleep(delay).await;
            }
        }
        Err(ClientError::Status(budget.spent()))
    }

    /// Marks server `i` failed (a stream part it served ended early).
    pub(crate) fn server_failed(&self, i: usize) {
        self.choice.failed(i);
    }

    /// `n` strictly ascending ids from one server.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for `n` outside 1 to [`MAX_COUNT`],
    /// before any call; [`ClientError::Status`] with the last status when
    /// the retry rule gives up, or at once for a non-retryable one.
    pub async fn next_ids(&self, n: u32) -> Result<Vec<u64>, ClientError> {
        check_count("count", n, 1)?;
        self.with_retries(&mut self.budget_from_now(), |mut s| async move {
            s.ids
                .next_ids(pb::NextIdsRequest {
                    count: n,
                    ..Default::default()
                })
                .await
        })
        .await
        .map(|(r, _)| r.ids)
    }

    /// `n` ids like [`RemoteClient::next_ids`], each with its text: the
    /// fixed-width Crockford base32 form that sorts like the ids
    /// ([`crate::text_id`]), written by the server for its layout.
    ///
    /// # Errors
    /// As [`RemoteClient::next_ids`], and [`ClientError::NoTexts`] when the
    /// server predates texts.
    pub async fn next_ids_with_texts(&self, n: u32) -> Result<Vec<(u64, String)>, ClientError> {
        check_count("count", n, 1)?;
        let (r, _) = self
            .with_retries(&mut self.budget_from_now(), |mut s| async move {
                s.ids
                    .next_ids(pb::NextIdsRequest {
                        count: n,
                        format: pb::IdFormat::CrockfordBase32.into(),
                        ..Default::default()
                    })
                    .await
            })
            .await?;
        if r.texts.len() != r.ids.len() {
            return Err(ClientError::NoTexts {
                ids: r.ids.len(),
                texts: r.texts.len(),
            });
        }
        Ok(r.ids.into_iter().zip(r.texts).collect())
    }

    /// Opens one server's part of a stream: `StreamIds(total, batch_size,
    /// format)` under the retry rule within `budget`;
    /// the part and the index of its server.
    pub(crate) async fn open_part(
        &self,
        budget: &mut Budget,
        total: u64,
        batch_size: u32,
        format: pb::IdFormat,
    ) -> Result<(IdStream, usize), ClientError> {
        check_count("batch_size", batch_size, 0)?;
        let (batches, i) = self
            .with_retries(budget, |mut s| async move {
                s.ids
                    .stream_ids(pb::StreamIdsRequest {
                        total,
                        batch_size,
                        format: format.into(),
                    })
                    .await
            })
            .await?;
        let part = IdStream::new(batches, total).idle_timeout(self.config.request_timeout);
        Ok((part, i))
    }

    /// A stream like [`RemoteClient::stream_ids`] whose batches carry each
    /// id's text too (`IdBatch::texts`, parallel to `ids`; see
    /// [`RemoteClient::next_ids_with_texts`]). A batch without them ends the
    /// stream with [`ClientError::NoTexts`].
    pub async fn stream_ids_with_texts(
        &self,
        total: u64,
        batch_size: u32,
    ) -> Result<IdStream, ClientError> {
        let format = pb::IdFormat::CrockfordBase32;
        let (part, _) = self
            .open_part(&mut self.budget_from_now(), total, batch_size, format)
            .await?;
        Ok(part.expecting_texts())
    }

    /// One server's stream of ascending batches (`total` 0 = until dropped;
    /// `batch_size` ids per batch, 1 to 100000, 0 = 1000). Opening it is
    /// retried like any call. A stream that ends before `total` ids ends
    /// with an error, never with `Ok(None)` (see [`IdStream`]); that is not
    /// retried here: ask for the remaining `total - received()` ids again,
    /// or use [`RemoteClient::stream`], which does.
    pub async fn stream_ids(&self, total: u64, batch_size: u32) -> Result<IdStream, ClientError> {
        let format = pb::IdFormat::Unspecified;
        let (part, _) = self
            .open_part(&mut self.budget_from_now(), total, batch_size, format)
            .await?;
        Ok(part)
    }

    /// Exactly `total` ids (1 to 2^63 − 1, the most ids a layout of 63 bits
    /// holds; [`RemoteClient::stream_ids`] with 0 streams until dropped) in batches of
    /// `batch_size` (1 to 100000, 0 = the server's default, 1000), resumed
    /// on another server whenever a part ends early with a retryable status:
    /// see [`ResumingStream`] for the guarantee. Opens nothing until read.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a `total` outside 1 to 2^63 − 1
    /// or a `batch_size` above 100000, before any call.
    pub fn stream(&self, total: u64, batch_size: u32) -> Result<ResumingStream, ClientError> {
        if !(1..=MAX_TOTAL).contains(&total) {
            return Err(ClientError::InvalidArgument {
                parameter: "total",
                detail: format!("must be 1 to {MAX_TOTAL}, got {total}"),
            });
        }
        check_count("batch_size", batch_size, 0)?;
        Ok(ResumingStream::new(self.clone(), total, batch_size))
    }

    /// The namespace's layout as the servers report it (`GetInfo`, asked
    /// once under the retry rule and kept).
    ///
    /// # Errors
    /// As any call, and [`ClientError::BadLayout`] for a layout this client
    /// cannot read.
    pub async fn layout(&self) -> Result<Layout, ClientError> {
        self.layout
            .get_or_try_init(|| async {
                let (info, _) = self
                    .with_retries(&mut self.budget_from_now(), |mut s| async move {
                        s.info.get_info(pb::GetInfoRequest {}).await
                    })
                    .await?;
                let layout = info.layout.unwrap_or_default();
                Layout::try_from(&layout).map_err(ClientError::BadLayout)
            })
            .await
            .copied()
    }

    /// The parts of `id` (timestamp, machine id, sequence) under
    /// [`RemoteClient::layout`].
    ///
    /// # Errors
    /// As [`RemoteClient::layout`], and [`ClientError::InvalidArgument`]
    /// (parameter `id`) for an id above the layout's largest.
    pub async fn decode(&self, id: u64) -> Result<DecodedId, ClientError> {
        let layout = self.layout().await?;
        layout
            .decode(id)
            .ok_or_else(|| ClientError::InvalidArgument {
                parameter: "id",
                detail: format!(
                    "{id} is above the largest id of the namespace's {}-bit layout, {}",
                    layout.total_bits(),
                    layout.max_id()
                ),
            })
    }
}

impl Server {
    /// Both services over `channel`, sending `config`'s API key.
    fn over(channel: Channel, config: &RemoteConfig) -> Self {
        let key = SendApiKey(config.api_key.clone());
        Self {
            ids: pb::id_service_client::IdServiceClient::with_interceptor(
                channel.clone(),
                key.clone(),
            )
            .max_decoding_message_size(64 << 20),
            info: pb::info_service_client::InfoServiceClient::with_interceptor(channel, key),
        }
    }
}

/// Refuses a `value` of `parameter` outside `min` to [`MAX_COUNT`].
fn check_count(parameter: &'static str, value: u32, min: u32) -> Result<(), ClientError> {
    if (min..=MAX_COUNT).contains(&value) {
        return Ok(());
    }
    Err(ClientError::InvalidArgument {
        parameter,
        detail: format!("must be {min} to {MAX_COUNT}, got {value}"),
    })
}

#[cfg(test)]
mod tests;
