//! The HTTP/JSON routes, read at start from the `google.api.http` rules of
//! the snowkeep.v1 descriptors (the mapping grpc-gateway, Envoy's gRPC-JSON
//! transcoder and Google's API infrastructure read): one route per
//! annotated RPC, so an HTTP route and its RPC cannot drift apart.
//!
//! Templates are the subset the protos use: literal segments, single-segment
//! variables (`{namespace}`) and a custom verb on the last segment
//! (`/v1/ids:stream`).

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor, Value};

/// Where an HTTP request's fields come from besides its path variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodyRule {
    /// No body: every other field comes from the query string.
    None,
    /// `body: "*"`: the JSON body is the whole request message (no query
    /// parameters).
    Whole,
}

/// One segment of a path template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// A field of the request message, one segment long.
    Variable(String),
}

/// A parsed path template, e.g. `/v1/namespaces/{namespace}/capacity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    segments: Vec<Segment>,
    /// The custom verb after the last segment (`stream` of `/v1/ids:stream`).
    verb: Option<String>,
    /// The template as written in the proto.
    text: String,
}

impl Template {
    /// Parses `text`; `None` for anything outside the supported subset.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let path = text.strip_prefix('/')?;
        let (path, verb) = match path.rsplit_once('/') {
            Some((head, last)) => match last.split_once(':') {
                Some((seg, verb)) => (format!("{head}/{seg}"), Some(verb.to_owned())),
                None => (path.to_owned(), None),
            },
            None => match path.split_once(':') {
                Some((seg, verb)) => (seg.to_owned(), Some(verb.to_owned())),
                None => (path.to_owned(), None),
            },
        };
        let mut segments = Vec::new();
        for seg in path.split('/') {
            if seg.is_empty() || seg.contains(['*', '=', ':']) {
                return None;
            }
            segments.push(match seg.strip_prefix('{') {
                Some(rest) => Segment::Variable(rest.strip_suffix('}')?.to_owned()),
                None if seg.contains(['{', '}']) => return None,
                None => Segment::Literal(seg.to_owned()),
            });
        }
        Some(Self {
            segments,
            verb,
            text: text.to_owned(),
        })
    }

    /// The variables of `path` when it matches, by field name.
    pub(crate) fn matches(&self, path: &str) -> Option<Vec<(String, String)>> {
        let mut path = path.strip_prefix('/')?;
        if let Some(verb) = &self.verb {
            path = path.strip_suffix(verb.as_str())?.strip_suffix(':')?;
        }
        let mut parts = path.split('/');
        let mut vars = Vec::new();
        for seg in &self.segments {
            let part = parts.next()?;
            match seg {
                Segment::Literal(lit) if lit == part => {}
                Segment::Variable(name) if !part.is_empty() && !part.contains(':') => {
                    // A variable's value is percent-decoded (the HttpRule
                    // rules); one that is not UTF-8 matches nothing.
                    let value = percent_encoding::percent_decode_str(part)
                        .decode_utf8()
                        .ok()?;
                    vars.push((name.clone(), value.into_owned()));
                }
                _ => return None,
            }
        }
        parts.next().is_none().then_some(vars)
    }

    /// The template as written in the proto.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

/// One HTTP route and the RPC it calls.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// The HTTP method.
    pub(crate) verb: http::Method,
    /// The path template.
    pub(crate) template: Template,
    /// The RPC's gRPC path, `/snowkeep.v1.IdService/NextIds`.
    pub(crate) grpc_path: String,
    /// The request message.
    pub(crate) input: MessageDescriptor,
    /// The response message (of each streamed message for a stream).
    pub(crate) output: MessageDescriptor,
    /// Where the fields come from.
    pub(crate) body: BodyRule,
    /// A server-streaming RPC: answered as newline-delimited JSON.
    pub(crate) streaming: bool,
}

/// What a request's method and path find.
pub(crate) enum Found<'a> {
    /// A route, with the path's variables.
    Route(&'a Route, Vec<(String, String)>),
    /// The path exists under other methods only (HTTP 405 with `Allow`).
    OtherMethods(Vec<http::Method>),
    /// No route has this path.
    Nothing,
}

/// Every route, in the order of the descriptors.
#[derive(Debug, Clone)]
pub(crate) struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    /// Reads the routes from an encoded `FileDescriptorSet` that holds
    /// `google/api/annotations.proto`. Errors name the RPC whose rule is
    /// outside the supported subset (a build of ours that cannot serve its
    /// own protos: caught by the tests, never by a user).
    pub(crate) fn from_descriptors(bytes: &[u8]) -> Result<Self, String> {
        let pool = DescriptorPool::decode(bytes).map_err(|e| e.to_string())?;
        let http = pool
            .get_extension_by_name("google.api.http")
            .ok_or("the descriptors lack google.api.http")?;
        let mut routes = Vec::new();
        let methods: Vec<MethodDescriptor> = pool
            .services()
            .flat_map(|s| s.methods().collect::<Vec<_>>())
            .collect();
        for method in methods {
            let options = method.options();
            if !options.has_extension(&http) {
                continue;
            }
            let rule = options.get_extension(&http);
            let Value::Message(rule) = rule.as_ref() else {
                return Err(format!(
                    "{}: google.api.http is not a message",
                    method.full_name()
                ));
            };
            routes.push(route(&method, rule)?);
        }
        Ok(Self { routes })
    }

    /// Every route.
    #[cfg(test)]
    pub(crate) fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The route for `method` and `path`.
    pub(crate) fn find(&self, method: &http::Method, path: &str) -> Found<'_> {
        let mut others = Vec::new();
        for route in &self.routes {
            if let Some(vars) = route.template.matches(path) {
                if route.verb == *method {
                    return Found::Route(route, vars);
                }
                others.push(route.verb.clone());
            }
        }
        match others.is_empty() {
            true => Found::Nothing,
            false => Found::OtherMethods(others),
        }
    }
}

/// The route of `method` under its `HttpRule`.
fn route(method: &MethodDescriptor, rule: &DynamicMessage) -> Result<Route, String> {
    let name = method.full_name();
    let text = |field: &str| match rule.get_field_by_name(field).as_deref() {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    let verbs = [
        ("get", http::Method::GET),
        ("put", http::Method::PUT),
        ("post", http::Method::POST),
        ("delete", http::Method::DELETE),
        ("patch", http::Method::PATCH),
    ];
    let (verb, path) = verbs
        .into_iter()
        .find_map(|(field, verb)| Some((verb, text(field)?)))
        .ok_or_else(|| format!("{name}: no get/put/post/delete/patch pattern"))?;
    let template =
        Template::parse(&path).ok_or_else(|| format!("{name}: unsupported template {path:?}"))?;
    let body = match text("body").as_deref() {
        None => BodyRule::None,
        Some("*") => BodyRule::Whole,
        Some(other) => return Err(format!("{name}: body {other:?} (only \"*\" or none)")),
    };
    if matches!(rule.get_field_by_name("additional_bindings").as_deref(), Some(Value::List(l)) if !l.is_empty())
    {
        return Err(format!("{name}: additional_bindings are not served"));
    }
    Ok(Route {
        verb,
        template,
        grpc_path: format!("/{}/{}", method.parent_service().full_name(), method.name()),
        input: method.input(),
        output: method.output(),
        body,
        streaming: method.is_server_streaming(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RouteTable {
        RouteTable::from_descriptors(snowkeep_proto::FILE_DESCRIPTOR_SET).unwrap()
    }

    #[test]
    fn every_annotated_rpc_is_a_route() {
        let table = table();
        let got: Vec<String> = table
            .routes()
            .iter()
            .map(|r| format!("{} {} -> {}", r.verb, r.template.text(), r.grpc_path))
            .collect();
        assert_eq!(
            got,
            [
                "GET /v1/ids -> /snowkeep.v1.IdService/NextIds",
                "GET /v1/ids:stream -> /snowkeep.v1.IdService/StreamIds",
                "GET /v1/info -> /snowkeep.v1.InfoService/GetInfo",
                "GET /v1/ids:decode -> /snowkeep.v1.InfoService/DecodeId",
                "GET /v1/capacity -> /snowkeep.v1.InfoService/GetCapacity",
                "POST /v1/leases:acquire -> /snowkeep.v1.LeaseService/Acquire",
                "POST /v1/leases:renew -> /snowkeep.v1.LeaseService/Renew",
                "POST /v1/leases:release -> /snowkeep.v1.LeaseService/Release",
                "GET /v1/namespaces/{namespace}/capacity -> /snowkeep.v1.LeaseService/Capacity",
                "GET /v1/version -> /snowkeep.v1.LeaseService/Version",
                "POST /v1/leases:check -> /snowkeep.v1.LeaseService/Check",
            ]
        );
        let streaming: Vec<&str> = table
            .routes()
            .iter()
            .filter(|r| r.streaming)
            .map(|r| r.template.text())
            .collect();
        assert_eq!(streaming, ["/v1/ids:stream"]);
    }

    #[test]
    fn paths_find_their_route_and_no_other() {
        let table = table();
        let get = http::Method::GET;
        let path_of = |found: Found<'_>| match found {
            Found::Route(r, vars) => format!("{} {:?}", r.grpc_path, vars),
            Found::OtherMethods(m) => format!("405 {m:?}"),
            Found::Nothing => "404".to_owned(),
        };
        assert_eq!(
            path_of(table.find(&get, "/v1/ids")),
            "/snowkeep.v1.IdService/NextIds []"
        );
        assert_eq!(
            path_of(table.find(&get, "/v1/ids:stream")),
            "/snowkeep.v1.IdService/StreamIds []"
        );
        assert_eq!(
            path_of(table.find(&get, "/v1/namespaces/orders/capacity")),
            "/snowkeep.v1.LeaseService/Capacity [(\"namespace\", \"orders\")]"
        );
        assert_eq!(
            path_of(table.find(&get, "/v1/namespaces/my%20orders%2Fx/capacity")),
            "/snowkeep.v1.LeaseService/Capacity [(\"namespace\", \"my orders/x\")]"
        );
        assert_eq!(
            path_of(table.find(&get, "/v1/namespaces/%FF/capacity")),
            "404"
        );
        assert_eq!(
            path_of(table.find(&http::Method::POST, "/v1/ids")),
            "405 [GET]"
        );
        assert_eq!(
            path_of(table.find(&get, "/v1/leases:acquire")),
            "405 [POST]"
        );
        for missing in [
            "/v1/ids:other",
            "/v1/ids/",
            "/v1/namespaces//capacity",
            "/v1/namespaces/a/b/capacity",
            "/",
            "",
            "/v1/ids:stream:stream",
        ] {
            assert_eq!(path_of(table.find(&get, missing)), "404", "{missing}");
        }
    }

    #[test]
    fn the_routes_are_exactly_the_openapi_documents() {
        let doc: serde_json::Value = serde_json::from_str(super::super::serve::OPENAPI).unwrap();
        let mut documented: Vec<String> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, item)| {
                let verbs: Vec<String> = item.as_object().unwrap().keys().cloned().collect();
                verbs
                    .into_iter()
                    .map(move |v| format!("{} {path}", v.to_uppercase()))
            })
            .collect();
        let mut served: Vec<String> = table()
            .routes()
            .iter()
            .map(|r| format!("{} {}", r.verb, r.template.text()))
            .collect();
        documented.sort();
        served.sort();
        assert_eq!(served, documented);
    }

    #[test]
    fn templates_outside_the_subset_are_refused() {
        for bad in ["v1/ids", "/v1/{name=*}", "/v1/**", "/v1/a{b}", "/v1//x"] {
            assert_eq!(Template::parse(bad), None, "{bad}");
        }
    }
}
