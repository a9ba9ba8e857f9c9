//! HTTP/JSON and gRPC-Web on the gRPC port, called as outsiders call them:
//! with `curl`, and from a page in headless chromium (`browser`).

mod browser;
mod curl;
mod stalls;
mod stream;
mod web;

use std::process::Command;

use snowkeep_test_support::server::ServerProcess;

/// What one `curl` call got.
#[derive(Debug)]
pub struct Got {
    /// The HTTP status.
    pub status: u16,
    /// The headers, names in lower case, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl Got {
    /// The value of header `name` (lower case), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{e}: not JSON: {:?}", self.body))
    }
}

/// Runs `curl -sS -i args…` and splits its answer. The last header block
/// wins (curl prints one per response, e.g. after a 100 Continue).
pub fn curl(args: &[&str]) -> Got {
    let out = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// Splits `curl -i` output into status, headers and body.
pub fn parse(text: &str) -> Got {
    let mut rest = text;
    loop {
        let (head, body) = rest
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no header block in {text:?}"));
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        if status == 100 {
            rest = body;
            continue;
        }
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        return Got {
            status,
            headers,
            body: body.to_owned(),
        };
    }
}

/// The ids (JSON strings) at `value[key]`, as numbers.
pub fn ids_of(value: &serde_json::Value, key: &str) -> Vec<u64> {
    value[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {value}"))
        .iter()
        .map(|id| {
            id.as_str()
                .unwrap_or_else(|| panic!("id {id} is not a string"))
                .parse()
                .unwrap()
        })
        .collect()
}

/// `message` as one uncompressed gRPC (and gRPC-Web) frame.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(message);
    framed
}

/// A server on the single-instance store, its state in the returned
/// directory (kept alive with it), with `extra` flags.
pub fn single_instance(extra: &[&str]) -> (ServerProcess, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let mut args = vec!["--state-dir", state.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    (ServerProcess::spawn(&args), state)
}
