//! How the server reaches etcd when etcd is secured: TLS (a CA bundle to
//! verify the members' server certificates, optionally a client certificate)
//! and etcd's own user/password authentication. One [`EtcdAccess`] is built
//! by the server's configuration from the `--etcd-*` flags and given to every etcd
//! client the server (or a tool on its code, like snowkeep-scale) makes, so
//! every path to etcd uses the same options.
//!
//! Also here: recognising etcd's refusals of those settings in an
//! etcd-client error ([`refusal_of`]), so a wrong password or an untrusted
//! certificate is reported as what it is, with the flag to fix, rather than as
//! "etcd is not reachable".
//!
//! Secrets (the password, the client key) never appear in `Debug` output.

use std::fmt;

use snowkeep_core::claim::AccessProblem;

/// TLS and authentication settings for etcd; the default is plaintext
/// without authentication.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// TLS for `https://` endpoints; `None` for `http://` endpoints.
    pub tls: Option<EtcdTls>,
    /// etcd user and password; `None` when etcd's auth is off.
    pub credentials: Option<EtcdCredentials>,
}

/// TLS towards etcd.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM certificates of the CAs that sign the etcd members' server
    /// certificates (the only roots trusted).
    pub ca_pem: Vec<u8>,
    /// The client certificate presented to etcd (for etcd's
    /// `--client-cert-auth`), if any.
    pub client_identity: Option<ClientIdentity>,
}

/// A client certificate chain and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

/// etcd's own authentication: a user and its password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdCredentials {
    /// The etcd user name.
    pub user: String,
    /// Its password (read from `--etcd-password-file`).
    pub password: String,
}

impl EtcdAccess {
    /// Whether requests carry an etcd identity: a user and password, or a
    /// client certificate (etcd takes its common name as the user when its
    /// auth is on).
    pub fn authenticates(&self) -> bool {
        self.credentials.is_some()
            || self
                .tls
                .as_ref()
                .is_some_and(|t| t.client_identity.is_some())
    }
}

impl fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls", &self.tls.is_some())
            .field(
                "client_certificate",
                &self
                    .tls
                    .as_ref()
                    .is_some_and(|t| t.client_identity.is_some()),
            )
            .field("user", &self.credentials.as_ref().map(|c| c.user.as_str()))
            .finish()
    }
}

/// The settings as one line for the start-up log: whether TLS is on (and
/// with a client certificate), and the etcd user. Never a secret.
impl fmt::Display for EtcdAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tls {
            None => f.write_str("plaintext")?,
            Some(t) if t.client_identity.is_some() => {
                f.write_str("TLS with a client certificate")?
            }
            Some(_) => f.write_str("TLS without a client certificate")?,
        }
        match &self.credentials {
            None => f.write_str(", no etcd user"),
            Some(c) => write!(f, ", etcd user {}", c.user),
        }
    }
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("client_identity", &self.client_identity)
            .finish()
    }
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCredentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// etcd's refusal of this server's TLS connection or credentials, if `e` is
/// one: a wrong user or password, authentication required but not given, a
/// user without permission on snowkeep's keys, an untrusted server
/// certificate, or a client certificate etcd wants and did not get (or does
/// not trust). `None` for anything else (an unreachable member, a timeout).
/// `access` names the user in a permission refusal and tells a missing client
/// certificate from a refused one.
pub fn refusal_of(e: &etcd_client::Error, access: &EtcdAccess) -> Option<AccessProblem> {
    use tonic::Code;
    if let etcd_client::Error::GRpcStatus(status) = e {
        let message = status.message();
        match status.code() {
            Code::InvalidArgument if message.contains("authentication failed") => {
                return Some(AccessProblem::Authentication)
            }
            Code::InvalidArgument if message.contains("user name is empty") => {
                return Some(AccessProblem::AuthenticationRequired)
            }
            Code::FailedPrecondition if message.contains("authentication is not enabled") => {
                return None
            }
            Code::PermissionDenied => {
                return Some(AccessProblem::Permission {
                    user: user_description(access),
                })
            }
            _ => {}
        }
    }
    match tls_refusal(&chain_text(e)) {
        Some(AccessProblem::ClientCertificate)
            if access
                .tls
                .as_ref()
                .is_some_and(|t| t.client_identity.is_none()) =>
        {
            Some(AccessProblem::ClientCertificateMissing)
        }
        other => other,
    }
}

/// The etcd user whose permissions etcd checks, quoted, and where its name
/// comes from: `--etcd-user`, or without it the client certificate's common
/// name (etcd takes that as the user of a request without a token).
pub fn user_description(access: &EtcdAccess) -> String {
    if let Some(credentials) = &access.credentials {
        return format!("{:?} (--etcd-user)", credentials.user);
    }
    let identity = access.tls.as_ref().and_then(|t| t.client_identity.as_ref());
    match identity.and_then(common_name) {
        Some(cn) => format!(
            "{cn:?} (the common name of --etcd-cert-file, which etcd takes as the user without --etcd-user)"
        ),
        None => "(none: give --etcd-user and --etcd-password-file)".to_owned(),
    }
}

/// The common name of the identity's leaf certificate.
fn common_name(identity: &ClientIdentity) -> Option<String> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::pem_slice_iter(&identity.cert_pem)
        .next()?
        .ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// The TLS refusal named in an error chain's text: rustls's words for a
/// server certificate it does not trust, and for the alerts a server sends
/// when it wants a client certificate or does not trust the one it got.
fn tls_refusal(text: &str) -> Option<AccessProblem> {
    if text.contains("invalid peer certificate") {
        Some(AccessProblem::ServerCertificate)
    } else if [
        "CertificateRequired",
        "BadCertificate",
        "UnknownCA",
        "certificate required",
        "bad certificate",
        "unknown certificate authority",
    ]
    .iter()
    .any(|alert| text.contains(alert))
    {
        Some(AccessProblem::ClientCertificate)
    } else if text.contains("InvalidContentType") || text.contains("corrupt message") {
        // A plaintext answer to a TLS hello: the member serves http://.
        Some(AccessProblem::TlsNotServed)
    } else {
        None
    }
}

/// `e` and its sources, joined with ": ".
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(e: &etcd_client::Error) -> Option<AccessProblem> {
        let access = EtcdAccess {
            tls: None,
            credentials: Some(EtcdCredentials {
                user: "snowkeep".into(),
                password: "secret".into(),
            }),
        };
        refusal_of(e, &access)
    }

    fn status(code: tonic::Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn etcd_auth_answers_are_recognised() {
        use tonic::Code;
        assert_eq!(
            refusal(&status(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password"
            )),
            Some(AccessProblem::Authentication)
        );
        assert_eq!(
            refusal(&status(
                Code::InvalidArgument,
                "etcdserver: user name is empty"
            )),
            Some(AccessProblem::AuthenticationRequired)
        );
        assert_eq!(
            refusal(&status(
                Code::PermissionDenied,
                "etcdserver: permission denied"
            )),
            Some(AccessProblem::Permission {
                user: "\"snowkeep\" (--etcd-user)".into()
            })
        );
        assert_eq!(
            refusal(&status(Code::Unavailable, "tcp connect error")),
            None
        );
        assert_eq!(
            refusal(&status(
                Code::InvalidArgument,
                "etcdserver: too many operations"
            )),
            None
        );
    }

    #[test]
    fn a_certificate_alert_without_a_client_certificate_is_a_missing_one() {
        let alert = status(
            tonic::Code::Unknown,
            "transport error: received fatal alert: CertificateRequired",
        );
        let tls = |client_identity| EtcdAccess {
            tls: Some(EtcdTls {
                ca_pem: b"ca".to_vec(),
                client_identity,
            }),
            credentials: None,
        };
        assert_eq!(
            refusal_of(&alert, &tls(None)),
            Some(AccessProblem::ClientCertificateMissing)
        );
        let identity = ClientIdentity {
            cert_pem: b"cert".to_vec(),
            key_pem: b"key".to_vec(),
        };
        assert_eq!(
            refusal_of(&alert, &tls(Some(identity))),
            Some(AccessProblem::ClientCertificate)
        );
    }

    #[test]
    fn tls_refusals_are_recognised_in_the_chain_text() {
        assert_eq!(
            tls_refusal("transport error: invalid peer certificate: UnknownIssuer"),
            Some(AccessProblem::ServerCertificate)
        );
        assert_eq!(
            tls_refusal("received fatal alert: CertificateRequired"),
            Some(AccessProblem::ClientCertificate)
        );
        assert_eq!(
            tls_refusal("received fatal alert: BadCertificate"),
            Some(AccessProblem::ClientCertificate)
        );
        assert_eq!(tls_refusal("tcp connect error: Connection refused"), None);
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let access = EtcdAccess {
            tls: Some(EtcdTls {
                ca_pem: b"ca".to_vec(),
                client_identity: Some(ClientIdentity {
                    cert_pem: b"cert".to_vec(),
                    key_pem: b"very-secret-key".to_vec(),
                }),
            }),
            credentials: Some(EtcdCredentials {
                user: "snowkeep".into(),
                password: "hunter2-secret".into(),
            }),
        };
        let shown = format!("{access:?} {:?} {:?}", access.tls, access.credentials);
        assert!(!shown.contains("very-secret-key"), "{shown}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        assert!(shown.contains("snowkeep"), "{shown}");
        assert_eq!(
            access.to_string(),
            "TLS with a client certificate, etcd user snowkeep"
        );
    }

    #[test]
    fn the_start_up_line_names_tls_and_the_user_in_words() {
        assert_eq!(EtcdAccess::default().to_string(), "plaintext, no etcd user");
        let server_only = EtcdAccess {
            tls: Some(EtcdTls {
                ca_pem: b"ca".to_vec(),
                client_identity: None,
            }),
            credentials: None,
        };
        assert_eq!(
            server_only.to_string(),
            "TLS without a client certificate, no etcd user"
        );
    }
}
