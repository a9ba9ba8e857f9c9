//! The proto3 JSON mapping of HTTP/JSON calls: a request message from the
//! path variables, the query string and the body; a response message, an
//! error (`google.rpc.Status`) and a stream line as JSON.
//!
//! Field names: a request may use the proto name (`batch_size`) or the JSON
//! name (`batchSize`), as every proto3 JSON parser accepts; responses use
//! the proto names, as the query parameters and the OpenAPI document do.
//! 64-bit integers (ids among them) are strings, as the mapping says.

use prost_reflect::{
    DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, SerializeOptions,
};
use serde_json::{Map, Value};

use super::routes::{BodyRule, Route};

/// A request that cannot become its RPC's message: HTTP 400 with this text
/// (INVALID_ARGUMENT), which names the field or parameter at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRequest(pub(crate) String);

/// The field of `message` named `name` (proto or JSON name).
fn field(message: &MessageDescriptor, name: &str) -> Option<FieldDescriptor> {
    message
        .get_field_by_name(name)
        .or_else(|| message.get_field_by_json_name(name))
}

/// The names a route's query string takes, for error messages.
fn known_parameters(route: &Route) -> String {
    let names: Vec<String> = route.input.fields().map(|f| f.name().to_owned()).collect();
    match names.is_empty() {
        true => "none".to_owned(),
        false => names.join(", "),
    }
}

/// One query parameter's value as JSON for `field`: booleans as booleans,
/// everything else as a string (the mapping reads numbers, enums and
/// 64-bit integers from strings).
fn query_value(route: &Route, field: &FieldDescriptor, raw: &str) -> Result<Value, BadRequest> {
    match field.kind() {
        Kind::Bool => match raw {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(BadRequest(format!(
                "query parameter \"{}\": expected true or false, got {raw:?}",
                field.name()
            ))),
        },
        // An enum by its number (`format=1`), as the mapping also reads it,
        // or by its name.
        Kind::Enum(_) => Ok(raw
            .parse::<i32>()
            .map_or_else(|_| Value::String(raw.to_owned()), Value::from)),
        Kind::Message(_) => Err(BadRequest(format!(
            "query parameter \"{}\" is a message: {} {} takes it in no query string",
            field.name(),
            route.verb,
            route.template.text()
        ))),
        _ => Ok(Value::String(raw.to_owned())),
    }
}

/// The query string's fields as a JSON object.
fn query_object(route: &Route, query: &str) -> Result<Map<String, Value>, BadRequest> {
    let mut object = Map::new();
    for (name, raw) in form_urlencoded::parse(query.as_bytes()) {
        let Some(field) = field(&route.input, &name) else {
            return Err(BadRequest(format!(
                "unknown query parameter {name:?}: {} {} takes {}",
                route.verb,
                route.template.text(),
                known_parameters(route)
            )));
        };
        let value = query_value(route, &field, &raw)?;
        let key = field.name().to_owned();
        if field.is_list() {
            let entry = object
                .entry(key)
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(values) = entry {
                values.push(value);
            }
        } else if object.insert(key, value).is_some() {
            return Err(BadRequest(format!(
                "query parameter \"{}\" given more than once",
                field.name()
            )));
        }
    }
    Ok(object)
}

/// The JSON body as an object (an empty body is `{}`).
fn body_object(route: &Route, body: &[u8]) -> Result<Map<String, Value>, BadRequest> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(BadRequest(format!(
            "the body of {} {} must be a JSON object (the {} message)",
            route.verb,
            route.template.text(),
            route.input.name()
        ))),
        Err(e) => Err(BadRequest(format!("the body is not valid JSON: {e}"))),
    }
}

/// The request message of `route` from the path's variables, the query
/// string and the body.
pub(crate) fn request_message(
    route: &Route,
    vars: Vec<(String, String)>,
    query: Option<&str>,
    body: &[u8],
) -> Result<DynamicMessage, BadRequest> {
    let query = query.unwrap_or_default();
    let mut object = match route.body {
        BodyRule::Whole if !query.is_empty() => {
            return Err(BadRequest(format!(
                "{} {} takes its fields in the JSON body, not in the query string",
                route.verb,
                route.template.text()
            )))
        }
        BodyRule::Whole => body_object(route, body)?,
        BodyRule::None if !body.is_empty() => {
            return Err(BadRequest(format!(
                "{} {} takes no body: give the fields as query parameters ({})",
                route.verb,
                route.template.text(),
                known_parameters(route)
            )))
        }
        BodyRule::None => query_object(route, query)?,
    };
    for (name, value) in vars {
        // The path's value wins over a body field of the same name.
        object.retain(|k, _| field(&route.input, k).is_none_or(|f| f.name() != name));
        object.insert(name, Value::String(value));
    }
    message_from_json(&route.input, Value::Object(object))
}

/// `value` as a `descriptor` message under the proto3 JSON mapping, unknown
/// fields refused; the error names the field at fault.
fn message_from_json(
    descriptor: &MessageDescriptor,
    value: Value,
) -> Result<DynamicMessage, BadRequest> {
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(value, &mut track);
    DynamicMessage::deserialize_with_options(descriptor.clone(), de, &DeserializeOptions::new())
        .map_err(|e| {
            let path = track.path().to_string();
            let first = path.split('.').next().unwrap_or_default();
            match (path.as_str(), field(descriptor, first)) {
                ("" | ".", _) => BadRequest(format!("invalid {}: {e}", descriptor.name())),
                (_, Some(f)) => {
                    BadRequest(format!("invalid field \"{path}\" ({}): {e}", type_name(&f)))
                }
                (_, None) => BadRequest(format!("invalid field \"{path}\": {e}")),
            }
        })
}

/// The proto type of `field`, as the error messages name it.
fn type_name(field: &FieldDescriptor) -> String {
    let kind = match field.kind() {
        Kind::Double => "double".to_owned(),
        Kind::Float => "float".to_owned(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => "int32".to_owned(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => "int64 (a string of digits)".to_owned(),
        Kind::Uint32 | Kind::Fixed32 => "uint32".to_owned(),
        Kind::Uint64 | Kind::Fixed64 => "uint64 (a string of digits)".to_owned(),
        Kind::Bool => "bool".to_owned(),
        Kind::String => "string".to_owned(),
        Kind::Bytes => "bytes (base64)".to_owned(),
        Kind::Message(m) => format!("{} object", m.name()),
        Kind::Enum(e) => format!("{} name", e.name()),
    };
    match (field.is_map(), field.is_list()) {
        (true, _) => format!("map of {kind}"),
        (_, true) => format!("list of {kind}"),
        _ => kind,
    }
}

/// `message` as JSON text (proto field names, 64-bit integers as strings,
/// every field present, defaults included, so a reader never needs to know
/// the defaults).
pub(crate) fn message_to_json(message: &DynamicMessage) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    let mut serializer = serde_json::Serializer::new(&mut out);
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(false);
    // Serializing a decoded message into a Vec cannot fail: every value of
    // a dynamic message has a JSON form.
    if message
        .serialize_with_options(&mut serializer, &options)
        .is_err()
    {
        out.clear();
        out.extend_from_slice(b"{}");
    }
    out
}

/// A `google.rpc.Status` as JSON: `{"code":…,"message":…,"details":[]}`.
pub(crate) fn status_json(code: tonic::Code, message: &str) -> Vec<u8> {
    let value = serde_json::json!({"code": code as i32, "message": message, "details": []});
    value.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::super::routes::RouteTable;
    use super::*;

    fn table() -> RouteTable {
        RouteTable::from_descriptors(snowkeep_proto::FILE_DESCRIPTOR_SET).unwrap()
    }

    fn route<'a>(table: &'a RouteTable, template: &str) -> &'a Route {
        table
            .routes()
            .iter()
            .find(|r| r.template.text() == template)
            .unwrap()
    }

    fn json_of(m: &DynamicMessage) -> String {
        String::from_utf8(message_to_json(m)).unwrap()
    }

    #[test]
    fn query_parameters_become_fields_by_proto_or_json_name() {
        let t = table();
        let ids = route(&t, "/v1/ids:stream");
        let m = request_message(
            ids,
            vec![],
            Some("total=5000&batchSize=100&format=ID_FORMAT_CROCKFORD_BASE32"),
            b"",
        )
        .unwrap();
        assert_eq!(
            json_of(&m),
            r#"{"total":"5000","batch_size":100,"format":"ID_FORMAT_CROCKFORD_BASE32"}"#
        );
        let m = request_message(route(&t, "/v1/ids"), vec![], None, b"").unwrap();
        assert_eq!(
            json_of(&m),
            r#"{"count":0,"client_time_unix_ms":"0","format":"ID_FORMAT_UNSPECIFIED"}"#
        );
        // An enum by its number, as the proto3 JSON mapping reads it too.
        let m = request_message(ids, vec![], Some("total=1&format=1"), b"").unwrap();
        assert_eq!(
            json_of(&m),
            r#"{"total":"1","batch_size":0,"format":"ID_FORMAT_CROCKFORD_BASE32"}"#
        );
    }

    #[test]
    fn path_variables_become_fields() {
        let t = table();
        let r = route(&t, "/v1/namespaces/{namespace}/capacity");
        let m = request_message(r, vec![("namespace".into(), "orders".into())], None, b"").unwrap();
        assert_eq!(json_of(&m), r#"{"namespace":"orders"}"#);
    }

    #[test]
    fn bad_input_is_a_bad_request_naming_the_field() {
        let t = table();
        let ids = route(&t, "/v1/ids");
        let err = |r: &Route, q: Option<&str>, body: &[u8]| {
            request_message(r, vec![], q, body).unwrap_err().0
        };
        assert_eq!(
            err(ids, Some("count=abc"), b""),
            "invalid field \"count\" (uint32): invalid digit found in string"
        );
        assert_eq!(
            err(ids, Some("cnt=3"), b""),
            "unknown query parameter \"cnt\": GET /v1/ids takes count, client_time_unix_ms, format"
        );
        assert_eq!(
            err(ids, Some("count=1&count=2"), b""),
            "query parameter \"count\" given more than once"
        );
        assert_eq!(
            err(ids, Some("count=1"), b"{}"),
            "GET /v1/ids takes no body: give the fields as query parameters (count, client_time_unix_ms, format)"
        );
        let acquire = route(&t, "/v1/leases:acquire");
        assert_eq!(
            err(acquire, None, b"[1]"),
            "the body of POST /v1/leases:acquire must be a JSON object (the AcquireRequest message)"
        );
        assert!(err(acquire, None, b"{\"count\":").starts_with("the body is not valid JSON: "));
        assert_eq!(
            err(acquire, None, br#"{"namespace": 5}"#),
            "invalid field \"namespace\" (string): invalid type: integer `5`, expected a string"
        );
        assert_eq!(
            err(acquire, None, br#"{"nope": 1}"#),
            "invalid AcquireRequest: unrecognized field name 'nope'"
        );
        assert_eq!(
            err(acquire, Some("count=1"), b"{}"),
            "POST /v1/leases:acquire takes its fields in the JSON body, not in the query string"
        );
    }

    #[test]
    fn errors_are_google_rpc_status_json() {
        assert_eq!(
            String::from_utf8(status_json(tonic::Code::InvalidArgument, "count \"x\"")).unwrap(),
            r#"{"code":3,"details":[],"message":"count \"x\""}"#
        );
    }
}
