//! The API-key flags: the mode this server expects of the cluster and the
//! bootstrap admin key, read at start into [`AuthConfig`].

use std::path::PathBuf;

use crate::auth::{AuthConfig, AuthMode, BootstrapKey};

use super::{ConfigError, StoreConfig};

/// API keys: the expected cluster mode and the first admin key.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "API keys")]
pub struct AuthArgs {
    /// API keys, whose mode is the cluster's (kept in etcd): not given, the
    /// server follows the cluster. `on` sets the cluster's mode to on when
    /// it was never set, and refuses to start (exit 64) when an admin turned
    /// it off; `off` refuses to start when the cluster's mode is on. While
    /// on, every call but health and reflection sends `authorization:
    /// Bearer <id>.<secret>`.
    #[arg(long, env = "SNOWKEEP_AUTH", value_enum)]
    pub auth: Option<AuthMode>,
    /// A file holding an API key `<id>.<secret>` (first line): at start the
    /// server writes it to etcd as an admin key unless a key with that id
    /// exists (which is left as it is). The way to the first admin key,
    /// e.g. from a Kubernetes Secret.
    #[arg(long, env = "SNOWKEEP_BOOTSTRAP_ADMIN_KEY_FILE")]
    pub bootstrap_admin_key_file: Option<PathBuf>,
}

impl AuthArgs {
    /// Reads the bootstrap admin key, if any, and checks that `--auth on`
    /// and a bootstrap key come with etcd, where API keys are kept.
    pub(super) fn config(&self, store: &StoreConfig) -> Result<AuthConfig, ConfigError> {
        let bootstrap_admin_key = self
            .bootstrap_admin_key_file
            .as_deref()
            .map(read_bootstrap_key)
            .transpose()?;
        if matches!(store, StoreConfig::SingleInstance { .. })
            && (self.auth == Some(AuthMode::On) || bootstrap_admin_key.is_some())
        {
            return Err(ConfigError::AuthNeedsEtcd("--auth on and --bootstrap-admin-key-file need etcd, where API keys are kept: add --etcd-endpoints (the single-instance store serves without authentication; keep its port private)"));
        }
        Ok(AuthConfig {
            mode: self.auth,
            bootstrap_admin_key,
        })
    }
}

/// Reads `--bootstrap-admin-key-file`: its first line is the key.
fn read_bootstrap_key(path: &std::path::Path) -> Result<BootstrapKey, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::BootstrapKey {
        path: path.to_owned(),
        problem: e.to_string(),
    })?;
    BootstrapKey::parse(&text).map_err(|e| ConfigError::BootstrapKey {
        path: path.to_owned(),
        problem: format!(
            "{e}; the file's first line is the key, e.g. k0123456789ab.<64 hex digits>"
        ),
    })
}
