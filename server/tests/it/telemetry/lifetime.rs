//! A layout's lifetime: the seconds until its timestamp field runs out, in
//! `snowkeep_layout_remaining_seconds`, `GetInfo`, `snowkeepctl namespaces`
//! and the status page, against real servers.

use std::time::Duration;

use snowkeep_client::{Clock, Layout, SystemClock};
use snowkeep_test_support::server::ServerProcess;

const DAY_MS: u64 = 86_400_000;

/// A 40/12/11 layout whose timestamp field runs out `days` after now, and
/// its `--layout` text.
pub(crate) fn layout_ending_in(days: u64) -> (Layout, String) {
    let epoch = SystemClock.unix_ms() + days * DAY_MS - (1u64 << 40);
    let layout = Layout::new(40, 12, 11, epoch).unwrap();
    (layout, format!("40/12/11@{epoch}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_200_days_from_its_end_shows_them_in_the_gauge_and_get_info() {
    let (layout, flag) = layout_ending_in(200);
    let end = layout.end_unix_ms();
    assert_eq!(end, layout.epoch_unix_ms() + (1u64 << 40));
    let state = tempfile::tempdir().unwrap();
    let server = ServerProcess::spawn(&[
        "--state-dir",
        state.path().to_str().unwrap(),
        "--layout",
        &flag,
    ]);
    server.wait_serving(Duration::from_secs(15)).await;

    // The gauge is computed at scrape time from the wall clock: exactly
    // end - now, to the ms, for a now between the reads around the scrape.
    let series = "snowkeep_layout_remaining_seconds{namespace=\"default\"}";
    let before = SystemClock.unix_ms();
    let remaining = server.metric(series).await;
    let after = SystemClock.unix_ms();
    let ms = (remaining * 1000.0).round();
    assert!((remaining * 1000.0 - ms).abs() < 1e-3, "{remaining}");
    assert!(
        ((end - after) as f64..=(end - before) as f64).contains(&ms),
        "{remaining} s left, not between {} and {}",
        (end - after) / 1000,
        (end - before) / 1000
    );
    assert!(remaining < 200.0 * 86_400.0 && remaining > 199.0 * 86_400.0);

    // GetInfo: the end exactly, and the whole seconds from its own clock.
    let info = server.info().await;
    assert_eq!(info.layout_end_unix_ms, end);
    assert_eq!(
        info.layout_remaining_seconds,
        (end - info.server_time_unix_ms) / 1000
    );
    assert!(info.layout_remaining_seconds <= 200 * 86_400);
    assert!(info.layout_remaining_seconds > 199 * 86_400);
}
