//! `TestPki`: certificates made in the test with rcgen, written as PEM files
//! to a temp dir: a CA, a server certificate for 127.0.0.1 and localhost,
//! client certificates signed by the CA, and a second CA that signs nothing
//! the servers trust (for "wrong CA" tests).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use tempfile::TempDir;

/// A CA and the certificates it signed, as files.
pub struct TestPki {
    dir: TempDir,
}

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8).
    pub key: PathBuf,
}

/// A CA: its certificate file and what signs with it.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
}

fn new_ca(name: &str) -> (Ca, String) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("self-sign CA");
    (
        Ca {
            issuer: Issuer::new(params, key),
        },
        cert.pem(),
    )
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

impl TestPki {
    /// Makes the CA ("snowkeep test CA"), a server certificate with IP SAN
    /// 127.0.0.1 and DNS SAN localhost, client certificates with common
    /// names `snowkeep-client` and `root` (etcd maps a client certificate's
    /// common name to a user when a request carries no token), and an
    /// unrelated CA; all in a new temp dir.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ca, ca_pem) = new_ca("snowkeep test CA");
        let (_, other_pem) = new_ca("some other CA");
        std::fs::write(dir.path().join("ca.pem"), ca_pem).expect("write CA");
        std::fs::write(dir.path().join("other-ca.pem"), other_pem).expect("write CA");
        let pki = Self { dir };
        pki.sign(
            &ca,
            "server",
            "127.0.0.1",
            vec![
                SanType::IpAddress([127, 0, 0, 1].into()),
                SanType::DnsName("localhost".try_into().expect("DNS name")),
            ],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        pki.sign(
            &ca,
            "client",
            "snowkeep-client",
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        pki.sign(
            &ca,
            "root-client",
            "root",
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        // One the CA signed, valid only in 2020.
        pki.sign_valid(&ca, "expired-client", "snowkeep-client", (2020, 2021));
        // A client certificate the CA never signed (self-signed).
        let (stranger, _) = new_ca("stranger");
        pki.sign(
            &stranger,
            "stranger-client",
            "snowkeep-client",
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        pki
    }

    fn sign(
        &self,
        ca: &Ca,
        name: &str,
        common_name: &str,
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
    ) {
        self.sign_with(ca, name, common_name, sans, usage, None);
    }

    /// A client certificate valid from January 1 of `years.0` to January 1
    /// of `years.1`.
    fn sign_valid(&self, ca: &Ca, name: &str, common_name: &str, years: (i32, i32)) {
        let usage = ExtendedKeyUsagePurpose::ClientAuth;
        self.sign_with(ca, name, common_name, Vec::new(), usage, Some(years));
    }

    fn sign_with(
        &self,
        ca: &Ca,
        name: &str,
        common_name: &str,
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
        valid_years: Option<(i32, i32)>,
    ) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        if let Some((from, to)) = valid_years {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(to, 1, 1);
        }
        params.subject_alt_names = sans;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca.issuer).expect("sign");
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).expect("write cert");
        std::fs::write(self.path(&format!("{name}.key")), key.serialize_pem()).expect("write key");
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA's certificate (the `--trusted-ca-file` of etcd, the
    /// `--etcd-ca-file` of servers).
    pub fn ca_file(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A CA certificate that signed none of these certificates.
    pub fn other_ca_file(&self) -> PathBuf {
        self.path("other-ca.pem")
    }

    /// etcd's server certificate (127.0.0.1, localhost).
    pub fn server(&self) -> CertFiles {
        self.cert_files("server")
    }

    /// The servers' client certificate (CN `snowkeep-client`, no etcd user).
    pub fn client(&self) -> CertFiles {
        self.cert_files("client")
    }

    /// The test's own client certificate for administering etcd (CN `root`).
    pub fn root_client(&self) -> CertFiles {
        self.cert_files("root-client")
    }

    /// A client certificate the CA signed (CN `snowkeep-client`) that
    /// expired in 2021.
    pub fn expired_client(&self) -> CertFiles {
        self.cert_files("expired-client")
    }

    /// A client certificate signed by a CA etcd does not trust.
    pub fn stranger_client(&self) -> CertFiles {
        self.cert_files("stranger-client")
    }

    fn cert_files(&self, name: &str) -> CertFiles {
        CertFiles {
            cert: self.path(&format!("{name}.pem")),
            key: self.path(&format!("{name}.key")),
        }
    }
}
