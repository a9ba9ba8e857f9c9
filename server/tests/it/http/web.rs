//! gRPC-Web on the gRPC port, and CORS: off unless `--cors-allow-origins`.

use std::process::Command;

use prost::Message;
use snowkeep_proto::v1 as pb;
use snowkeep_test_support::server::scrape;
use snowkeep_test_support::READY;

use super::curl;

/// POSTs one gRPC-Web call (`application/grpc-web+proto`) with `message`
/// to `path`; returns the headers (`curl -D`) and the body's frames as
/// (flag, bytes).
fn grpc_web(base: &str, path: &str, message: &[u8]) -> (String, Vec<(u8, Vec<u8>)>) {
    let dir = tempfile::tempdir().unwrap();
    let request = dir.path().join("request.bin");
    let framed = super::grpc_frame(message);
    std::fs::write(&request, framed).unwrap();
    let headers = dir.path().join("headers.txt");
    let body = dir.path().join("body.bin");
    let status = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-X", "POST"])
        .args([
            "-H",
            "content-type: application/grpc-web+proto",
            "-H",
            "x-grpc-web: 1",
        ])
        .arg("--data-binary")
        .arg(format!("@{}", request.display()))
        .arg("-D")
        .arg(&headers)
        .arg("-o")
        .arg(&body)
        .arg(format!("{base}{path}"))
        .status()
        .unwrap();
    assert!(status.success());
    let mut bytes = &std::fs::read(&body).unwrap()[..];
    let mut frames = Vec::new();
    while bytes.len() >= 5 {
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        frames.push((bytes[0], bytes[5..5 + len].to_vec()));
        bytes = &bytes[5 + len..];
    }
    assert!(bytes.is_empty(), "a partial frame is left: {bytes:?}");
    (std::fs::read_to_string(&headers).unwrap(), frames)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_calls_next_ids_and_is_counted_as_grpc_web() {
    let (server, _state) = super::single_instance(&[]);
    server.wait_serving(READY).await;
    let request = pb::NextIdsRequest {
        count: 3,
        ..Default::default()
    };
    let (headers, frames) = grpc_web(
        &server.url(),
        "/snowkeep.v1.IdService/NextIds",
        &request.encode_to_vec(),
    );
    assert!(headers.starts_with("HTTP/1.1 200"), "{headers}");
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("content-type: application/grpc-web+proto"),
        "{headers}"
    );
    assert_eq!(frames.len(), 2, "a message and the trailers: {frames:?}");
    assert_eq!(frames[0].0, 0);
    let ids = pb::NextIdsResponse::decode(&frames[0].1[..]).unwrap().ids;
    assert_eq!(ids.len(), 3);
    assert!(ids[0] < ids[1] && ids[1] < ids[2]);
    assert_eq!(frames[1].0, 0x80, "the trailers frame");
    assert!(
        String::from_utf8_lossy(&frames[1].1).contains("grpc-status:0"),
        "{frames:?}"
    );
    let metrics = scrape(server.metrics_port).await;
    let line = "snowkeep_grpc_requests_total{service=\"snowkeep.v1.IdService\",method=\"NextIds\",protocol=\"grpc-web\",code=\"OK\"} 1";
    assert!(
        metrics.lines().any(|l| l == line),
        "{line} not in:\n{metrics}"
    );
}

/// A browser's preflight for a gRPC-Web call from `origin`.
fn preflight(base: &str, origin: &str) -> super::Got {
    curl(&[
        "-X",
        "OPTIONS",
        "-H",
        &format!("origin: {origin}"),
        "-H",
        "access-control-request-method: POST",
        "-H",
        "access-control-request-headers: content-type,x-grpc-web",
        &format!("{base}/snowkeep.v1.IdService/NextIds"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default_and_opened_to_the_listed_origins_only() {
    let (closed, _state) = super::single_instance(&[]);
    let (open, _state2) =
        super::single_instance(&["--cors-allow-origins", "http://page.example:8080"]);
    closed.wait_serving(READY).await;
    open.wait_serving(READY).await;
    let got = preflight(&closed.url(), "http://page.example:8080");
    assert_eq!(got.header("access-control-allow-origin"), None, "{got:?}");
    let got = preflight(&open.url(), "http://page.example:8080");
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        got.header("access-control-allow-origin"),
        Some("http://page.example:8080")
    );
    let got = preflight(&open.url(), "http://evil.example");
    assert_eq!(got.header("access-control-allow-origin"), None, "{got:?}");
    // A simple GET from the listed origin carries the header too.
    let got = curl(&[
        "-H",
        "origin: http://page.example:8080",
        &format!("{}/v1/ids?count=1", open.url()),
    ]);
    assert_eq!(got.status, 200);
    assert_eq!(
        got.header("access-control-allow-origin"),
        Some("http://page.example:8080")
    );
}
