//! Logs and traces: `tracing` to stderr, plain or JSON
//! (`--log-format`, level from `SNOWKEEP_LOG`), and, with `--otlp-endpoint`,
//! every span exported over OTLP/gRPC too (one span per gRPC call, named
//! `package.Service/Method`, beside the structured log events).
//!
//! The exporter runs its batches on the tokio runtime
//! (opentelemetry_sdk's async-runtime batch processor): the SDK's default
//! processor exports from a plain thread, where tonic has no reactor and
//! every export fails.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{ExporterBuildError, WithExportConfig};
use opentelemetry_sdk::trace::{
    span_processor_with_async_runtime::BatchSpanProcessor, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;

/// The installed telemetry; [`Telemetry::shutdown`] flushes pending spans.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter; call it before
    /// the runtime ends.
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            let _ = p.shutdown();
        }
    }
}

/// Installs the global subscriber: logs in `format`, plus OTLP trace export
/// to `otlp_endpoint` (`http://collector:4317`) when given. Must run inside
/// the tokio runtime when an endpoint is given.
///
/// # Errors
/// The exporter could not be built (a malformed endpoint).
pub fn init(
    format: LogFormat,
    otlp_endpoint: Option<&str>,
) -> Result<Telemetry, ExporterBuildError> {
    let filter =
        || EnvFilter::try_from_env("SNOWKEEP_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let logs = match format {
        LogFormat::Plain => fmt.with_filter(filter()).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter()).boxed(),
    };
    let Some(endpoint) = otlp_endpoint else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry::default());
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()?;
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            Resource::builder()
                .with_service_name("snowkeep-server")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    // The per-call spans are DEBUG so the logs never pay for them; traces
    // take them, and the debug events inside them of the crates a call runs
    // through (the guards, the etcd store, the claim loop: targets
    // `snowkeep_guard`, `snowkeep_etcd`, `snowkeep_core`), whatever
    // SNOWKEEP_LOG says.
    let traces = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("snowkeep-server"))
        .with_filter(EnvFilter::new(
            "info,snowkeep_server=debug,snowkeep_guard=debug,snowkeep_etcd=debug,snowkeep_core=debug",
        ));
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}
