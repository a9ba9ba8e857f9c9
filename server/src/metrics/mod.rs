//! The Prometheus side of the metric catalog: the recorder with its
//! histogram buckets, and the per-call gRPC metrics layer. The catalog
//! itself (every name, its help and its labels) is `snowkeep_core::metrics`,
//! re-exported here, so the server names metrics as `crate::metrics::X`.

pub(crate) mod grpc_layer;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
pub use snowkeep_core::metrics::*;

/// Histogram buckets for every `_seconds` histogram, in seconds.
const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Buckets of [`CLOCK_SKEW_SECONDS`], in seconds: from NTP-grade to the Lease
/// API's threshold (600 s by default) and past it, so alerts can count
/// observations above half the threshold (`le="300"`) and above it (`le="600"`).
const SKEW_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

/// Installs the Prometheus recorder as the global `metrics` recorder and
/// describes the catalog; [`crate::metrics_http::serve`] serves the returned handle's scrape
/// (any path answers, `/metrics` included).
///
/// # Errors
/// A recorder is already installed, or a bucket list is empty.
pub fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .with_recommended_naming(true)
        // A full-name matcher wins over a suffix one (the exporter sorts them).
        .set_buckets_for_metric(Matcher::Full(CLOCK_SKEW_SECONDS.into()), SKEW_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .install_recorder()?;
    describe_all();
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(handle)
}
