//! `GET /metrics` (any path) over HTTP/1.1 on `--metrics-listen`, and the
//! HTTP/1.1 serving loop the status page shares. It lives beside the
//! catalog (`crate::metrics`), not in it: it serves on the connection limits'
//! listener, and those limits count in the catalog's names.
//!
//! metrics-exporter-prometheus has its own listener, but its accept loop
//! retries an accept error at once and logs a warning each time: with the
//! process out of file descriptors that is one core spinning and about
//! 130,000 warnings a second. Its connections also never time out. So the
//! exporter only renders ([`PrometheusHandle::render`]) and this module
//! serves, on the same accept loop as the gRPC port (backoff on accept
//! errors, throttled logs, a connection cap, silent connections closed).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use snowkeep_client::SystemClock;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use tonic::transport::server::Connected;

use crate::allow::AllowList;
use crate::limits::conn::{Listener, ListenerLimits};

/// Most open connections to the metrics port (Prometheus keeps one per
/// scraper).
pub(crate) const MAX_CONNECTIONS: usize = 16;
/// A request's headers must arrive within this.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often histograms and summaries are maintained between scrapes.
const UPKEEP_PERIOD: Duration = Duration::from_secs(5);

/// Serves the scrape from `handle` on `listener` until `shutdown`. Idle
/// connections close after `idle_timeout`.
///
/// `--allow-cidrs` does not apply here: it lists the client networks of
/// the gRPC port, while scrapers come from the monitoring network; the
/// metrics port is its own listener (`--metrics-listen`), to bind to an
/// internal address or fence off with a NetworkPolicy.
pub async fn serve(
    listener: TcpListener,
    handle: PrometheusHandle,
    idle_timeout: Duration,
    shutdown: CancellationToken,
) {
    let upkeep = {
        let (handle, shutdown) = (handle.clone(), shutdown.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP_PERIOD);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => handle.run_upkeep(),
                }
            }
        })
    };
    serve_http1(
        listener,
        ("metrics", "the metrics port's 16"),
        AllowList::default(),
        idle_timeout,
        shutdown,
        move |_request| scrape(handle.clone()),
    )
    .await;
    upkeep.abort();
}

/// Serves HTTP/1.1 on `listener` (the listener `name`, at most
/// [`MAX_CONNECTIONS`] open, each closed after `idle_timeout` idle or
/// [`HEADER_READ_TIMEOUT`] without its headers; `limit` names that limit in
/// the log) with `answer` for every request, until `shutdown`. The metrics
/// port (with an empty `allow`: every peer) and the status page (with
/// `--allow-cidrs`) use it. A peer outside `allow` gets 403 saying why for
/// every request, and its connection counts against the small budget of
/// such connections, as on the gRPC port.
pub(crate) async fn serve_http1<F, Fut>(
    listener: TcpListener,
    (name, limit): (&'static str, &'static str),
    allow: AllowList,
    idle_timeout: Duration,
    shutdown: CancellationToken,
    answer: F,
) where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    let limits = ListenerLimits {
        name,
        max_connections: MAX_CONNECTIONS,
        max_connections_flag: limit,
        max_connections_per_peer: None,
        send_timeout: None,
        idle_timeout,
        handshake_timeout: crate::limits::conn::HANDSHAKE_TIMEOUT,
        tcp_keepalive: None,
    };
    let incoming = Listener::new(listener, limits, shutdown.clone())
        .with_allow_list(allow.clone())
        .incoming();
    tokio::pin!(incoming);
    loop {
        let io = tokio::select! {
            _ = shutdown.cancelled() => break,
            io = incoming.next() => match io {
                Some(Ok(io)) => io,
                None => break,
            },
        };
        let answer = answer.clone();
        let conn = io.connect_info();
        let peer = conn.tcp.remote_addr().map(|a| a.ip());
        let refusal = (!allow.admits(peer)).then(|| allow.refusal(peer));
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let answered = match &refusal {
                    None => Some(answer(request)),
                    Some(_) => {
                        // The connection closes shortly, once this answer is out.
                        conn.state.denied();
                        None
                    }
                };
                let refusal = refusal.clone();
                async move {
                    Ok::<_, Infallible>(match answered {
                        Some(answered) => answered.await,
                        None => forbidden(refusal.unwrap_or_default()),
                    })
                }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(io), service)
                .await;
            if let Err(e) = served {
                debug!(listener = name, error = %e, "HTTP connection ended with an error");
            }
        });
    }
}

/// 403 with `message`, for a peer outside `--allow-cidrs`.
fn forbidden(message: String) -> http::Response<Full<Bytes>> {
    let mut response = http::Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = http::StatusCode::FORBIDDEN;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn scrape(handle: PrometheusHandle) -> http::Response<Full<Bytes>> {
    let text = tokio::task::spawn_blocking(move || {
        // Gauges read from the clock at scrape time, then the scrape.
        crate::metrics::set_layout_remaining(&SystemClock);
        handle.render()
    })
    .await
    .unwrap_or_default();
    let mut response = http::Response::new(Full::new(Bytes::from(text)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}
