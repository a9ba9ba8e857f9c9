//! The cluster's security mode: `snowkeepctl auth enable|disable`.

use snowkeep_proto::v1 as pb;

use crate::conn::ConnArgs;
use crate::output::{print, Output};

/// Commands on the cluster's security mode, which every server follows.
#[derive(clap::Subcommand)]
pub enum AuthCommand {
    /// Require API keys on every server of the cluster (refused while etcd
    /// holds no usable admin key).
    Enable,
    /// Serve every server's calls without API keys again; needs an admin
    /// key (--api-key-file).
    Disable,
}

impl AuthCommand {
    /// Runs the command.
    pub async fn run(self, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
        let enabled = matches!(self, AuthCommand::Enable);
        let r = conn
            .admin()
            .await?
            .set_auth_mode(pb::SetAuthModeRequest { enabled })
            .await?
            .into_inner();
        let mode = if r.enabled { "on" } else { "off" };
        let changed = if r.changed { "yes" } else { "no (already so)" };
        print(
            output,
            &["AUTH", "CHANGED"],
            vec![vec![mode.to_owned(), changed.to_owned()]],
            serde_json::json!({"enabled": r.enabled, "changed": r.changed}),
        )
    }
}
