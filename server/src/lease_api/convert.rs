//! Conversions between the Lease API's protobuf messages and its records,
//! and the checks of a request's fields (INVALID_ARGUMENT when malformed).

use snowkeep_client::{Layout, Millis};
use snowkeep_proto::v1 as pb;

use crate::service::convert::layout_to_pb;
use crate::service::status::ApiError;
use snowkeep_core::lease::records::{LeaseCheck, LeaseToken, RequesterGrant, RequesterId};
use snowkeep_core::namespace::is_valid_namespace;

/// A requester's id: the SHA-256 of `host_id:pid:start_unix_ms:nonce`, after
/// checking its fields (INVALID_ARGUMENT when absent or malformed).
pub fn requester_id(requester: Option<&pb::Requester>) -> Result<RequesterId, ApiError> {
    let r = requester.ok_or(ApiError::InvalidRequester {
        reason: "requester is missing",
    })?;
    let host_ok = !r.host_id.is_empty()
        && r.host_id.len() <= 128
        && r.host_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !host_ok {
        return Err(ApiError::InvalidRequester {
            reason: "host_id must be 1-128 characters of A-Z a-z 0-9 . _ -",
        });
    }
    if r.pid == 0 || r.start_unix_ms == 0 {
        return Err(ApiError::InvalidRequester {
            reason: "pid and start_unix_ms must be set",
        });
    }
    if !(16..=64).contains(&r.nonce.len()) || !r.nonce.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ApiError::InvalidRequester {
            reason: "nonce must be 16-64 hex digits drawn at random for each generator",
        });
    }
    Ok(RequesterId::of(&format!(
        "{}:{}:{}:{}",
        r.host_id, r.pid, r.start_unix_ms, r.nonce
    )))
}

/// A request's `lease_token`: `None` when empty, INVALID_ARGUMENT unless it
/// is 64 hex digits.
pub fn lease_token(text: &str) -> Result<Option<LeaseToken>, ApiError> {
    LeaseToken::parse(text).map_err(|_| ApiError::InvalidLeaseToken)
}

/// Checks a namespace name like `--namespace` does (INVALID_ARGUMENT otherwise).
pub fn check_namespace(namespace: &str) -> Result<(), ApiError> {
    if is_valid_namespace(namespace) {
        Ok(())
    } else {
        Err(ApiError::InvalidNamespace {
            namespace: namespace.to_owned(),
        })
    }
}

/// A requester's grant as its protobuf message.
pub fn grant_to_pb(grant: RequesterGrant, server_time_unix_ms: u64) -> pb::LeaseGrant {
    let ms = |d: std::time::Duration| Millis::of(d).get();
    pb::LeaseGrant {
        machine_ids: grant
            .held
            .iter()
            .map(|h| pb::LeasedMachineId {
                machine_id: u32::from(h.machine_id.get()),
                floor_ms: h.floor.get(),
                fence_ms: h.fence.get(),
            })
            .collect(),
        lease_duration_ms: ms(grant.duration),
        expires_in_ms: if grant.held.is_empty() {
            0
        } else {
            ms(grant.duration)
        },
        layout: Some(layout_to_pb(&grant.layout)),
        server_time_unix_ms,
        lease_token: grant
            .token
            .as_ref()
            .map(LeaseToken::to_hex)
            .unwrap_or_default(),
        gone_reason: if grant.held.is_empty() {
            pb::LeaseCheckReason::LeaseGone as i32
        } else {
            pb::LeaseCheckReason::Unspecified as i32
        },
        ..Default::default()
    }
}

/// A lease check's outcome as its protobuf reason.
pub fn check_reason(check: LeaseCheck) -> pb::LeaseCheckReason {
    match check {
        LeaseCheck::Valid { .. } => pb::LeaseCheckReason::Valid,
        LeaseCheck::LeaseGone => pb::LeaseCheckReason::LeaseGone,
        LeaseCheck::NamespaceGone => pb::LeaseCheckReason::NamespaceGone,
        LeaseCheck::RolledBack => pb::LeaseCheckReason::RolledBack,
    }
}

/// A lease check's outcome as its protobuf message.
pub fn check_to_pb(check: LeaseCheck) -> pb::CheckResponse {
    let (remaining_ms, detail) = match check {
        LeaseCheck::Valid { remaining } => (
            Millis::of(remaining).get(),
            "the lease stands",
        ),
        LeaseCheck::LeaseGone => (
            0,
            "this requester holds no lease (or other machine ids) any more: stop issuing",
        ),
        LeaseCheck::NamespaceGone => (
            0,
            "the namespace does not exist any more, or was created again since the grant (etcd lost its state): stop issuing",
        ),
        LeaseCheck::RolledBack => (
            0,
            "etcd was restored from an older snapshot and the namespace is rolled back until an operator confirms a floor: stop issuing",
        ),
    };
    let reason = check_reason(check);
    pb::CheckResponse {
        valid: reason == pb::LeaseCheckReason::Valid,
        reason: reason as i32,
        remaining_ms,
        detail: detail.to_owned(),
    }
}

/// The Renew answer "your lease is gone" (no machine ids), saying why.
pub fn gone_grant(
    reason: pb::LeaseCheckReason,
    layout: Option<&Layout>,
    server_time_unix_ms: u64,
) -> pb::LeaseGrant {
    pb::LeaseGrant {
        layout: layout.map(layout_to_pb),
        server_time_unix_ms,
        gone_reason: reason as i32,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_logs_the_same_tag_the_server_does() {
        let who = snowkeep_client::Requester {
            host_id: "host-1".into(),
            pid: 42,
            start_unix_ms: 1_700_000_000_000,
            nonce: "00112233445566778899aabbccddeeff".into(),
        };
        let id = requester_id(Some(&who.to_pb())).unwrap();
        assert_eq!(
            id,
            RequesterId::of("host-1:42:1700000000000:00112233445566778899aabbccddeeff")
        );
        assert_eq!(who.tag(), id.tag());
    }
}
