//! How snowkeepctl reaches a server: endpoint, API key, TLS.

use anyhow::Context;
use snowkeep_proto::v1::admin_service_client::AdminServiceClient;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Connection flags, shared by every command.
#[derive(clap::Args)]
pub struct ConnArgs {
    /// A server's gRPC address (`http://` or `https://`).
    #[arg(
        long,
        global = true,
        env = "SNOWKEEP_ENDPOINT",
        default_value = "http://127.0.0.1:50051"
    )]
    pub endpoint: String,
    /// The API key (`<id>.<secret>`), sent as `authorization: Bearer <key>`.
    #[arg(long, global = true, env = "SNOWKEEP_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A file holding the API key (its first line), instead of --api-key.
    #[arg(
        long,
        global = true,
        env = "SNOWKEEP_API_KEY_FILE",
        conflicts_with = "api_key"
    )]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Request timeout.
    #[arg(long, global = true, env = "SNOWKEEP_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
}

/// Adds the API key to every request.
#[derive(Clone)]
pub struct ApiKey(Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for ApiKey {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// The admin client snowkeepctl uses.
pub type Admin = AdminServiceClient<InterceptedService<Channel, ApiKey>>;

impl ConnArgs {
    fn key(&self) -> anyhow::Result<ApiKey> {
        let key = match (&self.api_key, &self.api_key_file) {
            (Some(k), _) => Some(k.trim().to_owned()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the API key from {}", path.display()))?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        let value = key
            .map(|k| {
                MetadataValue::try_from(format!("Bearer {k}"))
                    .context("the API key has characters a header cannot carry")
            })
            .transpose()?;
        Ok(ApiKey(value))
    }

    /// Connects to the server's AdminService.
    pub async fn admin(&self) -> anyhow::Result<Admin> {
        let endpoint = Endpoint::from_shared(self.endpoint.clone())
            .with_context(|| format!("--endpoint {:?} is not a URL", self.endpoint))?
            .timeout(self.timeout)
            .connect_timeout(self.timeout);
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to {}", self.endpoint))?;
        Ok(AdminServiceClient::with_interceptor(channel, self.key()?))
    }
}

/// The info client snowkeepctl uses (for the server's own namespace).
pub type Info =
    snowkeep_proto::v1::info_service_client::InfoServiceClient<InterceptedService<Channel, ApiKey>>;

impl ConnArgs {
    /// Connects to the server's InfoService.
    pub async fn info(&self) -> anyhow::Result<Info> {
        let endpoint = Endpoint::from_shared(self.endpoint.clone())
            .with_context(|| format!("--endpoint {:?} is not a URL", self.endpoint))?
            .timeout(self.timeout)
            .connect_timeout(self.timeout);
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to {}", self.endpoint))?;
        Ok(
            snowkeep_proto::v1::info_service_client::InfoServiceClient::with_interceptor(
                channel,
                self.key()?,
            ),
        )
    }
}
