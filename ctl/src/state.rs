//! Commands on the cluster's state: namespaces, machine ids, requesters,
//! capacity, decode, evict, export, import.

use snowkeep_proto::v1 as pb;

use crate::conn::ConnArgs;
use crate::output::{print, Output};

/// Cluster-state commands.
#[derive(clap::Subcommand)]
pub enum StateCommand {
    /// List namespaces with their layouts and capacity.
    Namespaces,
}

impl StateCommand {
    /// Runs the command.
    pub async fn run(self, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
        match self {
            StateCommand::Namespaces => {
                let mut admin = conn.admin().await?;
                let r = admin
                    .list_namespaces(pb::ListNamespacesRequest {})
                    .await?
                    .into_inner();
                let rows = r.namespaces.iter().map(|n| vec![n.name.clone()]).collect();
                let json = serde_json::json!(r
                    .namespaces
                    .iter()
                    .map(|n| serde_json::json!({ "name": n.name }))
                    .collect::<Vec<_>>());
                print(output, &["NAMESPACE"], rows, json);
                Ok(())
            }
        }
    }
}
