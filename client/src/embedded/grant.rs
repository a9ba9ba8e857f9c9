//! The checks a grant passes before the generator uses it (the fail-fast
//! rules of the Lease API contract, `docs/api.md`): each refusal makes
//! `EmbeddedGenerator::start` release the grant and return the error.

use std::time::Duration;

use snowkeep_proto::v1 as pb;

use crate::error::ClientError;
use crate::layout::Layout;

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
