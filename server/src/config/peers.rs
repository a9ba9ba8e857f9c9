//! The peer clock check's flags: the address this server registers for
//! peers and how it calls them, into [`PeerSkewConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::tls::TlsSettings;

use super::{ConfigError, DEFAULT_PEER_SKEW_INTERVAL, DEFAULT_PEER_SKEW_WARN};

/// Registration in etcd for peers, and the check of their clocks.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Peer clock check")]
pub struct PeerArgs {
    /// `host:port` where peer servers reach this server's gRPC port, registered
    /// in etcd for the peer clock check. Default: --listen, or HOSTNAME:PORT
    /// when --listen is a wildcard address (on Kubernetes, set it to
    /// `$(POD_IP):50051`).
    #[arg(long, env = "SNOWKEEP_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// How often to measure the clock offset to every peer server of the
    /// namespace (NTP-style, through InfoService.GetInfo); 0s turns it off.
    #[arg(long, env = "SNOWKEEP_PEER_SKEW_INTERVAL", default_value = DEFAULT_PEER_SKEW_INTERVAL, value_parser = humantime::parse_duration)]
    pub peer_skew_interval: Duration,
    /// Peer clock offset above which a warning is logged.
    #[arg(long, env = "SNOWKEEP_PEER_SKEW_WARN", default_value = DEFAULT_PEER_SKEW_WARN, value_parser = humantime::parse_duration)]
    pub peer_skew_warn: Duration,
    /// With TLS on the gRPC port: PEM CA certificates that sign the peers'
    /// server certificates, so the peer clock check calls peers over TLS
    /// (presenting this server's own certificate, for peers that require
    /// client certificates). Without it the check is off under TLS.
    #[arg(long, env = "SNOWKEEP_PEER_TLS_CA_FILE")]
    pub peer_tls_ca_file: Option<PathBuf>,
    /// The name peers' certificates carry, checked instead of the advertised
    /// address (peers are called by address, which certificates rarely
    /// name), e.g. the Service's DNS name.
    #[arg(long, env = "SNOWKEEP_PEER_TLS_SERVER_NAME")]
    pub peer_tls_server_name: Option<String>,
}

/// Settings of the peer clock check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSkewConfig {
    /// `host:port` registered for peers to call.
    pub advertise_address: String,
    /// Period of the check; zero turns it off.
    pub interval: Duration,
    /// Offset that logs a warning.
    pub warn: Duration,
    /// TLS towards peers (`--peer-tls-ca-file`); `None`: plaintext, which
    /// only works while the gRPC port serves plaintext.
    pub tls: Option<PeerTls>,
}

/// How the peer clock check reaches peers that serve TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTls {
    /// `--peer-tls-ca-file`: the CA bundle peers' certificates chain to.
    pub ca_file: PathBuf,
    /// `--peer-tls-server-name`: the name checked in their certificates.
    pub server_name: Option<String>,
    /// This server's own certificate and key (`--tls-cert-file`,
    /// `--tls-key-file`), presented to peers that require one; read again
    /// for every new peer connection, so a rotated pair is used.
    pub identity: (PathBuf, PathBuf),
}

impl PeerArgs {
    /// Builds the check's settings. `tls` is the gRPC port's: the peer TLS
    /// flags only apply when this server (and so its peers) serves TLS.
    /// `listen` is the default advertised address (see [`advertise_default`]).
    pub(super) fn skew_config(
        &self,
        tls: Option<&TlsSettings>,
        listen: SocketAddr,
    ) -> Result<PeerSkewConfig, ConfigError> {
        Ok(PeerSkewConfig {
            tls: self.tls(tls)?,
            advertise_address: self
                .advertise_address
                .clone()
                .unwrap_or_else(|| advertise_default(listen)),
            interval: self.peer_skew_interval,
            warn: self.peer_skew_warn,
        })
    }

    /// `--peer-tls-ca-file` and `--peer-tls-server-name`, checked against
    /// the gRPC port's TLS, whose certificate is presented to peers.
    fn tls(&self, tls: Option<&TlsSettings>) -> Result<Option<PeerTls>, ConfigError> {
        match (tls, &self.peer_tls_ca_file) {
            (_, None) if self.peer_tls_server_name.is_some() => {
                Err(ConfigError::TlsFlags("--peer-tls-server-name (SNOWKEEP_PEER_TLS_SERVER_NAME) needs --peer-tls-ca-file"))
            }
            (_, None) => Ok(None),
            (None, Some(_)) => {
                Err(ConfigError::TlsFlags("--peer-tls-ca-file (SNOWKEEP_PEER_TLS_CA_FILE) is for peers that serve TLS: add --tls-cert-file and --tls-key-file, or drop it"))
            }
            (Some(t), Some(ca)) => Ok(Some(PeerTls {
                ca_file: ca.clone(),
                server_name: self.peer_tls_server_name.clone(),
                identity: (t.cert_file.clone(), t.key_file.clone()),
            })),
        }
    }
}

/// The address peers use when none is configured: `listen` itself, or this
/// host's name with its port when `listen` is a wildcard address.
fn advertise_default(listen: SocketAddr) -> String {
    if listen.ip().is_unspecified() {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        format!("{host}:{}", listen.port())
    } else {
        listen.to_string()
    }
}
