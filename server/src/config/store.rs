//! The store flags: etcd's client URLs with TLS and authentication towards
//! etcd (into [`StoreConfig`] and `snowkeep_etcd`'s [`EtcdAccess`]), or the
//! single-instance store's directory.

use std::path::PathBuf;

use snowkeep_etcd::access::{ClientIdentity, EtcdAccess, EtcdCredentials, EtcdTls};

use super::etcd_files::{read_certificates, read_password, read_private_key};
use super::{ConfigError, EndpointProblem, StoreConfig, DEFAULT_STATE_DIR};

/// Where machine-id leases are kept, and how etcd is reached.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Store (etcd or the single-instance store)")]
pub struct StoreArgs {
    /// etcd client URLs (comma-separated), `http://host:port` (or `host:port`)
    /// or, for TLS, `https://host:port` (all of one scheme), e.g.
    /// http://127.0.0.1:2379. Without it the server runs on the
    /// single-instance store.
    #[arg(long, env = "SNOWKEEP_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// CA bundle (PEM) that signs the etcd members' server certificates: the
    /// only roots trusted for https:// endpoints, and required with them (for
    /// a public CA, give the system bundle, e.g.
    /// /etc/ssl/certs/ca-certificates.crt). Read at start.
    #[arg(long, env = "SNOWKEEP_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM, leaf first) presented to etcd, for etcd's
    /// --client-cert-auth; needs --etcd-key-file. Read at start.
    #[arg(long, env = "SNOWKEEP_ETCD_CERT_FILE")]
    pub etcd_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert-file. Read at start.
    #[arg(long, env = "SNOWKEEP_ETCD_KEY_FILE")]
    pub etcd_key_file: Option<PathBuf>,
    /// etcd user, when etcd's authentication is enabled; needs
    /// --etcd-password-file.
    #[arg(long, env = "SNOWKEEP_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password (one trailing newline is
    /// ignored). The password is taken only from a file, never from the
    /// command line, and never logged. Read at start.
    #[arg(long, env = "SNOWKEEP_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// Directory of the single-instance store's state file (used without --etcd-endpoints).
    #[arg(long, env = "SNOWKEEP_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

impl StoreArgs {
    /// etcd at the checked `--etcd-endpoints`, or without them the
    /// single-instance store in `--state-dir`.
    pub(super) fn store(&self) -> Result<StoreConfig, ConfigError> {
        if self.etcd_endpoints.is_empty() {
            return Ok(StoreConfig::SingleInstance {
                state_dir: self.state_dir.clone(),
            });
        }
        let endpoints = self
            .etcd_endpoints
            .iter()
            .map(|e| {
                parse_endpoint(e).map_err(|problem| ConfigError::Endpoint {
                    entry: e.clone(),
                    problem,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(StoreConfig::Etcd { endpoints })
    }

    /// Checks the etcd TLS and authentication flags against the endpoints,
    /// reads the files they name and builds [`EtcdAccess`].
    ///
    /// Decided here: `https://` endpoints need `--etcd-ca-file` (the system
    /// roots are never trusted implicitly; a public CA's users give the system
    /// bundle as the file), the endpoints are all `http://` or all `https://`,
    /// and TLS files with `http://` endpoints are refused rather than ignored.
    pub(super) fn etcd_access(&self, store: &StoreConfig) -> Result<EtcdAccess, ConfigError> {
        let given = self.etcd_ca_file.is_some()
            || self.etcd_cert_file.is_some()
            || self.etcd_key_file.is_some()
            || self.etcd_user.is_some()
            || self.etcd_password_file.is_some();
        let StoreConfig::Etcd { endpoints } = store else {
            return match given {
                true => Err(ConfigError::EtcdAccess("--etcd-ca-file, --etcd-cert-file, --etcd-key-file, --etcd-user and --etcd-password-file apply to etcd: add --etcd-endpoints")),
                false => Ok(EtcdAccess::default()),
            };
        };
        let https = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https != 0 && https != endpoints.len() {
            return Err(ConfigError::EtcdAccess("--etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) mixes http:// and https:// client URLs: an etcd cluster serves its clients either with TLS or without, so give every endpoint the same scheme"));
        }
        if self.etcd_cert_file.is_some() != self.etcd_key_file.is_some() {
            return Err(ConfigError::EtcdAccess("--etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE) and --etcd-key-file (SNOWKEEP_ETCD_KEY_FILE) come together: give both (a client certificate and its private key, PEM) or neither"));
        }
        if self.etcd_user.is_some() != self.etcd_password_file.is_some() {
            return Err(ConfigError::EtcdAccess("--etcd-user (SNOWKEEP_ETCD_USER) and --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE) come together: give both or neither"));
        }
        let tls = match https {
            0 => self.plaintext()?,
            _ => Some(self.etcd_tls()?),
        };
        Ok(EtcdAccess {
            tls,
            credentials: self.credentials()?,
        })
    }

    /// `http://` endpoints: refused with TLS files rather than ignoring them.
    fn plaintext(&self) -> Result<Option<EtcdTls>, ConfigError> {
        if self.etcd_ca_file.is_some() || self.etcd_cert_file.is_some() {
            return Err(ConfigError::EtcdAccess("--etcd-ca-file, --etcd-cert-file and --etcd-key-file are for TLS to etcd, but every --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) URL is plaintext http://: give the members' https:// client URLs, or drop the TLS flags"));
        }
        Ok(None)
    }

    /// `https://` endpoints: the CA bundle (required) and the client
    /// certificate and key (if given), read and checked.
    fn etcd_tls(&self) -> Result<EtcdTls, ConfigError> {
        let Some(ca_file) = &self.etcd_ca_file else {
            return Err(ConfigError::EtcdAccess("https:// etcd endpoints need --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE), the CA bundle (PEM) that signs the etcd members' server certificates; for certificates from a public CA give the system bundle, e.g. /etc/ssl/certs/ca-certificates.crt"));
        };
        const CA: &str = "--etcd-ca-file (SNOWKEEP_ETCD_CA_FILE)";
        const CERT: &str = "--etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE)";
        const KEY: &str = "--etcd-key-file (SNOWKEEP_ETCD_KEY_FILE)";
        let ca_pem = read_certificates(CA, ca_file)?;
        let client_identity = match (&self.etcd_cert_file, &self.etcd_key_file) {
            (Some(cert), Some(key)) => Some(ClientIdentity {
                cert_pem: read_certificates(CERT, cert)?,
                key_pem: read_private_key(KEY, key)?,
            }),
            _ => None,
        };
        Ok(EtcdTls {
            ca_pem,
            client_identity,
        })
    }

    /// The etcd user and the password read from its file, if given.
    fn credentials(&self) -> Result<Option<EtcdCredentials>, ConfigError> {
        let (Some(user), Some(file)) = (&self.etcd_user, &self.etcd_password_file) else {
            return Ok(None);
        };
        if user.is_empty() || user.chars().any(char::is_control) {
            return Err(ConfigError::EtcdAccess("--etcd-user (SNOWKEEP_ETCD_USER) is empty or holds control characters: give the etcd user's name"));
        }
        Ok(Some(EtcdCredentials {
            user: user.clone(),
            password: read_password(file)?,
        }))
    }
}

/// Checks one `--etcd-endpoints` entry and returns the client URL to use,
/// `http://host:port` or `https://host:port` (a bare `host:port` gets
/// `http://`, as etcdctl does).
fn parse_endpoint(entry: &str) -> Result<String, EndpointProblem> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err(EndpointProblem::Empty);
    }
    let (scheme, rest) = match entry.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => ("http", rest),
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => ("https", rest),
        Some(_) => return Err(EndpointProblem::Scheme),
        None => ("http", entry),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let authority: http::uri::Authority = rest.parse().map_err(|_| EndpointProblem::Malformed)?;
    let well_formed = authority.as_str() == rest
        && !rest.contains(['@', '/', '?', '#'])
        && !authority.host().is_empty()
        && authority.port_u16().is_some_and(|p| p != 0);
    if !well_formed {
        return Err(EndpointProblem::Malformed);
    }
    Ok(format!("{scheme}://{authority}"))
}
