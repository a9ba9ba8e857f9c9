//! Configuration that used to be accepted and then ignored or mishandled is
//! refused at start with exit code 64 and a message naming the rule; the
//! Lease API refuses the same namespace names with INVALID_ARGUMENT.

use std::time::Duration;

use snowkeep_proto::v1 as pb;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, check_request, lease_api_server, release, renew};
use snowkeep_test_support::server::ServerProcess;

const RULE: &str = r#"a namespace is 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or a digit (so never "." or "..", and no "/")"#;

/// Starts one server per `args` at once; asserts each exits 64 with its
/// message in the log.
async fn refused(cases: Vec<(Vec<String>, String)>) {
    let mut servers: Vec<(ServerProcess, Vec<String>, String)> = cases
        .into_iter()
        .map(|(args, message)| {
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            (ServerProcess::spawn(&argv), args, message)
        })
        .collect();
    for (server, args, message) in &mut servers {
        let code = server.wait_exit(Duration::from_secs(15)).await.code();
        let log = server.log();
        assert_eq!(code, Some(64), "{args:?}: log:\n{log}");
        assert!(
            log.contains(message.as_str()),
            "{args:?}: want {message}\nlog:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_endpoint_that_is_not_http_host_port_refuses_to_start_with_64() {
    let entry = |e: &str, problem: &str| {
        format!(r#"invalid --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) entry "{e}": {problem}"#)
    };
    let malformed = "not an etcd client URL; use http://host:port, https://host:port (or host:port): a host, a port from 1 to 65535, no user, path or query";
    let empty = "the entry is empty (a doubled or trailing comma?); give etcd client URLs as http://host:port, comma-separated";
    let cases = [
        (
            "https://127.0.0.1:2379",
            "https:// etcd endpoints need --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE), the CA bundle (PEM) that signs the etcd members' server certificates; for certificates from a public CA give the system bundle, e.g. /etc/ssl/certs/ca-certificates.crt".to_owned(),
        ),
        ("garbage", entry("garbage", malformed)),
        ("", entry("", empty)),
        ("http://127.0.0.1:2379,,http://127.0.0.1:2380", entry("", empty)),
        (
            "unix:///var/run/etcd.sock",
            entry(
                "unix:///var/run/etcd.sock",
                "only http:// and https:// client URLs are supported; use http://host:port or https://host:port",
            ),
        ),
    ];
    refused(
        cases
            .into_iter()
            .map(|(value, message)| (vec![format!("--etcd-endpoints={value}")], message))
            .collect(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_outside_the_rule_refuses_to_start_with_64() {
    let too_long = "n".repeat(65);
    let cases: Vec<(Vec<String>, String)> = [".", "..", "a/b", "", too_long.as_str(), "-x"]
        .into_iter()
        .map(|ns| {
            (
                vec![format!("--namespace={ns}")],
                format!(r#"invalid --namespace (SNOWKEEP_NAMESPACE) "{ns}": {RULE}"#),
            )
        })
        .collect();
    refused(cases).await;

    // The variable takes the same rule; on etcd too (the check comes first).
    let etcd = EtcdProcess::start().await;
    let mut s = ServerProcess::spawn_env(
        &["--etcd-endpoints", &etcd.endpoint()],
        &[("SNOWKEEP_NAMESPACE", "..")],
    );
    assert_eq!(s.wait_exit(Duration::from_secs(15)).await.code(), Some(64));
    assert!(s.log().contains(RULE), "log:\n{}", s.log());

    // Upper case is allowed (names are case-sensitive): an existing namespace
    // such as "Orders" keeps working.
    let state = tempfile::tempdir().unwrap();
    let s = ServerProcess::spawn(&[
        "--namespace",
        "Orders",
        "--state-dir",
        state.path().to_str().unwrap(),
    ]);
    s.wait_serving(Duration::from_secs(15)).await;
    assert_eq!(s.info().await.namespace, "Orders");
    assert!(state.path().join("Orders.state").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_api_refuses_a_namespace_outside_the_rule_with_invalid_argument() {
    let (_etcd, _server, mut api) = lease_api_server("names").await;
    let who = snowkeep_client::Requester {
        host_id: "names-host".into(),
        pid: 9,
        start_unix_ms: 1,
        nonce: "00000000000000aa".into(),
    };
    let too_long = "n".repeat(65);
    for ns in [".", "..", "a/b", "", too_long.as_str(), "_x"] {
        let want = format!("invalid namespace {ns:?}: {RULE}");
        let check = |what: &str, status: tonic::Status| {
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what} {ns:?}");
            assert_eq!(status.message(), want, "{what} {ns:?}");
        };
        let acquire = api.acquire(acquire(ns, &who, 1, None)).await.unwrap_err();
        check("Acquire", acquire);
        let renew = api.renew(renew(ns, &who, "", None)).await.unwrap_err();
        check("Renew", renew);
        let release = api.release(release(ns, &who, "", &[])).await.unwrap_err();
        check("Release", release);
        let lease_check = api
            .check(check_request(&who, "", ns, 0, vec![]))
            .await
            .unwrap_err();
        check("Check", lease_check);
        let capacity = api
            .capacity(pb::CapacityRequest {
                namespace: ns.into(),
            })
            .await
            .unwrap_err();
        check("Capacity", capacity);
    }
    // A valid name that no server has used is unknown, not invalid.
    let unknown = api
        .capacity(pb::CapacityRequest {
            namespace: "Orders".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tls_and_auth_flags_that_do_not_fit_refuse_to_start_with_64() {
    let pki = snowkeep_test_support::pki::TestPki::new();
    let path = |p: std::path::PathBuf| p.to_str().unwrap().to_owned();
    let (ca, client) = (path(pki.ca_file()), pki.client());
    let (cert, key) = (path(client.cert), path(client.key));
    let missing = path(pki.dir().join("missing.pem"));
    let password = pki.dir().join("password");
    std::fs::write(&password, "pw\n").unwrap();
    let password = path(password);
    let https = "--etcd-endpoints=https://127.0.0.1:2379".to_owned();
    let http = "--etcd-endpoints=http://127.0.0.1:2379".to_owned();
    let flag = |name: &str, value: &str| format!("--{name}={value}");
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec!["--etcd-endpoints=http://127.0.0.1:1,https://127.0.0.1:2".into(), flag("etcd-ca-file", &ca)],
            "--etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) mixes http:// and https:// client URLs: an etcd cluster serves its clients either with TLS or without, so give every endpoint the same scheme".into(),
        ),
        (
            vec![http.clone(), flag("etcd-ca-file", &ca)],
            "--etcd-ca-file, --etcd-cert-file and --etcd-key-file are for TLS to etcd, but every --etcd-endpoints (SNOWKEEP_ETCD_ENDPOINTS) URL is plaintext http://: give the members' https:// client URLs, or drop the TLS flags".into(),
        ),
        (
            vec![https.clone(), flag("etcd-ca-file", &ca), flag("etcd-cert-file", &cert)],
            "--etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE) and --etcd-key-file (SNOWKEEP_ETCD_KEY_FILE) come together: give both (a client certificate and its private key, PEM) or neither".into(),
        ),
        (
            vec![http.clone(), flag("etcd-user", "snowkeep")],
            "--etcd-user (SNOWKEEP_ETCD_USER) and --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE) come together: give both or neither".into(),
        ),
        (
            vec![https.clone(), flag("etcd-ca-file", &missing)],
            format!("cannot use --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE) {missing}: cannot read it (No such file or directory"),
        ),
        (
            vec![https.clone(), flag("etcd-ca-file", &ca), flag("etcd-cert-file", &cert), flag("etcd-key-file", &cert)],
            format!("cannot use --etcd-key-file (SNOWKEEP_ETCD_KEY_FILE) {cert}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in it"),
        ),
        (
            vec![https.clone(), flag("etcd-ca-file", &key)],
            format!("cannot use --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE) {key}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it"),
        ),
        (
            vec![http.clone(), flag("etcd-user", "snowkeep"), flag("etcd-password-file", &missing)],
            format!("cannot use --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE) {missing}: cannot read it"),
        ),
        (
            vec![flag("etcd-user", "snowkeep"), flag("etcd-password-file", &password)],
            "--etcd-ca-file, --etcd-cert-file, --etcd-key-file, --etcd-user and --etcd-password-file apply to etcd: add --etcd-endpoints".into(),
        ),
    ];
    refused(cases).await;

    // The password file may come from the environment too; never the
    // password itself (there is no flag for it).
    let mut s = ServerProcess::spawn_env(
        &[&http, "--etcd-user=snowkeep"],
        &[("SNOWKEEP_ETCD_PASSWORD_FILE", &missing)],
    );
    assert_eq!(s.wait_exit(Duration::from_secs(15)).await.code(), Some(64));
    assert!(
        s.log()
            .contains("cannot use --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE)"),
        "log:\n{}",
        s.log()
    );
    let mut s = ServerProcess::spawn(&[&http, "--etcd-password=pw"]);
    assert_eq!(s.wait_exit(Duration::from_secs(15)).await.code(), Some(64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_page_without_etcd_refuses_to_start_with_64() {
    refused(vec![(
        vec!["--admin-listen".to_owned(), "127.0.0.1:9465".to_owned()],
        "invalid --admin-listen (SNOWKEEP_ADMIN_LISTEN) 127.0.0.1:9465: the status page shows a cluster's state, which is kept in etcd: add --etcd-endpoints (the single-instance store has no status page)".to_owned(),
    )])
    .await;
}
