use std::convert::Infallible;

use http_body::Frame;
use http_body_util::BodyExt;
use tonic::Status;

use tonic::Code;
use tower::ServiceExt;

use super::*;
use crate::limits::weight::Small;

fn request(path: &str, body: Vec<u8>) -> http::Request<tonic::body::Body> {
    http::Request::post(path)
        .body(tonic::body::Body::new(http_body_util::Full::new(
            Bytes::from(body),
        )))
        .unwrap()
}

type Answering = tower::util::BoxCloneService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    Infallible,
>;

/// An inner service answering every call with one 1000-byte chunk.
fn answering() -> Answering {
    tower::util::BoxCloneService::new(tower::service_fn(
        |_req: http::Request<tonic::body::Body>| async {
            Ok::<_, Infallible>(http::Response::new(tonic::body::Body::new(
                http_body_util::Full::new(Bytes::from(vec![7u8; 1000])),
            )))
        },
    ))
}

fn status_of(resp: &http::Response<tonic::body::Body>) -> Option<Status> {
    Status::from_header_map(resp.headers())
}

/// A shed call is answered only once its request has ended, so h2 never
/// has to reset it (after 1,024 such resets h2 closes the connection,
/// and every call on it fails).
#[tokio::test(start_paused = true)]
async fn a_shed_call_is_answered_after_its_request_ends_or_a_second() {
    let limits = CallLimits::new(
        &Limits {
            max_concurrent_calls: 1,
            ..Limits::default()
        },
        Arc::new(Small),
    );
    let svc = limits.layer().layer(answering());
    let path = "/snowkeep.v1.InfoService/GetInfo";
    let held = svc.clone().oneshot(request(path, vec![])).await.unwrap();
    assert!(status_of(&held).is_none());
    // A request whose body is still on its way when the call is shed.
    let late_body = |rx: tokio::sync::mpsc::Receiver<Bytes>| {
        let frames =
            tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |b| {
                Ok::<_, Status>(Frame::data(b))
            });
        http::Request::post(path)
            .body(tonic::body::Body::new(http_body_util::StreamBody::new(
                frames,
            )))
            .unwrap()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut shed = Box::pin(svc.clone().oneshot(late_body(rx)));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(shed.as_mut().poll(&mut cx).is_pending());
    tx.send(Bytes::from_static(&[0, 0, 0, 0, 0])).await.unwrap();
    assert!(
        shed.as_mut().poll(&mut cx).is_pending(),
        "answered before the request ended"
    );
    drop(tx);
    let started = tokio::time::Instant::now();
    let resp = shed.await.unwrap();
    assert_eq!(started.elapsed(), std::time::Duration::ZERO);
    assert_eq!(status_of(&resp).unwrap().code(), Code::ResourceExhausted);
    // A request that never ends is answered after SHED_BODY_WAIT.
    let (_tx, rx) = tokio::sync::mpsc::channel(1);
    let started = tokio::time::Instant::now();
    let resp = svc.clone().oneshot(late_body(rx)).await.unwrap();
    assert_eq!(started.elapsed(), SHED_BODY_WAIT);
    assert_eq!(status_of(&resp).unwrap().code(), Code::ResourceExhausted);
    drop(held);
}

#[tokio::test]
async fn a_full_pool_sheds_until_the_response_chunks_are_dropped() {
    let limits = CallLimits::new(
        &Limits {
            max_concurrent_calls: 2,
            ..Limits::default()
        },
        Arc::new(Small),
    );
    let svc = limits.layer().layer(answering());
    let path = "/snowkeep.v1.InfoService/GetInfo";
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let resp = svc.clone().oneshot(request(path, vec![])).await.unwrap();
        assert!(status_of(&resp).is_none());
        bodies.push(resp.into_body());
    }
    assert_eq!(limits.in_progress(), 2);
    let shed = svc.clone().oneshot(request(path, vec![])).await.unwrap();
    let status = status_of(&shed).expect("a status");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "this server already has 2 unary calls in progress, its limit (--max-concurrent-calls); retry with backoff or call another snowkeep server"
    );
    // Streams have their own pool.
    let stream = svc
        .clone()
        .oneshot(request("/grpc.health.v1.Health/Watch", vec![]))
        .await
        .unwrap();
    assert!(status_of(&stream).is_none());
    drop(stream);
    // Reading a body to its end is not enough while its chunk lives on
    // (queued in h2, say); dropping the chunk frees the slot.
    let mut body = bodies.pop().unwrap();
    let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(body.frame().await.is_none());
    drop(body);
    assert_eq!(limits.in_progress(), 2);
    assert_eq!(chunk.len(), 1000);
    drop(chunk);
    assert_eq!(limits.in_progress(), 1);
    let resp = svc.clone().oneshot(request(path, vec![])).await.unwrap();
    assert!(status_of(&resp).is_none());
}

/// An inner service answering every call with two 1000-byte chunks.
fn answering_twice() -> Answering {
    tower::util::BoxCloneService::new(tower::service_fn(
        |_req: http::Request<tonic::body::Body>| async {
            let chunks = (0..2u8).map(|i| Ok::<_, Status>(Frame::data(Bytes::from(vec![i; 1000]))));
            Ok::<_, Infallible>(http::Response::new(tonic::body::Body::new(
                http_body_util::StreamBody::new(futures_util::stream::iter(chunks)),
            )))
        },
    ))
}

/// A stream's body hands over its next chunk only once the last one has
/// been dropped (written out); a unary call's body does not wait.
#[tokio::test]
async fn a_stream_body_hands_over_a_chunk_only_after_the_last_is_written() {
    use futures_util::FutureExt;
    let limits = CallLimits::new(&Limits::default(), Arc::new(Small));
    let svc = limits.layer().layer(answering_twice());
    let stream = svc
        .clone()
        .oneshot(request("/grpc.health.v1.Health/Watch", vec![]))
        .await
        .unwrap();
    let mut body = stream.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, vec![0u8; 1000]);
    assert!(
        body.frame().now_or_never().is_none(),
        "handed over unwritten"
    );
    drop(first);
    let second = body.frame().now_or_never().expect("ready once written");
    assert_eq!(
        second.unwrap().unwrap().into_data().unwrap(),
        vec![1u8; 1000]
    );

    let unary = svc
        .oneshot(request("/snowkeep.v1.InfoService/GetInfo", vec![]))
        .await
        .unwrap();
    let mut body = unary.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let second = body
        .frame()
        .now_or_never()
        .expect("unary bodies are not paced");
    assert_eq!(
        second.unwrap().unwrap().into_data().unwrap(),
        vec![1u8; 1000]
    );
    drop(first);
}

#[tokio::test]
async fn an_oversized_request_is_refused_from_its_length_prefix() {
    let limits = CallLimits::new(&Limits::default(), Arc::new(Small));
    let svc = limits.layer().layer(answering());
    let mut body = vec![0u8, 0, 1, 0, 0]; // promises 65536 bytes
    body.extend_from_slice(&[1, 2, 3]);
    let resp = svc
        .oneshot(request("/snowkeep.v1.IdService/NextIds", body))
        .await
        .unwrap();
    let status = status_of(&resp).expect("a status");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "the request message is 65536 bytes, over this server's limit of 16384 bytes (--max-recv-message-size)"
    );
    assert_eq!(limits.in_progress(), 0);
}
