//! Test harness: real etcd processes and real snowkeep-server processes on free
//! loopback ports, with helpers that read like the behaviour under test.

pub mod etcd;
pub mod server;

use std::time::Duration;

/// Returns a TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// Polls `cond` every 20 ms until it is true or `within` passes; returns how
/// long it took, or panics naming `what`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    loop {
        if cond().await {
            return start.elapsed();
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
