//! The bridge from an HTTP/JSON call to its RPC: the request message framed
//! as a gRPC call through the same layers as every gRPC call (metrics,
//! allow-list, API keys, call limits), and the gRPC response read back.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::{Body as _, Frame};
use prost_reflect::{DynamicMessage, MessageDescriptor};
use tonic::body::Body;
use tonic::Code;

use super::json;

/// The gRPC message header: a compression flag and a 4-byte length.
const HEADER: usize = 5;

/// `message` as a gRPC request body (one uncompressed message).
pub(crate) fn framed(message: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER + message.len());
    buf.put_u8(0);
    buf.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    buf.put_slice(message);
    buf.freeze()
}

/// The next whole message in `buf`, taken out of it.
fn next_message(buf: &mut BytesMut) -> Option<Bytes> {
    if buf.len() < HEADER {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < HEADER + len {
        return None;
    }
    buf.advance(HEADER);
    Some(buf.split_to(len).freeze())
}

/// A call's final status: its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ended {
    /// The gRPC code.
    pub(crate) code: Code,
    /// `grpc-message`, percent-decoded.
    pub(crate) message: String,
}

/// The status in `headers` (trailers, or the headers of a trailers-only
/// answer), if any.
pub(crate) fn status_of(headers: &http::HeaderMap) -> Option<Ended> {
    let status = tonic::Status::from_header_map(headers)?;
    Some(Ended {
        code: status.code(),
        message: status.message().to_owned(),
    })
}

/// What a unary call answered: its one message (encoded), or its status.
pub(crate) async fn unary_answer(response: http::Response<Body>) -> Result<Bytes, Ended> {
    if let Some(ended) = status_of(response.headers()).filter(|e| e.code != Code::Ok) {
        return Err(ended);
    }
    let mut body = response.into_body();
    let mut buf = BytesMut::new();
    let mut status = None;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| Ended {
            code: Code::Internal,
            message: format!("the call's body failed: {e}"),
        })?;
        match frame.into_data() {
            Ok(data) => buf.extend_from_slice(&data),
            Err(frame) => status = frame.trailers_ref().and_then(status_of),
        }
    }
    match status {
        Some(ended) if ended.code != Code::Ok => return Err(ended),
        Some(_) => {}
        None => {
            return Err(Ended {
                code: Code::Internal,
                message: "the call ended without a status".to_owned(),
            })
        }
    }
    next_message(&mut buf).ok_or_else(|| Ended {
        code: Code::Internal,
        message: "the call answered no message".to_owned(),
    })
}

/// `bytes` decoded as `output`.
pub(crate) fn decoded(output: &MessageDescriptor, bytes: Bytes) -> Result<DynamicMessage, Ended> {
    DynamicMessage::decode(output.clone(), bytes).map_err(|e| Ended {
        code: Code::Internal,
        message: format!("the call's answer did not decode: {e}"),
    })
}

/// A server stream as newline-delimited JSON, the way grpc-gateway writes
/// it: `{"result":<message>}` per streamed message, and, when the call ends
/// with an error, a last line `{"error":<google.rpc.Status>}` (whose message
/// says how many ids were sent: a stream never ends cleanly early). The
/// gRPC body is polled only when this body is, so a slow reader paces the
/// stream as HTTP/2 flow control paces a gRPC one.
pub(crate) struct NdjsonBody {
    inner: Body,
    output: MessageDescriptor,
    buf: BytesMut,
    done: bool,
}

impl NdjsonBody {
    /// The NDJSON form of the stream `inner`, whose messages are `output`.
    pub(crate) fn new(inner: Body, output: MessageDescriptor) -> Self {
        Self {
            inner,
            output,
            buf: BytesMut::new(),
            done: false,
        }
    }

    fn line(&self, message: Bytes) -> Bytes {
        let mut line = Vec::with_capacity(message.len() * 3 + 16);
        match DynamicMessage::decode(self.output.clone(), message) {
            Ok(m) => {
                line.extend_from_slice(b"{\"result\":");
                line.extend_from_slice(&json::message_to_json(&m));
                line.push(b'}');
            }
            Err(e) => {
                let text = format!("a streamed message did not decode: {e}");
                line = error_line(Code::Internal, &text).to_vec();
                line.pop();
            }
        }
        line.push(b'\n');
        Bytes::from(line)
    }
}

/// The last line of a stream that ended with an error.
pub(crate) fn error_line(code: Code, message: &str) -> Bytes {
    let mut line = b"{\"error\":".to_vec();
    line.extend_from_slice(&json::status_json(code, message));
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

impl http_body::Body for NdjsonBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        loop {
            if let Some(message) = next_message(&mut self.buf) {
                let line = self.line(message);
                return Poll::Ready(Some(Ok(Frame::data(line))));
            }
            if self.done {
                return Poll::Ready(None);
            }
            let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
            let end = match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        self.buf.extend_from_slice(&data);
                        continue;
                    }
                    Err(frame) => frame.trailers_ref().and_then(status_of),
                },
                Some(Err(e)) => Some(Ended {
                    code: Code::Internal,
                    message: format!("the stream failed: {e}"),
                }),
                None => None,
            };
            self.done = true;
            let end = end.unwrap_or(Ended {
                code: Code::Internal,
                message: "the stream ended without a status".to_owned(),
            });
            if end.code != Code::Ok {
                return Poll::Ready(Some(Ok(Frame::data(error_line(end.code, &end.message)))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_round_trips_and_waits_for_whole_messages() {
        let framed = framed(b"abc");
        assert_eq!(&framed[..], b"\0\0\0\0\x03abc");
        let mut buf = BytesMut::from(&framed[..4]);
        assert_eq!(next_message(&mut buf), None);
        buf.extend_from_slice(&framed[4..]);
        buf.extend_from_slice(&framed[..2]);
        assert_eq!(next_message(&mut buf).as_deref(), Some(&b"abc"[..]));
        assert_eq!(buf.len(), 2);
        assert_eq!(next_message(&mut buf), None);
    }

    #[test]
    fn an_error_line_is_a_status_under_error() {
        assert_eq!(
            &error_line(Code::Unavailable, "stream ended early: 4 of 10 ids sent")[..],
            &b"{\"error\":{\"code\":14,\"details\":[],\"message\":\"stream ended early: 4 of 10 ids sent\"}}\n"[..]
        );
    }
}
