//! The migration floor of `--floor-after-id`: a new namespace whose every id
//! is greater than every id an earlier generator may have issued, whatever
//! that generator's epoch or bit split.

use std::time::Duration;

use snowkeep_client::{Layout, Millis};
use snowkeep_core::text::rfc3339;

use super::ConfigError;

/// The floor (layout ms of `new`) for a namespace whose ids must all be
/// greater than `after_id`, an id of layout `old`
/// ([`Layout::floor_above_id`]). Only the integers are compared: an id's
/// epoch or field order in the old generator does not matter, only that
/// `after_id` fits `old`'s bits.
///
/// Errors ([`ConfigError::MigrationFloor`], exit 64): `after_id` above
/// `old`'s largest id; `new` cannot express an id above it; or the floor
/// lies more than `max_fence_wait` after `now_unix_ms`, so servers would not
/// claim before then; the message names the latest epoch that would serve now.
pub fn migration_floor(
    after_id: u64,
    old: &Layout,
    new: &Layout,
    now_unix_ms: u64,
    max_fence_wait: Duration,
) -> Result<Millis, ConfigError> {
    let refuse = |problem: String| Err(ConfigError::MigrationFloor(problem));
    if after_id > old.max_id() {
        return refuse(format!(
            "--floor-after-id {after_id} does not fit --floor-layout {old}: its largest id is {} ({} bits)",
            old.max_id(),
            old.total_bits()
        ));
    }
    let Some(floor) = new.floor_above_id(after_id) else {
        let hint = match new.total_bits() {
            63 => "no 63-bit layout can start above an id this close to 2^63".to_owned(),
            53 => "ids above 2^53 - 1 cannot be JavaScript-safe: keep a 63-bit layout and give browsers the text form (IdFormat, docs/api.md)".to_owned(),
            _ => "choose a layout of more bits (at most 63)".to_owned(),
        };
        return refuse(format!(
            "--layout {new} cannot express an id above {after_id}: its largest id is {} ({} bits); {hint}",
            new.max_id(),
            new.total_bits()
        ));
    };
    let floor_unix = new.to_unix_ms(floor);
    let wait_ms = u64::try_from(max_fence_wait.as_millis()).unwrap_or(u64::MAX);
    if floor_unix > now_unix_ms.saturating_add(wait_ms) {
        // The epoch at which the floor is one ms in the past now.
        let latest = now_unix_ms.checked_sub(floor.get() + 1);
        let hint = match latest {
            Some(ms) => format!(
                "an epoch at or before {ms} ({}), as in --layout {}",
                rfc3339(ms),
                new.with_epoch(ms)
            ),
            None => {
                "a layout whose timestamp starts further left (fewer machine and sequence bits)"
                    .to_owned()
            }
        };
        return refuse(format!(
            "the floor above id {after_id} under --layout {new} is {}, {} from now, more than --max-fence-wait {}: this namespace could not issue before then; choose {hint}",
            rfc3339(floor_unix),
            ahead(floor_unix - now_unix_ms),
            humantime::format_duration(max_fence_wait),
        ));
    }
    Ok(floor)
}

/// A span of `ms` as an operator reads it: days past a day, else seconds.
fn ahead(ms: u64) -> String {
    match ms / 86_400_000 {
        0 => format!("{} s", ms / 1000),
        days => format!("{days} days"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z
    const WAIT: Duration = Duration::from_secs(10);

    /// Leaf's snowflake: 41 bits of ms since 2010-11-04T01:42:54.657Z, 10
    /// worker bits, 12 sequence bits.
    fn leaf() -> Layout {
        "41/10/12@1288834974657".parse().unwrap()
    }

    /// Sonyflake: 39 bits of 10 ms since 2014-09-01, 8 sequence bits, 16
    /// machine bits (its field order differs; only the 63 bits count).
    fn sonyflake() -> Layout {
        "39/16/8@1409529600000/10ms".parse().unwrap()
    }

    #[test]
    fn a_leaf_maximum_on_leafs_epoch_floors_at_its_millisecond() {
        let new: Layout = "41/12/10@1288834974657".parse().unwrap();
        let leaf_ms = NOW - 1_288_834_974_657;
        let max = (leaf_ms << 22) | 0x3f_ffff;
        let floor = migration_floor(max, &leaf(), &new, NOW, WAIT).unwrap();
        assert_eq!(floor, Millis(leaf_ms));
        assert!(new.encode(Millis(leaf_ms + 1), snowkeep_client::MachineId(0), 0) > max);
    }

    #[test]
    fn a_sonyflake_maximum_floors_below_the_default_shift() {
        let new: Layout = "41/12/10@1409529600000".parse().unwrap();
        let ticks = (NOW - 1_409_529_600_000) / 10;
        let max = (ticks << 24) | 0xff_ffff;
        let floor = migration_floor(max, &sonyflake(), &new, NOW, WAIT).unwrap();
        assert_eq!(floor, Millis(max >> 22));
        assert_eq!(floor, Millis((ticks << 2) | 3));
    }

    #[test]
    fn each_refusal_says_what_to_change() {
        let message = |r: Result<Millis, ConfigError>| r.unwrap_err().to_string();
        let js = Layout::js53();
        assert_eq!(
            message(migration_floor(1 << 53, &js, &Layout::default(), NOW, WAIT)),
            "--floor-after-id 9007199254740992 does not fit --floor-layout 39/6/8@1767225600000/10ms: its largest id is 9007199254740991 (53 bits)"
        );
        let max = ((NOW - 1_288_834_974_657) << 22) | 0x3f_ffff;
        assert_eq!(
            message(migration_floor(max, &leaf(), &js, NOW, WAIT)),
            format!("--layout 39/6/8@1767225600000/10ms cannot express an id above {max}: its largest id is 9007199254740991 (53 bits); ids above 2^53 - 1 cannot be JavaScript-safe: keep a 63-bit layout and give browsers the text form (IdFormat, docs/api.md)")
        );
        // Leaf's ids on the default 2026 epoch: about 16 years ahead.
        let ahead = message(migration_floor(max, &leaf(), &Layout::default(), NOW, WAIT));
        assert!(ahead.starts_with("the floor above id "), "{ahead}");
        assert!(
            ahead.ends_with("is 2042-01-27T22:17:05Z, 5536 days from now, more than --max-fence-wait 10s: this namespace could not issue before then; choose an epoch at or before 1288834974656 (2010-11-04T01:42:54Z), as in --layout 41/12/10@1288834974656"),
            "{ahead}"
        );
    }
}
