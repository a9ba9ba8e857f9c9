//! The serving side of start-up: the status page, the gRPC listener with
//! its connection limits, allow-list and TLS, and tonic's server with the
//! HTTP/2 bounds and the layers every call passes.

use std::future::Future;
use std::sync::Arc;

use snowkeep_client::GeneratorSet;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::Routes;
use tracing::{info, warn};

use super::Shared;
use crate::admin::AdminHandler;
use crate::config::{CorsOrigins, ServerConfig};
use crate::limits::calls::CallLimits;
use crate::limits::conn::{Listener, ListenerLimits};
use crate::limits::wire::WireStatusLayer;
use crate::limits::Limits;
use crate::peers::PeerClocks;
use crate::service::info::InfoHandler;
use crate::tls::{Reloader, ServerTls};

/// HTTP/2 receive windows (stream and connection), at least the largest
/// request message: requests are small, and a connection can then hold at
/// most this many bytes of request data the server has not read yet.
fn receive_window(limits: &Limits) -> u32 {
    u32::try_from(limits.max_recv_message_size + 5)
        .unwrap_or(u32::MAX)
        .max(65_535)
}

/// What the status page shows besides the shared handles.
pub(super) struct StatusPage {
    /// The administration service's handler.
    pub(super) admin: AdminHandler,
    /// This server's InfoService handler.
    pub(super) info: InfoHandler,
    /// This server's generators.
    pub(super) generators: Arc<GeneratorSet>,
    /// The peer clock check's last round.
    pub(super) peers: PeerClocks,
    /// Whether the peer clock check runs.
    pub(super) peer_check: bool,
}

/// Serves the status page (`--admin-listen`) on `listener` until shutdown.
pub(super) fn serve_status_page(
    config: &ServerConfig,
    shared: &Shared,
    listener: TcpListener,
    page: StatusPage,
    tracker: &TaskTracker,
) {
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(address = %address, auth = ?config.auth.mode, "serving the status page (--admin-listen)");
    let sources = crate::status_page::StatusSources {
        admin: page.admin,
        info: page.info,
        generators: page.generators,
        peers: page.peers,
        peer_check: page.peer_check,
        peer_warn: config.peer_skew.warn,
        audit: crate::status_page::AuditRing::follow(shared.shutdown.clone()),
        clock: shared.clock.clone(),
        instance_id: config.instance_id.clone(),
        namespace: shared.namespace.clone(),
        auth: shared.auth_mode.clone(),
        keys: shared.key_cache.clone(),
    };
    tracker.spawn(crate::status_page::serve(
        listener,
        sources,
        crate::allow::AllowList::new(config.allow_cidrs.clone()),
        config.limits.idle_timeout,
        shared.shutdown.clone(),
    ));
}

/// Warns when `--max-connections` (with the metrics port's, the
/// allow-list's and the status page's connections) leaves too few file
/// descriptors under the open-file limit.
pub(super) fn warn_if_few_descriptors(config: &ServerConfig) {
    let limits = &config.limits;
    if let Some(soft) = crate::limits::conn::open_file_limit() {
        // Connections outside the allow-list, and the status page's, only
        // exist when those are configured.
        let disallowed = match config.allow_cidrs.is_empty() {
            true => 0,
            false => crate::limits::conn::DISALLOWED_MAX_CONNECTIONS,
        };
        let status_page = match config.admin_listen {
            None => 0,
            Some(_) => crate::status_page::MAX_CONNECTIONS,
        };
        let needed = (limits.max_connections
            + crate::metrics_http::MAX_CONNECTIONS
            + disallowed
            + status_page) as u64
            + crate::limits::conn::OWN_DESCRIPTORS;
        if needed > soft {
            warn!(
            open_file_limit = soft,
            max_connections = limits.max_connections,
            metrics_connections = crate::metrics_http::MAX_CONNECTIONS,
            disallowed_connections = disallowed,
            status_page_connections = status_page,
            own_descriptors = crate::limits::conn::OWN_DESCRIPTORS,
            "--max-connections leaves too few file descriptors under the open-file limit: clients can exhaust those the server needs for etcd and its state; raise the limit (ulimit -n, LimitNOFILE) or lower --max-connections"
        );
        }
    }
}

/// The gRPC port's listener: connection limits, the allow-list, and TLS
/// (its reloader spawned on `tracker`) when configured.
pub(super) fn grpc_listener(
    config: &ServerConfig,
    listener: TcpListener,
    tls: Option<(ServerTls, Reloader)>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Listener {
    let limits = &config.limits;
    let listener = Listener::new(
        listener,
        ListenerLimits {
            name: "gRPC",
            max_connections: limits.max_connections,
            max_connections_flag: "--max-connections",
            max_connections_per_peer: limits.max_connections_per_peer,
            send_timeout: limits.stream_send_timeout,
            idle_timeout: limits.idle_timeout,
            handshake_timeout: crate::limits::conn::HANDSHAKE_TIMEOUT,
            tcp_keepalive: limits.tcp_keepalive,
        },
        shutdown.clone(),
    )
    .with_allow_list(crate::allow::AllowList::new(config.allow_cidrs.clone()));
    let listener = match (tls, &config.tls) {
        (Some((tls, reloader)), Some(settings)) => {
            info!(cert_file = %settings.cert_file.display(), client_ca_file = ?settings.client_ca_file, reload_interval = ?settings.reload_interval, "serving gRPC over TLS");
            tracker.spawn(reloader.run(shutdown.clone()));
            listener.with_tls(tls)
        }
        _ => listener,
    };
    if !config.allow_cidrs.is_empty() {
        info!(allow_cidrs = ?config.allow_cidrs, disallowed_max_connections = crate::limits::conn::DISALLOWED_MAX_CONNECTIONS, "calls from other peer addresses get PERMISSION_DENIED, on connections of their own small budget that close soon");
    }
    listener
}

/// The CORS layer of `--cors-allow-origins`; `None` (no CORS headers at
/// all) when it is empty.
fn cors(origins: &CorsOrigins) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    let allow = match origins {
        CorsOrigins::None => return None,
        CorsOrigins::Any => AllowOrigin::any(),
        CorsOrigins::List(list) => AllowOrigin::list(
            list.iter()
                .filter_map(|o| http::HeaderValue::from_str(o).ok()),
        ),
    };
    // gRPC-Web sends its own headers (x-grpc-web, x-user-agent,
    // grpc-timeout) and reads the status from grpc-status and
    // grpc-message.
    let exposed = [
        "grpc-status",
        "grpc-message",
        "grpc-status-details-bin",
        "retry-after",
    ]
    .map(http::HeaderName::from_static);
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([http::Method::GET, http::Method::POST])
            .allow_headers(Any)
            .expose_headers(exposed)
            .max_age(std::time::Duration::from_secs(600)),
    )
}

/// Serves `routes` on `listener` until shutdown: tonic's HTTP/2 bounds, one
/// span per call, then the layers outermost first: CORS (with
/// `--cors-allow-origins`), HTTP/JSON and gRPC-Web (whose calls pass every
/// layer below), metrics, allow-list, API keys, call limits, wire status. HTTP/1.1 is accepted beside HTTP/2 for HTTP/JSON and gRPC-Web.
pub(super) fn serve_grpc(
    config: &ServerConfig,
    shared: Shared,
    listener: Listener,
    call_limits: &CallLimits,
    routes: Routes,
) -> Result<impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static, String> {
    let limits = &config.limits;
    let window = receive_window(limits);
    let allow = crate::allow::AllowList::new(config.allow_cidrs.clone());
    let http_api = crate::http::HttpApi::new(limits.max_recv_message_size, limits.request_timeout)?
        .with_allow_list(allow.clone());
    Ok(tonic::transport::Server::builder()
        .accept_http1(true)
        // tonic leaves these unset, which hyper reads as "no limit".
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .http2_max_header_list_size(limits.http2_max_header_list_size)
        .http2_keepalive_interval(limits.http2_keepalive_interval)
        .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout))
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .http2_adaptive_window(Some(false))
        // One span per call, named after the method (exported over OTLP
        // with --otlp-endpoint).
        .trace_fn(|req| {
            let path = req.uri().path();
            // DEBUG: off for the logs by default (no cost per call),
            // on for the OTLP layer, whose filter lets it through.
            tracing::debug_span!(
                "grpc",
                otel.name = path,
                rpc.system = "grpc",
                rpc.method = path
            )
        })
        // Outermost first. Browsers' preflight requests end here.
        .layer(tower::util::option_layer(cors(&config.cors_allow_origins)))
        // gRPC-Web is translated in it, for gRPC-Web calls only.
        .layer(crate::http::HttpJsonLayer::new(http_api))
        // Metrics see the final code of every call, shed ones included.
        .layer(crate::metrics::grpc_layer::GrpcMetricsLayer::new())
        // Before anything that holds resources for a call.
        .layer(allow)
        // Inside metrics (which count its refusals by code), before the
        // call limits: a call without a valid key takes no call slot.
        .layer(crate::auth::AuthLayer::new(
            shared.auth_mode,
            shared.key_cache,
            shared.clock,
            shared.namespace,
        ))
        .layer(call_limits.layer())
        .layer(WireStatusLayer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(listener.incoming(), shared.shutdown.cancelled_owned()))
}
