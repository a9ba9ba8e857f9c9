//! The logging and trace-export flags, read by `main` before the rest is
//! validated (so refusals are logged in the chosen format).

/// Log format and OTLP trace export.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Logs and traces")]
pub struct TelemetryArgs {
    /// Log format.
    #[arg(long, env = "SNOWKEEP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// OTLP/gRPC collector to export traces to, e.g. `http://otel-collector:4317`;
    /// no trace export without it.
    #[arg(long, env = "SNOWKEEP_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}
