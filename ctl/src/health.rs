//! `snowkeepctl health`: a probe that works over TLS and mTLS, where
//! Kubernetes' own gRPC probe cannot.

use crate::conn::ConnArgs;

/// What to check.
#[derive(clap::Args)]
pub struct HealthArgs {
    /// The grpc.health.v1 service name to check ("" is the server as a whole).
    #[arg(long, default_value = "")]
    pub service: String,
}

impl HealthArgs {
    /// Checks the health status; an error unless it is SERVING.
    pub async fn run(self, _conn: &ConnArgs) -> anyhow::Result<()> {
        anyhow::bail!("health is not implemented yet")
    }
}
