//! TLS for the clients (feature `tls`: tonic's rustls with the ring
//! provider): the CA bundle that verifies snowkeep servers and, for servers
//! that require client certificates (`--tls-client-ca-file`), the client's
//! own certificate and key. Used with `https://` endpoints by
//! [`RemoteClient::new_with_tls`](crate::RemoteClient::new_with_tls) and
//! [`EmbeddedGenerator::start_with_tls`](crate::EmbeddedGenerator::start_with_tls).

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::error::ClientError;

/// A client's TLS settings: PEM bytes, cheap to clone.
#[derive(Clone, Debug)]
pub struct ClientTls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    server_name: Option<String>,
}

/// The bytes of `path`, the file of setting `parameter` (`tls.ca`,
/// `tls.cert`, `tls.key`), or an error naming both.
fn read(parameter: &str, path: &Path) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|e| ClientError::Tls {
        detail: format!("{parameter}: cannot read {}: {e}", path.display()),
    })
}

impl ClientTls {
    /// Trusts the CA certificates of `ca_pem` (PEM) only.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            identity: None,
            server_name: None,
        }
    }

    /// Trusts the CA certificates of the PEM file `ca_file` only.
    ///
    /// # Errors
    /// [`ClientError::Tls`] when the file cannot be read.
    pub fn from_ca_file(ca_file: impl AsRef<Path>) -> Result<Self, ClientError> {
        Ok(Self::new(read("tls.ca", ca_file.as_ref())?))
    }

    /// Presents this certificate chain and key (PEM) to servers that ask for
    /// one (mTLS).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// [`ClientTls::identity`] from PEM files.
    ///
    /// # Errors
    /// [`ClientError::Tls`] when a file cannot be read.
    pub fn identity_files(
        self,
        cert_file: impl AsRef<Path>,
        key_file: impl AsRef<Path>,
    ) -> Result<Self, ClientError> {
        let cert = read("tls.cert", cert_file.as_ref())?;
        let key = read("tls.key", key_file.as_ref())?;
        Ok(self.identity(cert, key))
    }

    /// Checks servers' certificates for `name` instead of the endpoint's
    /// host (for endpoints given by address).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// `endpoint` with these settings (for code that builds its own
    /// channels, such as the servers' peer clock check).
    ///
    /// # Errors
    /// [`ClientError::Tls`] for settings tonic refuses.
    pub fn apply(&self, endpoint: Endpoint) -> Result<Endpoint, ClientError> {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            tls = tls.domain_name(name.clone());
        }
        endpoint.tls_config(tls).map_err(|e| ClientError::Tls {
            detail: e.to_string(),
        })
    }
}
