//! The cluster's security mode in `AdminService`: `SetAuthMode`, and the
//! check that keeps a server which does not check keys from managing them
//! once the cluster's mode is on (see `crate::auth::cluster`).

use snowkeep_proto::v1 as pb;
use tonic::Status;

use crate::auth::cluster::StoredValue;
use crate::auth::{ClusterAuth, Enforcement, KeyCache};
use snowkeep_core::claim::StoreError;
use snowkeep_etcd::auth_mode::AuthModeStore;

/// The refusal of `auth enable` while etcd holds no usable admin key.
const NO_ADMIN_KEY: &str = "etcd holds no usable admin key (admin permission, every namespace, not revoked or expired), so with API keys on nobody could administer the cluster: create one first (snowkeepctl key create --permission admin, or a server's --bootstrap-admin-key-file), then enable";

/// How often a mode change is tried again when another change raced it.
const ATTEMPTS: usize = 8;

fn unavailable(e: &StoreError) -> Status {
    Status::unavailable(format!(
        "etcd did not answer: {}; retry",
        snowkeep_core::DisplayChain(e)
    ))
}

fn store(mode: &ClusterAuth) -> Result<AuthModeStore, Status> {
    mode.store().ok_or_else(|| {
        Status::unavailable(
            "this server has not read the cluster's security mode from etcd yet; retry shortly",
        )
    })
}

/// The refusal of a key change (or listing) made without an API key while
/// the cluster's security mode is on.
fn keys_required() -> Status {
    Status::unauthenticated(
        "no API key: the cluster's security mode is on, so managing API keys needs an admin key, even through a server that has not switched to checking keys yet; send `authorization: Bearer <id>.<secret>` (snowkeepctl --api-key-file)",
    )
}

/// The refusal of a key write whose guard failed: the mode changed between
/// the read and the write.
pub(super) fn mode_changed() -> Status {
    keys_required()
}

/// For a key-management call that came without a verified key (the server
/// does not check keys): reads the stored mode and refuses the call when it
/// is on (UNAUTHENTICATED); else the mode key's mod revision, the guard a
/// key write commits under, so no write of such a call commits after the
/// mode turned on.
pub(super) async fn keyless_guard(mode: &ClusterAuth) -> Result<i64, Status> {
    let (stored, _) = store(mode)?.read().await.map_err(|e| unavailable(&e))?;
    match StoredValue::of(&stored).enforcement() {
        Enforcement::Off => Ok(stored.mod_revision),
        _ => Err(keys_required()),
    }
}

/// `SetAuthMode`: sets the stored mode to `enabled` with a compare-and-swap.
/// `authenticated` is true when the authentication layer verified an admin
/// key for the call. Turning keys on needs a usable admin key in `keys`, and
/// the write commits only while that key's record is unchanged in etcd: a
/// revocation racing the enable makes the write fail, and the next attempt
/// judges the keys again (so the mode is never on with no admin key).
/// Turning keys off needs `authenticated`.
pub(super) async fn set(
    mode: &ClusterAuth,
    keys: &KeyCache,
    now_unix_ms: u64,
    enabled: bool,
    authenticated: bool,
) -> Result<pb::SetAuthModeResponse, Status> {
    let store = store(mode)?;
    for _ in 0..ATTEMPTS {
        let (stored, _) = store.read().await.map_err(|e| unavailable(&e))?;
        let value = StoredValue::of(&stored);
        let unchanged = pb::SetAuthModeResponse {
            enabled,
            changed: false,
        };
        match (enabled, &value) {
            (true, StoredValue::On) => return Ok(unchanged),
            (false, StoredValue::Off | StoredValue::Unset) => return Ok(unchanged),
            (false, _) if !authenticated => {
                return Err(Status::unauthenticated(
                    "no API key: turning API keys off needs an admin key (snowkeepctl --api-key-file ADMIN_KEY auth disable); this server does not check keys yet, so it cannot tell an administrator from anyone else",
                ))
            }
            _ => {}
        }
        let guard = if enabled {
            let Some(Some(admin_key)) = keys.usable_admin_key(now_unix_ms) else {
                return Err(Status::failed_precondition(NO_ADMIN_KEY));
            };
            Some(admin_key)
        } else {
            None
        };
        let guard = guard.as_ref().map(|(id, at)| (id.as_str(), *at));
        let value: &[u8] = if enabled { b"on" } else { b"off" };
        if store
            .write(value, stored.mod_revision, guard)
            .await
            .map_err(|e| unavailable(&e))?
            .is_ok()
        {
            return Ok(pb::SetAuthModeResponse {
                enabled,
                changed: true,
            });
        }
    }
    Err(Status::aborted(
        "the cluster's security mode kept changing under this call; retry",
    ))
}
