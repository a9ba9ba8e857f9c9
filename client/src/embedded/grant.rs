//! The checks a grant passes before the generator uses it (the fail-fast
//! rules of the Lease API contract, `docs/api.md`): each refusal makes
//! `EmbeddedGenerator::start` release the grant and return the error.

use std::time::{Duration, Instant};

use snowkeep_proto::v1 as pb;

use crate::clock::Clock;
use crate::error::ClientError;
use crate::layout::{Layout, Millis};

/// Checks a grant against what was asked and
/// returns its layout.
pub(super) fn check_grant(grant: &pb::LeaseGrant, asked: u32) -> Result<Layout, ClientError> {
    let l = grant
        .layout
        .ok_or(ClientError::BadLayout(crate::layout::LayoutError::Parse {
            text: String::new(),
            field: "shape",
        }))?;
    let layout = Layout::try_from(&l).map_err(ClientError::BadLayout)?;
    if grant.machine_ids.len() != asked as usize {
        return Err(ClientError::GrantCount {
            asked,
            granted: grant.machine_ids.len(),
        });
    }
    for (i, g) in grant.machine_ids.iter().enumerate() {
        if grant.machine_ids[..i]
            .iter()
            .any(|h| h.machine_id == g.machine_id)
        {
            return Err(ClientError::GrantDuplicate {
                machine_id: g.machine_id,
            });
        }
        if g.machine_id >= layout.machine_id_count() {
            return Err(ClientError::MachineIdOutOfRange {
                machine_id: g.machine_id,
                machine_bits: layout.machine_bits(),
            });
        }
    }
    if grant.expires_in_ms == 0 {
        return Err(ClientError::GrantExpired);
    }
    Ok(layout)
}

/// How far the wall clock `unix_ms` is past the earliest fence of `grant`;
/// `None` while it is at or below every fence.
pub(super) fn past_fence(
    layout: &Layout,
    unix_ms: u64,
    grant: &pb::LeaseGrant,
) -> Option<Duration> {
    let now = layout.to_layout_ms(unix_ms)?.get();
    let fence = grant.machine_ids.iter().map(|m| m.fence_ms).min()?;
    (now > fence).then(|| Duration::from_millis(now - fence))
}

/// How long start waits for `clock` to pass the grant's highest floor
/// before the first id can be stamped; an error when the lease already
/// ended by the local clock (`GrantExpired`: the answer came after the
/// lease it grants) or when the wait is longer than `max_floor_wait` or the
/// time left to `deadline` (`ClockBehindFloor`: the lease would end before
/// the first id).
pub(super) fn floor_wait(
    layout: &Layout,
    clock: &dyn Clock,
    grant: &pb::LeaseGrant,
    deadline: Instant,
    max_floor_wait: Duration,
) -> Result<Duration, ClientError> {
    if clock.now() >= deadline {
        return Err(ClientError::GrantExpired);
    }
    let max_floor = grant
        .machine_ids
        .iter()
        .map(|m| m.floor_ms)
        .max()
        .unwrap_or(0);
    let now = layout.to_layout_ms(clock.unix_ms()).unwrap_or_default();
    let first = layout.first_stamp_after(Millis(max_floor));
    let wait = Duration::from_millis(first.get().saturating_sub(now.get()));
    let max = max_floor_wait.min(deadline.saturating_duration_since(clock.now()));
    if wait > max {
        return Err(ClientError::ClockBehindFloor { wait, max });
    }
    Ok(wait)
}
