//! `GET /v1/ids:stream` as newline-delimited JSON: whole batches, then
//! either the end (exactly `total` ids) or an error line that counts the
//! ids sent.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use snowkeep_test_support::READY;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{curl, ids_of};

fn lines(body: &str) -> Vec<Value> {
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_sends_whole_batches_and_ends_after_exactly_total_ids() {
    let (server, _state) = super::single_instance(&[]);
    server.wait_serving(READY).await;
    let got = curl(&[&format!(
        "{}/v1/ids:stream?total=5&batch_size=2",
        server.url()
    )]);
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.header("content-type"), Some("application/x-ndjson"));
    let lines = lines(&got.body);
    let sizes: Vec<usize> = lines
        .iter()
        .map(|l| ids_of(&l["result"], "ids").len())
        .collect();
    assert_eq!(sizes, [2, 2, 1], "{lines:?}");
    let all: Vec<u64> = lines
        .iter()
        .flat_map(|l| ids_of(&l["result"], "ids"))
        .collect();
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
    // A bad batch size is a 400 before anything streams.
    let got = curl(&[&format!(
        "{}/v1/ids:stream?total=5&batch_size=100001",
        server.url()
    )]);
    assert_eq!(got.status, 400, "{got:?}");
    assert_eq!(got.json()["code"], json!(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_at_shutdown_ends_with_an_error_line_counting_the_ids_sent() {
    let (mut server, _state) = super::single_instance(&[]);
    server.wait_serving(READY).await;
    let total = 1_000_000_000u64;
    let url = format!(
        "{}/v1/ids:stream?total={total}&batch_size=1000",
        server.url()
    );
    let mut curl = tokio::process::Command::new("curl")
        .args(["-sS", "-N", &url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(curl.stdout.take().unwrap()).lines();
    let mut got = Vec::new();
    // Some batches first, so the cut comes mid-stream.
    while got.len() < 3 {
        got.push(
            out.next_line()
                .await
                .unwrap()
                .expect("a line before the end"),
        );
    }
    server.signal("TERM");
    while let Some(line) = tokio::time::timeout(Duration::from_secs(30), out.next_line())
        .await
        .expect("the stream ends within the grace period")
        .unwrap()
    {
        got.push(line);
    }
    let status = curl.wait().await.unwrap();
    assert!(status.success(), "curl: {status}");
    server.wait_exit(Duration::from_secs(30)).await;
    let lines = lines(&got.join("\n"));
    let (last, batches) = lines.split_last().unwrap();
    let sent: usize = batches
        .iter()
        .map(|l| ids_of(&l["result"], "ids").len())
        .sum();
    assert!(batches
        .iter()
        .all(|l| ids_of(&l["result"], "ids").len() == 1000));
    let rest = total - sent as u64;
    assert_eq!(
        last,
        &json!({"error": {"code": 14, "details": [], "message": format!(
            "stream ended early: {sent} of {total} ids sent; this server is shutting down; ask for the remaining {rest} ids on another snowkeep server"
        )}}),
        "after {} batches",
        batches.len()
    );
}
