//! snowkeep-server binary: parse → log → metrics → bind → run → exit code
//! (0 after a clean release, 64 for bad configuration, 1 for a runtime failure).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use std::io::Write;

use snowkeep_core::DisplayChain;
use snowkeep_server::config::{Args, ServerConfig};
use snowkeep_server::{metrics, metrics_http, run, shutdown, telemetry};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

const EX_USAGE: u8 = 64;

/// mimalloc instead of glibc's malloc (as ferroid-tonic-server does): a
/// unary call makes about 60 small allocations across hyper, h2, tonic and
/// our layers, and mimalloc takes 8,000 to 10,000 fewer instructions per
/// `NextIds(count=1)` for them than glibc (`scripts/profile-unary`: 68,224 →
/// 60,387 with `--auth off`, 86,512 → 76,425 with `--auth on`;
/// `docs/benchmarks.md`). Built without transparent huge pages, so an idle
/// server stays near 14 MB resident.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            // --help and --version print to stdout and succeed; anything else
            // is bad configuration (EX_USAGE), like the checks after parsing.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "snowkeep-server: cannot start the tokio runtime: {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    // The OTLP exporter runs on the runtime, so telemetry starts inside it.
    let (log_format, otlp) = (args.telemetry.log_format, &args.telemetry.otlp_endpoint);
    let telemetry = match runtime.block_on(async { telemetry::init(log_format, otlp.as_deref()) }) {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "snowkeep-server: invalid --otlp-endpoint: {e}"
            );
            return ExitCode::from(EX_USAGE);
        }
    };
    let (listen, metrics_listen) = (args.listening.listen, args.listening.metrics_listen);
    let config = match ServerConfig::try_from(args) {
        Ok(c) => c,
        Err(e) => {
            error!(error = %DisplayChain(&e), "invalid configuration");
            return ExitCode::from(EX_USAGE);
        }
    };
    let code = match config.setup_only {
        true => runtime.block_on(setup_only(config)),
        false => runtime.block_on(serve(config, listen, metrics_listen)),
    };
    // Flush spans while the runtime the exporter runs on still lives.
    telemetry.shutdown();
    code
}

/// Serves: metrics on `metrics_listen` (up through the drain), gRPC on
/// `listen` until a signal; 0 after a clean release, 64 for bad
/// configuration, 1 otherwise.
async fn serve(config: ServerConfig, listen: SocketAddr, metrics_listen: SocketAddr) -> ExitCode {
    if let Err(code) = serve_metrics(metrics_listen, config.limits.idle_timeout).await {
        return code;
    }
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            error!(address = %listen, error = %e, "cannot bind the gRPC listener");
            return ExitCode::FAILURE;
        }
    };
    let token = CancellationToken::new();
    if let Err(e) = shutdown::cancel_on_signal(token.clone()) {
        error!(error = %e, "cannot install signal handlers");
        return ExitCode::FAILURE;
    }
    info!(grpc = %listen, metrics = %metrics_listen, "listening");
    match run(config, listener, token).await {
        Ok(()) => {
            info!("stopped cleanly");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = %DisplayChain(&e), "snowkeep-server stopped");
            if e.is_usage() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Installs the metrics recorder and serves it on `address`, never
/// cancelled: metrics stay up through the drain.
async fn serve_metrics(address: SocketAddr, idle_timeout: Duration) -> Result<(), ExitCode> {
    let handle = match metrics::install_recorder() {
        Ok(h) => h,
        Err(e) => {
            error!(error = %DisplayChain(&e), "cannot install the metrics recorder");
            return Err(ExitCode::FAILURE);
        }
    };
    match tokio::net::TcpListener::bind(address).await {
        Ok(l) => {
            let token = CancellationToken::new();
            drop(tokio::spawn(metrics_http::serve(
                l,
                handle,
                idle_timeout,
                token,
            )));
            Ok(())
        }
        Err(e) => {
            error!(address = %address, error = %e, "cannot serve metrics");
            Err(ExitCode::FAILURE)
        }
    }
}

/// `--create-namespace-only` / `--confirm-namespace-floor`: no listener, no
/// metrics; 0 when done, 64 for bad configuration, 1 otherwise.
async fn setup_only(config: ServerConfig) -> ExitCode {
    let token = CancellationToken::new();
    if let Err(e) = shutdown::cancel_on_signal(token.clone()) {
        error!(error = %e, "cannot install signal handlers");
        return ExitCode::FAILURE;
    }
    match run::setup_namespace(config, token).await {
        Ok(true) => {
            info!("namespace set up");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            error!("interrupted before etcd answered: the namespace is unchanged");
            ExitCode::FAILURE
        }
        Err(e) => {
            error!(error = %DisplayChain(&e), "namespace setup failed");
            if e.is_usage() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
