//! The weight of a call: the most memory its response can make the server
//! hold at once, read from its request before it runs, so that
//! [`super::calls`] can reserve it. Only IdService's responses grow with
//! the request (8 bytes per id); every other answer is a few KiB.

use prost::Message;
use snowkeep_proto::v1 as pb;

use super::LimitError;
use snowkeep_core::batch::{DEFAULT_STREAM_BATCH, MAX_BATCH};

/// gRPC's length-prefix of every message, bytes.
pub(super) const GRPC_HEADER: usize = 5;
/// tonic encodes response messages into chunks of at least this many bytes
/// before handing them to hyper (its `yield_threshold`).
pub(super) const ENCODE_CHUNK: usize = 32 * 1024;
/// Weight of the responses of methods other than IdService's: health,
/// info, Lease API and reflection answers are a few KiB.
pub(super) const SMALL_RESPONSE: usize = 64 * 1024;

/// `NextIds`: its weight grows with `count`.
pub(super) const NEXT_IDS: &str = "/snowkeep.v1.IdService/NextIds";
/// `StreamIds`: its weight grows with `batch_size`.
pub(super) const STREAM_IDS: &str = "/snowkeep.v1.IdService/StreamIds";

/// Weight in bytes of a call's response, from its request `frame` (one
/// length-prefixed gRPC message): what the call can make the server hold at
/// once. A request the handler will refuse weighs [`SMALL_RESPONSE`].
///
/// * `NextIds(count)`: the ids (8 bytes each) and their encoded message,
///   both alive while tonic encodes.
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
            let len = ids_message_len(n);
            if len > max_send {
                return Err(LimitError::IdsTooLarge {
                    count: n,
                    len,
                    max: max_send,
                    fit: ids_fitting(max_send),
                });
            }
            Ok(8 * n + GRPC_HEADER + len)
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
            let len = ids_message_len(n);
            if len > max_send {
                return Err(LimitError::BatchTooLarge {
                    batch: n,
                    len,
                    max: max_send,
                    fit: ids_fitting(max_send),
                });
            }
            Ok(8 * n + 2 * (ENCODE_CHUNK + GRPC_HEADER + len))
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

/// The most ids whose message fits in `max` bytes.
fn ids_fitting(max: usize) -> usize {
    let mut n = max.saturating_sub(11) / 8;
    while ids_message_len(n + 1) <= max {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::limits::status;
    use crate::limits::test_frame as frame;

    #[test]
    fn ids_message_len_matches_prost() {
        for n in [1usize, 2, 15, 16, 1000, 2047, 2048, 100_000] {
            let msg = pb::NextIdsResponse {
                ids: vec![u64::MAX; n],
            };
            assert_eq!(ids_message_len(n), msg.encoded_len(), "{n} ids");
        }
        assert_eq!(ids_message_len(100_000), 800_004);
        assert_eq!(ids_fitting(800_004), 100_000);
        assert_eq!(ids_fitting(800_003), 99_999);
        assert_eq!(ids_fitting(64 * 1024), 8_191);
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
                &frame(&pb::StreamIdsRequest { total, batch_size }),
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
        });
        let s = status(weigh(STREAM_IDS, &f, 64 * 1024).unwrap_err());
        assert_eq!(
            s.message(),
            "batch_size 10000 makes 80004-byte messages, over this server's limit of 65536 bytes (--max-send-message-size); use a batch_size of at most 8191"
        );
    }
}
