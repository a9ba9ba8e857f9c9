//! How the status page words a fence against the clock.
//!
//! A fence behind the clock is normal: an idle holder writes nothing to etcd
//! (design.md, *Outage budget*), so its fences fall behind and the first
//! call after the idle spell raises them. A signed "ms ahead" made every
//! idle, healthy holder look broken with a negative number; the page says
//! what the fence means instead.

/// The fence of one machine id as the page shows it: `fence_ms` is the fence
/// (layout ms, 0 when there is none), `ahead_ms` how far it is ahead of the
/// clock (negative when behind), `held` whether the machine id has a holder.
pub(crate) fn fence_text(fence_ms: u64, ahead_ms: i64, held: bool) -> String {
    if fence_ms == 0 {
        return "none".to_owned();
    }
    if ahead_ms > 0 {
        let ahead = span(ahead_ms.unsigned_abs());
        return if held {
            format!("{ahead} ahead")
        } else {
            format!("{ahead} ahead: a claim waits for it")
        };
    }
    let ago = span(ahead_ms.unsigned_abs());
    if held {
        format!("passed {ago} ago: idle, raised by the next call")
    } else {
        format!("passed {ago} ago: claimable at once")
    }
}

/// `ms` as a person reads it: tenths of seconds under a minute, then
/// minutes and seconds, hours and minutes, days and hours.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{}.{} s", s, (ms % 1000) / 100),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_holders_fence_behind_the_clock_is_no_negative_number() {
        assert_eq!(
            fence_text(1_000_000, -42_300, true),
            "passed 42.3 s ago: idle, raised by the next call"
        );
        assert_eq!(
            fence_text(1_000_000, 0, true),
            "passed 0.0 s ago: idle, raised by the next call"
        );
        assert_eq!(fence_text(1_000_000, 89_960, true), "1 min 29 s ahead");
        assert_eq!(fence_text(1_000_000, 2_950, true), "2.9 s ahead");
    }

    #[test]
    fn a_free_machine_ids_fence_says_whether_a_claim_waits() {
        assert_eq!(
            fence_text(1_000_000, 12_000, false),
            "12.0 s ahead: a claim waits for it"
        );
        assert_eq!(
            fence_text(1_000_000, -7_200_000, false),
            "passed 2 h 0 min ago: claimable at once"
        );
        assert_eq!(fence_text(0, 0, false), "none");
        assert_eq!(fence_text(0, 0, true), "none");
    }

    #[test]
    fn spans_read_as_seconds_minutes_hours_and_days() {
        assert_eq!(span(999), "0.9 s");
        assert_eq!(span(59_999), "59.9 s");
        assert_eq!(span(61_000), "1 min 1 s");
        assert_eq!(span(3_600_000), "1 h 0 min");
        assert_eq!(span(90_061_000), "1 d 1 h");
    }
}
