//! `RemoteClient`: calls `IdService` on several snowkeep servers, balancing
//! round-robin and retrying a retryable failure (UNAVAILABLE, a transport
//! error, a server at its limits: the codes `ClientError::is_retryable`
//! retries) on the next server with backoff, so one server going away costs
//! a retry, not a failed call. [`IdPool`] prefetches in the background so
//! `next_id()` is a local pop. [`IdStream`] counts a stream's ids, so one
//! that ends before its total is an error, never a short success.

mod pool;
mod stream;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use snowkeep_proto::v1 as pb;
use tonic::transport::Endpoint;

use crate::api_key::{KeyedChannel, SendApiKey};
use tracing::debug;

pub use pool::{IdPool, PoolConfig};
pub use stream::IdStream;

use crate::backoff::Backoff;
use crate::error::{is_retryable_code, ClientError};

/// The TLS settings `build` takes: [`crate::tls::ClientTls`] with the `tls`
/// feature, nothing to give without it.
#[cfg(feature = "tls")]
type TlsSettings = crate::tls::ClientTls;
#[cfg(not(feature = "tls"))]
type TlsSettings = std::convert::Infallible;

/// Settings of a remote client.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Attempts per call across servers (at least the number of servers makes
    /// every server get a chance).
    pub attempts: u32,
    /// First delay between attempts; doubles up to `max_backoff`.
    pub backoff: Duration,
    /// Largest delay between attempts.
    pub max_backoff: Duration,
    /// Timeout of one attempt.
    pub request_timeout: Duration,
    /// The API key sent with every call (a cluster that requires API keys
    /// needs one with the `ids` permission); `None` sends none.
    pub api_key: Option<crate::ApiKey>,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            attempts: 6,
            backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            api_key: None,
        }
    }
}

/// A client of several snowkeep servers.
#[derive(Debug, Clone)]
pub struct RemoteClient {
    servers: Vec<pb::id_service_client::IdServiceClient<KeyedChannel>>,
    next: std::sync::Arc<AtomicUsize>,
    config: RemoteConfig,
}

impl RemoteClient {
    /// A client of `endpoints` (`http://host:port`); connections open lazily.
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
                let mut endpoint = Endpoint::from_shared(e.clone())
                    .map_err(|_| ClientError::InvalidEndpoint {
                        endpoint: e.clone(),
                    })?
                    .connect_timeout(config.request_timeout)
                    .tcp_nodelay(true);
                #[cfg(feature = "tls")]
                if let Some(tls) = tls {
                    endpoint = tls.apply(endpoint)?;
                }
                let channel = endpoint.connect_lazy();
                let key = SendApiKey(config.api_key.clone());
                Ok(
                    pb::id_service_client::IdServiceClient::with_interceptor(channel, key)
                        .max_decoding_message_size(64 << 20),
                )
            })
            .collect::<Result<_, ClientError>>()?;
        Ok(Self {
            servers,
            next: Default::default(),
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

    /// Runs `call` on servers in turn until it succeeds or a non-retryable
    /// status comes back, with backoff between attempts.
    async fn with_retries<T, F, Fut>(&self, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(pb::id_service_client::IdServiceClient<KeyedChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff = Backoff::new(self.config.backoff, self.config.max_backoff);
        let mut last = None;
        for attempt in 0..self.config.attempts.max(1) {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.servers.len();
            let answer =
                tokio::time::timeout(self.config.request_timeout, call(self.servers[i].clone()))
                    .await;
            let status = match answer {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(status)) => status,
                Err(_) => tonic::Status::deadline_exceeded("no answer in time"),
            };
            if !is_retryable_code(status.code()) {
                return Err(ClientError::Status(status));
            }
            debug!(server = i, attempt, code = ?status.code(), "retrying on the next server");
            last = Some(status);
            // The next server is a different one: only back off once every
            // server has been tried in this round.
            if ((attempt + 1) as usize).is_multiple_of(self.servers.len()) {
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
        Err(ClientError::Status(last.unwrap_or_else(|| {
            tonic::Status::unavailable("no attempt made")
        })))
    }

    /// `n` strictly ascending ids from one server (1 to 100000).
    pub async fn next_ids(&self, n: u32) -> Result<Vec<u64>, ClientError> {
        self.with_retries(|mut c| async move {
            c.next_ids(pb::NextIdsRequest {
                count: n,
                ..Default::default()
            })
            .await
        })
        .await
        .map(|r| r.ids)
    }

    /// `n` ids like [`RemoteClient::next_ids`], each with its text: the
    /// fixed-width Crockford base32 form that sorts like the ids
    /// ([`crate::text_id`]), written by the server for its layout.
    ///
    /// # Errors
    /// As [`RemoteClient::next_ids`], and [`ClientError::NoTexts`] when the
    /// server predates texts.
    pub async fn next_ids_with_texts(&self, n: u32) -> Result<Vec<(u64, String)>, ClientError> {
        let r = self
            .with_retries(|mut c| async move {
                c.next_ids(pb::NextIdsRequest {
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

    /// A stream like [`RemoteClient::stream_ids`] whose batches carry each
    /// id's text too (`IdBatch::texts`, parallel to `ids`; see
    /// [`RemoteClient::next_ids_with_texts`]). A batch without them ends the
    /// stream with [`ClientError::NoTexts`].
    pub async fn stream_ids_with_texts(
        &self,
        total: u64,
        batch_size: u32,
    ) -> Result<IdStream, ClientError> {
        let batches = self
            .with_retries(|mut c| async move {
                c.stream_ids(pb::StreamIdsRequest {
                    total,
                    batch_size,
                    format: pb::IdFormat::CrockfordBase32.into(),
                })
                .await
            })
            .await?;
        Ok(IdStream::new(batches, total).expecting_texts())
    }

    /// A stream of ascending batches from one server (`total` 0 = until
    /// dropped; `batch_size` ids per batch, 1 to 100000, 0 = 1000). Opening
    /// it is retried like any call. A stream that ends before `total` ids
    /// ends with an error, never with `Ok(None)` (see [`IdStream`]); that is
    /// not retried, since the caller has consumed part of it: ask for the
    /// remaining `total - received()` ids again.
    pub async fn stream_ids(&self, total: u64, batch_size: u32) -> Result<IdStream, ClientError> {
        let batches = self
            .with_retries(|mut c| async move {
                c.stream_ids(pb::StreamIdsRequest {
                    total,
                    batch_size,
                    ..Default::default()
                })
                .await
            })
            .await?;
        Ok(IdStream::new(batches, total))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    use snowkeep_proto::v1::id_service_server::{IdService, IdServiceServer};
    use tonic::{Code, Request, Response, Status};

    use super::*;

    /// An `IdService` that answers every `NextIds` with `refusal`, or, when
    /// that is `None`, with the ids 1 to `count`; it counts the calls.
    struct Fixed {
        refusal: Option<Code>,
        calls: Arc<AtomicU32>,
    }

    #[tonic::async_trait]
    impl IdService for Fixed {
        async fn next_ids(
            &self,
            request: Request<pb::NextIdsRequest>,
        ) -> Result<Response<pb::NextIdsResponse>, Status> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match self.refusal {
                Some(code) => Err(Status::new(code, "refused")),
                None => Ok(Response::new(pb::NextIdsResponse {
                    ids: (1..=u64::from(request.into_inner().count)).collect(),
                    ..Default::default()
                })),
            }
        }

        type StreamIdsStream = futures_util::stream::Empty<Result<pb::IdBatch, Status>>;

        async fn stream_ids(
            &self,
            _: Request<pb::StreamIdsRequest>,
        ) -> Result<Response<Self::StreamIdsStream>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    /// Serves a [`Fixed`] on a free loopback port; its URL and call count.
    async fn serve(refusal: Option<Code>) -> (String, Arc<AtomicU32>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let calls = Arc::new(AtomicU32::new(0));
        let service = IdServiceServer::new(Fixed {
            refusal,
            calls: calls.clone(),
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        (url, calls)
    }

    fn config(attempts: u32) -> RemoteConfig {
        RemoteConfig {
            attempts,
            backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
            ..RemoteConfig::default()
        }
    }

    #[tokio::test]
    async fn a_server_at_its_limits_is_retried_on_the_next_server() {
        for code in [Code::ResourceExhausted, Code::Unavailable] {
            let (busy, busy_calls) = serve(Some(code)).await;
            let (ok, ok_calls) = serve(None).await;
            let client = RemoteClient::new(&[busy, ok], config(2)).unwrap();
            assert_eq!(client.next_ids(3).await.unwrap(), vec![1, 2, 3], "{code:?}");
            assert_eq!(busy_calls.load(Ordering::SeqCst), 1, "{code:?}");
            assert_eq!(ok_calls.load(Ordering::SeqCst), 1, "{code:?}");
        }
    }

    #[tokio::test]
    async fn a_refusal_no_retry_can_heal_is_returned_after_one_call() {
        for code in [Code::InvalidArgument, Code::PermissionDenied] {
            let (bad, bad_calls) = serve(Some(code)).await;
            let (ok, ok_calls) = serve(None).await;
            let client = RemoteClient::new(&[bad, ok], config(2)).unwrap();
            match client.next_ids(3).await {
                Err(ClientError::Status(s)) => assert_eq!(s.code(), code),
                other => panic!("{code:?}: expected the status, got {other:?}"),
            }
            assert_eq!(bad_calls.load(Ordering::SeqCst), 1, "{code:?}");
            assert_eq!(ok_calls.load(Ordering::SeqCst), 0, "{code:?}");
        }
    }
}
