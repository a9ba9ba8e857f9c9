//! `--auth on` on a cluster whose security mode was never set: the server
//! turns keys on for every server, so it applies the rule `auth enable`
//! applies. It writes its bootstrap admin key first (when it has one), then
//! writes `on` only while etcd holds a usable admin key, in one transaction
//! guarded on that key's record; with none it refuses to start (exit 64)
//! instead of locking the cluster.

use snowkeep_client::SharedClock;

use super::cache::{parse, usable_admin};
use super::BootstrapKey;
use snowkeep_core::claim::StoreError;
use snowkeep_etcd::apikeys::ApiKeyStore;

/// Why `--auth on` may not set the mode: no usable admin key.
pub(crate) const NO_ADMIN_KEY: &str = "--auth on would turn API keys on for the whole cluster (its security mode in etcd was never set), but etcd holds no usable admin key (admin permission, every namespace, not revoked or expired), so nobody could administer it. Give this server --bootstrap-admin-key-file FILE (make FILE with `snowkeepctl key generate`), or create an admin key first with `snowkeepctl key create --permission admin` while keys are off";

/// Writes `bootstrap` (unless a key with its id exists), then finds a
/// usable admin key in etcd: its id and record's mod revision, the guard
/// of the mode write. Errors: [`StoreError::AuthModeMismatch`] with
/// [`NO_ADMIN_KEY`] when there is none, or what etcd answered.
pub(crate) async fn admin_key_for_on(
    keys: &ApiKeyStore,
    bootstrap: Option<&BootstrapKey>,
    clock: &SharedClock,
) -> Result<(String, i64), StoreError> {
    if let Some(boot) = bootstrap {
        let record = boot.record(clock.unix_ms());
        // Written, or a key with that id is there already (left as it is).
        keys.create(&boot.id, record.to_json().as_bytes(), None)
            .await?;
    }
    let (stored, _) = keys.list().await?;
    let now = clock.unix_ms();
    stored
        .iter()
        .find_map(|s| {
            parse(s)
                .filter(|r| usable_admin(r, now))
                .map(|r| (r.id, s.mod_revision))
        })
        .ok_or_else(|| StoreError::AuthModeMismatch {
            problem: NO_ADMIN_KEY.to_owned(),
        })
}
