//! HTTP/JSON and gRPC-Web on the gRPC port: one listener, told apart by
//! content type.
//!
//! - `application/grpc…`: gRPC, passed through untouched.
//! - `application/grpc-web…`: gRPC-Web (tonic-web translates it further in),
//!   marked [`Protocol::GrpcWeb`] for the metrics.
//! - anything else: HTTP/JSON. The route comes from the RPC's
//!   `google.api.http` rule ([`routes`]), the request message from the
//!   path, query string and body under the proto3 JSON mapping ([`json`]),
//!   and the call is made as a gRPC call through the very layers gRPC calls
//!   pass (metrics, allow-list, API keys, call limits), so an HTTP call is
//!   authenticated, limited, audited and counted as its gRPC twin is. Its
//!   answer is JSON, its error a `google.rpc.Status` with the HTTP status of
//!   the standard mapping ([`http_status`]).
//!
//! Besides the annotated RPCs: `GET /healthz` (issuance: the gRPC health of
//! `snowkeep.v1.IdService`), `GET /livez` (the process: the liveness
//! service's), and `GET /openapi.json` (the OpenAPI document generated from
//! the same protos, `docs/openapi.json`).

mod carry;
pub(crate) mod grpc;
pub(crate) mod json;
pub(crate) mod routes;
mod serve;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::{Either, MapOk};
use futures_util::TryFutureExt;
use tonic::body::Body;
use tower::{Layer, Service, ServiceExt};

pub(crate) use serve::HttpApi;

use crate::metrics::grpc_layer::Protocol;

/// The HTTP status of a gRPC code, by the standard mapping (the one
/// grpc-gateway and Google's APIs use).
pub fn http_status(code: tonic::Code) -> http::StatusCode {
    use http::StatusCode as S;
    use tonic::Code as C;
    match code {
        C::Ok => S::OK,
        C::Cancelled => S::from_u16(499).unwrap_or(S::BAD_REQUEST),
        C::InvalidArgument | C::FailedPrecondition | C::OutOfRange => S::BAD_REQUEST,
        C::DeadlineExceeded => S::GATEWAY_TIMEOUT,
        C::NotFound => S::NOT_FOUND,
        C::AlreadyExists | C::Aborted => S::CONFLICT,
        C::PermissionDenied => S::FORBIDDEN,
        C::Unauthenticated => S::UNAUTHORIZED,
        C::ResourceExhausted => S::TOO_MANY_REQUESTS,
        C::Unimplemented => S::NOT_IMPLEMENTED,
        C::Unavailable => S::SERVICE_UNAVAILABLE,
        C::Unknown | C::Internal | C::DataLoss => S::INTERNAL_SERVER_ERROR,
    }
}

/// Serves HTTP/JSON and gRPC-Web in front of the gRPC layers; see the
/// module docs. gRPC calls pass through with no more than a look at their
/// content type: no allocation, no translation.
#[derive(Clone)]
pub(crate) struct HttpJsonLayer {
    api: Arc<HttpApi>,
}

impl HttpJsonLayer {
    /// A layer serving `api`.
    pub(crate) fn new(api: HttpApi) -> Self {
        Self { api: Arc::new(api) }
    }
}

impl<S> Layer<S> for HttpJsonLayer {
    type Service = HttpJson<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpJson {
            inner,
            api: Arc::clone(&self.api),
        }
    }
}

/// The service of [`HttpJsonLayer`].
#[derive(Clone)]
pub(crate) struct HttpJson<S> {
    inner: S,
    api: Arc<HttpApi>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The answer of a gRPC call as it came (`B`), or one built here.
type Answer<B> = http::Response<ApiBody<B>>;

/// A gRPC call's answer unchanged.
fn grpc_answer<B>(response: http::Response<B>) -> Answer<B> {
    response.map(|body| ApiBody::Grpc { body })
}

impl<S, B> Service<http::Request<Body>> for HttpJson<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + std::fmt::Display,
{
    type Response = Answer<B>;
    type Error = S::Error;
    #[allow(clippy::type_complexity)]
    type Future = Either<
        MapOk<S::Future, fn(http::Response<B>) -> Answer<B>>,
        BoxFuture<Result<Answer<B>, S::Error>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let protocol = Protocol::of(request.headers());
        if protocol == Protocol::Grpc {
            let answer: fn(http::Response<B>) -> Answer<B> = grpc_answer;
            return Either::Left(self.inner.call(request).map_ok(answer));
        }
        // The clone takes the place of the service made ready by
        // poll_ready, which serves this call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        request.extensions_mut().insert(protocol);
        // The answer is translated into new bytes: it carries the gRPC
        // chunks it was made from until it is written out (see [`carry`]).
        let kept = Arc::new(carry::Kept::default());
        let taken = Arc::clone(&kept);
        let inner = ready.map_response(move |r: http::Response<B>| {
            r.map(|body| Body::new(carry::Taken::new(body, taken)))
        });
        let carried = move |body| ApiBody::Other {
            body: Body::new(carry::Carried::new(body, kept)),
        };
        if protocol == Protocol::GrpcWeb {
            let web = tonic_web::GrpcWebLayer::new().layer(inner);
            return Either::Right(Box::pin(async move {
                let response = web.oneshot(request).await?;
                Ok(response.map(carried))
            }));
        }
        let api = Arc::clone(&self.api);
        Either::Right(Box::pin(async move {
            let response = api.serve(inner, request).await?;
            Ok(response.map(carried))
        }))
    }
}

pin_project_lite::pin_project! {
    /// The body of an answer: a gRPC call's own, or one built here (JSON,
    /// NDJSON, gRPC-Web, a CORS preflight's empty one).
    #[project = ApiBodyProj]
    pub(crate) enum ApiBody<B> {
        /// A gRPC call's body, unchanged.
        Grpc { #[pin] body: B },
        /// Any other.
        Other { #[pin] body: Body },
    }
}

impl<B> Default for ApiBody<B> {
    fn default() -> Self {
        ApiBody::Other {
            body: Body::default(),
        }
    }
}

impl<B> http_body::Body for ApiBody<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.project() {
            ApiBodyProj::Grpc { body } => body.poll_frame(cx).map_err(Into::into),
            ApiBodyProj::Other { body } => body.poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ApiBody::Grpc { body } => body.is_end_stream(),
            ApiBody::Other { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            ApiBody::Grpc { body } => body.size_hint(),
            ApiBody::Other { body } => body.size_hint(),
        }
    }
}
