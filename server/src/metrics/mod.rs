//! The Prometheus side of the metric catalog: the recorder with its
//! histogram buckets, and the per-call gRPC metrics layer. The catalog
//! itself (every name, its help and its labels) is `snowkeep_core::metrics`,
//! re-exported here, so the server names metrics as `crate::metrics::X`.

pub(crate) mod grpc_layer;

use std::collections::BTreeMap;
use std::sync::Mutex;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use snowkeep_client::{Clock, Layout};
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

/// The end of each watched namespace's layout (`Layout::end_unix_ms`, ms
/// since the Unix epoch), by namespace: what [`LAYOUT_REMAINING_SECONDS`]
/// counts down to.
static LAYOUT_ENDS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Watches `layout`, the layout of `namespace`: from now on every scrape
/// (and this call) sets [`LAYOUT_REMAINING_SECONDS`] of `namespace` from
/// `clock`'s wall time ([`set_layout_remaining`]).
pub fn watch_layout(namespace: &str, layout: &Layout, clock: &dyn Clock) {
    LAYOUT_ENDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(namespace.to_owned(), layout.end_unix_ms());
    set_layout_remaining(clock);
}

/// Sets [`LAYOUT_REMAINING_SECONDS`] of every watched namespace: the
/// seconds from `clock`'s wall time to the end of its layout, 0 once past.
/// The scrape calls it just before rendering, so the value is exact to the
/// millisecond at scrape time.
pub fn set_layout_remaining(clock: &dyn Clock) {
    let now_unix_ms = clock.unix_ms();
    let ends = LAYOUT_ENDS.lock().unwrap_or_else(|p| p.into_inner());
    for (namespace, end_unix_ms) in ends.iter() {
        metrics::gauge!(LAYOUT_REMAINING_SECONDS, "namespace" => namespace.clone())
            .set(layout_remaining_seconds(*end_unix_ms, now_unix_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;
    use snowkeep_client::ManualClock;

    /// The gauge's line in a scrape of `recorder`.
    fn gauge_line(handle: &PrometheusHandle, namespace: &str) -> Option<String> {
        let prefix = format!("{LAYOUT_REMAINING_SECONDS}{{namespace=\"{namespace}\"}} ");
        handle
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
    }

    #[test]
    fn the_layout_gauge_counts_down_to_the_layouts_end_and_stops_at_zero() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // The default layout ends 2^41 ms after 2026-01-01T00:00:00Z:
        // 2095-09-07T15:47:35.552Z.
        let layout = Layout::default();
        let end = 1_767_225_600_000 + (1u64 << 41);
        assert_eq!(layout.end_unix_ms(), end);
        let clock = ManualClock::new(end - 400 * 86_400_000 - 250);
        metrics::with_local_recorder(&recorder, || {
            watch_layout("lifetime-unit", &layout, &*clock);
            assert_eq!(
                gauge_line(&handle, "lifetime-unit").as_deref(),
                Some("34560000.25")
            );
            clock.set_unix_ms(end - 1);
            set_layout_remaining(&*clock);
            assert_eq!(
                gauge_line(&handle, "lifetime-unit").as_deref(),
                Some("0.001")
            );
            for past in [end, end + 5_000] {
                clock.set_unix_ms(past);
                set_layout_remaining(&*clock);
                assert_eq!(gauge_line(&handle, "lifetime-unit").as_deref(), Some("0"));
            }
        });
    }
}
