//! Calls `IdService` on one or more snowkeep servers with retries, and draws
//! ids from a prefetching pool.
//!
//! ```sh
//! cargo run -p snowkeep-client --example remote -- http://127.0.0.1:50051 http://127.0.0.1:50052
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

use snowkeep_client::{IdPool, PoolConfig, RemoteClient, RemoteConfig};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut endpoints: Vec<String> = std::env::args().skip(1).collect();
    if endpoints.is_empty() {
        endpoints.push("http://127.0.0.1:50051".into());
    }
    let client = RemoteClient::new(&endpoints, RemoteConfig::default())?;
    println!("next_ids {:?}", client.next_ids(5).await?);
    let mut stream = client.stream_ids(10_000, 1_000).await?;
    let mut streamed = 0;
    while let Some(batch) = stream.message().await? {
        streamed += batch.ids.len();
    }
    println!("streamed {streamed} ids");
    let pool = IdPool::new(client, PoolConfig::default());
    let t0 = tokio::time::Instant::now();
    for _ in 0..100_000 {
        pool.next_id().await?;
    }
    println!("100000 ids from the pool in {:?}", t0.elapsed());
    Ok(())
}
