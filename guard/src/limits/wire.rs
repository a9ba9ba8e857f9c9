//! The right status for a malformed or oversized message, whatever method
//! it was sent to.
//!
//! tonic answers a request it cannot decode with INTERNAL (protobuf that does
//! not parse, a body that ends inside a message, an unknown compression
//! flag) and a message over a size limit with OUT_OF_RANGE. Both are the
//! client's doing: [`WireStatusLayer`] turns them into a [`LimitError`]
//! (INVALID_ARGUMENT or RESOURCE_EXHAUSTED), keeping tonic's detail and
//! naming the flag to change.
//! It rewrites the status of trailers-only responses (a request refused
//! before the handler ran) and of trailers (a response message too large).
//! It recognises tonic's errors by their fixed message prefixes; the
//! integration tests send each malformed input to a real server, so a tonic
//! upgrade that rewords them fails there.
//!
//! Statuses of the handlers themselves never start with these prefixes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tonic::{Code, Status};
use tower::{Layer, Service};

use super::{status, LimitError};

/// What tonic's `status` for a malformed or oversized message means, when
/// it is one: the client's fault, with a client's code.
pub fn fixed(status: &Status) -> Option<LimitError> {
    let msg = status.message();
    match status.code() {
        Code::Internal if msg.starts_with("failed to decode Protobuf message") => {
            Some(LimitError::InvalidMessage {
                detail: msg.to_owned(),
            })
        }
        Code::Internal if msg == "Unexpected EOF decoding stream." => {
            Some(LimitError::TruncatedMessage)
        }
        Code::Internal => {
            let rest = msg
                .strip_prefix("protocol error: received message with invalid compression flag: ")?;
            let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
            Some(LimitError::InvalidCompressionFlag {
                flag: digits.parse().ok()?,
            })
        }
        Code::OutOfRange if msg.starts_with("Error, decoded message length too large") => {
            let (len, max) = found_and_limit(msg)?;
            Some(LimitError::RequestTooLarge { len, max })
        }
        Code::OutOfRange if msg.starts_with("Error, encoded message length too large") => {
            let (len, max) = found_and_limit(msg)?;
            Some(LimitError::ResponseTooLarge { len, max })
        }
        _ => None,
    }
}

/// The header (or trailer) of a response's gRPC status code.
pub const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// The two numbers of tonic's "found N bytes, the limit is: M bytes".
fn found_and_limit(msg: &str) -> Option<(usize, usize)> {
    let (_, rest) = msg.split_once("found ")?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    Some((found.parse().ok()?, limit.parse().ok()?))
}

/// True when `headers` carry a `grpc-status` that [`fixed`] may rewrite:
/// INTERNAL (13) or OUT_OF_RANGE (11). Every other response, OK ones first,
/// is passed on without parsing its status (this runs on every call).
fn may_need_fixing(headers: &HeaderMap) -> bool {
    headers
        .get(&GRPC_STATUS)
        .is_some_and(|v| matches!(v.as_bytes(), b"13" | b"11"))
}

/// Rewrites the status in `headers` (response headers or trailers) when
/// [`fixed`] says what it means.
fn fix_headers(headers: &mut HeaderMap) {
    if !may_need_fixing(headers) {
        return;
    }
    let Some(error) = Status::from_header_map(headers).as_ref().and_then(fixed) else {
        return;
    };
    for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
        headers.remove(name);
    }
    // A status built from our own text always encodes.
    let _ = status(error).add_header(headers);
}

/// Applies [`fixed`] to every response (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct WireStatusLayer;

impl<S> Layer<S> for WireStatusLayer {
    type Service = WireStatus<S>;

    fn layer(&self, inner: S) -> WireStatus<S> {
        WireStatus { inner }
    }
}

/// The service of [`WireStatusLayer`].
#[derive(Debug, Clone)]
pub struct WireStatus<S> {
    inner: S,
}

impl<S, R, B> Service<http::Request<R>> for WireStatus<S>
where
    S: Service<http::Request<R>, Response = http::Response<B>>,
{
    type Response = http::Response<WireBody<B>>;
    type Error = S::Error;
    type Future = WireFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<R>) -> Self::Future {
        WireFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`WireStatus`]: fixes the response headers.
    pub struct WireFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, B, E> Future for WireFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<WireBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut response = std::task::ready!(self.project().inner.poll(cx))?;
        fix_headers(response.headers_mut());
        Poll::Ready(Ok(response.map(|inner| WireBody { inner })))
    }
}

/// A response body whose trailers get [`fixed`].
#[derive(Debug)]
pub struct WireBody<B> {
    inner: B,
}

impl<B: Body + Unpin> Body for WireBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut frame = std::task::ready!(Pin::new(&mut self.get_mut().inner).poll_frame(cx));
        if let Some(Ok(f)) = frame.as_mut() {
            if let Some(trailers) = f.trailers_mut() {
                fix_headers(trailers);
            }
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

    /// tonic's own texts, as tonic 0.14 writes them.
    #[test]
    fn tonic_decode_and_size_errors_get_client_codes() {
        let cases = [
            (
                Status::internal("failed to decode Protobuf message: invalid wire type value: 7"),
                LimitError::InvalidMessage {
                    detail: "failed to decode Protobuf message: invalid wire type value: 7".into(),
                },
                Code::InvalidArgument,
            ),
            (
                Status::internal("Unexpected EOF decoding stream."),
                LimitError::TruncatedMessage,
                Code::InvalidArgument,
            ),
            (
                Status::internal("protocol error: received message with invalid compression flag: 7 (valid flags are 0 and 1), while sending request"),
                LimitError::InvalidCompressionFlag { flag: 7 },
                Code::InvalidArgument,
            ),
            (
                Status::out_of_range("Error, decoded message length too large: found 70000 bytes, the limit is: 16384 bytes"),
                LimitError::RequestTooLarge { len: 70000, max: 16384 },
                Code::ResourceExhausted,
            ),
            (
                Status::out_of_range("Error, encoded message length too large: found 80004 bytes, the limit is: 65536 bytes"),
                LimitError::ResponseTooLarge { len: 80004, max: 65536 },
                Code::ResourceExhausted,
            ),
        ];
        for (tonic_status, error, code) in cases {
            assert_eq!(
                fixed(&tonic_status).as_ref(),
                Some(&error),
                "{tonic_status:?}"
            );
            assert_eq!(status(error).code(), code);
        }
    }

    #[test]
    fn other_statuses_are_kept() {
        for status in [
            Status::internal("corrupt fence value in etcd"),
            Status::out_of_range("anything else"),
            Status::out_of_range("Error, decoded message length too large: in a new wording"),
            Status::invalid_argument("count must be between 1 and 100000, got 0"),
            Status::internal("protocol error: received message with compressed-flag but no grpc-encoding was specified"),
        ] {
            assert!(fixed(&status).is_none(), "{status:?}");
        }
    }

    /// The fast path lets through exactly the two codes `fixed` rewrites.
    #[test]
    fn only_internal_and_out_of_range_are_parsed() {
        for (code, parsed) in [
            (Code::Ok, false),
            (Code::InvalidArgument, false),
            (Code::OutOfRange, true),
            (Code::Unavailable, false),
            (Code::Internal, true),
            (Code::Unauthenticated, false),
        ] {
            let mut headers = HeaderMap::new();
            Status::new(code, "x").add_header(&mut headers).unwrap();
            assert_eq!(may_need_fixing(&headers), parsed, "{code:?}");
        }
        assert!(!may_need_fixing(&HeaderMap::new()));
    }

    #[test]
    fn headers_are_rewritten_in_place() {
        let mut headers = HeaderMap::new();
        Status::internal("failed to decode Protobuf message: buffer underflow")
            .add_header(&mut headers)
            .unwrap();
        fix_headers(&mut headers);
        let status = Status::from_header_map(&headers).unwrap();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "the request is not a valid protobuf message for this method (failed to decode Protobuf message: buffer underflow); build requests from snowkeep's .proto files"
        );
        assert_eq!(headers.get_all("grpc-status").iter().count(), 1);
    }
}
