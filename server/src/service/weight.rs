//! The weight of a call: the most memory its response can make the server
//! hold at once, read from its request before it runs, so that the guard's
//! call limits (`snowkeep_guard::limits::calls`) can reserve it. Only
//! IdService's responses grow with the request (8 bytes per id, and 15 more
//! per id with texts, `IdFormat`); every other
//! answer is a few KiB. [`IdWeight`] is the [`Weigh`] the server hands the
//! call limits.

use prost::Message;
use snowkeep_guard::limits::weight::{Weigh, GRPC_HEADER, SMALL_RESPONSE};
use snowkeep_guard::limits::LimitError;
use snowkeep_proto::v1 as pb;

use snowkeep_core::batch::{DEFAULT_STREAM_BATCH, MAX_BATCH};

/// tonic encodes response messages into chunks of at least this many bytes
/// before handing them to hyper (its `yield_threshold`).
const ENCODE_CHUNK: usize = 32 * 1024;

/// `NextIds`: its weight grows with `count`.
const NEXT_IDS: &str = "/snowkeep.v1.IdService/NextIds";
/// `StreamIds`: its weight grows with `batch_size`.
const STREAM_IDS: &str = "/snowkeep.v1.IdService/StreamIds";

/// Weighs IdService's calls by the ids they ask for (see [`weigh`]), every
/// other call at [`SMALL_RESPONSE`].
#[derive(Debug, Clone, Copy, Default)]
pub struct IdWeight;

impl Weigh for IdWeight {
    fn weigh(&self, path: &str, frame: &[u8], max_send: usize) -> Result<usize, LimitError> {
        weigh(path, frame, max_send)
    }
}

/// Weight in bytes of a call's response, from its request `frame` (one
/// length-prefixed gRPC message): what the call can make the server hold at
/// once. A request the handler will refuse weighs [`SMALL_RESPONSE`].
///
/// * `NextIds(count)`: the ids (8 bytes each, plus a `String` each when the
///   request asks for texts) and their encoded message, both alive while
///   tonic encodes.
/// * `StreamIds(batch_size)`: one message generated, one waiting in hyper
///   for the client's flow-control window and one in h2's send buffer; tonic
///   packs small messages into chunks of [`ENCODE_CHUNK`] bytes.
///
/// # Errors
/// [`LimitError::IdsTooLarge`] or [`LimitError::BatchTooLarge`] when one
/// response message would be larger than `max_send` bytes: refused before
/// any id is generated.
pub fn weigh(path: &str, frame: &[u8], max_send: usize) -> Result<usize, LimitError> {
    match path {
        NEXT_IDS => {
            let Some(req) = decode::<pb::NextIdsRequest>(frame) else {
                return Ok(SMALL_RESPONSE);
            };
            if req.count == 0 || req.count > MAX_BATCH {
                return Ok(SMALL_RESPONSE);
            }
            let n = req.count as usize;
            let texts = req.format != 0;
            let len = ids_message_len(n) + texts_len(n, texts);
            if len > max_send {
                return Err(LimitError::IdsTooLarge {
                    count: n,
                    len,
                    max: max_send,
                    fit: ids_fitting(max_send, texts),
                });
            }
            Ok(held_len(n, texts) + GRPC_HEADER + len)
        }
        STREAM_IDS => {
            let Some(req) = decode::<pb::StreamIdsRequest>(frame) else {
                return Ok(SMALL_RESPONSE);
            };
            let batch = match req.batch_size {
                0 => DEFAULT_STREAM_BATCH,
                b if b <= MAX_BATCH => b,
                _ => return Ok(SMALL_RESPONSE),
            };
            let n = match req.total {
                0 => batch as usize,
                total => total.min(u64::from(batch)) as usize,
            };
            let texts = req.format != 0;
            let len = ids_message_len(n) + texts_len(n, texts);
            if len > max_send {
                return Err(LimitError::BatchTooLarge {
                    batch: n,
                    len,
                    max: max_send,
                    fit: ids_fitting(max_send, texts),
                });
            }
            Ok(held_len(n, texts) + 2 * (ENCODE_CHUNK + GRPC_HEADER + len))
        }
        _ => Ok(SMALL_RESPONSE),
    }
}

/// The message of one uncompressed gRPC `frame`, when the frame is exactly that.
fn decode<M: Message + Default>(frame: &[u8]) -> Option<M> {
    let (&[0, a, b, c, d], body) = (frame.get(..GRPC_HEADER)?, frame.get(GRPC_HEADER..)?) else {
        return None;
    };
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    (body.len() == len).then(|| M::decode(body).ok())?
}

/// Bytes of a protobuf message holding `n` ids as its packed `fixed64`
/// field 1 (`NextIdsResponse`, `IdBatch`), gRPC prefix excluded.
pub fn ids_message_len(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let payload = 8 * n as u64;
    let varint = (64 - (payload | 1).leading_zeros() as usize).div_ceil(7);
    1 + varint + 8 * n
}

/// The widest text of an id (`snowkeep.v1.IdFormat`): a 63-bit layout's.
const TEXT_WIDTH: usize = snowkeep_client::text_id::width(63);

/// Bytes the `texts` field (field 2) adds to a message of `n` ids when the
/// request asked for texts: per id a tag, a length and the text.
pub fn texts_len(n: usize, texts: bool) -> usize {
    if texts {
        n * (2 + TEXT_WIDTH)
    } else {
        0
    }
}

/// Bytes the server holds for `n` ids before encoding them: the numbers and,
/// with texts, each `String` and its heap bytes.
fn held_len(n: usize, texts: bool) -> usize {
    let text = if texts {
        std::mem::size_of::<String>() + TEXT_WIDTH.next_multiple_of(8)
    } else {
        0
    };
    n * (8 + text)
}

/// The most ids whose message (with their texts when `texts`) fits in `max`
/// bytes.
fn ids_fitting(max: usize, texts: bool) -> usize {
    let per_id = 8 + if texts { 2 + TEXT_WIDTH } else { 0 };
    let mut n = max.saturating_sub(11) / per_id;
    while ids_message_len(n + 1) + texts_len(n + 1, texts) <= max {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use std::sync::Arc;

    use bytes::Bytes;
    use snowkeep_guard::limits::calls::{CallKind, CallLimits, STREAMING_METHODS};
    use snowkeep_guard::limits::Limits;
    use tonic::Status;
    use tower::{Layer, ServiceExt};

    use super::*;

    /// The status a client gets for `error`, as the guard's layers give it.
    fn status(error: LimitError) -> Status {
        error.into()
    }

    /// `msg` as one uncompressed gRPC message: flag, 4-byte big-endian
    /// length, body.
    fn frame(msg: &impl prost::Message) -> Vec<u8> {
        let body = msg.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn request(path: &str, body: Vec<u8>) -> http::Request<tonic::body::Body> {
        http::Request::post(path)
            .body(tonic::body::Body::new(http_body_util::Full::new(
                Bytes::from(body),
            )))
            .unwrap()
    }

    /// An inner service answering every call with one 1000-byte chunk.
    fn answering() -> tower::util::BoxCloneService<
        http::Request<tonic::body::Body>,
        http::Response<tonic::body::Body>,
        std::convert::Infallible,
    > {
        tower::util::BoxCloneService::new(tower::service_fn(
            |_req: http::Request<tonic::body::Body>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::new(
                    http_body_util::Full::new(Bytes::from(vec![7u8; 1000])),
                )))
            },
        ))
    }

    fn status_of(resp: &http::Response<tonic::body::Body>) -> Option<Status> {
        Status::from_header_map(resp.headers())
    }

    #[test]
    fn ids_message_len_matches_prost() {
        for n in [1usize, 2, 15, 16, 1000, 2047, 2048, 100_000] {
            let msg = pb::NextIdsResponse {
                ids: vec![u64::MAX; n],
                ..Default::default()
            };
            assert_eq!(ids_message_len(n), msg.encoded_len(), "{n} ids");
        }
        assert_eq!(ids_message_len(100_000), 800_004);
        assert_eq!(ids_fitting(800_004, false), 100_000);
        assert_eq!(ids_fitting(800_003, false), 99_999);
        assert_eq!(ids_fitting(64 * 1024, false), 8_191);
    }

    #[test]
    fn texts_len_matches_prost_for_63_bit_texts() {
        for n in [1usize, 2, 1000, 100_000] {
            let ids = vec![(1u64 << 63) - 1; n];
            let msg = pb::NextIdsResponse {
                texts: ids
                    .iter()
                    .map(|&id| snowkeep_client::text_id::encode(id, 63))
                    .collect(),
                ids,
            };
            let len = ids_message_len(n) + texts_len(n, true);
            assert_eq!(len, msg.encoded_len(), "{n} ids");
        }
        assert_eq!(texts_len(3, false), 0);
        // 23 bytes per id: 8 for the number, 15 for its text.
        assert_eq!(ids_fitting(64 * 1024, true), 2_849);
        let fit = ids_fitting(64 * 1024, true);
        assert!(ids_message_len(fit) + texts_len(fit, true) <= 64 * 1024);
        assert!(ids_message_len(fit + 1) + texts_len(fit + 1, true) > 64 * 1024);
    }

    #[test]
    fn weights_follow_the_request() {
        let max = 1 << 20;
        let next = |count| {
            weigh(
                NEXT_IDS,
                &frame(&pb::NextIdsRequest {
                    count,
                    ..Default::default()
                }),
                max,
            )
        };
        assert_eq!(next(1).unwrap(), 8 + 5 + 10);
        assert_eq!(next(100_000).unwrap(), 800_000 + 5 + 800_004);
        // Refused by the handler: nothing to weigh.
        assert_eq!(next(0).unwrap(), SMALL_RESPONSE);
        assert_eq!(next(100_001).unwrap(), SMALL_RESPONSE);
        let stream = |total, batch_size| {
            weigh(
                STREAM_IDS,
                &frame(&pb::StreamIdsRequest {
                    total,
                    batch_size,
                    ..Default::default()
                }),
                max,
            )
        };
        // batch_size 0 means 1000.
        assert_eq!(stream(0, 0).unwrap(), 8000 + 2 * (ENCODE_CHUNK + 5 + 8003));
        assert_eq!(stream(10, 1000).unwrap(), 80 + 2 * (ENCODE_CHUNK + 5 + 82));
        assert_eq!(
            weigh(NEXT_IDS, b"\0\0\0\0\x02\xff\xff", max).unwrap(),
            SMALL_RESPONSE
        );
        assert_eq!(
            weigh("/snowkeep.v1.InfoService/GetInfo", b"", max).unwrap(),
            SMALL_RESPONSE
        );
    }

    #[test]
    fn a_response_over_the_send_limit_is_refused_before_generating() {
        let f = frame(&pb::NextIdsRequest {
            count: 10_000,
            ..Default::default()
        });
        let s = status(weigh(NEXT_IDS, &f, 64 * 1024).unwrap_err());
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            s.message(),
            "10000 ids make a 80004-byte response message, over this server's limit of 65536 bytes (--max-send-message-size); ask for at most 8191 ids per call"
        );
        let f = frame(&pb::StreamIdsRequest {
            total: 0,
            batch_size: 10_000,
            ..Default::default()
        });
        let s = status(weigh(STREAM_IDS, &f, 64 * 1024).unwrap_err());
        assert_eq!(
            s.message(),
            "batch_size 10000 makes 80004-byte messages, over this server's limit of 65536 bytes (--max-send-message-size); use a batch_size of at most 8191"
        );
        // With texts, 15 more bytes per id: 3000 ids fit without, not with.
        let texts = |count| {
            frame(&pb::NextIdsRequest {
                count,
                format: pb::IdFormat::CrockfordBase32.into(),
                ..Default::default()
            })
        };
        let numbers = frame(&pb::NextIdsRequest {
            count: 3000,
            ..Default::default()
        });
        assert!(weigh(NEXT_IDS, &numbers, 64 * 1024).is_ok());
        let s = status(weigh(NEXT_IDS, &texts(3000), 64 * 1024).unwrap_err());
        assert_eq!(
            s.message(),
            "3000 ids make a 69004-byte response message, over this server's limit of 65536 bytes (--max-send-message-size); ask for at most 2849 ids per call"
        );
        let held = weigh(NEXT_IDS, &texts(2849), 64 * 1024).unwrap();
        let plain = weigh(
            NEXT_IDS,
            &frame(&pb::NextIdsRequest {
                count: 2849,
                ..Default::default()
            }),
            64 * 1024,
        )
        .unwrap();
        assert_eq!(held - plain, 2849 * (15 + 24 + 16));
    }

    /// Every server-streaming method the server serves is in the streams
    /// pool, and no other.
    #[test]
    fn streaming_methods_are_exactly_the_server_streaming_ones() {
        let sets = [
            snowkeep_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        let mut streaming = Vec::new();
        let mut methods = 0;
        for bytes in sets {
            let set = prost_types::FileDescriptorSet::decode(bytes).unwrap();
            for file in set.file {
                for service in &file.service {
                    for m in &service.method {
                        methods += 1;
                        let path = format!("/{}.{}/{}", file.package(), service.name(), m.name());
                        let kind = CallKind::of(&path);
                        if m.server_streaming() || m.client_streaming() {
                            assert_eq!(kind, CallKind::Stream, "{path}");
                            streaming.push(path);
                        } else {
                            assert_eq!(kind, CallKind::Unary, "{path}");
                        }
                    }
                }
            }
        }
        assert!(methods >= 14, "{methods} methods");
        streaming.sort();
        let mut expected: Vec<String> = STREAMING_METHODS.iter().map(|s| (*s).to_owned()).collect();
        expected.sort();
        assert_eq!(streaming, expected);
    }

    #[tokio::test]
    async fn memory_is_reserved_by_weight_and_refused_when_full() {
        // 4 MiB: 1 MiB for unary calls; a NextIds(50000) weighs ~800 KB.
        let limits = CallLimits::new(
            &Limits {
                max_call_memory: 4 << 20,
                ..Limits::default()
            },
            Arc::new(IdWeight),
        );
        let svc = limits.layer().layer(answering());
        let big = || {
            request(
                NEXT_IDS,
                frame(&pb::NextIdsRequest {
                    count: 50_000,
                    ..Default::default()
                }),
            )
        };
        let first = svc.clone().oneshot(big()).await.unwrap();
        assert!(status_of(&first).is_none());
        let second = svc.clone().oneshot(big()).await.unwrap();
        let status = status_of(&second).expect("a status");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status
                .message()
                .starts_with("this server's memory for unary calls is in use: "),
            "{}",
            status.message()
        );
        drop(first);
        let third = svc.clone().oneshot(big()).await.unwrap();
        assert!(status_of(&third).is_none());
        // More than the whole pool can ever give: says so.
        let huge = svc
            .clone()
            .oneshot(request(
                NEXT_IDS,
                frame(&pb::NextIdsRequest {
                    count: 100_000,
                    ..Default::default()
                }),
            ))
            .await
            .unwrap();
        let status = status_of(&huge).expect("a status");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status
                .message()
                .ends_with("a share of --max-call-memory); ask for fewer ids per call"),
            "{}",
            status.message()
        );
    }
}
