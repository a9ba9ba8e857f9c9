//! `--etcd-endpoints` and the etcd TLS and authentication flags.

use super::*;

fn endpoint_problem(value: &str) -> Option<EndpointProblem> {
    match parse(&["--etcd-endpoints", value]) {
        Err(ConfigError::Endpoint { problem, .. }) => Some(problem),
        Err(e) => panic!("{value:?}: unexpected {e}"),
        Ok(_) => None,
    }
}

#[test]
fn every_etcd_endpoint_is_checked_once_here() {
    use EndpointProblem::*;
    for (value, problem) in [
        ("unix:///run/etcd.sock", Scheme),
        ("ftp://etcd:2379", Scheme),
        ("https://etcd:2379/v3", Malformed),
        ("grpc://etcd:2379", Scheme),
        ("", Empty),
        ("http://a:1,,http://b:2", Empty),
        ("http://a:1,", Empty),
        ("garbage", Malformed),
        ("http://", Malformed),
        ("http://etcd", Malformed),
        ("http://etcd:0", Malformed),
        ("http://etcd:65536", Malformed),
        ("http://etcd:2379/v3", Malformed),
        ("http://user:pw@etcd:2379", Malformed),
        ("http://etcd:2379?x=1", Malformed),
        ("http://:2379", Malformed),
        ("etcd :2379", Malformed),
    ] {
        assert_eq!(endpoint_problem(value), Some(problem), "{value:?}");
    }
    let c = parse(&[
        "--etcd-endpoints",
        "localhost:2379,http://10.0.0.1:2379/, http://[::1]:2380",
    ])
    .unwrap();
    assert_eq!(
        c.store,
        StoreConfig::Etcd {
            endpoints: vec![
                "http://localhost:2379".into(),
                "http://10.0.0.1:2379".into(),
                "http://[::1]:2380".into()
            ]
        }
    );
}

#[test]
fn an_endpoint_error_names_the_entry_and_the_remedy() {
    let e = parse(&["--etcd-endpoints", "grpc://etcd:2379"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) entry \"grpc://etcd:2379\": only http:// and https:// client URLs are supported; use http://host:port or https://host:port"
    );
}

/// A CA certificate, a client certificate and key, and a password
/// file, in a temp dir.
struct EtcdFiles {
    dir: tempfile::TempDir,
}

impl EtcdFiles {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["snowkeep".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", &ca.pem());
        write("client.pem", &cert.pem());
        write("client.key", &key.serialize_pem());
        write("password", "s3cret-pw\n");
        write("empty", "\n");
        write("garbage", "not pem at all");
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }
}

#[test]
fn tls_and_credentials_flags_build_the_etcd_access() {
    let f = EtcdFiles::new();
    let c = parse(&[
        "--etcd-endpoints",
        "https://a:1,HTTPS://b:2",
        "--etcd-ca-file",
        &f.path("ca.pem"),
        "--etcd-cert-file",
        &f.path("client.pem"),
        "--etcd-key-file",
        &f.path("client.key"),
        "--etcd-user",
        "snowkeep",
        "--etcd-password-file",
        &f.path("password"),
    ])
    .unwrap();
    assert_eq!(
        c.store,
        StoreConfig::Etcd {
            endpoints: vec!["https://a:1".into(), "https://b:2".into()]
        }
    );
    let tls = c.etcd_access.tls.as_ref().unwrap();
    assert!(tls.ca_pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
    assert!(tls.client_identity.is_some());
    let creds = c.etcd_access.credentials.as_ref().unwrap();
    assert_eq!(
        (creds.user.as_str(), creds.password.as_str()),
        ("snowkeep", "s3cret-pw")
    );
    assert!(!format!("{c:?}").contains("s3cret-pw"));
    // Credentials without TLS, and neither.
    let c = parse(&[
        "--etcd-endpoints",
        "http://a:1",
        "--etcd-user",
        "snowkeep",
        "--etcd-password-file",
        &f.path("password"),
    ])
    .unwrap();
    assert!(c.etcd_access.tls.is_none() && c.etcd_access.credentials.is_some());
    assert_eq!(
        parse(&["--etcd-endpoints", "http://a:1"])
            .unwrap()
            .etcd_access,
        EtcdAccess::default()
    );
}

#[test]
fn etcd_access_flags_that_do_not_fit_are_refused_with_the_rule() {
    let f = EtcdFiles::new();
    let (ca, cert, key, pw) = (
        f.path("ca.pem"),
        f.path("client.pem"),
        f.path("client.key"),
        f.path("password"),
    );
    let refused = |args: &[&str], want: &str| {
        let err = parse(args).unwrap_err().to_string();
        assert!(err.contains(want), "{args:?}: {err}");
    };
    refused(
        &[
            "--etcd-endpoints",
            "http://a:1,https://b:2",
            "--etcd-ca-file",
            &ca,
        ],
        "mixes http:// and https://",
    );
    refused(
        &["--etcd-endpoints", "https://a:1"],
        "https:// etcd endpoints need --etcd-ca-file",
    );
    refused(
        &["--etcd-endpoints", "http://a:1", "--etcd-ca-file", &ca],
        "every --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) URL is plaintext http://",
    );
    refused(
        &[
            "--etcd-endpoints",
            "https://a:1",
            "--etcd-ca-file",
            &ca,
            "--etcd-cert-file",
            &cert,
        ],
        "come together: give both (a client certificate",
    );
    refused(
        &[
            "--etcd-endpoints",
            "https://a:1",
            "--etcd-ca-file",
            &ca,
            "--etcd-key-file",
            &key,
        ],
        "come together: give both (a client certificate",
    );
    refused(&["--etcd-endpoints", "http://a:1", "--etcd-user", "u"], "--etcd-user (SNOWKEEP_ETCD_USER) and --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE) come together");
    refused(
        &[
            "--etcd-endpoints",
            "http://a:1",
            "--etcd-password-file",
            &pw,
        ],
        "come together: give both or neither",
    );
    refused(
        &["--etcd-user", "u", "--etcd-password-file", &pw],
        "apply to etcd: add --etcd-endpoints",
    );
    refused(
        &[
            "--etcd-endpoints",
            "https://a:1",
            "--etcd-ca-file",
            &f.path("missing.pem"),
        ],
        "cannot use --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE)",
    );
    refused(
        &[
            "--etcd-endpoints",
            "https://a:1",
            "--etcd-ca-file",
            &f.path("missing.pem"),
        ],
        "cannot read it (No such file or directory",
    );
    refused(
        &[
            "--etcd-endpoints",
            "https://a:1",
            "--etcd-ca-file",
            &f.path("garbage"),
        ],
        "no PEM certificate",
    );
    refused(
        &["--etcd-endpoints", "https://a:1", "--etcd-ca-file", &key],
        "no PEM certificate",
    );
    refused(
        &[
            "--etcd-endpoints",
            "https://a:1",
            "--etcd-ca-file",
            &ca,
            "--etcd-cert-file",
            &cert,
            "--etcd-key-file",
            &cert,
        ],
        "--etcd-key-file (SNOWKEEP_ETCD_KEY_FILE)",
    );
    refused(
        &[
            "--etcd-endpoints",
            "https://a:1",
            "--etcd-ca-file",
            &ca,
            "--etcd-cert-file",
            &cert,
            "--etcd-key-file",
            &cert,
        ],
        "no PEM private key",
    );
    refused(
        &[
            "--etcd-endpoints",
            "http://a:1",
            "--etcd-user",
            "u",
            "--etcd-password-file",
            &f.path("empty"),
        ],
        "the file is empty",
    );
    refused(
        &[
            "--etcd-endpoints",
            "http://a:1",
            "--etcd-user",
            "",
            "--etcd-password-file",
            &pw,
        ],
        "give the etcd user's name",
    );
    // A key's problem never quotes the file.
    let err = parse(&[
        "--etcd-endpoints",
        "https://a:1",
        "--etcd-ca-file",
        &ca,
        "--etcd-cert-file",
        &cert,
        "--etcd-key-file",
        &cert,
    ])
    .unwrap_err()
    .to_string();
    assert!(!err.contains("BEGIN"), "{err}");
}
