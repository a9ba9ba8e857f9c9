//! Commands on API keys and the audit trail.

use snowkeep_proto::v1 as pb;

use crate::conn::ConnArgs;
use crate::output::{print, Output};

/// API key commands.
#[derive(clap::Subcommand)]
pub enum KeyCommand {
    /// List API keys (never their secrets).
    List,
}

impl KeyCommand {
    /// Runs the command.
    pub async fn run(self, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
        match self {
            KeyCommand::List => {
                let mut admin = conn.admin().await?;
                let r = admin.list_keys(pb::ListKeysRequest {}).await?.into_inner();
                let rows = r
                    .keys
                    .iter()
                    .map(|k| vec![k.id.clone(), k.description.clone()])
                    .collect();
                let json = serde_json::json!(r
                    .keys
                    .iter()
                    .map(|k| serde_json::json!({ "id": k.id, "description": k.description }))
                    .collect::<Vec<_>>());
                print(output, &["ID", "DESCRIPTION"], rows, json);
                Ok(())
            }
        }
    }
}

/// Audit trail commands.
#[derive(clap::Subcommand)]
pub enum AuditCommand {
    /// Follow the audit trail of the server answering.
    Tail,
}

impl AuditCommand {
    /// Runs the command.
    pub async fn run(self, conn: &ConnArgs, _output: Output) -> anyhow::Result<()> {
        match self {
            AuditCommand::Tail => {
                let mut admin = conn.admin().await?;
                let _ = admin.tail_audit(pb::TailAuditRequest {}).await?;
                Ok(())
            }
        }
    }
}
