//! The TLS probe run before a server's first etcd request: one TLS
//! connection of our own to each `https://` endpoint, with the same CA and
//! client certificate as the gRPC clients, that reads what the member answers
//! and sends nothing after the handshake.
//!
//! Why it exists: under TLS 1.3 a member checks the client certificate only
//! after the client's handshake is done, so its refusal (an alert such as
//! `certificate_required` or `bad_certificate`) comes after the handshake.
//! The gRPC client writes its HTTP/2 preface at once; the member closes the
//! connection with that preface unread, the kernel answers with a reset, and
//! whether the client then reads the alert or only sees "connection closed" or
//! "broken pipe" is a race. The probe never writes after its handshake, so the
//! member reads everything we sent and its alert arrives before its close.
//! Under TLS 1.2 the same alert ends the handshake itself.
//!
//! The verdict does not depend on an error text either: a member that asked
//! for a client certificate (the probe's certificate resolver records the
//! request) and closed the connection before sending any application data has
//! refused the certificate, whatever alert was or was not read. A member that
//! accepts sends its HTTP/2 settings at once (the probe offers ALPN `h2`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::{AlertDescription, SignatureScheme};
use tokio::io::AsyncReadExt;

use super::access::{ClientIdentity, EtcdTls};
use snowkeep_core::claim::AccessProblem;

/// What one probe of one endpoint found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Probe {
    /// The member completed the handshake and sent application data, or
    /// stayed silent (without closing) until the probe's time ran out.
    Accepted,
    /// The member refused this server's TLS settings.
    Refused {
        /// What it refused.
        problem: AccessProblem,
        /// What the probe saw, for the log.
        seen: String,
    },
    /// No verdict: the member is not reachable, or the connection failed in
    /// a way that says nothing about certificates.
    Unanswered(String),
}

/// Records whether the member asked for a client certificate, and presents
/// ours (if any) when it does.
#[derive(Debug)]
struct RecordingResolver {
    key: Option<Arc<CertifiedKey>>,
    asked: AtomicBool,
}

impl rustls::client::ResolvesClientCert for RecordingResolver {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.asked.store(true, Ordering::SeqCst);
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        // Also without a certificate: the resolver must be asked, to record
        // that the member wants one.
        true
    }
}

/// Probes the endpoint `url` (`https://host:port`) with `tls`, within
/// `within`, and gives the verdict. `now_unix_s` tells an expired client
/// certificate from another refused one.
pub(super) async fn probe(url: &str, tls: &EtcdTls, within: Duration, now_unix_s: i64) -> Probe {
    let (host, port) = match host_port(url) {
        Some(hp) => hp,
        None => return Probe::Unanswered(format!("cannot parse {url} as https://host:port")),
    };
    let (config, resolver) = match client_config(tls) {
        Ok(c) => c,
        Err(e) => return Probe::Unanswered(format!("cannot build the TLS client: {e}")),
    };
    let Ok(name) = ServerName::try_from(host.clone()) else {
        return Probe::Unanswered(format!("{host:?} is not a DNS name or IP address"));
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut handshaken = false;
    let outcome = tokio::time::timeout(within, async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| Seen::Unreachable(e.to_string()))?;
        let mut stream = connector.connect(name, tcp).await.map_err(Seen::from_io)?;
        handshaken = true;
        // Read only: a write now could make the member's close a reset.
        let mut buf = [0u8; 512];
        match stream.read(&mut buf).await {
            Ok(0) => Err(Seen::Closed(
                "the connection closed right after the handshake".into(),
            )),
            Ok(_) => Ok(()),
            Err(e) => Err(Seen::from_io(e)),
        }
    })
    .await;
    let asked = resolver.asked.load(Ordering::SeqCst);
    match outcome {
        Ok(Ok(())) => Probe::Accepted,
        // Past the handshake and silent: no refusal seen.
        Err(_) if handshaken => Probe::Accepted,
        Err(_) => Probe::Unanswered(format!(
            "no TLS handshake within {}",
            humantime::format_duration(within)
        )),
        Ok(Err(seen)) => verdict(seen, asked, tls.client_identity.as_ref(), now_unix_s),
    }
}

/// What ended a probe early.
#[derive(Debug)]
enum Seen {
    /// No TCP connection.
    Unreachable(String),
    /// A TLS error (an alert received, a certificate not trusted).
    Tls(rustls::Error),
    /// A close or reset, without a TLS error.
    Closed(String),
}

impl Seen {
    fn from_io(e: std::io::Error) -> Self {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            Some(tls) => Seen::Tls(tls.clone()),
            None => Seen::Closed(e.to_string()),
        }
    }
}

/// The verdict on what the probe saw; `asked` is true when the member asked
/// for a client certificate.
fn verdict(seen: Seen, asked: bool, identity: Option<&ClientIdentity>, now_unix_s: i64) -> Probe {
    let client = |alert: Option<AlertDescription>| client_problem(alert, identity, now_unix_s);
    let problem = match &seen {
        Seen::Unreachable(_) => None,
        Seen::Tls(rustls::Error::InvalidCertificate(_)) => Some(AccessProblem::ServerCertificate),
        Seen::Tls(rustls::Error::AlertReceived(alert)) if is_certificate_alert(*alert) => {
            Some(client(Some(*alert)))
        }
        Seen::Tls(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
            Some(AccessProblem::TlsNotServed)
        }
        // Asked for a certificate, then closed without application data:
        // the certificate was refused, whichever way the close arrived.
        Seen::Tls(_) | Seen::Closed(_) if asked => Some(client(None)),
        Seen::Tls(_) | Seen::Closed(_) => None,
    };
    let seen = match seen {
        Seen::Unreachable(s) | Seen::Closed(s) => s,
        Seen::Tls(e) => e.to_string(),
    };
    match problem {
        Some(problem) => Probe::Refused { problem, seen },
        None => Probe::Unanswered(seen),
    }
}

/// The alerts a member sends about the client certificate (or the key
/// that signed the handshake with it).
fn is_certificate_alert(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::AccessDenied
            | AlertDescription::DecryptError
    )
}

/// Which client-certificate refusal it is: none given, one expired (the
/// member said so, or its notAfter is past by our clock), or one refused.
fn client_problem(
    alert: Option<AlertDescription>,
    identity: Option<&ClientIdentity>,
    now_unix_s: i64,
) -> AccessProblem {
    match identity {
        None => AccessProblem::ClientCertificateMissing,
        Some(_) if alert == Some(AlertDescription::CertificateExpired) => {
            AccessProblem::ClientCertificateExpired
        }
        Some(id) if not_after(id).is_some_and(|t| t < now_unix_s) => {
            AccessProblem::ClientCertificateExpired
        }
        Some(_) => AccessProblem::ClientCertificate,
    }
}

/// The notAfter (Unix seconds) of the identity's leaf certificate.
fn not_after(identity: &ClientIdentity) -> Option<i64> {
    let der = CertificateDer::pem_slice_iter(&identity.cert_pem)
        .next()?
        .ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// The probe's client configuration: `tls`'s CAs as the only roots, ALPN
/// `h2`, and a resolver that records a certificate request.
fn client_config(
    tls: &EtcdTls,
) -> Result<(rustls::ClientConfig, Arc<RecordingResolver>), rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&tls.ca_pem).flatten() {
        roots.add(cert)?;
    }
    let key = match &tls.client_identity {
        Some(id) => {
            let chain = CertificateDer::pem_slice_iter(&id.cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            let key = PrivateKeyDer::from_pem_slice(&id.key_pem)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            Some(Arc::new(CertifiedKey::from_der(chain, key, &provider)?))
        }
        None => None,
    };
    let resolver = Arc::new(RecordingResolver {
        key,
        asked: AtomicBool::new(false),
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((config, resolver))
}

/// The host (brackets of an IPv6 address removed) and port of an
/// `https://host:port` URL; port 443 when none is given.
fn host_port(url: &str) -> Option<(String, u16)> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_owned(), uri.port_u16().unwrap_or(443)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> ClientIdentity {
        ClientIdentity {
            cert_pem: Vec::new(),
            key_pem: Vec::new(),
        }
    }

    #[test]
    fn alerts_about_the_client_certificate_are_refusals() {
        let id = identity();
        for alert in [
            AlertDescription::CertificateRequired,
            AlertDescription::BadCertificate,
            AlertDescription::UnknownCA,
            AlertDescription::DecryptError,
        ] {
            let seen = Seen::Tls(rustls::Error::AlertReceived(alert));
            assert_eq!(
                verdict(seen, true, Some(&id), 0),
                Probe::Refused {
                    problem: AccessProblem::ClientCertificate,
                    seen: format!("received fatal alert: {alert:?}"),
                }
            );
        }
        let seen = Seen::Tls(rustls::Error::AlertReceived(
            AlertDescription::CertificateExpired,
        ));
        assert!(matches!(
            verdict(seen, true, Some(&id), 0),
            Probe::Refused {
                problem: AccessProblem::ClientCertificateExpired,
                ..
            }
        ));
    }

    /// An identity whose certificate is valid from January 1 of `from` to
    /// January 1 of `to`.
    fn identity_valid(from: i32, to: i32) -> ClientIdentity {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["c".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
        ClientIdentity {
            cert_pem: params.self_signed(&key).unwrap().pem().into_bytes(),
            key_pem: key.serialize_pem().into_bytes(),
        }
    }

    #[test]
    fn a_refused_certificate_is_missing_expired_or_refused() {
        let bad = || Some(AlertDescription::BadCertificate);
        // 2026-01-01T00:00:00Z.
        let now = 1_767_225_600;
        assert_eq!(
            client_problem(bad(), None, now),
            AccessProblem::ClientCertificateMissing
        );
        assert_eq!(
            client_problem(bad(), Some(&identity_valid(2020, 2021)), now),
            AccessProblem::ClientCertificateExpired
        );
        assert_eq!(
            client_problem(bad(), Some(&identity_valid(2020, 2040)), now),
            AccessProblem::ClientCertificate
        );
        assert_eq!(
            client_problem(
                Some(AlertDescription::CertificateExpired),
                Some(&identity_valid(2020, 2040)),
                now
            ),
            AccessProblem::ClientCertificateExpired
        );
    }

    #[test]
    fn a_close_after_a_certificate_request_is_a_refusal_and_without_one_is_not() {
        let closed = || Seen::Closed("connection reset by peer".into());
        assert_eq!(
            verdict(closed(), true, None, 0),
            Probe::Refused {
                problem: AccessProblem::ClientCertificateMissing,
                seen: "connection reset by peer".into(),
            }
        );
        assert_eq!(
            verdict(closed(), true, Some(&identity()), 0),
            Probe::Refused {
                problem: AccessProblem::ClientCertificate,
                seen: "connection reset by peer".into(),
            }
        );
        assert_eq!(
            verdict(closed(), false, Some(&identity()), 0),
            Probe::Unanswered("connection reset by peer".into())
        );
        assert_eq!(
            verdict(Seen::Unreachable("refused".into()), true, None, 0),
            Probe::Unanswered("refused".into())
        );
    }

    #[test]
    fn an_untrusted_server_certificate_and_a_plaintext_port_are_named() {
        let seen = Seen::Tls(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        assert!(matches!(
            verdict(seen, false, None, 0),
            Probe::Refused {
                problem: AccessProblem::ServerCertificate,
                ..
            }
        ));
        let seen = Seen::Tls(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert!(matches!(
            verdict(seen, false, None, 0),
            Probe::Refused {
                problem: AccessProblem::TlsNotServed,
                ..
            }
        ));
    }

    /// How a test server treats its one connection.
    #[derive(Clone, Copy)]
    enum Then {
        /// Sends application data after the handshake.
        Answer,
        /// Resets the connection right after the handshake, without an alert.
        Reset,
    }

    /// A rustls server on a free loopback port speaking only `version`,
    /// asking for a client certificate (`client_auth`: none, optional,
    /// required) and doing `then` with its first connection. Returns its URL
    /// and the CA that signed its certificate.
    async fn server_once(
        version: &'static rustls::SupportedProtocolVersion,
        client_auth: Option<bool>,
        then: Then,
    ) -> (String, EtcdTls) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[version])
            .unwrap();
        let builder = match client_auth {
            None => builder.with_no_client_auth(),
            Some(required) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                );
                let verifier = match required {
                    true => verifier,
                    false => verifier.allow_unauthenticated(),
                };
                builder.with_client_cert_verifier(verifier.build().unwrap())
            }
        };
        let key_der = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        let config = builder
            .with_single_cert(vec![leaf.der().clone()], key_der)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let Ok(mut stream) = acceptor.accept(tcp).await else {
                return; // the alert is sent; the connection closes
            };
            match then {
                Then::Answer => {
                    use tokio::io::AsyncWriteExt;
                    stream.write_all(b"settings").await.unwrap();
                    stream.flush().await.unwrap();
                    let _ = stream.read(&mut [0u8; 16]).await;
                }
                // A zero linger makes the close a reset at once (and so
                // never blocks, which is what the deprecation warns of).
                #[allow(deprecated)]
                Then::Reset => stream.get_ref().0.set_linger(Some(Duration::ZERO)).unwrap(),
            }
        });
        let tls = EtcdTls {
            ca_pem: ca_pem.into_bytes(),
            client_identity: None,
        };
        (url, tls)
    }

    const VERSIONS: [&rustls::SupportedProtocolVersion; 2] =
        [&rustls::version::TLS12, &rustls::version::TLS13];

    async fn probe_of(url: &str, tls: &EtcdTls) -> Probe {
        probe(url, tls, Duration::from_secs(10), 0).await
    }

    #[tokio::test]
    async fn a_refused_missing_certificate_is_named_under_tls_1_2_and_1_3() {
        for version in VERSIONS {
            let (url, tls) = server_once(version, Some(true), Then::Answer).await;
            let verdict = probe_of(&url, &tls).await;
            assert!(
                matches!(
                    verdict,
                    Probe::Refused {
                        problem: AccessProblem::ClientCertificateMissing,
                        ..
                    }
                ),
                "{version:?}: {verdict:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_reset_after_a_certificate_request_is_a_refusal_under_tls_1_2_and_1_3() {
        for version in VERSIONS {
            let (url, tls) = server_once(version, Some(false), Then::Reset).await;
            let verdict = probe_of(&url, &tls).await;
            assert!(
                matches!(
                    verdict,
                    Probe::Refused {
                        problem: AccessProblem::ClientCertificateMissing,
                        ..
                    }
                ),
                "{version:?}: {verdict:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_reset_without_a_certificate_request_is_no_verdict_and_an_answer_accepts() {
        for version in VERSIONS {
            let (url, tls) = server_once(version, None, Then::Reset).await;
            let verdict = probe_of(&url, &tls).await;
            assert!(
                matches!(verdict, Probe::Unanswered(_)),
                "{version:?}: {verdict:?}"
            );
            let (url, tls) = server_once(version, Some(false), Then::Answer).await;
            assert_eq!(probe_of(&url, &tls).await, Probe::Accepted, "{version:?}");
        }
    }

    #[test]
    fn endpoint_urls_give_host_and_port() {
        assert_eq!(
            host_port("https://127.0.0.1:2379"),
            Some(("127.0.0.1".into(), 2379))
        );
        assert_eq!(host_port("https://[::1]:2379"), Some(("::1".into(), 2379)));
        assert_eq!(
            host_port("https://etcd-0.etcd"),
            Some(("etcd-0.etcd".into(), 443))
        );
    }
}
