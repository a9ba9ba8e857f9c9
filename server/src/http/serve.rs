//! One HTTP/JSON call: find its route, build its RPC's request, call it
//! through the gRPC layers and answer in JSON.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use prost::Message;
use tonic::body::Body;
use tonic::Code;
use tower::{Service, ServiceExt};

use super::grpc::{self, Ended, NdjsonBody};
use super::json;
use super::routes::{Found, Route, RouteTable};
use super::{http_status, Protocol};

/// The OpenAPI document of the HTTP/JSON API, generated from the protos
/// (`scripts/gen-openapi`; a test checks it matches them).
pub(crate) const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// The largest HTTP/JSON body (or `--max-recv-message-size`, if smaller).
/// Parsed JSON takes many times its text in memory, outside the call
/// memory bound; the largest request of the API (a `Check` naming all 1,024
/// machine ids of a layout) is under 8 KiB of JSON.
pub(crate) const MAX_JSON_BODY: usize = 64 * 1024;

/// The health service whose status `GET /healthz` answers: issuance.
const READINESS_SERVICE: &str = "snowkeep.v1.IdService";

/// Headers of a request that pass on to its RPC: the API key, and what a
/// trace or a log may want.
const PASSED_ON: [&str; 3] = ["authorization", "traceparent", "x-request-id"];

/// A request's route and its path variables.
type Routed<'a> = (&'a Route, Vec<(String, String)>);

/// The HTTP/JSON API: its routes and bounds.
pub(crate) struct HttpApi {
    table: RouteTable,
    max_body: usize,
    body_timeout: std::time::Duration,
    allow: crate::allow::AllowList,
}

impl HttpApi {
    /// The API of the snowkeep.v1 protos; bodies of at most `max_body`
    /// bytes (the gRPC request message bound) and [`MAX_JSON_BODY`], each wholly arrived within
    /// `body_timeout` of its headers (`--request-timeout`, the bound of a
    /// gRPC request message). Errors only when the descriptors built into
    /// this binary hold a rule it cannot serve.
    pub(crate) fn new(max_body: usize, body_timeout: std::time::Duration) -> Result<Self, String> {
        Ok(Self {
            table: RouteTable::from_descriptors(snowkeep_proto::FILE_DESCRIPTOR_SET)?,
            max_body: max_body.min(MAX_JSON_BODY),
            body_timeout,
            allow: crate::allow::AllowList::new(Vec::new()),
        })
    }

    /// The same API refusing peers outside `allow` (`--allow-cidrs`) what
    /// it answers itself (the document, a 404, a 405, a body it refuses),
    /// as the allow-list layer refuses them every call.
    pub(crate) fn with_allow_list(self, allow: crate::allow::AllowList) -> Self {
        Self { allow, ..self }
    }

    /// 403 for a peer outside the allow-list, which also marks its
    /// connection to close soon; `None` for one inside it.
    fn refused(&self, parts: &http::request::Parts) -> Option<Response<Body>> {
        let denied = self.allow.refuse(&parts.extensions)?;
        Some(error_response(
            StatusCode::FORBIDDEN,
            denied.code(),
            denied.message(),
        ))
    }

    /// The route of a request, with its path variables; or what is
    /// answered instead: the OpenAPI document, a 404 or a 405.
    fn route(
        &self,
        parts: &http::request::Parts,
        path: &str,
    ) -> Result<Routed<'_>, Box<Response<Body>>> {
        if path == "/openapi.json" {
            return Err(Box::new(match parts.method == Method::GET {
                true => json_response(StatusCode::OK, OPENAPI.into()),
                false => method_not_allowed(&parts.method, path, &[Method::GET]),
            }));
        }
        if matches!(path, "/healthz" | "/livez") {
            // GET and HEAD were answered before.
            let allowed = [Method::GET, Method::HEAD];
            return Err(Box::new(method_not_allowed(&parts.method, path, &allowed)));
        }
        match self.table.find(&parts.method, path) {
            Found::Route(route, vars) => Ok((route, vars)),
            Found::OtherMethods(allowed) => {
                Err(Box::new(method_not_allowed(&parts.method, path, &allowed)))
            }
            Found::Nothing => {
                let text = format!(
                    "no route {} {path}: the routes are listed in GET /openapi.json",
                    parts.method
                );
                Err(Box::new(error_response(
                    StatusCode::NOT_FOUND,
                    Code::NotFound,
                    &text,
                )))
            }
        }
    }

    /// The whole body, at most `max_body` bytes, arrived within
    /// `body_timeout`; or the refusal: 408 (and `Connection: close` on
    /// HTTP/1, where the rest may still come), 413.
    async fn read_body(
        &self,
        parts: &http::request::Parts,
        body: Body,
    ) -> Result<Bytes, Response<Body>> {
        let collect = Limited::new(body, self.max_body).collect();
        match tokio::time::timeout(self.body_timeout, collect).await {
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
            Err(_) => {
                let text = format!(
                    "the body did not wholly arrive within {:?} of the headers (--request-timeout)",
                    self.body_timeout
                );
                let mut response =
                    error_response(StatusCode::REQUEST_TIMEOUT, Code::DeadlineExceeded, &text);
                if parts.version < http::Version::HTTP_2 {
                    response
                        .headers_mut()
                        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                }
                Err(response)
            }
            Ok(Err(_)) => {
                let text = format!(
                    "the body is over {} bytes (the bound of an HTTP/JSON body: 64 KiB, or --max-recv-message-size if smaller) or could not be read",
                    self.max_body
                );
                Err(error_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Code::ResourceExhausted,
                    &text,
                ))
            }
        }
    }

    /// Answers `request` by calling `inner` (the gRPC layers and routes).
    pub(crate) async fn serve<S>(
        self: Arc<Self>,
        inner: S,
        request: Request<Body>,
    ) -> Result<Response<Body>, S::Error>
    where
        S: Service<Request<Body>, Response = Response<Body>> + Send,
        S::Future: Send,
    {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_owned();
        // HEAD too, for health checkers that send it (hyper sends no body).
        if matches!(parts.method, Method::GET | Method::HEAD) {
            match path.as_str() {
                "/healthz" => return health(inner, parts, READINESS_SERVICE).await,
                "/livez" => {
                    let service = crate::service::health::LIVENESS_SERVICE;
                    return health(inner, parts, service).await;
                }
                _ => {}
            }
        }
        // What is answered here, before the layers, is refused to peers
        // the allow-list refuses, as the allow-list layer refuses them
        // every call.
        let refused = self.refused(&parts);
        let (route, vars) = match self.route(&parts, &path) {
            Ok(found) => found,
            Err(local) => return Ok(refused.unwrap_or(*local)),
        };
        if refused.is_some() {
            // Its body unread: the allow-list layer refuses the call, and
            // the metrics count it under its method.
            let call = grpc_request(parts, &route.grpc_path, Vec::new());
            let response = inner.oneshot(call).await?;
            return Ok(answer(route, response).await);
        }
        let body = match self.read_body(&parts, body).await {
            Ok(body) => body,
            Err(refusal) => return Ok(refusal),
        };
        let message = match json::request_message(route, vars, parts.uri.query(), &body) {
            Ok(message) => message,
            Err(json::BadRequest(text)) => {
                return Ok(error_response(
                    StatusCode::BAD_REQUEST,
                    Code::InvalidArgument,
                    &text,
                ))
            }
        };
        let call = grpc_request(parts, &route.grpc_path, message.encode_to_vec());
        let response = inner.oneshot(call).await?;
        Ok(answer(route, response).await)
    }
}

/// The gRPC request of an HTTP call: its RPC's path, the message framed,
/// the headers [`PASSED_ON`] and every extension of the HTTP request (the
/// peer's address and TLS details, for the allow-list and the audit trail),
/// marked [`Protocol::Http`].
fn grpc_request(parts: http::request::Parts, grpc_path: &str, message: Vec<u8>) -> Request<Body> {
    let mut call = Request::new(Body::new(Full::new(grpc::framed(&message))));
    *call.method_mut() = Method::POST;
    *call.version_mut() = http::Version::HTTP_2;
    *call.uri_mut() = http::Uri::try_from(grpc_path).unwrap_or_default();
    let headers = call.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    for name in PASSED_ON {
        if let Some(value) = parts.headers.get(name) {
            headers.insert(name, value.clone());
        }
    }
    *call.extensions_mut() = parts.extensions;
    call.extensions_mut().insert(Protocol::Http);
    call
}

/// The HTTP answer of an RPC's gRPC response.
async fn answer(route: &Route, response: Response<Body>) -> Response<Body> {
    if route.streaming {
        if let Some(ended) = grpc::status_of(response.headers()).filter(|e| e.code != Code::Ok) {
            return ended_response(&ended);
        }
        let body = NdjsonBody::new(response.into_body(), route.output.clone());
        let mut answer = Response::new(Body::new(body));
        answer.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        );
        return answer;
    }
    match grpc::unary_answer(response)
        .await
        .and_then(|bytes| grpc::decoded(&route.output, bytes))
    {
        Ok(message) => json_response(StatusCode::OK, json::message_to_json(&message).into()),
        Err(ended) => ended_response(&ended),
    }
}

/// `GET /healthz` and `GET /livez`: the gRPC health of `service`, 200
/// `{"status":"SERVING"}` or 503 with the status it has.
async fn health<S>(
    inner: S,
    parts: http::request::Parts,
    service: &str,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send,
    S::Future: Send,
{
    let request = tonic_health::pb::HealthCheckRequest {
        service: service.to_owned(),
    };
    let call = grpc_request(
        parts,
        "/grpc.health.v1.Health/Check",
        request.encode_to_vec(),
    );
    let response = inner.oneshot(call).await?;
    let status = match grpc::unary_answer(response).await {
        Ok(bytes) => tonic_health::pb::HealthCheckResponse::decode(bytes)
            .map(|r| r.status())
            .unwrap_or_default(),
        Err(ended) => return Ok(ended_response(&ended)),
    };
    let serving = status == tonic_health::pb::health_check_response::ServingStatus::Serving;
    let body = serde_json::json!({ "status": status.as_str_name() }).to_string();
    let code = if serving {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = json_response(code, body.into());
    if !serving {
        retry_after(&mut response);
    }
    Ok(response)
}

/// A JSON answer.
fn json_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::new(Full::new(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The answer of a call that ended with `ended`.
fn ended_response(ended: &Ended) -> Response<Body> {
    error_response(http_status(ended.code), ended.code, &ended.message)
}

/// An error answer: a `google.rpc.Status` as JSON; `Retry-After: 1` on
/// 429 and 503 (load shed, not ready: worth trying again soon).
fn error_response(status: StatusCode, code: Code, message: &str) -> Response<Body> {
    let mut response = json_response(status, json::status_json(code, message).into());
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        retry_after(&mut response);
    }
    if status == StatusCode::UNAUTHORIZED {
        // RFC 9110 §11.6.1: a 401 names the scheme it takes (RFC 6750).
        response.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"snowkeep\""),
        );
    }
    response
}

fn retry_after(response: &mut Response<Body>) {
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
}

/// 405 with `Allow`.
fn method_not_allowed(method: &Method, path: &str, allowed: &[Method]) -> Response<Body> {
    let list: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    let text = format!(
        "{method} is not served at {path}; it takes {}",
        list.join(", ")
    );
    let mut response = error_response(StatusCode::METHOD_NOT_ALLOWED, Code::Unimplemented, &text);
    if let Ok(value) = HeaderValue::from_str(&list.join(", ")) {
        response.headers_mut().insert(http::header::ALLOW, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_body_is_bounded_by_64_kib_whatever_the_message_bound() {
        let timeout = std::time::Duration::from_secs(5);
        assert_eq!(
            HttpApi::new(16 * 1024, timeout).unwrap().max_body,
            16 * 1024
        );
        assert_eq!(HttpApi::new(64 << 20, timeout).unwrap().max_body, 64 * 1024);
    }
}
