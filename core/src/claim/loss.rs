//! How loudly a lost claim is logged (design.md, *Claim lifecycle*, Lose).
//!
//! A loss never risks a duplicate: the fences bound what the old claim can
//! still stamp, and the next claim stamps above them. What it costs is a new
//! claim, usually a few ms on a free machine id. So a loss the loop recovers
//! from on its own (an etcd lease that expired during a stall, a holder key
//! that went with it) is a warning; one that needs a person (a rolled-back
//! namespace, or `--on-lease-lost exit` ending the process) is an error.

use tracing::{error, warn};

use super::{LossReason, OnLeaseLost};

/// The level a loss is logged at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossLevel {
    /// The loop claims again by itself.
    Warn,
    /// An operator must act, or the process exits.
    Error,
}

/// The level of a loss for `reason` under `on_lease_lost`.
pub fn loss_level(reason: LossReason, on_lease_lost: OnLeaseLost) -> LossLevel {
    match (reason, on_lease_lost) {
        (LossReason::RolledBack, _) | (_, OnLeaseLost::Exit) => LossLevel::Error,
        (
            LossReason::Expired | LossReason::HolderChanged | LossReason::Deadline,
            OnLeaseLost::Reclaim,
        ) => LossLevel::Warn,
    }
}

/// Logs the loss of `machine_ids` in `namespace` at its [`loss_level`],
/// saying what happens next.
pub fn log_loss(
    namespace: &str,
    machine_ids: &[u16],
    reason: LossReason,
    on_lease_lost: OnLeaseLost,
) {
    match (loss_level(reason, on_lease_lost), reason, on_lease_lost) {
        (LossLevel::Error, _, OnLeaseLost::Exit) => {
            error!(namespace, ?machine_ids, %reason, "machine-id lease lost; issuance stopped, exiting (--on-lease-lost exit)")
        }
        (LossLevel::Error, _, _) => {
            error!(namespace, ?machine_ids, %reason, "machine-id lease lost; issuance stopped: the namespace is rolled back, so nothing is claimed until an operator confirms a floor (docs/operations.md#restoring-etcd-from-a-snapshot)")
        }
        (LossLevel::Warn, ..) => {
            warn!(namespace, ?machine_ids, %reason, "machine-id lease lost; issuance stopped, claiming again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_the_loop_recovers_from_is_a_warning_one_that_needs_a_person_an_error() {
        use LossLevel::{Error, Warn};
        use LossReason::{Deadline, Expired, HolderChanged, RolledBack};
        let reclaim: Vec<LossLevel> = [Expired, HolderChanged, Deadline, RolledBack]
            .into_iter()
            .map(|r| loss_level(r, OnLeaseLost::Reclaim))
            .collect();
        assert_eq!(reclaim, [Warn, Warn, Warn, Error]);
        let exit: Vec<LossLevel> = [Expired, HolderChanged, Deadline, RolledBack]
            .into_iter()
            .map(|r| loss_level(r, OnLeaseLost::Exit))
            .collect();
        assert_eq!(exit, [Error, Error, Error, Error]);
    }
}
