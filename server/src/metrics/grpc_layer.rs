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
//! `service`/`method` values; anything else is `unknown`. `protocol` is the
//! protocol the call came in on (`grpc`, `http` for HTTP/JSON, `grpc-web`),
//! from the request's [`Protocol`] extension.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use metrics::{Counter, Gauge, Histogram};
use tonic::Code;
use tower::{Layer, Service};

use super::{GRPC_REQUESTS_IN_FLIGHT, GRPC_REQUESTS_TOTAL, GRPC_REQUEST_DURATION_SECONDS};
use snowkeep_client::error::code_name;

/// The protocol a call came in on, as a request extension: the metrics
/// label `protocol`. A call without one is plain gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// gRPC over HTTP/2.
    Grpc,
    /// HTTP/JSON, transcoded to its RPC.
    Http,
    /// gRPC-Web (browsers).
    GrpcWeb,
}

impl Protocol {
    /// Every protocol, in label order.
    pub const ALL: [Protocol; 3] = [Protocol::Grpc, Protocol::Http, Protocol::GrpcWeb];

    /// The `protocol` label value.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
            Protocol::GrpcWeb => "grpc-web",
        }
    }

    /// The protocol of a request by its `content-type` (a media type is
    /// case-insensitive, RFC 9110 §8.3.1).
    pub(crate) fn of(headers: &http::HeaderMap) -> Self {
        let Some(ct) = headers.get(http::header::CONTENT_TYPE) else {
            return Protocol::Http;
        };
        let ct = ct.as_bytes();
        let starts = |prefix: &[u8]| {
            ct.get(..prefix.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
        };
        if starts(b"application/grpc-web") {
            Protocol::GrpcWeb
        } else if starts(b"application/grpc") {
            Protocol::Grpc
        } else {
            Protocol::Http
        }
    }
}

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
#[cfg(test)]
fn labels(path: &str) -> (&'static str, &'static str) {
    match method_index(path) {
        Some(i) => KNOWN[i],
        None => ("unknown", "unknown"),
    }
}

/// The position of `/service/method` in [`KNOWN`], or `None` for anything
/// else (which is labelled `unknown`). The paths are matched whole, on the
/// connection's task for every call: no splitting.
fn method_index(path: &str) -> Option<usize> {
    let rest = path.strip_prefix('/')?;
    KNOWN.iter().position(|(s, m)| {
        rest.len() == s.len() + 1 + m.len()
            && rest.starts_with(s)
            && rest.as_bytes()[s.len()] == b'/'
            && rest.ends_with(m)
    })
}

/// The `grpc-status` of `headers`: one or two ASCII digits (the gRPC
/// codes are 0 to 16); anything else is no status.
fn grpc_status(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get(&GRPC_STATUS)?.as_bytes();
    let code = match *value {
        [d] if d.is_ascii_digit() => i32::from(d - b'0'),
        [a, b] if a.is_ascii_digit() && b.is_ascii_digit() => {
            i32::from(a - b'0') * 10 + i32::from(b - b'0')
        }
        _ => return None,
    };
    Some(Code::from(code))
}

/// The `grpc-status` header's name, parsed once (a `&str` name is parsed on
/// every lookup); the guard's status rewriting reads it too.
pub(crate) use snowkeep_guard::limits::wire::GRPC_STATUS;

/// The gRPC status codes, 0 to 16.
const CODES: usize = 17;

/// One method's metric handles, each registered on its first use.
///
/// Looking a series up by its labels costs an allocation and a hash lookup in
/// the recorder's registry, four times per call; a handle is an `Arc` to the
/// series. Registering on first use keeps `/metrics` exactly as it was: a
/// series appears once a call produced it.
#[derive(Default)]
struct MethodSeries {
    in_flight: OnceLock<Gauge>,
    duration: OnceLock<Histogram>,
    total: [OnceLock<Counter>; CODES],
}

/// Every method's handles, for each protocol: [`KNOWN`]'s in order, then
/// `unknown`'s, for [`Protocol::ALL`] in order.
struct Series {
    methods: Vec<MethodSeries>,
}

/// Methods per protocol: [`KNOWN`] and `unknown`.
const METHODS: usize = KNOWN.len() + 1;

impl Series {
    fn new() -> Self {
        Self {
            methods: (0..METHODS * Protocol::ALL.len())
                .map(|_| MethodSeries::default())
                .collect(),
        }
    }
}

/// The labels and handles of one method.
#[derive(Clone, Copy)]
struct Method<'a> {
    service: &'static str,
    method: &'static str,
    protocol: &'static str,
    series: &'a MethodSeries,
}

impl Method<'_> {
    fn in_flight(&self) -> &Gauge {
        let (service, method, protocol) = (self.service, self.method, self.protocol);
        self.series.in_flight.get_or_init(|| {
            metrics::gauge!(GRPC_REQUESTS_IN_FLIGHT, "service" => service, "method" => method, "protocol" => protocol)
        })
    }

    fn duration(&self) -> &Histogram {
        let (service, method, protocol) = (self.service, self.method, self.protocol);
        self.series.duration.get_or_init(|| {
            metrics::histogram!(GRPC_REQUEST_DURATION_SECONDS, "service" => service, "method" => method, "protocol" => protocol)
        })
    }

    fn total(&self, code: Code) -> &Counter {
        let (service, method, protocol) = (self.service, self.method, self.protocol);
        // `Code` is 0..=16 by construction (`Code::from` maps anything else
        // to UNKNOWN).
        let slot = (code as usize).min(CODES - 1);
        self.series.total[slot].get_or_init(|| {
            let code = code_name(code);
            metrics::counter!(GRPC_REQUESTS_TOTAL, "service" => service, "method" => method, "protocol" => protocol, "code" => code)
        })
    }
}

/// Adds [`GrpcMetrics`] around a service.
#[derive(Clone)]
pub(crate) struct GrpcMetricsLayer {
    series: Arc<Series>,
}

impl GrpcMetricsLayer {
    /// A layer whose handles bind to the metrics recorder installed when each
    /// series is first used.
    pub(crate) fn new() -> Self {
        Self {
            series: Arc::new(Series::new()),
        }
    }
}

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics {
            inner,
            series: Arc::clone(&self.series),
        }
    }
}

/// Records `snowkeep_grpc_*` metrics for every call through it.
#[derive(Clone)]
pub(crate) struct GrpcMetrics<S> {
    inner: S,
    series: Arc<Series>,
}

/// One call being measured; records when dropped.
struct Call {
    series: Arc<Series>,
    index: usize,
    #[allow(clippy::disallowed_methods)] // the metrics timer is one of the two clock exceptions
    started: std::time::Instant,
    code: Option<Code>,
}

impl Call {
    #[allow(clippy::disallowed_methods)] // the metrics latency timer
    fn start(series: Arc<Series>, path: &str, protocol: Protocol) -> Self {
        let method = method_index(path).unwrap_or(KNOWN.len());
        let index = protocol as usize * METHODS + method;
        let call = Self {
            series,
            index,
            started: std::time::Instant::now(),
            code: None,
        };
        call.method().in_flight().increment(1.0);
        call
    }

    fn method(&self) -> Method<'_> {
        let (service, method) = KNOWN
            .get(self.index % METHODS)
            .copied()
            .unwrap_or(("unknown", "unknown"));
        Method {
            service,
            method,
            protocol: Protocol::ALL[self.index / METHODS].label(),
            series: &self.series.methods[self.index],
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let method = self.method();
        method.in_flight().decrement(1.0);
        method
            .total(self.code.unwrap_or(Code::Cancelled))
            .increment(1);
        method
            .duration()
            .record(self.started.elapsed().as_secs_f64());
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for GrpcMetrics<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<MeasuredBody<ResBody>>;
    type Error = S::Error;
    type Future = MeasuredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let protocol = request
            .extensions()
            .get::<Protocol>()
            .copied()
            .unwrap_or(Protocol::Grpc);
        let call = Call::start(Arc::clone(&self.series), request.uri().path(), protocol);
        MeasuredFuture {
            inner: self.inner.call(request),
            call: Some(call),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`GrpcMetrics`]: hands the call's measurement
    /// to the response body. An error here ends the call without a
    /// response: the drop of the call records it as CANCELLED.
    pub(crate) struct MeasuredFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, B, E> Future for MeasuredFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<MeasuredBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let mut call = this.call.take();
        if let Some(call) = call.as_mut() {
            call.code = grpc_status(response.headers());
        }
        Poll::Ready(Ok(response.map(|body| MeasuredBody { inner: body, call })))
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
    fn the_protocol_is_read_from_the_content_type_in_any_case() {
        let of = |ct: Option<&'static str>| {
            let mut headers = http::HeaderMap::new();
            if let Some(ct) = ct {
                headers.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static(ct),
                );
            }
            Protocol::of(&headers)
        };
        assert_eq!(of(Some("application/grpc")), Protocol::Grpc);
        assert_eq!(of(Some("application/grpc+proto")), Protocol::Grpc);
        assert_eq!(of(Some("Application/GRPC")), Protocol::Grpc);
        assert_eq!(of(Some("application/grpc-web-text")), Protocol::GrpcWeb);
        assert_eq!(of(Some("APPLICATION/gRPC-Web+proto")), Protocol::GrpcWeb);
        assert_eq!(of(Some("application/json")), Protocol::Http);
        assert_eq!(of(Some("application/grp")), Protocol::Http);
        assert_eq!(of(None), Protocol::Http);
    }

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
    fn the_status_is_read_from_its_digits_only() {
        let status = |v: &'static str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-status", http::HeaderValue::from_static(v));
            grpc_status(&h)
        };
        assert_eq!(status("0"), Some(Code::Ok));
        assert_eq!(status("8"), Some(Code::ResourceExhausted));
        assert_eq!(status("16"), Some(Code::Unauthenticated));
        assert_eq!(status("17"), Some(Code::Unknown));
        for bad in ["", "x", "1x", "016", "-1", " 1"] {
            assert_eq!(status(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_status(&http::HeaderMap::new()), None);
    }

    #[test]
    fn codes_have_their_canonical_names() {
        assert_eq!(code_name(Code::Ok), "OK");
        assert_eq!(code_name(Code::from(14)), "UNAVAILABLE");
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
    }

    #[test]
    fn each_call_counts_once_under_its_method_and_final_code() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let layer = GrpcMetricsLayer::new();
            let next_ids = "/snowkeep.v1.IdService/NextIds";
            for code in [
                Some(Code::Ok),
                Some(Code::Ok),
                Some(Code::Unavailable),
                None,
            ] {
                let mut call = Call::start(Arc::clone(&layer.series), next_ids, Protocol::Grpc);
                call.code = code;
            }
            let mut http = Call::start(Arc::clone(&layer.series), next_ids, Protocol::Http);
            http.code = Some(Code::Ok);
            drop(http);
            let open = Call::start(
                Arc::clone(&layer.series),
                "/attacker.Svc/Any",
                Protocol::GrpcWeb,
            );
            let text = handle.render();
            drop(open);
            let after = handle.render();
            let series = |text: &str, needle: &str| {
                text.lines()
                    .find(|l| l.starts_with(needle))
                    .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
            };
            let total = |code: &str| {
                series(&text, &format!(
                    "snowkeep_grpc_requests_total{{service=\"snowkeep.v1.IdService\",method=\"NextIds\",protocol=\"grpc\",code=\"{code}\"}}"
                ))
            };
            assert_eq!(total("OK").as_deref(), Some("2"));
            assert_eq!(total("UNAVAILABLE").as_deref(), Some("1"));
            // Dropped before a status: CANCELLED.
            assert_eq!(total("CANCELLED").as_deref(), Some("1"));
            // Codes no call ended with have no series.
            assert_eq!(total("INTERNAL"), None);
            let http_ok = "snowkeep_grpc_requests_total{service=\"snowkeep.v1.IdService\",method=\"NextIds\",protocol=\"http\",code=\"OK\"}";
            assert_eq!(series(&text, http_ok).as_deref(), Some("1"));
            let unknown_in_flight =
                "snowkeep_grpc_requests_in_flight{service=\"unknown\",method=\"unknown\",protocol=\"grpc-web\"}";
            assert_eq!(series(&text, unknown_in_flight).as_deref(), Some("1"));
            assert_eq!(series(&after, unknown_in_flight).as_deref(), Some("0"));
            let next_ids_in_flight = "snowkeep_grpc_requests_in_flight{service=\"snowkeep.v1.IdService\",method=\"NextIds\",protocol=\"grpc\"}";
            assert_eq!(series(&text, next_ids_in_flight).as_deref(), Some("0"));
            let count = "snowkeep_grpc_request_duration_seconds_count{service=\"snowkeep.v1.IdService\",method=\"NextIds\",protocol=\"grpc\"}";
            assert_eq!(series(&text, count).as_deref(), Some("4"));
        });
    }
}
