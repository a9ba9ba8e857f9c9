//! Calling any gRPC method by name: descriptors from server reflection
//! (`grpc.reflection.v1`) or from `.proto` files compiled at run time (protox,
//! pure Rust, no protoc), requests built from JSON into dynamic messages
//! (prost-reflect), and a tonic codec that encodes and decodes them.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use anyhow::{bail, Context};
use prost::Message;
use prost_reflect::prost_types::{FileDescriptorProto, FileDescriptorSet};
use prost_reflect::{
    DescriptorPool, DynamicMessage, Kind, MessageDescriptor, MethodDescriptor, ReflectMessage,
    Value,
};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

use crate::template::CallInfo;

/// Compiles `protos` (searched in `import_paths`, plus each file's own folder)
/// into a descriptor pool.
pub fn pool_from_protos(
    protos: &[PathBuf],
    import_paths: &[PathBuf],
) -> anyhow::Result<DescriptorPool> {
    let mut includes: Vec<PathBuf> = import_paths.to_vec();
    for p in protos {
        if let Some(dir) = p.parent() {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir.to_owned()
            };
            if !includes.contains(&dir) {
                includes.push(dir);
            }
        }
    }
    let set = protox::compile(protos, &includes).context("compiling --proto files")?;
    DescriptorPool::from_file_descriptor_set(set).context("loading the compiled descriptors")
}

/// Asks the server (reflection v1) for the file defining `symbol` and every
/// file it imports.
pub async fn pool_from_reflection(
    channel: Channel,
    symbol: &str,
) -> anyhow::Result<DescriptorPool> {
    let mut client = ServerReflectionClient::new(channel);
    let mut files: HashMap<String, FileDescriptorProto> = HashMap::new();
    let mut wanted = vec![MessageRequest::FileContainingSymbol(symbol.to_owned())];
    let mut asked: HashSet<String> = HashSet::new();
    while let Some(request) = wanted.pop() {
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        };
        let mut stream = client
            .server_reflection_info(tokio_stream::once(req))
            .await
            .context(
                "server reflection (grpc.reflection.v1) is not available; pass --proto instead",
            )?
            .into_inner();
        let resp = stream
            .message()
            .await?
            .context("server reflection answered nothing")?;
        match resp.message_response {
            Some(MessageResponse::FileDescriptorResponse(f)) => {
                for bytes in f.file_descriptor_proto {
                    let file = FileDescriptorProto::decode(bytes.as_slice())
                        .context("reflection sent an undecodable file descriptor")?;
                    for dep in &file.dependency {
                        if !files.contains_key(dep) && asked.insert(dep.clone()) {
                            wanted.push(MessageRequest::FileByFilename(dep.clone()));
                        }
                    }
                    files.insert(file.name().to_owned(), file);
                }
            }
            Some(MessageResponse::ErrorResponse(e)) => {
                bail!(
                    "server reflection cannot find {symbol:?}: {}",
                    e.error_message
                )
            }
            other => bail!("unexpected server reflection answer: {other:?}"),
        }
    }
    let mut pool = DescriptorPool::new();
    // Add files after their imports.
    let mut pending: Vec<FileDescriptorProto> = files.into_values().collect();
    while !pending.is_empty() {
        let before = pending.len();
        let (ready, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|f| {
            f.dependency
                .iter()
                .all(|d| pool.get_file_by_name(d).is_some())
        });
        if !ready.is_empty() {
            pool.add_file_descriptor_set(FileDescriptorSet { file: ready })
                .context("loading reflected descriptors")?;
        }
        pending = rest;
        if pending.len() == before {
            bail!(
                "server reflection left imports unresolved: {:?}",
                pending.iter().map(|f| f.name()).collect::<Vec<_>>()
            );
        }
    }
    Ok(pool)
}

/// Splits `package.Service/Method` or `package.Service.Method` into the
/// service and method names.
pub fn split_call(call: &str) -> anyhow::Result<(&str, &str)> {
    let (service, method) = call
        .rsplit_once('/')
        .or_else(|| call.rsplit_once('.'))
        .filter(|(s, m)| !s.is_empty() && !m.is_empty())
        .with_context(|| format!("--call {call:?}: write package.Service/Method"))?;
    Ok((service, method))
}

/// Finds `call` in `pool`.
pub fn find_method(pool: &DescriptorPool, call: &str) -> anyhow::Result<MethodDescriptor> {
    let (service, method) = split_call(call)?;
    let svc = pool.get_service_by_name(service).with_context(|| {
        let known: Vec<String> = pool.services().map(|s| s.full_name().to_owned()).collect();
        format!("service {service:?} not found; known: {}", known.join(", "))
    })?;
    let found = svc.methods().find(|m| m.name() == method);
    found.with_context(|| {
        let known: Vec<String> = svc.methods().map(|m| m.name().to_owned()).collect();
        format!(
            "method {method:?} not found in {service}; known: {}",
            known.join(", ")
        )
    })
}

/// The template names of a method.
pub fn call_info(m: &MethodDescriptor) -> CallInfo {
    CallInfo {
        fully_qualified_name: m.full_name().to_owned(),
        method_name: m.name().to_owned(),
        service_name: m.parent_service().full_name().to_owned(),
        input_name: m.input().full_name().to_owned(),
        output_name: m.output().full_name().to_owned(),
    }
}

/// Builds request messages from JSON text: one message, or for a
/// client-streaming method a JSON array of messages.
pub fn messages_from_json(
    desc: &MessageDescriptor,
    json: &str,
    streaming: bool,
) -> anyhow::Result<Vec<DynamicMessage>> {
    let value: serde_json::Value =
        serde_json::from_str(json).context("request data is not JSON")?;
    let items = match value {
        serde_json::Value::Array(items) if streaming => items,
        serde_json::Value::Array(_) => bail!(
            "request data is a JSON array, but {} takes one message",
            desc.full_name()
        ),
        other => vec![other],
    };
    items
        .into_iter()
        .map(|v| {
            DynamicMessage::deserialize(desc.clone(), v)
                .with_context(|| format!("request data does not fit {}", desc.full_name()))
        })
        .collect()
}

/// The ids a response carries, for the checker: a repeated 64-bit integer
/// field named `ids` (snowkeep), or a bytes field `packed_ids` of
/// little-endian u64s (ferroid).
pub fn ids_of(msg: &DynamicMessage) -> Vec<u64> {
    let desc = msg.descriptor();
    if let Some(f) = desc.get_field_by_name("ids") {
        if f.is_list()
            && matches!(
                f.kind(),
                Kind::Uint64 | Kind::Fixed64 | Kind::Int64 | Kind::Sfixed64
            )
        {
            if let Value::List(values) = msg.get_field(&f).as_ref() {
                return values
                    .iter()
                    .filter_map(|v| v.as_u64().or_else(|| v.as_i64().map(|i| i as u64)))
                    .collect();
            }
        }
    }
    if let Some(f) = desc.get_field_by_name("packed_ids") {
        if let Value::Bytes(b) = msg.get_field(&f).as_ref() {
            return b
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect();
        }
    }
    Vec::new()
}

/// The ids a `snowkeep.v1.IdService.StreamIds` request asks for: its
/// `total` when above 0. `None` for an unbounded stream and for every other
/// method, whose responses have no known total.
pub fn stream_total(method: &MethodDescriptor, request: &DynamicMessage) -> Option<u64> {
    if method.full_name() != "snowkeep.v1.IdService.StreamIds" {
        return None;
    }
    request
        .get_field_by_name("total")
        .and_then(|v| v.as_u64())
        .filter(|&t| t > 0)
}

/// A tonic codec for dynamic messages of one method.
#[derive(Debug, Clone)]
pub struct DynamicCodec {
    response: MessageDescriptor,
}

impl DynamicCodec {
    /// Decodes responses as `response`.
    pub fn new(response: MessageDescriptor) -> Self {
        Self { response }
    }
}

/// Encodes dynamic requests.
#[derive(Debug)]
pub struct DynamicEncoder;

/// Decodes dynamic responses.
#[derive(Debug)]
pub struct DynamicDecoder(MessageDescriptor);

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicEncoder;
    type Decoder = DynamicDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        DynamicEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        DynamicDecoder(self.response.clone())
    }
}

impl Encoder for DynamicEncoder {
    type Item = DynamicMessage;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: DynamicMessage,
        dst: &mut EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        item.encode(dst)
            .map_err(|e| tonic::Status::internal(format!("encoding the request: {e}")))
    }
}

impl Decoder for DynamicDecoder {
    type Item = DynamicMessage;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, tonic::Status> {
        DynamicMessage::decode(self.0.clone(), src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("decoding the response: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snowkeep_pool() -> DescriptorPool {
        DescriptorPool::decode(snowkeep_proto::FILE_DESCRIPTOR_SET).unwrap()
    }

    #[test]
    fn finds_methods_in_both_spellings_and_names_what_is_known() {
        let pool = snowkeep_pool();
        let m = find_method(&pool, "snowkeep.v1.IdService/NextIds").unwrap();
        assert_eq!(m.full_name(), "snowkeep.v1.IdService.NextIds");
        assert!(find_method(&pool, "snowkeep.v1.IdService.StreamIds")
            .unwrap()
            .is_server_streaming());
        let err = find_method(&pool, "snowkeep.v1.IdService/Nope")
            .unwrap_err()
            .to_string();
        assert!(err.contains("known: NextIds, StreamIds"), "{err}");
        let err = find_method(&pool, "nothing").unwrap_err().to_string();
        assert!(err.contains("write package.Service/Method"), "{err}");
    }

    #[test]
    fn json_requests_become_messages_and_ids_come_back_out() {
        let pool = snowkeep_pool();
        let m = find_method(&pool, "snowkeep.v1.IdService/NextIds").unwrap();
        let msgs = messages_from_json(&m.input(), r#"{"count": 3}"#, false).unwrap();
        assert_eq!(msgs[0].encode_to_vec(), vec![0x08, 3]);
        let err = messages_from_json(&m.input(), r#"{"cnt": 3}"#, false).unwrap_err();
        assert!(
            format!("{err:#}").contains("does not fit snowkeep.v1.NextIdsRequest"),
            "{err:#}"
        );
        let mut resp = DynamicMessage::new(m.output());
        resp.set_field_by_name("ids", Value::List(vec![Value::U64(5), Value::U64(9)]));
        assert_eq!(ids_of(&resp), vec![5, 9]);
    }

    #[test]
    fn only_a_snowkeep_stream_request_has_a_total() {
        let pool = snowkeep_pool();
        let stream = find_method(&pool, "snowkeep.v1.IdService/StreamIds").unwrap();
        let total = |json: &str| {
            let msgs = messages_from_json(&stream.input(), json, false).unwrap();
            stream_total(&stream, &msgs[0])
        };
        assert_eq!(total(r#"{"total": 5000, "batch_size": 10}"#), Some(5000));
        assert_eq!(total(r#"{"total": 0}"#), None);
        assert_eq!(total("{}"), None);
        let unary = find_method(&pool, "snowkeep.v1.IdService/NextIds").unwrap();
        let msgs = messages_from_json(&unary.input(), r#"{"count": 3}"#, false).unwrap();
        assert_eq!(stream_total(&unary, &msgs[0]), None);
    }
}
