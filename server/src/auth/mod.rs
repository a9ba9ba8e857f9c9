//! API keys: who may call what.
//!
//! While the cluster's security mode is on ([`cluster`]), every call but `grpc.health.v1` and server reflection
//! carries `authorization: Bearer <id>.<secret>` metadata. The
//! [`AuthLayer`] checks it before any handler runs:
//!
//! | what | status |
//! | --- | --- |
//! | no key, a malformed key, an unknown id, a wrong secret, an expired or revoked key | UNAUTHENTICATED |
//! | IdService without `ids`, LeaseService without `lease`, AdminService without `admin` (InfoService takes any valid key) | PERMISSION_DENIED |
//! | IdService on a server whose namespace the key may not use | PERMISSION_DENIED |
//! | no keys loaded yet (etcd not reached since start) | UNAVAILABLE |
//!
//! The Lease API names its namespace in the request body, so its handler
//! checks the namespace against the [`KeyScope`] the layer put into the
//! request's extensions (an `Arc<KeyScope>`), and counts the key's holdings at Acquire against
//! its `max_lease_machine_ids` (RESOURCE_EXHAUSTED over it; see
//! `snowkeep_etcd::requesters` for the guarantee).
//!
//! Keys live in etcd at `/snowkeep/v1/apikeys/<id>` ([`KeyRecord`], JSON,
//! with the SHA-256 of the secret only); every server follows them with a
//! watch ([`KeyCache`]). The single-instance store has no etcd, so `--auth
//! on` is refused there.
//!
//! The mode itself is the cluster's, kept in etcd and followed by every
//! server ([`ClusterAuth`]); `--auth` only asserts it at start.
//!
//! The keys themselves (records, presented keys, verification, scopes, the
//! bootstrap key) are data, in `snowkeep_core::api_key`, below both this module and
//! the etcd store that keeps them; the names are re-exported here.
//!
//! | module | owns |
//! | --- | --- |
//! | [`cache`] | the servers' copy of the keys and the watch that keeps it current |
//! | [`cluster`] | the cluster's security mode: the check at start and the watch |
//! | `first_mode` | `--auth on` on a cluster whose mode was never set: the admin key it needs |
//! | [`layer`] | the tower layer |
//! | `memo` | the key a connection last presented and that verified, so its next calls skip the hash |
//! | `revoke` | ending a key's open streams when it is revoked or expires |

pub mod cache;
pub mod cluster;
mod first_mode;
pub mod layer;
mod memo;
mod revoke;
#[cfg(test)]
mod test_keys;

pub use cache::KeyCache;
pub use cluster::{ClusterAuth, Enforcement};
pub use layer::AuthLayer;
pub use snowkeep_core::api_key::{BootstrapKey, KeyRecord, KeyScope, Permission, PresentedKey};

/// `--auth`: what this server expects the cluster's security mode to be
/// ([`cluster`]); not given, it follows the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Every call is served without a key (the quickstart).
    Off,
    /// Every call but health and reflection needs a valid API key.
    On,
}

/// Authentication settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// `--auth`, `None` when not given (follow the cluster).
    pub mode: Option<AuthMode>,
    /// `--bootstrap-admin-key-file`, read and hashed.
    pub bootstrap_admin_key: Option<BootstrapKey>,
}
