//! TLS on the gRPC port, with certificates reloaded from their files.
//!
//! tonic's own `ServerTlsConfig` fixes the certificate at start, so the TLS
//! handshake happens inside our listener instead: every accepted connection
//! takes the [`ServerTls`] configuration current at that moment
//! ([`ServerTls::acceptor`]) and `limits::conn::GuardedIo` runs the
//! handshake on the connection's own task, under the listener's handshake
//! timeout. `ServerTls::reload` re-reads the files every
//! `--tls-reload-interval`; when their content changed and parses, the new
//! certificate, key and client CA serve every connection accepted from then
//! on. Connections already open keep the session they negotiated, and the
//! port stays open throughout. A changed file that does not parse (or a key
//! that does not match its certificate) is logged and counted, and the
//! previous certificate keeps serving.
//!
//! rustls with the ring provider only; ALPN offers `h2` (gRPC clients
//! require it). With `--tls-client-ca-file` every client must present a
//! certificate signed by one of that file's CAs (mTLS), or its handshake
//! fails.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use snowkeep_core::metrics as m;

/// The TLS flags, validated: which files to serve and how often to re-read
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// `--tls-cert-file`: PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// `--tls-key-file`: PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf.
    pub key_file: PathBuf,
    /// `--tls-client-ca-file`: PEM CA certificates client certificates must
    /// chain to; `None` asks for no client certificate.
    pub client_ca_file: Option<PathBuf>,
    /// `--tls-reload-interval`: how often the files are re-read.
    pub reload_interval: Duration,
}

/// Why a certificate, key or CA file cannot serve.
#[derive(Debug, Error)]
pub enum TlsError {
    /// The file cannot be read.
    #[error("cannot read {flag} {}", path.display())]
    Read {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no PEM block of the kind the flag needs.
    #[error("{flag} {} holds no {what}: give a PEM file (-----BEGIN {what}-----)", path.display())]
    Empty {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What was expected, e.g. `CERTIFICATE`.
        what: &'static str,
    },
    /// A PEM block or certificate does not parse.
    #[error("{flag} {} is not valid PEM or DER: {detail}", path.display())]
    Malformed {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The parser's words.
        detail: String,
    },
    /// rustls refused the certificate and key (e.g. a key that is not the
    /// certificate's) or the client CAs.
    #[error("{what} cannot serve TLS: {detail}")]
    Refused {
        /// Which files, named by their flags.
        what: &'static str,
        /// rustls's words.
        detail: String,
    },
}

/// What the reload loop compares: the files' bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// A parsed configuration and the leaf certificate's notAfter.
struct Built {
    config: Arc<rustls::ServerConfig>,
    not_after_unix: i64,
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

fn read_all(settings: &TlsSettings) -> Result<Contents, TlsError> {
    Ok(Contents {
        cert: read("--tls-cert-file", &settings.cert_file)?,
        key: read("--tls-key-file", &settings.key_file)?,
        client_ca: settings
            .client_ca_file
            .as_deref()
            .map(|p| read("--tls-client-ca-file", p))
            .transpose()?,
    })
}

/// The certificates of a PEM file, at least one: [`TlsError::Malformed`]
/// for a section that does not parse, [`TlsError::Empty`] for none.
pub fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Malformed {
            flag,
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            flag,
            path: path.to_owned(),
            what: "CERTIFICATE",
        });
    }
    Ok(certs)
}

/// The ring provider: the only one snowkeep builds with.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn build(settings: &TlsSettings, contents: &Contents) -> Result<Built, TlsError> {
    let certs = certificates("--tls-cert-file", &settings.cert_file, &contents.cert)?;
    let leaf = x509_parser::parse_x509_certificate(&certs[0])
        .map_err(|e| TlsError::Malformed {
            flag: "--tls-cert-file",
            path: settings.cert_file.clone(),
            detail: e.to_string(),
        })?
        .1;
    let not_after_unix = leaf.validity().not_after.timestamp();
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            flag: "--tls-key-file",
            path: settings.key_file.clone(),
            what: "PRIVATE KEY",
        },
        e => TlsError::Malformed {
            flag: "--tls-key-file",
            path: settings.key_file.clone(),
            detail: e.to_string(),
        },
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Refused {
            what: "the ring provider",
            detail: e.to_string(),
        })?;
    let builder = match (&settings.client_ca_file, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in certificates("--tls-client-ca-file", path, pem)? {
                roots.add(ca).map_err(|e| TlsError::Malformed {
                    flag: "--tls-client-ca-file",
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider())
                .build()
                .map_err(|e| TlsError::Refused {
                    what: "--tls-client-ca-file",
                    detail: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Refused {
            what: "--tls-cert-file with --tls-key-file",
            detail: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Built {
        config: Arc::new(config),
        not_after_unix,
    })
}

/// Reads and parses the files once, as the server would at start.
///
/// # Errors
/// A file that cannot be read or parsed, or a key that is not the
/// certificate's.
pub fn check(settings: &TlsSettings) -> Result<(), TlsError> {
    build(settings, &read_all(settings)?).map(|_| ())
}

/// The TLS configuration new connections take; shared with the reload loop.
#[derive(Clone)]
pub struct ServerTls {
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the files for the first time.
    ///
    /// # Errors
    /// As [`check`].
    pub fn load(settings: &TlsSettings) -> Result<(Self, Reloader), TlsError> {
        let contents = read_all(settings)?;
        let built = build(settings, &contents)?;
        expiry_gauge().set(built.not_after_unix as f64);
        reloads("ok").increment(0);
        reloads("error").increment(0);
        let tls = ServerTls {
            current: Arc::new(RwLock::new(built.config)),
        };
        let reloader = Reloader {
            tls: tls.clone(),
            settings: settings.clone(),
            seen: Ok(contents),
        };
        Ok((tls, reloader))
    }

    /// An acceptor with the configuration current now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(config)
    }
}

fn reloads(result: &'static str) -> metrics::Counter {
    metrics::counter!(m::TLS_RELOADS_TOTAL, "result" => result)
}

fn expiry_gauge() -> metrics::Gauge {
    metrics::gauge!(m::TLS_CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS)
}

/// Re-reads the files of a [`ServerTls`] (see the module docs).
pub struct Reloader {
    tls: ServerTls,
    settings: TlsSettings,
    /// What the files held at the last look (or why they could not be
    /// read), so one change is acted on (and counted) once.
    seen: Result<Contents, String>,
}

impl Reloader {
    /// Looks at the files once: swaps in a changed, valid configuration.
    /// `Some(true)` when it swapped, `Some(false)` when a change was refused,
    /// `None` when nothing changed since the last look.
    fn look(&mut self) -> Option<bool> {
        let now = read_all(&self.settings).map_err(|e| snowkeep_core::DisplayChain(&e).to_string());
        if now == self.seen {
            return None;
        }
        self.seen = now.clone();
        let built = match now {
            Ok(contents) => build(&self.settings, &contents),
            Err(read) => {
                warn!(error = %read, "TLS files changed and cannot be read; new connections keep the previous certificate");
                reloads("error").increment(1);
                return Some(false);
            }
        };
        match built {
            Ok(built) => {
                *self.tls.current.write().unwrap_or_else(|p| p.into_inner()) = built.config;
                expiry_gauge().set(built.not_after_unix as f64);
                reloads("ok").increment(1);
                info!(
                    cert_file = %self.settings.cert_file.display(),
                    not_after_unix = built.not_after_unix,
                    "TLS certificate reloaded; new connections use it"
                );
                Some(true)
            }
            Err(e) => {
                warn!(error = %snowkeep_core::DisplayChain(&e), "TLS files changed but do not parse; new connections keep the previous certificate until they are fixed");
                reloads("error").increment(1);
                Some(false)
            }
        }
    }

    /// Re-reads the files every `reload_interval` until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.reload_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            // Small files; off the runtime's workers all the same, in case
            // the volume is slow.
            self = match tokio::task::spawn_blocking(move || {
                self.look();
                self
            })
            .await
            {
                Ok(me) => me,
                Err(e) => {
                    warn!(error = %e, "the TLS reload task failed; the certificate serving now stays");
                    return;
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        dir: tempfile::TempDir,
    }

    /// A self-signed certificate for `localhost` and its key, as PEM.
    fn self_signed() -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    impl Pki {
        fn new() -> Self {
            Pki {
                dir: tempfile::tempdir().unwrap(),
            }
        }
        fn write(&self, name: &str, text: &str) -> PathBuf {
            let p = self.dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        }
        fn settings(&self) -> TlsSettings {
            TlsSettings {
                cert_file: self.dir.path().join("tls.crt"),
                key_file: self.dir.path().join("tls.key"),
                client_ca_file: None,
                reload_interval: Duration::from_millis(100),
            }
        }
    }

    #[test]
    fn files_are_refused_naming_the_flag_and_what_is_wrong() {
        let pki = Pki::new();
        let s = pki.settings();
        let err = check(&s).unwrap_err().to_string();
        assert!(err.starts_with("cannot read --tls-cert-file "), "{err}");
        let (cert, key) = self_signed();
        pki.write("tls.crt", "garbage");
        pki.write("tls.key", &key);
        let err = check(&s).unwrap_err().to_string();
        assert!(
            err.ends_with("holds no CERTIFICATE: give a PEM file (-----BEGIN CERTIFICATE-----)"),
            "{err}"
        );
        pki.write("tls.crt", &cert);
        pki.write("tls.key", "");
        let err = check(&s).unwrap_err().to_string();
        assert!(err.contains("--tls-key-file"), "{err}");
        assert!(
            err.ends_with("holds no PRIVATE KEY: give a PEM file (-----BEGIN PRIVATE KEY-----)"),
            "{err}"
        );
        // Another certificate's key.
        let (_, other_key) = self_signed();
        pki.write("tls.key", &other_key);
        let err = check(&s).unwrap_err().to_string();
        assert!(
            err.starts_with("--tls-cert-file with --tls-key-file cannot serve TLS: "),
            "{err}"
        );
        pki.write("tls.key", &key);
        check(&s).unwrap();
    }

    #[test]
    fn a_reload_swaps_only_a_changed_valid_certificate() {
        let pki = Pki::new();
        let s = pki.settings();
        let (cert, key) = self_signed();
        pki.write("tls.crt", &cert);
        pki.write("tls.key", &key);
        let (tls, mut reloader) = ServerTls::load(&s).unwrap();
        let first = tls.acceptor().config().clone();
        assert_eq!(first.alpn_protocols, vec![b"h2".to_vec()]);
        assert_eq!(reloader.look(), None);
        // Garbage: refused once, the old configuration stays.
        pki.write(
            "tls.crt",
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        );
        assert_eq!(reloader.look(), Some(false));
        assert_eq!(reloader.look(), None);
        assert!(Arc::ptr_eq(&first, tls.acceptor().config()));
        // A new valid pair: swapped.
        let (cert2, key2) = self_signed();
        pki.write("tls.key", &key2);
        pki.write("tls.crt", &cert2);
        assert_eq!(reloader.look(), Some(true));
        assert!(!Arc::ptr_eq(&first, tls.acceptor().config()));
        // A missing file is a failed reload, not a crash.
        std::fs::remove_file(s.key_file.clone()).unwrap();
        assert_eq!(reloader.look(), Some(false));
    }
}
