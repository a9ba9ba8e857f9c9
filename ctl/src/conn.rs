//! How snowkeepctl reaches a server: endpoint, API key, TLS.

use std::path::{Path, PathBuf};

use anyhow::Context;
use snowkeep_proto::v1::admin_service_client::AdminServiceClient;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The least time `export` and `import` may take.
pub const MIN_TRANSFER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

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
    /// A flag wins over an environment variable; --api-key wins over
    /// --api-key-file when both are flags (or both variables).
    #[arg(long, global = true, env = "SNOWKEEP_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A file holding the API key (its first line), instead of --api-key.
    #[arg(long, global = true, env = "SNOWKEEP_API_KEY_FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Whether the key file wins over the key: --api-key-file was given as
    /// a flag and --api-key came only from SNOWKEEP_API_KEY (set by
    /// [`ConnArgs::settle_key_sources`]).
    #[arg(skip)]
    pub file_over_key: bool,
    /// Request timeout.
    #[arg(long, global = true, env = "SNOWKEEP_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
    /// PEM CA certificates to verify an https:// server with; default: the
    /// system's trusted roots.
    #[arg(long, global = true, env = "SNOWKEEP_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for servers that require one (mTLS); with
    /// --tls-key-file.
    #[arg(
        long,
        global = true,
        env = "SNOWKEEP_TLS_CERT_FILE",
        requires = "tls_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(
        long,
        global = true,
        env = "SNOWKEEP_TLS_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, when it is not the
    /// endpoint's host (e.g. an address that is not in the certificate).
    #[arg(long, global = true, env = "SNOWKEEP_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
}

/// The canonical (upper-case) name of a gRPC status code.
pub use snowkeep_client::error::code_name;

/// A status as `CODE_NAME: message`, with the errors beneath it (a
/// transport failure's cause, such as a TLS alert, is only there).
pub fn explain(status: &tonic::Status) -> String {
    let mut out = format!("{}: {}", code_name(status.code()), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// An error as snowkeepctl prints it (without the `snowkeepctl: ` prefix):
/// its context, then a gRPC status as [`explain`] writes it.
pub fn render(error: &anyhow::Error) -> String {
    let mut parts = Vec::new();
    for cause in error.chain() {
        if let Some(status) = cause.downcast_ref::<tonic::Status>() {
            parts.push(explain(status));
            break;
        }
        parts.push(cause.to_string());
    }
    parts.join(": ")
}

/// What to do about an error (as [`render`] writes it) that a flag fixes,
/// for a connection to `endpoint`.
pub fn hint(error: &anyhow::Error, text: &str, endpoint: &str) -> Option<&'static str> {
    let unauthenticated = error.chain().any(|c| {
        c.downcast_ref::<tonic::Status>()
            .is_some_and(|s| s.code() == tonic::Code::Unauthenticated)
    });
    let plaintext = !is_https(endpoint);
    if text.contains("CertificateRequired") {
        Some("the server requires a client certificate: give --tls-cert-file and --tls-key-file")
    } else if text.contains("UnknownCA") || text.contains("BadCertificate") {
        Some("the server does not accept this client certificate: use one signed by the CA of its --tls-client-ca-file")
    } else if unauthenticated || text.starts_with("UNAUTHENTICATED: ") {
        Some("send an API key with --api-key-file FILE (or SNOWKEEP_API_KEY_FILE)")
    } else if plaintext
        && (text.contains("frame with invalid size") || text.contains("h2 protocol error"))
    {
        Some("the server may serve TLS: use https:// and --tls-ca-file")
    } else {
        None
    }
}

fn is_https(endpoint: &str) -> bool {
    endpoint
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

fn read(flag: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {flag} {}", path.display()))
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
            (Some(k), None) => Some(k.trim().to_owned()),
            (Some(k), Some(_)) if !self.file_over_key => Some(k.trim().to_owned()),
            (_, Some(path)) => Some(
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

    /// The TLS settings for an `https://` endpoint; `None` for `http://`.
    ///
    /// # Errors
    /// TLS flags with an `http://` endpoint, or a file that cannot be read.
    fn tls(&self) -> anyhow::Result<Option<ClientTlsConfig>> {
        if !is_https(&self.endpoint) {
            let flag = [
                ("--tls-ca-file", self.tls_ca_file.is_some()),
                ("--tls-cert-file", self.tls_cert_file.is_some()),
                ("--tls-server-name", self.tls_server_name.is_some()),
            ]
            .into_iter()
            .find_map(|(flag, set)| set.then_some(flag));
            if let Some(flag) = flag {
                anyhow::bail!(
                    "{flag} applies to TLS: give an https:// --endpoint (not {:?})",
                    self.endpoint
                );
            }
            return Ok(None);
        }
        let mut tls = ClientTlsConfig::new();
        tls = match &self.tls_ca_file {
            Some(path) => tls.ca_certificate(Certificate::from_pem(read("--tls-ca-file", path)?)),
            None => tls.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) {
            tls = tls.identity(Identity::from_pem(
                read("--tls-cert-file", cert)?,
                read("--tls-key-file", key)?,
            ));
        }
        if let Some(name) = &self.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        Ok(Some(tls))
    }

    /// Connects to the server at `--endpoint`, over TLS for `https://`.
    ///
    /// # Errors
    /// A bad URL or TLS file, or the server cannot be reached (the TLS
    /// handshake failing included).
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        self.channel_for(self.timeout).await
    }

    /// Like [`ConnArgs::channel`], with calls allowed `call_timeout` (the
    /// connection attempt still `--timeout`).
    async fn channel_for(&self, call_timeout: std::time::Duration) -> anyhow::Result<Channel> {
        let mut endpoint = Endpoint::from_shared(self.endpoint.clone())
            .with_context(|| format!("--endpoint {:?} is not a URL", self.endpoint))?
            .timeout(call_timeout)
            .connect_timeout(self.timeout);
        if let Some(tls) = self.tls()? {
            endpoint = endpoint
                .tls_config(tls)
                .context("the TLS settings cannot be used")?;
        }
        endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to {}", self.endpoint))
    }

    /// Connects to the server's AdminService.
    pub async fn admin(&self) -> anyhow::Result<Admin> {
        let channel = self.channel().await?;
        Ok(AdminServiceClient::with_interceptor(channel, self.key()?))
    }

    /// Connects to the server's AdminService for `export` and `import`:
    /// their calls may take `--timeout` or [`MIN_TRANSFER_TIMEOUT`],
    /// whichever is longer (a large state takes longer than the 10 s
    /// default, mostly the import's etcd writes).
    pub async fn admin_for_transfer(&self) -> anyhow::Result<Admin> {
        let channel = self
            .channel_for(self.timeout.max(MIN_TRANSFER_TIMEOUT))
            .await?;
        Ok(AdminServiceClient::with_interceptor(channel, self.key()?))
    }
}

/// The info client snowkeepctl uses (for the server's own namespace).
pub type Info =
    snowkeep_proto::v1::info_service_client::InfoServiceClient<InterceptedService<Channel, ApiKey>>;

impl ConnArgs {
    /// Connects to the server's InfoService, over TLS for `https://` as
    /// every other connection.
    pub async fn info(&self) -> anyhow::Result<Info> {
        let channel = self.channel().await?;
        Ok(
            snowkeep_proto::v1::info_service_client::InfoServiceClient::with_interceptor(
                channel,
                self.key()?,
            ),
        )
    }

    /// Records where the API key flags came from, so a flag wins over an
    /// environment variable: --api-key-file on the command line wins over
    /// SNOWKEEP_API_KEY; --api-key on the command line wins over both.
    pub fn settle_key_sources(&mut self, matches: &clap::ArgMatches) {
        let key = on_command_line(matches, "api_key");
        let file = on_command_line(matches, "api_key_file");
        self.file_over_key = file && !key;
    }
}

/// Whether global argument `id` was given on the command line, at the top
/// level or after a subcommand.
fn on_command_line(matches: &clap::ArgMatches, id: &str) -> bool {
    let here = matches.try_get_raw(id).ok().flatten().is_some()
        && matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    here || matches
        .subcommand()
        .is_some_and(|(_, sub)| on_command_line(sub, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_print_their_canonical_code_name_and_a_hint() {
        let e = anyhow::Error::new(tonic::Status::failed_precondition("etcd holds state"));
        let text = render(&e);
        assert_eq!(text, "FAILED_PRECONDITION: etcd holds state");
        assert_eq!(hint(&e, &text, "http://x:1"), None);

        let e = anyhow::Error::new(tonic::Status::unauthenticated("no API key"))
            .context("asking the server for its namespace (or pass --namespace)");
        let text = render(&e);
        assert_eq!(
            text,
            "asking the server for its namespace (or pass --namespace): UNAUTHENTICATED: no API key"
        );
        assert_eq!(
            hint(&e, &text, "http://x:1"),
            Some("send an API key with --api-key-file FILE (or SNOWKEEP_API_KEY_FILE)")
        );

        let e = anyhow::Error::new(tonic::Status::internal(
            "h2 protocol error: http2 error: connection error detected: frame with invalid size",
        ));
        let text = render(&e);
        assert_eq!(
            hint(&e, &text, "http://x:1"),
            Some("the server may serve TLS: use https:// and --tls-ca-file")
        );
        assert_eq!(hint(&e, &text, "https://x:1"), None);

        let e = anyhow::anyhow!("received fatal alert: CertificateRequired");
        assert_eq!(
            hint(&e, &render(&e), "https://x:1"),
            Some(
                "the server requires a client certificate: give --tls-cert-file and --tls-key-file"
            )
        );
        assert_eq!(code_name(tonic::Code::NotFound), "NOT_FOUND");
    }
}
