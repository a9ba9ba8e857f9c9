//! `snowkeepctl health`: a probe that works over TLS and mTLS, where
//! Kubernetes' own gRPC probe cannot.

use anyhow::Context;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use crate::conn::ConnArgs;

/// What to check.
#[derive(clap::Args)]
pub struct HealthArgs {
    /// The grpc.health.v1 service name to check ("" is the server as a
    /// whole; snowkeep.v1.IdService is SERVING only while ids can be issued).
    #[arg(long, default_value = "")]
    pub service: String,
}

impl HealthArgs {
    /// Checks the health status with grpc.health.v1 `Check`: prints
    /// `SERVING` and returns `Ok` only when the status is SERVING.
    ///
    /// # Errors
    /// The server cannot be reached (TLS included) or does not answer, the
    /// service is unknown to it, or its status is anything but SERVING.
    pub async fn run(self, conn: &ConnArgs) -> anyhow::Result<()> {
        let what = if self.service.is_empty() {
            "the server".to_owned()
        } else {
            format!("service {:?}", self.service)
        };
        let channel = conn.channel().await?;
        let response = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: self.service.clone(),
            })
            .await
            .map_err(|s| {
                anyhow::anyhow!(
                    "health check of {what} at {} failed: {}",
                    conn.endpoint,
                    crate::conn::explain(&s)
                )
            })?;
        let status = ServingStatus::try_from(response.into_inner().status)
            .context("the server answered an unknown health status")?;
        if status != ServingStatus::Serving {
            anyhow::bail!(
                "{what} at {} is {}, not SERVING",
                conn.endpoint,
                status.as_str_name()
            );
        }
        crate::output::line("SERVING")
    }
}
