//! A tower layer that counts gRPC requests by service, method and final
//! status code, times them, and tracks those in flight.
//!
//! The final code is the `grpc-status` of the response headers (a
//! trailers-only answer) or of the trailers; a call whose body is dropped
//! before its trailers (a cancelled stream) counts as `CANCELLED`. Duration
//! and in-flight end when the response body ends or is dropped, so a stream
//! counts for as long as it streams.
//!
//! Label values are bounded: only the methods of [`KNOWN`] get their own
//! `service`/`method` values; anything else is `unknown`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::Code;
use tower::{Layer, Service};

use super::{GRPC_REQUESTS_IN_FLIGHT, GRPC_REQUESTS_TOTAL, GRPC_REQUEST_DURATION_SECONDS};
use snowkeep_client::error::code_name;

/// Every method this server serves, as `(service, method)`.
const KNOWN: &[(&str, &str)] = &[
    ("snowkeep.v1.IdService", "NextIds"),
    ("snowkeep.v1.IdService", "StreamIds"),
    ("snowkeep.v1.InfoService", "GetInfo"),
    ("snowkeep.v1.InfoService", "DecodeId"),
    ("snowkeep.v1.InfoService", "GetCapacity"),
    ("snowkeep.v1.LeaseService", "Acquire"),
    ("snowkeep.v1.LeaseService", "Renew"),
    ("snowkeep.v1.LeaseService", "Release"),
    ("snowkeep.v1.LeaseService", "Capacity"),
    ("snowkeep.v1.LeaseService", "Version"),
    ("snowkeep.v1.LeaseService", "Check"),
    ("grpc.health.v1.Health", "Check"),
    ("grpc.health.v1.Health", "Watch"),
    (
        "grpc.reflection.v1.ServerReflection",
        "ServerReflectionInfo",
    ),
    (
        "grpc.reflection.v1alpha.ServerReflection",
        "ServerReflectionInfo",
    ),
];

/// The bounded labels of a request path `/service/method`.
fn labels(path: &str) -> (&'static str, &'static str) {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let (service, method) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    KNOWN
        .iter()
        .find(|(s, m)| *s == service && *m == method)
        .copied()
        .unwrap_or(("unknown", "unknown"))
}

fn grpc_status(headers: &http::HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(Code::from)
}

/// Adds [`GrpcMetrics`] around a service.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GrpcMetricsLayer;

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

/// Records `snowkeep_grpc_*` metrics for every call through it.
#[derive(Debug, Clone)]
pub(crate) struct GrpcMetrics<S> {
    inner: S,
}

/// One call being measured; records when dropped.
struct Call {
    service: &'static str,
    method: &'static str,
    #[allow(clippy::disallowed_methods)] // the metrics timer is one of the two clock exceptions
    started: std::time::Instant,
    code: Option<Code>,
}

impl Call {
    #[allow(clippy::disallowed_methods)] // the metrics latency timer
    fn start(path: &str) -> Self {
        let (service, method) = labels(path);
        metrics::gauge!(GRPC_REQUESTS_IN_FLIGHT, "service" => service, "method" => method)
            .increment(1.0);
        Self {
            service,
            method,
            started: std::time::Instant::now(),
            code: None,
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let (service, method) = (self.service, self.method);
        let code = code_name(self.code.unwrap_or(Code::Cancelled));
        metrics::gauge!(GRPC_REQUESTS_IN_FLIGHT, "service" => service, "method" => method)
            .decrement(1.0);
        metrics::counter!(GRPC_REQUESTS_TOTAL, "service" => service, "method" => method, "code" => code)
            .increment(1);
        metrics::histogram!(GRPC_REQUEST_DURATION_SECONDS, "service" => service, "method" => method)
            .record(self.started.elapsed().as_secs_f64());
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for GrpcMetrics<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<MeasuredBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let mut call = Call::start(request.uri().path());
        let response = self.inner.call(request);
        Box::pin(async move {
            // An error here ends the call without a response: the drop of
            // `call` records it as CANCELLED.
            let response = response.await?;
            call.code = grpc_status(response.headers());
            Ok(response.map(|body| MeasuredBody {
                inner: body,
                call: Some(call),
            }))
        })
    }
}

/// A response body that finishes its call's measurement at its end.
pub(crate) struct MeasuredBody<B> {
    inner: B,
    call: Option<Call>,
}

impl<B: Body + Unpin> Body for MeasuredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(code) = f.trailers_ref().and_then(grpc_status) {
                    if let Some(call) = self.call.as_mut() {
                        call.code = Some(code);
                    }
                }
            }
            Some(Err(_)) => {
                if let Some(call) = self.call.as_mut() {
                    call.code.get_or_insert(Code::Internal);
                }
            }
            None => {}
        }
        if frame.is_none() || self.inner.is_end_stream() {
            // Recorded now rather than whenever the body is dropped.
            self.call.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_to_known_methods() {
        assert_eq!(
            labels("/snowkeep.v1.IdService/NextIds"),
            ("snowkeep.v1.IdService", "NextIds")
        );
        assert_eq!(
            labels("/snowkeep.v1.IdService/Nope"),
            ("unknown", "unknown")
        );
        assert_eq!(labels("/attacker.Svc/AnyThing"), ("unknown", "unknown"));
        assert_eq!(labels(""), ("unknown", "unknown"));
    }

    #[test]
    fn codes_have_their_canonical_names() {
        assert_eq!(code_name(Code::Ok), "OK");
        assert_eq!(code_name(Code::from(14)), "UNAVAILABLE");
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
    }
}
