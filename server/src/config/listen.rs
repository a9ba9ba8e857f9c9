//! The listening flags: the gRPC, metrics and status-page addresses, TLS on
//! the gRPC port (its files read once here) and the client allow-list.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::tls::TlsSettings;

use super::{
    ConfigError, StoreConfig, DEFAULT_LISTEN, DEFAULT_METRICS_LISTEN, DEFAULT_TLS_RELOAD_INTERVAL,
};

/// Where the server listens, and who may call its gRPC port.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Listening and TLS")]
pub struct ListenArgs {
    /// gRPC listen address.
    #[arg(long, env = "SNOWKEEP_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Prometheus metrics listen address (GET /metrics).
    #[arg(long, env = "SNOWKEEP_METRICS_LISTEN", default_value = DEFAULT_METRICS_LISTEN)]
    pub metrics_listen: SocketAddr,
    /// Status page listen address (HTTP, GET /): a read-only page of the
    /// cluster's namespaces, machine ids, Lease API requesters, this
    /// server's state and recent audit events. Off unless given; a port
    /// alone (e.g. 9465) listens on 127.0.0.1 only; give a whole address
    /// (e.g. 0.0.0.0:9465) when the page must be reached from other hosts.
    /// With --auth on it needs an API key with the admin permission. Needs
    /// --etcd-endpoints.
    #[arg(long, env = "SNOWKEEP_ADMIN_LISTEN", value_parser = parse_admin_listen)]
    pub admin_listen: Option<SocketAddr>,
    /// PEM certificate chain (leaf first) to serve the gRPC port over TLS
    /// with; needs --tls-key-file. Re-read every --tls-reload-interval.
    #[arg(long, env = "SNOWKEEP_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "SNOWKEEP_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates: with it every client must present a certificate
    /// signed by one of them (mTLS), or its TLS handshake fails.
    #[arg(long, env = "SNOWKEEP_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// How often the TLS files are re-read; changed, valid files serve the
    /// connections accepted from then on (100ms to 1h).
    #[arg(long, env = "SNOWKEEP_TLS_RELOAD_INTERVAL", default_value = DEFAULT_TLS_RELOAD_INTERVAL, value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,
    /// Client networks allowed to call the gRPC port, comma-separated CIDR
    /// ranges (10.0.0.0/8,127.0.0.1/32; a bare address is one host); calls
    /// from elsewhere get PERMISSION_DENIED. Empty allows every address.
    #[arg(long, env = "SNOWKEEP_ALLOW_CIDRS", value_delimiter = ',')]
    pub allow_cidrs: Vec<String>,
    /// Web origins (scheme://host[:port], comma-separated, or `*`) whose
    /// pages may call the gRPC port from a browser, over gRPC-Web or
    /// HTTP/JSON (CORS). Empty (the default): no cross-origin call is
    /// allowed. API keys and the allow-list apply either way.
    #[arg(long, env = "SNOWKEEP_CORS_ALLOW_ORIGINS", value_delimiter = ',')]
    pub cors_allow_origins: Vec<String>,
}

impl ListenArgs {
    /// Checks the TLS flags and reads the files once, so a server never starts
    /// with TLS it cannot serve.
    pub(super) fn tls(&self) -> Result<Option<TlsSettings>, ConfigError> {
        let (cert_file, key_file) = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(c), Some(k)) => (c.clone(), k.clone()),
            (None, None) if self.tls_client_ca_file.is_some() => {
                return Err(ConfigError::TlsFlags("--tls-client-ca-file (SNOWKEEP_TLS_CLIENT_CA_FILE) needs TLS: add --tls-cert-file and --tls-key-file"));
            }
            (None, None) => return Ok(None),
            (Some(_), None) => {
                return Err(ConfigError::TlsFlags("--tls-cert-file (SNOWKEEP_TLS_CERT_FILE) needs --tls-key-file (SNOWKEEP_TLS_KEY_FILE): give both, or neither to serve plaintext"));
            }
            (None, Some(_)) => {
                return Err(ConfigError::TlsFlags("--tls-key-file (SNOWKEEP_TLS_KEY_FILE) needs --tls-cert-file (SNOWKEEP_TLS_CERT_FILE): give both, or neither to serve plaintext"));
            }
        };
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(3600));
        if !(min..=max).contains(&self.tls_reload_interval) {
            return Err(ConfigError::OutOfRange {
                flag: "--tls-reload-interval (SNOWKEEP_TLS_RELOAD_INTERVAL)",
                value: self.tls_reload_interval,
                min,
                max,
            });
        }
        let settings = TlsSettings {
            cert_file,
            key_file,
            client_ca_file: self.tls_client_ca_file.clone(),
            reload_interval: self.tls_reload_interval,
        };
        crate::tls::check(&settings)?;
        Ok(Some(settings))
    }

    /// Parses `--allow-cidrs`: CIDR ranges or single addresses; empty
    /// entries are skipped (an empty list allows every address).
    pub(super) fn allow_cidrs(&self) -> Result<Vec<IpNet>, ConfigError> {
        self.allow_cidrs
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.parse::<IpNet>()
                    .or_else(|_| e.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map_err(|_| ConfigError::AllowCidr(e.to_owned()))
            })
            .collect()
    }

    /// Parses `--cors-allow-origins`: `*`, or origins `scheme://host[:port]`
    /// with no path; empty entries are skipped.
    pub(super) fn cors_allow_origins(&self) -> Result<CorsOrigins, ConfigError> {
        let entries: Vec<&str> = self
            .cors_allow_origins
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
            .collect();
        if entries.is_empty() {
            return Ok(CorsOrigins::None);
        }
        if entries == ["*"] {
            return Ok(CorsOrigins::Any);
        }
        let origins = entries
            .into_iter()
            .map(|e| {
                let origin = e.trim_end_matches('/');
                let uri: http::Uri = origin
                    .parse()
                    .map_err(|_| ConfigError::CorsOrigin(e.to_owned()))?;
                let plain = matches!(uri.scheme_str(), Some("http" | "https"))
                    && uri.host().is_some()
                    && uri.path_and_query().is_none_or(|p| p.as_str() == "/");
                match plain {
                    true => Ok(origin.to_owned()),
                    false => Err(ConfigError::CorsOrigin(e.to_owned())),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(CorsOrigins::List(origins))
    }

    /// Checks `--admin-listen`: the status page needs etcd and an address
    /// of its own.
    pub(super) fn check_admin_listen(&self, store: &StoreConfig) -> Result<(), ConfigError> {
        let Some(address) = self.admin_listen else {
            return Ok(());
        };
        let problem = if matches!(store, StoreConfig::SingleInstance { .. }) {
            Some("the status page shows a cluster's state, which is kept in etcd: add --etcd-endpoints (the single-instance store has no status page)")
        } else if address.port() != 0 && (address == self.listen || address == self.metrics_listen)
        {
            Some("the status page needs an address of its own, not the one of --listen or --metrics-listen")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(ConfigError::AdminListen { address, problem }),
            None => Ok(()),
        }
    }
}

/// `--admin-listen`: `HOST:PORT`, or a port alone, which binds the loopback
/// address 127.0.0.1 so the page stays on the host unless an address says
/// otherwise.
fn parse_admin_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)));
    }
    text.parse().map_err(|_| {
        format!("{text:?} is neither HOST:PORT (e.g. 127.0.0.1:9465, [::1]:9465) nor a port (e.g. 9465, which listens on 127.0.0.1)")
    })
}

/// The web origins `--cors-allow-origins` lets call from a browser.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CorsOrigins {
    /// No cross-origin calls (no CORS headers at all): the default.
    #[default]
    None,
    /// Any origin (`*`).
    Any,
    /// These origins, each `scheme://host[:port]`.
    List(Vec<String>),
}
