//! Generates ids in this process from machine ids leased through a snowkeep
//! server's Lease API, then gives them back.
//!
//! ```sh
//! cargo run -p snowkeep-client --example embedded -- http://127.0.0.1:50051 default
//! ```
//! The server must run on etcd (`--etcd-endpoints`), and the namespace must
//! exist (created once with `snowkeep-server --create-namespace-only`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use snowkeep_client::{EmbeddedConfig, EmbeddedGenerator, SystemClock};

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
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let namespace = args.next().unwrap_or_else(|| "default".into());
    let config = EmbeddedConfig {
        // Give up after one Acquire in an example; a service would keep retrying.
        acquire_attempts: Some(1),
        ..EmbeddedConfig::new(endpoint, namespace)
    };
    let generator = EmbeddedGenerator::start(config, SystemClock::shared()).await?;
    println!("leased machine ids {:?}", generator.machine_ids());
    // Give the machine ids back whatever happens while using them: returning
    // early with `?` would leave them held until the lease ends (10 minutes
    // after Acquire).
    let used = use_ids(&generator).await;
    let released = generator.shutdown().await;
    println!("released {released} machine id(s)");
    used
}

async fn use_ids(generator: &EmbeddedGenerator) -> Result<(), Box<dyn std::error::Error>> {
    let id = generator.next_id().await?;
    let d = generator.layout().decode(id).ok_or("decode")?;
    println!(
        "next_id  {id} (timestamp {} ms, machine id {}, sequence {})",
        d.timestamp.get(),
        d.machine_id,
        d.sequence
    );
    let ids = generator.next_ids(5).await?;
    println!("next_ids {ids:?}");
    let t0 = tokio::time::Instant::now();
    let n = 1_000_000;
    generator.next_ids(n).await?;
    println!("{n} ids in {:?} (no network hop)", t0.elapsed());
    Ok(())
}
