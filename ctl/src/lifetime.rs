//! How long a namespace's layout has left: the time from the clock to the
//! end of its timestamp field (the server's `Layout::end_unix_ms`), in
//! years of 365 days, the year of the `SnowkeepLayoutEndingSoon` alert.
//! `snowkeepctl namespaces` and the server's status page both show it with
//! these functions, so they never disagree.

/// A year of 365 days, in ms.
pub const YEAR_MS: u64 = 365 * 86_400_000;

/// Whole tenths of a [`YEAR_MS`] year from `now_unix_ms` to `end_unix_ms`
/// (both ms since the Unix epoch), rounded down, so under a year reads
/// below 1.0; 0 once past. `None` when `end_unix_ms` is 0 (a server that
/// does not send it).
pub fn tenths_of_years_left(end_unix_ms: u64, now_unix_ms: u64) -> Option<u64> {
    (end_unix_ms != 0).then(|| end_unix_ms.saturating_sub(now_unix_ms) / (YEAR_MS / 10))
}

/// `tenths` (of [`tenths_of_years_left`]) as years with one decimal:
/// `68.8`, `0.5`; `-` for `None`.
pub fn years_text(tenths: Option<u64>) -> String {
    match tenths {
        Some(t) => format!("{}.{}", t / 10, t % 10),
        None => "-".to_owned(),
    }
}

/// `tenths` as a JSON number of years (`68.8`), or null for `None`.
pub fn years_json(tenths: Option<u64>) -> serde_json::Value {
    match tenths {
        Some(t) => serde_json::json!(t as f64 / 10.0),
        None => serde_json::Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn years_left_round_down_to_a_tenth_and_stop_at_zero() {
        // The default layout (41 bits from 2026-01-01) ends at
        // 2095-09-07T15:47:35.552Z; from 2026-12-03T00:00:00Z that is
        // 68.8 years of 365 days (68.80...).
        let end = 1_767_225_600_000 + (1u64 << 41);
        let t = tenths_of_years_left(end, 1_796_256_000_000);
        assert_eq!(years_text(t), "68.8");
        assert_eq!(years_json(t), serde_json::json!(68.8));
        // 200 days: 0.547 years, under a year.
        assert_eq!(
            years_text(tenths_of_years_left(end, end - 200 * 86_400_000)),
            "0.5"
        );
        // One ms short of a year reads 0.9, a year exactly 1.0.
        assert_eq!(
            years_text(tenths_of_years_left(end, end - YEAR_MS + 1)),
            "0.9"
        );
        assert_eq!(years_text(tenths_of_years_left(end, end - YEAR_MS)), "1.0");
        for past in [end, end + 1] {
            assert_eq!(years_text(tenths_of_years_left(end, past)), "0.0");
        }
        assert_eq!(years_text(tenths_of_years_left(0, end)), "-");
        assert_eq!(years_json(None), serde_json::Value::Null);
    }
}
