//! snowkeep-http-floor: the HTTP floor of a machine. It answers every
//! request with a `GET /v1/ids?count=1` answer of the same shape and size as
//! snowkeep's (`{"ids":["<19 digits>"],"texts":[]}`, the id a counter) and
//! no work behind it, on the same HTTP stack snowkeep's port uses (hyper
//! with hyper-util's HTTP/1.1-or-HTTP/2 connection builder, mimalloc), so
//! an HTTP load tool measures what serving HTTP costs here
//! (`scripts/bench-http`, `docs/benchmarks.md`).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;

/// A no-work HTTP server for measuring the HTTP floor.
#[derive(Debug, Parser)]
#[command(name = "snowkeep-http-floor", version, about)]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:50062")]
    listen: SocketAddr,
}

/// The first id: 19 digits, as snowkeep's ids are today.
const FIRST_ID: u64 = 122_672_950_695_428_096;

fn answer(counter: &AtomicU64) -> hyper::Response<Full<Bytes>> {
    let id = FIRST_ID + counter.fetch_add(1, Ordering::Relaxed);
    let body = format!(r#"{{"ids":["{id}"],"texts":[]}}"#);
    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    let _ = writeln!(
        std::io::stderr(),
        "snowkeep-http-floor listening on {listen}"
    );
    let counter = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let counter = Arc::clone(&counter);
        tokio::spawn(async move {
            let service = service_fn(move |_request| {
                let response = answer(&counter);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "snowkeep-http-floor: cannot start the runtime: {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args.listen)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "snowkeep-http-floor: {e:#}");
            ExitCode::FAILURE
        }
    }
}
