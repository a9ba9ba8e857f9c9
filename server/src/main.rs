//! snowkeep-server binary: parse → log → metrics → bind → run → exit code
//! (0 after a clean release, 64 for bad configuration, 1 for a runtime failure).

use std::process::ExitCode;

use clap::Parser;
use std::io::Write;

use snowkeep_core::DisplayChain;
use snowkeep_server::config::{Args, ServerConfig};
use snowkeep_server::{metrics, metrics_http, run, shutdown, telemetry};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

const EX_USAGE: u8 = 64;

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
    let telemetry = match runtime.block_on(async {
        telemetry::init(
            args.telemetry.log_format,
            args.telemetry.otlp_endpoint.as_deref(),
        )
    }) {
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
    if config.setup_only {
        let code = runtime.block_on(setup_only(config));
        telemetry.shutdown();
        return code;
    }
    let code = runtime.block_on(async move {
        let handle = match metrics::install_recorder() {
            Ok(h) => h,
            Err(e) => {
                error!(error = %DisplayChain(&e), "cannot install the metrics recorder");
                return ExitCode::FAILURE;
            }
        };
        match tokio::net::TcpListener::bind(metrics_listen).await {
            // Never cancelled: metrics stay up through the drain.
            Ok(l) => drop(tokio::spawn(metrics_http::serve(
                l,
                handle,
                config.limits.idle_timeout,
                CancellationToken::new(),
            ))),
            Err(e) => {
                error!(address = %metrics_listen, error = %e, "cannot serve metrics");
                return ExitCode::FAILURE;
            }
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
    });
    // Flush spans while the runtime the exporter runs on still lives.
    telemetry.shutdown();
    code
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
