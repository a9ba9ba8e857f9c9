//! TLS on the gRPC port against real server processes, with certificates
//! made here (rcgen): ids, health, reflection and `snowkeepctl health`
//! through TLS; mTLS refusing clients without a certificate from the client
//! CA; a rotated certificate picked up by new connections while old ones
//! keep theirs, and a garbage file keeping the old certificate; and the
//! start-up refusals of TLS and allow-list flags.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use snowkeep_proto::v1 as pb;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

/// A test certificate authority.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM, and its notAfter (Unix seconds).
struct Leaf {
    cert: String,
    key: String,
    not_after_unix: i64,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn leaf(&self, purpose: ExtendedKeyUsagePurpose, names: &[&str], year: i32) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![purpose];
        params.not_after = rcgen::date_time_ymd(year, 6, 1);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
            not_after_unix: params.not_after.unix_timestamp(),
        }
    }

    /// A server certificate for `localhost` and `127.0.0.1`, valid until
    /// June `year`.
    fn server(&self, year: i32) -> Leaf {
        self.leaf(
            ExtendedKeyUsagePurpose::ServerAuth,
            &["localhost", "127.0.0.1"],
            year,
        )
    }

    /// A client certificate.
    fn client(&self, name: &str) -> Leaf {
        self.leaf(ExtendedKeyUsagePurpose::ClientAuth, &[name], 2040)
    }
}

/// Files in a temp dir.
struct Files(tempfile::TempDir);

impl Files {
    fn new() -> Self {
        Files(tempfile::tempdir().unwrap())
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.path().join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    fn path(&self, name: &str) -> String {
        self.0.path().join(name).to_str().unwrap().to_owned()
    }
}

/// A server certificate directory laid out as the kubelet lays out a
/// mounted Secret: `tls.crt` and `tls.key` are links through `..data`, a
/// link to a versioned directory that one rename swaps, so both files
/// change at once.
struct SecretDir {
    files: Files,
    version: usize,
}

impl SecretDir {
    fn new(leaf: &Leaf) -> Self {
        let mut dir = SecretDir {
            files: Files::new(),
            version: 0,
        };
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.root().join(name)).unwrap();
        }
        dir.swap(&leaf.cert, &leaf.key);
        dir
    }

    fn root(&self) -> &Path {
        self.files.0.path()
    }

    /// Writes a new version and swaps `..data` to it in one rename.
    fn swap(&mut self, cert: &str, key: &str) {
        self.version += 1;
        let v = format!("..v{}", self.version);
        self.files.write(&format!("{v}/tls.crt"), cert);
        self.files.write(&format!("{v}/tls.key"), key);
        let tmp = self.root().join("..data_tmp");
        std::os::unix::fs::symlink(&v, &tmp).unwrap();
        std::fs::rename(&tmp, self.root().join("..data")).unwrap();
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--tls-cert-file".into(),
            self.files.path("tls.crt"),
            "--tls-key-file".into(),
            self.files.path("tls.key"),
        ]
    }
}

/// A channel to `port` over TLS trusting only `ca`, presenting `identity`
/// when given; the server name checked is `localhost`.
async fn connect(
    port: u16,
    ca: &str,
    identity: Option<&Leaf>,
) -> Result<Channel, tonic::transport::Error> {
    connect_from(None, port, ca, identity).await
}

/// [`connect`] from source address `source` when given.
async fn connect_from(
    source: Option<&str>,
    port: u16,
    ca: &str,
    identity: Option<&Leaf>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.cert, &id.key));
    }
    Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .local_address(source.map(|s| s.parse().unwrap()))
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
}

async fn next_ids(channel: Channel, count: u32) -> Result<Vec<u64>, tonic::Status> {
    pb::id_service_client::IdServiceClient::new(channel)
        .next_ids(pb::NextIdsRequest {
            count,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().ids)
}

/// NextIds(`count`) on a new TLS connection: the ids, or the error
/// (connecting or calling) with its whole source chain.
async fn ids_over_new_connection(
    port: u16,
    ca: &str,
    identity: Option<&Leaf>,
    count: u32,
) -> Result<Vec<u64>, String> {
    let channel = connect(port, ca, identity)
        .await
        .map_err(|e| format!("connect: {}", chain(&e)))?;
    next_ids(channel, count)
        .await
        .map_err(|s| format!("{:?}: {}: {}", s.code(), s.message(), chain(&s)))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Waits until IdService is SERVING through TLS; returns the channel that
/// said so.
async fn wait_serving_tls(server: &ServerProcess, ca: &str, identity: Option<&Leaf>) -> Channel {
    let start = tokio::time::Instant::now();
    loop {
        if let Ok(channel) = connect(server.port, ca, identity).await {
            let status = HealthClient::new(channel.clone())
                .check(HealthCheckRequest {
                    service: "snowkeep.v1.IdService".into(),
                })
                .await
                .map(|r| r.into_inner().status);
            if status.ok() == Some(ServingStatus::Serving as i32) {
                return channel;
            }
        }
        assert!(
            start.elapsed() < READY,
            "not SERVING over TLS within {READY:?}; log:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// True for an error of [`ids_over_new_connection`] that failed below gRPC
/// (connecting, TLS, HTTP/2), not with a status from the server. Which
/// code the client reports depends on the moment it notices the closed
/// connection (an alert it reads, a reset, a request cancelled with the
/// connection), so the set of codes is checked, not one.
fn transport_failure(err: &str) -> bool {
    [
        "Unknown: ",
        "Unavailable: ",
        "Internal: ",
        "Cancelled: ",
        "connect: ",
    ]
    .iter()
    .any(|p| err.starts_with(p))
        && err.contains("transport error")
}

/// Waits until the server's log says a TLS handshake failed with `error`
/// (rustls's words).
async fn handshake_failure_logged(server: &ServerProcess, error: &str) {
    let start = tokio::time::Instant::now();
    loop {
        let log = server.log();
        if log.lines().any(|l| {
            l.contains("TLS handshake failed; closing the connection") && l.contains(error)
        }) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no handshake failure with {error:?} logged; log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_ascending(ids: &[u64]) {
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids not ascending");
}

/// Runs snowkeepctl with `args`: (exit code, stdout, stderr).
fn snowkeepctl(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args(args)
        .env_remove("SNOWKEEP_ENDPOINT")
        .output()
        .expect("run snowkeepctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_health_reflection_and_snowkeepctl_health_work_over_tls_and_plaintext_clients_fail() {
    let etcd = EtcdProcess::start().await;
    let ca = Ca::new("snowkeep test CA");
    let leaf = ca.server(2040);
    let files = Files::new();
    let (cert, key) = (
        files.write("tls.crt", &leaf.cert),
        files.write("tls.key", &leaf.key),
    );
    let ca_file = files.write("ca.crt", &ca.pem);
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "tls",
        &["--tls-cert-file", &cert, "--tls-key-file", &key],
    );
    let channel = wait_serving_tls(&server, &ca.pem, None).await;

    let ids = next_ids(channel.clone(), 1_000).await.unwrap();
    assert_eq!(ids.len(), 1_000);
    assert_ascending(&ids);

    let whole = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(whole.status, ServingStatus::Serving as i32);

    let mut reflection = ServerReflectionClient::new(channel.clone());
    let mut answers = reflection
        .server_reflection_info(tokio_stream::once(ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("reflection did not list services");
    };
    let mut services: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    services.sort();
    assert!(
        services.contains(&"snowkeep.v1.IdService".to_owned())
            && services.contains(&"grpc.health.v1.Health".to_owned()),
        "{services:?}"
    );

    // A plaintext (h2c) client gets no gRPC answer at all.
    let plaintext = async {
        let channel = Channel::from_shared(server.url())
            .unwrap()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("connect: {}", chain(&e)))?;
        next_ids(channel, 1)
            .await
            .map_err(|s| format!("{:?}: {}", s.code(), chain(&s)))
    }
    .await;
    let err = plaintext.expect_err("a plaintext client must not get ids from a TLS port");
    // The TLS side answers its first bytes (the HTTP/2 preface is no
    // ClientHello) with an alert and closes: the call fails in the
    // transport, as a reset or as a frame h2 cannot parse (the alert),
    // whichever the client notices first.
    assert!(transport_failure(&err), "{err}");

    // The serving certificate's expiry, exactly, and no reload yet.
    assert_eq!(
        server
            .metric("snowkeep_tls_certificate_expiry_timestamp_seconds")
            .await,
        leaf.not_after_unix as f64
    );
    assert_eq!(
        server
            .metric("snowkeep_tls_reloads_total{result=\"ok\"}")
            .await,
        0.0
    );

    // The client library over TLS: RemoteClient, and the embedded
    // generator's Lease API client (checked by address: the certificate
    // names 127.0.0.1).
    let tls = snowkeep_client::ClientTls::from_ca_file(&ca_file).unwrap();
    let endpoint = format!("https://127.0.0.1:{}", server.port);
    let remote = snowkeep_client::RemoteClient::new_with_tls(
        std::slice::from_ref(&endpoint),
        snowkeep_client::RemoteConfig::default(),
        &tls,
    )
    .unwrap();
    assert_eq!(remote.next_ids(300).await.unwrap().len(), 300);
    let config = snowkeep_client::EmbeddedConfig {
        acquire_attempts: Some(3),
        ..snowkeep_client::EmbeddedConfig::new(endpoint.clone(), "tls")
    };
    let embedded = snowkeep_client::EmbeddedGenerator::start_with_tls(
        config,
        snowkeep_client::SystemClock::shared(),
        &tls,
    )
    .await
    .unwrap();
    assert_eq!(embedded.next_ids(50).await.unwrap().len(), 50);
    assert_eq!(embedded.shutdown().await, 1);

    // snowkeepctl health, as the Kubernetes exec probe runs it: by address.
    let endpoint = format!("https://127.0.0.1:{}", server.port);
    let (code, out, err) =
        snowkeepctl(&["health", "--endpoint", &endpoint, "--tls-ca-file", &ca_file]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "SERVING\n"),
        "stderr: {err}"
    );
    let (code, _, err) = snowkeepctl(&[
        "health",
        "--service",
        "snowkeep.v1.IdService",
        "--endpoint",
        &endpoint,
        "--tls-ca-file",
        &ca_file,
    ]);
    assert_eq!(code, Some(0), "stderr: {err}");
    let (code, _, err) = snowkeepctl(&[
        "health",
        "--service",
        "no.such.Service",
        "--endpoint",
        &endpoint,
        "--tls-ca-file",
        &ca_file,
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with(&format!(
            "snowkeepctl: health check of service \"no.such.Service\" at {endpoint} failed: NOT_FOUND: "
        )),
        "{err}"
    );
    // The commands that default to the server's namespace ask for it over
    // TLS too.
    for command in ["capacity", "machine-ids", "requesters"] {
        let (code, out, err) = snowkeepctl(&[
            command,
            "--output",
            "json",
            "--endpoint",
            &endpoint,
            "--tls-ca-file",
            &ca_file,
        ]);
        assert_eq!((code, err.as_str()), (Some(0), ""), "{command}");
        let out: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(out["namespace"], "tls", "{command}: {out}");
    }
    // A plaintext endpoint for a TLS server: what to do.
    let (code, _, err) = snowkeepctl(&["capacity", "--endpoint", &server.url()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with("snowkeepctl: "), "{err}");
    if err.contains("frame with invalid size") || err.contains("h2 protocol error") {
        assert!(
            err.ends_with("\nhint: the server may serve TLS: use https:// and --tls-ca-file\n"),
            "{err}"
        );
    }
    // Without the CA the server's certificate is not trusted.
    let other = Files::new();
    let other_ca = other.write("ca.crt", &Ca::new("another CA").pem);
    let (code, _, err) = snowkeepctl(&[
        "health",
        "--endpoint",
        &endpoint,
        "--tls-ca-file",
        &other_ca,
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with(&format!("snowkeepctl: connecting to {endpoint}")),
        "{err}"
    );
    assert!(err.contains("UnknownIssuer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_serves_only_clients_with_a_certificate_from_the_client_ca() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let stranger_ca = Ca::new("stranger CA");
    let leaf = server_ca.server(2040);
    let files = Files::new();
    let server = ServerProcess::spawn(&[
        "--tls-cert-file",
        &files.write("tls.crt", &leaf.cert),
        "--tls-key-file",
        &files.write("tls.key", &leaf.key),
        "--tls-client-ca-file",
        &files.write("client-ca.crt", &client_ca.pem),
    ]);
    let app = client_ca.client("app");
    let channel = wait_serving_tls(&server, &server_ca.pem, Some(&app)).await;
    let ids = next_ids(channel, 10).await.unwrap();
    assert_eq!(ids.len(), 10);

    // The handshake fails: the client sees its connection end (with TLS
    // 1.3 it may have sent its request already, so it may not get to read
    // the alert), and the server says why.
    let no_cert = ids_over_new_connection(server.port, &server_ca.pem, None, 1)
        .await
        .expect_err("a client without a certificate must not get ids");
    assert!(transport_failure(&no_cert), "{no_cert}");
    handshake_failure_logged(&server, "error=peer sent no certificates").await;

    let stranger = stranger_ca.client("stranger");
    let foreign = ids_over_new_connection(server.port, &server_ca.pem, Some(&stranger), 1)
        .await
        .expect_err("a client certificate from another CA must not get ids");
    assert!(transport_failure(&foreign), "{foreign}");
    handshake_failure_logged(&server, "error=invalid peer certificate: UnknownIssuer").await;

    let ids = ids_over_new_connection(server.port, &server_ca.pem, Some(&app), 7)
        .await
        .unwrap();
    assert_eq!(ids.len(), 7);

    // The client library presents its identity too; without one it fails.
    let endpoint = vec![format!("https://127.0.0.1:{}", server.port)];
    let config = snowkeep_client::RemoteConfig {
        attempts: 1,
        ..Default::default()
    };
    let tls = snowkeep_client::ClientTls::new(server_ca.pem.clone()).server_name("localhost");
    let with_id = tls.clone().identity(app.cert.clone(), app.key.clone());
    let remote =
        snowkeep_client::RemoteClient::new_with_tls(&endpoint, config.clone(), &with_id).unwrap();
    assert_eq!(remote.next_ids(12).await.unwrap().len(), 12);
    let anonymous = snowkeep_client::RemoteClient::new_with_tls(&endpoint, config, &tls).unwrap();
    assert!(anonymous.next_ids(1).await.is_err());

    // snowkeepctl presents its certificate too.
    let endpoint = format!("https://127.0.0.1:{}", server.port);
    let ca_file = files.write("ca.crt", &server_ca.pem);
    let cert = files.write("app.crt", &app.cert);
    let key = files.write("app.key", &app.key);
    let (code, out, err) = snowkeepctl(&[
        "health",
        "--endpoint",
        &endpoint,
        "--tls-ca-file",
        &ca_file,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-server-name",
        "localhost",
    ]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "SERVING\n"),
        "stderr: {err}"
    );
    let (code, _, err) =
        snowkeepctl(&["health", "--endpoint", &endpoint, "--tls-ca-file", &ca_file]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with(&format!(
            "snowkeepctl: health check of the server at {endpoint} failed: "
        )) || err.starts_with(&format!("snowkeepctl: connecting to {endpoint}")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_serves_new_connections_and_garbage_keeps_the_old_one() {
    let old_ca = Ca::new("old CA");
    let old = old_ca.server(2040);
    let mut secret = SecretDir::new(&old);
    let mut args = secret.args();
    args.extend(["--tls-reload-interval".into(), "200ms".into()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ServerProcess::spawn(&argv);
    let before = wait_serving_tls(&server, &old_ca.pem, None).await;
    assert_eq!(next_ids(before.clone(), 3).await.unwrap().len(), 3);

    let new_ca = Ca::new("new CA");
    let new = new_ca.server(2041);
    secret.swap(&new.cert, &new.key);
    let port = server.port;
    let new_pem = new_ca.pem.clone();
    eventually(
        "a client trusting only the new CA gets ids",
        Duration::from_secs(15),
        || {
            let pem = new_pem.clone();
            async move { ids_over_new_connection(port, &pem, None, 1).await.is_ok() }
        },
    )
    .await;
    // The connection opened before the rotation keeps its session.
    assert_eq!(next_ids(before.clone(), 5).await.unwrap().len(), 5);
    // New connections trusting only the old CA fail: the certificate is new.
    let err = ids_over_new_connection(port, &old_ca.pem, None, 1)
        .await
        .expect_err("the old certificate must no longer serve new connections");
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert_eq!(
        server
            .metric("snowkeep_tls_reloads_total{result=\"ok\"}")
            .await,
        1.0
    );
    assert_eq!(
        server
            .metric("snowkeep_tls_certificate_expiry_timestamp_seconds")
            .await,
        new.not_after_unix as f64
    );

    // Garbage in the certificate file: logged, counted, the new
    // certificate keeps serving.
    secret.swap("this is not a certificate\n", &new.key);
    let metrics_port = server.metrics_port;
    eventually(
        "a failed reload is counted",
        Duration::from_secs(15),
        || async move {
            snowkeep_test_support::server::scrape(metrics_port)
                .await
                .contains("snowkeep_tls_reloads_total{result=\"error\"} 1\n")
        },
    )
    .await;
    assert!(
        server
            .log()
            .contains("TLS files changed but do not parse; new connections keep the previous certificate until they are fixed"),
        "{}",
        server.log()
    );
    let ids = ids_over_new_connection(port, &new_ca.pem, None, 4)
        .await
        .unwrap();
    assert_eq!(ids.len(), 4);
    assert_eq!(next_ids(before, 2).await.unwrap().len(), 2);
    assert_eq!(
        server
            .metric("snowkeep_tls_reloads_total{result=\"ok\"}")
            .await,
        1.0
    );
    assert_eq!(
        server
            .metric("snowkeep_tls_certificate_expiry_timestamp_seconds")
            .await,
        new.not_after_unix as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_allow_list_flags_that_cannot_serve_refuse_to_start_with_64() {
    let ca = Ca::new("refusals CA");
    let leaf = ca.server(2040);
    let files = Files::new();
    let cert = files.write("tls.crt", &leaf.cert);
    let key = files.write("tls.key", &leaf.key);
    let garbage = files.write("garbage.crt", "not PEM\n");
    let missing: PathBuf = files.0.path().join("missing.crt");
    let missing = missing.to_str().unwrap();
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--tls-cert-file", &cert],
            "--tls-cert-file (SNOWKEEP_TLS_CERT_FILE) needs --tls-key-file (SNOWKEEP_TLS_KEY_FILE): give both, or neither to serve plaintext".into(),
        ),
        (
            vec!["--tls-key-file", &key],
            "--tls-key-file (SNOWKEEP_TLS_KEY_FILE) needs --tls-cert-file (SNOWKEEP_TLS_CERT_FILE): give both, or neither to serve plaintext".into(),
        ),
        (
            vec!["--tls-cert-file", missing, "--tls-key-file", &key],
            format!("invalid TLS files: cannot read --tls-cert-file {missing}: No such file or directory (os error 2)"),
        ),
        (
            vec!["--tls-cert-file", &garbage, "--tls-key-file", &key],
            format!("invalid TLS files: --tls-cert-file {garbage} holds no CERTIFICATE: give a PEM file (-----BEGIN CERTIFICATE-----)"),
        ),
        (
            vec!["--tls-cert-file", &cert, "--tls-key-file", &key, "--tls-client-ca-file", missing],
            format!("invalid TLS files: cannot read --tls-client-ca-file {missing}: No such file or directory (os error 2)"),
        ),
        (
            vec!["--peer-tls-ca-file", &cert],
            "--peer-tls-ca-file (SNOWKEEP_PEER_TLS_CA_FILE) is for peers that serve TLS: add --tls-cert-file and --tls-key-file, or drop it".into(),
        ),
        (
            vec!["--tls-cert-file", &cert, "--tls-key-file", &key, "--peer-tls-server-name", "x"],
            "--peer-tls-server-name (SNOWKEEP_PEER_TLS_SERVER_NAME) needs --peer-tls-ca-file".into(),
        ),
        (
            vec!["--allow-cidrs", "10.0.0.0/8,10.0.0.300/32"],
            "invalid --allow-cidrs (SNOWKEEP_ALLOW_CIDRS) entry \"10.0.0.300/32\": use CIDR ranges like 10.0.0.0/8 or fd00::/8 (or a single address), comma-separated".into(),
        ),
    ];
    let mut servers: Vec<_> = cases
        .into_iter()
        .map(|(args, message)| (ServerProcess::spawn(&args), args.join(" "), message))
        .collect();
    for (server, args, message) in &mut servers {
        let code = server.wait_exit(Duration::from_secs(15)).await.code();
        let log = server.log();
        assert_eq!(code, Some(64), "{args}: log:\n{log}");
        assert!(
            log.contains(message.as_str()),
            "{args}: want {message}\nlog:\n{log}"
        );
    }
}

/// With TLS, a peer outside `--allow-cidrs` completes its handshake within
/// the small budget of such connections and gets the allow-list's
/// PERMISSION_DENIED, on each new connection; an allowed peer is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_peer_outside_the_allow_list_gets_the_denial_and_allowed_ones_are_served() {
    let ca = Ca::new("snowkeep test CA");
    let leaf = ca.server(2040);
    let files = Files::new();
    let (cert, key) = (
        files.write("tls.crt", &leaf.cert),
        files.write("tls.key", &leaf.key),
    );
    let server = ServerProcess::spawn(&[
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--allow-cidrs",
        "127.0.0.1/32",
    ]);
    let channel = wait_serving_tls(&server, &ca.pem, None).await;
    for _ in 0..3 {
        let outside = connect_from(Some("127.0.0.2"), server.port, &ca.pem, None)
            .await
            .unwrap();
        let denied = next_ids(outside, 5).await.unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
        assert_eq!(
            denied.message(),
            "peer 127.0.0.2 is outside this server's --allow-cidrs (127.0.0.1/32): call from an allowed network, or have the operator add the client's range to --allow-cidrs"
        );
    }
    assert_eq!(next_ids(channel, 5).await.unwrap().len(), 5);
}

/// With TLS and client certificates on the gRPC port, the peer clock check
/// calls peers over TLS: `--peer-tls-ca-file` trusts their certificates,
/// `--peer-tls-server-name` is the name those carry (peers are called by
/// address, which the certificate here does not name), and each server
/// presents its own certificate to the other. Both measure each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_check_each_others_clocks_over_mtls() {
    let ca = Ca::new("cluster CA");
    // Server and client use in one certificate, as cert-manager issues it
    // for the Kubernetes example; no IP address among its names.
    let mut params =
        CertificateParams::new(vec!["snowkeep-peer".to_owned(), "localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "snowkeep-peer");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let leaf = Leaf {
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after_unix: params.not_after.unix_timestamp(),
    };
    let files = Files::new();
    let (crt, k, ca_file) = (
        files.write("tls.crt", &leaf.cert),
        files.write("tls.key", &leaf.key),
        files.write("ca.crt", &ca.pem),
    );
    let etcd = EtcdProcess::start().await;
    let flags = [
        "--tls-cert-file",
        crt.as_str(),
        "--tls-key-file",
        k.as_str(),
        "--tls-client-ca-file",
        ca_file.as_str(),
        "--peer-tls-ca-file",
        ca_file.as_str(),
        "--peer-tls-server-name",
        "snowkeep-peer",
        "--peer-skew-interval",
        "1s",
    ];
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "peertls", &flags);
    wait_serving_tls(&a, &ca.pem, Some(&leaf)).await;
    let b = ServerProcess::joining(&etcd.endpoint(), "peertls", &flags);
    wait_serving_tls(&b, &ca.pem, Some(&leaf)).await;
    for s in [&a, &b] {
        s.wait_peer_measured("peertls", "a peer clock measurement over mTLS")
            .await;
        assert!(!s
            .log()
            .contains("the peer clock check (--peer-skew-interval) is off"));
    }
}
