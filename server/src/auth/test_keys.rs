//! Helpers the authentication tests share.

use snowkeep_core::api_key::{KeyRecord, PresentedKey};
use snowkeep_etcd::apikeys::StoredKey;
use tonic::Status;

/// `record` as etcd holds it at `mod_revision`.
pub(super) fn stored(record: &KeyRecord, mod_revision: i64) -> StoredKey {
    StoredKey {
        id: record.id.clone(),
        value: record.to_json().into_bytes(),
        mod_revision,
    }
}

/// `status` is the refusal of `key`, expired at 10 s past the epoch.
pub(super) fn assert_expired_at_10_s(status: &Status, key: &PresentedKey) {
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert_eq!(
        status.message(),
        format!(
            "API key {} expired at 1970-01-01T00:00:10Z: ask an administrator for a new key",
            key.id()
        )
    );
}
