//! The background tasks that keep a started generator's lease: the renewer
//! (the **renew** and **deadline** rules of the [`super`] docs) and the
//! checker (the **check** rule), each stopping issuance for good when the
//! lease is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use snowkeep_proto::v1 as pb;
use tracing::{debug, warn};

use super::{Shared, MAX_RETRY, MIN_RETRY};
use crate::error::{ClientError, StopReason};
use crate::layout::MachineId;

/// The stop reason a "lease gone" answer gives (`Renew`'s `gone_reason`,
/// `Check`'s `reason`); `None` for a valid lease or an unset reason.
fn gone_reason(reason: i32) -> Option<StopReason> {
    match pb::LeaseCheckReason::try_from(reason).ok()? {
        pb::LeaseCheckReason::LeaseGone => Some(StopReason::LeaseGone),
        pb::LeaseCheckReason::NamespaceGone => Some(StopReason::NamespaceGone),
        pb::LeaseCheckReason::RolledBack => Some(StopReason::NamespaceRolledBack),
        pb::LeaseCheckReason::Valid | pb::LeaseCheckReason::Unspecified => None,
    }
}

/// Asks the server every `check_interval` whether the lease still stands and
/// stops issuance at once when it does not. No answer (server unreachable,
/// an older server without Check) changes nothing: the renewer and the fence
/// rule as before.
pub(super) async fn check_loop(shared: Arc<Shared>) {
    let every = shared.config.check_interval;
    if every.is_zero() {
        return;
    }
    loop {
        tokio::time::sleep(every).await;
        if shared.stopped().is_some() {
            return;
        }
        let request = pb::CheckRequest {
            requester: Some(shared.requester.to_pb()),
            namespace: shared.config.namespace.clone(),
            namespace_incarnation: shared.incarnation,
            machine_ids: shared
                .machine_ids
                .iter()
                .map(|m| u32::from(m.get()))
                .collect(),
            lease_token: shared.token.clone(),
        };
        match shared.call(shared.client.check(request)).await {
            Ok(answer) if answer.valid => {}
            Ok(answer) => match gone_reason(answer.reason) {
                Some(reason) => {
                    warn!(namespace = %shared.config.namespace, detail = %answer.detail, "Check: the lease is gone");
                    shared.stop(reason);
                    return;
                }
                None => debug!(
                    reason = answer.reason,
                    "Check answered an unknown reason; ignored"
                ),
            },
            // As for Renew: the server holds this requester's machine ids
            // under another lease token, so they are not ours.
            Err(ClientError::Status(s)) if s.code() == tonic::Code::PermissionDenied => {
                shared.stop(StopReason::TokenRefused);
                return;
            }
            Err(e) => {
                debug!(namespace = %shared.config.namespace, error = %e, "Check failed; issuing on below the fence")
            }
        }
    }
}

/// Renews until issuance stops: immediately, then at half the remaining
/// lease, retrying every `min(10 min, remaining/4)` (at least 5 s) while behind.
pub(super) async fn renew_loop(shared: Arc<Shared>, mut deadline: Instant) {
    let mut next = shared.clock.now();
    loop {
        let wake = next.min(deadline);
        tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
        if shared.stopped().is_some() {
            return;
        }
        if shared.clock.now() >= deadline {
            shared.stop(StopReason::Expired);
            return;
        }
        let sent = shared.clock.now();
        let request = pb::RenewRequest {
            requester: Some(shared.requester.to_pb()),
            namespace: shared.config.namespace.clone(),
            client_time_unix_ms: shared.client_time(),
            lease_token: shared.token.clone(),
            namespace_incarnation: shared.incarnation,
        };
        // A Renew that hangs (a stopped server answers nothing until the
        // call's timeout) must not hold the stop past the deadline: the
        // application learns `Expired` when issuance ends, not later.
        let renewed = tokio::select! {
            answer = shared.call(shared.client.renew(request)) => answer,
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                shared.stop(StopReason::Expired);
                return;
            }
        };
        match renewed {
            Ok(grant) if grant.machine_ids.is_empty() => {
                shared.stop(gone_reason(grant.gone_reason).unwrap_or(StopReason::LeaseGone));
                return;
            }
            Ok(grant) => {
                let renewed: Vec<MachineId> = grant
                    .machine_ids
                    .iter()
                    .map(|g| MachineId(g.machine_id as u16))
                    .collect();
                if renewed != shared.machine_ids {
                    shared.stop(StopReason::MachineIdsChanged {
                        held: shared.machine_ids.len(),
                        renewed: renewed.len(),
                    });
                    return;
                }
                if grant.expires_in_ms == 0 {
                    shared.stop(StopReason::Expired);
                    return;
                }
                if let Some(past) = shared.past_fence(&grant) {
                    // Stamping nothing while holding the machine ids helps no
                    // one: give them back.
                    let released = shared.release(StopReason::ClockPastFence { past }).await;
                    warn!(namespace = %shared.config.namespace, released, "released the machine ids: the local clock is past the renewed fence");
                    return;
                }
                if !shared.publish(&grant, sent) {
                    // A Check stopped issuance while this renewal was in
                    // flight: the stop stands.
                    return;
                }
                deadline = sent + Duration::from_millis(grant.expires_in_ms);
                next = sent + (deadline - sent) / 2;
            }
            Err(ClientError::Status(s)) if s.code() == tonic::Code::PermissionDenied => {
                shared.stop(StopReason::TokenRefused);
                return;
            }
            Err(e) => {
                let remaining = deadline.saturating_duration_since(shared.clock.now());
                let retry = (remaining / 4).clamp(MIN_RETRY, MAX_RETRY);
                warn!(namespace = %shared.config.namespace, error = %e, retry_in = ?retry, remaining = ?remaining, "Renew failed; retrying");
                next = shared.clock.now() + retry;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gone_answer_maps_to_its_stop_reason_and_anything_else_to_none() {
        let r = |reason: pb::LeaseCheckReason| gone_reason(reason as i32);
        assert_eq!(
            r(pb::LeaseCheckReason::LeaseGone),
            Some(StopReason::LeaseGone)
        );
        assert_eq!(
            r(pb::LeaseCheckReason::NamespaceGone),
            Some(StopReason::NamespaceGone)
        );
        assert_eq!(
            r(pb::LeaseCheckReason::RolledBack),
            Some(StopReason::NamespaceRolledBack)
        );
        assert_eq!(r(pb::LeaseCheckReason::Valid), None);
        // Older servers leave it unset; a newer server's unknown value is no answer.
        assert_eq!(r(pb::LeaseCheckReason::Unspecified), None);
        assert_eq!(gone_reason(99), None);
    }
}
