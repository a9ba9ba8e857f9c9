//! The server against an etcd secured as production runs it: TLS on the
//! client URL, client certificates required, and etcd's authentication on
//! (a `snowkeep` user whose role reaches only `/snowkeep/`). It issues,
//! releases and takes back its machine id, serves the Lease API, keeps its
//! lease across many expiries of its auth token. Every refusal etcd gives
//! at connect stops it at start, at its first attempt, with exit code 64 and
//! a message naming what to fix: a wrong password or user, no user, a user
//! without (write) permission on `/snowkeep/`, no client certificate, one
//! from another CA, an expired one, and a CA that did not sign etcd's server
//! certificate.

use std::collections::HashSet;
use std::time::Duration;

use snowkeep_etcd::etcd_client::{GetOptions, Permission};

use snowkeep_test_support::etcd::{EtcdProcess, SecureOptions};
use snowkeep_test_support::lease::{acquire, ids_of, lease_client, renew, requester};
use snowkeep_test_support::pki::CertFiles;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

/// A server on the secured `etcd` in `namespace` with `args` (the
/// `--etcd-*` flags) and a 2 s lease TTL and outage budget unless `extra`
/// sets them, creating the namespace.
fn server(args: &[String], namespace: &str, extra: &[&str]) -> ServerProcess {
    let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
    argv.extend(["--namespace", namespace, "--create-namespace"]);
    if !extra.contains(&"--lease-ttl") {
        argv.extend(["--lease-ttl", "2s"]);
    }
    if !extra.contains(&"--outage-budget") {
        argv.extend(["--outage-budget", "2s"]);
    }
    argv.extend_from_slice(extra);
    ServerProcess::spawn(&argv)
}

/// `args` with `flag`'s value replaced by `value`, or `flag` and its value
/// dropped when `value` is `None`.
fn with_flag(args: &[String], flag: &str, value: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            let _ = it.next();
            if let Some(v) = value {
                out.extend([flag.to_owned(), v.to_owned()]);
            }
        } else {
            out.push(a.clone());
        }
    }
    out
}

/// The holder keys of `namespace` in etcd, as `(key, value)`.
async fn holders(etcd: &EtcdProcess, namespace: &str) -> Vec<(String, String)> {
    let prefix = format!("/snowkeep/v1/ns/{namespace}/holder/");
    etcd.client()
        .await
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                kv.value_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_issues_releases_and_takes_back_its_machine_id_through_tls_and_etcd_auth() {
    let etcd = EtcdProcess::start_secured().await;
    let args = etcd.server_args();
    let extra = ["--instance-id", "pod-0"];
    let mut s = server(&args, "secured", &extra);
    s.wait_serving(READY).await;
    let ids = s.next_ids(1000).await.unwrap();
    assert_eq!(ids.len(), 1000);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 1000);
    let machine_id = s.machine_id().await;
    let held = holders(&etcd, "secured").await;
    assert_eq!(
        held,
        vec![(
            format!("/snowkeep/v1/ns/secured/holder/{machine_id:05}"),
            "pod-0".to_owned()
        )]
    );
    let log = s.log();
    assert!(
        !log.contains(etcd_client_password()),
        "the password must never be logged:\n{log}"
    );
    // The start-up line says in words how the server reaches etcd.
    assert_eq!(
        log.matches("etcd_access=TLS with a client certificate, etcd user snowkeep")
            .count(),
        1,
        "{log}"
    );
    assert!(!log.contains("EtcdAccess {"), "{log}");

    // A clean stop releases through the secured etcd (the holder key goes),
    // and the same instance takes the same machine id back.
    s.signal("TERM");
    assert!(s.wait_exit(Duration::from_secs(20)).await.success());
    assert_eq!(holders(&etcd, "secured").await, vec![]);
    let again = server(&args, "secured", &extra);
    again.wait_serving(READY).await;
    assert_eq!(again.machine_id().await, machine_id);
    let more = again.next_ids(1000).await.unwrap();
    assert_eq!(more.len(), 1000);
    assert!(
        more[0] > *ids.last().unwrap(),
        "ids after the restart come after the ones before"
    );
}

fn etcd_client_password() -> &'static str {
    snowkeep_test_support::etcd::SNOWKEEP_PASSWORD
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_api_acquires_and_renews_through_the_secured_etcd() {
    let etcd = EtcdProcess::start_secured().await;
    let s = server(&etcd.server_args(), "secured-api", &[]);
    s.wait_serving(READY).await;
    let mut api = lease_client(&s).await;
    let who = requester(7);
    let grant = api
        .acquire(acquire("secured-api", &who, 2, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 2);
    let renewed = api
        .renew(renew("secured-api", &who, &grant.lease_token, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids_of(&renewed), ids_of(&grant));
    assert_eq!(renewed.lease_duration_ms, 48 * 3600 * 1000);
    // The server's own machine id plus the requester's two.
    assert_eq!(holders(&etcd, "secured-api").await.len(), 3);
}

/// How long a refused server may take to exit. The access check is its
/// first step, so it exits in about a second; the bound leaves room for a
/// loaded machine.
const REFUSED_WITHIN: Duration = Duration::from_secs(20);

/// `args` with `--etcd-cert-file` and `--etcd-key-file` set to `files`.
fn with_client_certificate(args: &[String], files: &CertFiles) -> Vec<String> {
    let args = with_flag(args, "--etcd-cert-file", Some(files.cert.to_str().unwrap()));
    with_flag(&args, "--etcd-key-file", Some(files.key.to_str().unwrap()))
}

/// Starts a server with `args` on `etcd` (creating `namespace`), asserts it
/// exits with 64 within [`REFUSED_WITHIN`] and `message` in its log, that
/// it did so at its first attempt (it never took the refusal for an etcd
/// still starting), and that it wrote nothing: not even the namespace.
async fn refused_at_start(etcd: &EtcdProcess, args: &[String], namespace: &str, message: &str) {
    refused_after_namespace(etcd, args, namespace, message).await;
    let record = etcd
        .client()
        .await
        .get(format!("/snowkeep/v1/ns/{namespace}/layout"), None)
        .await
        .unwrap();
    assert_eq!(record.kvs().len(), 0, "the namespace was not created");
}

/// [`refused_at_start`] for a namespace that may exist already.
async fn refused_after_namespace(
    etcd: &EtcdProcess,
    args: &[String],
    namespace: &str,
    message: &str,
) {
    let mut s = server(args, namespace, &[]);
    let code = s.wait_exit(REFUSED_WITHIN).await.code();
    let log = s.log();
    assert_eq!(code, Some(64), "log:\n{log}");
    assert!(log.contains(message), "want {message:?} in:\n{log}");
    assert!(
        !log.contains("etcd is not reachable yet"),
        "refused at the first attempt, never retried:\n{log}"
    );
    assert!(
        !log.contains(etcd_client_password()),
        "the password must never be logged:\n{log}"
    );
    assert_eq!(holders(etcd, namespace).await, vec![], "nothing claimed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_stops_the_server_at_start_naming_the_flags() {
    let etcd = EtcdProcess::start_secured().await;
    let wrong = etcd.pki().dir().join("wrong.password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let args = with_flag(
        &etcd.server_args(),
        "--etcd-password-file",
        Some(wrong.to_str().unwrap()),
    );
    refused_at_start(&etcd, &args, "wrong-pw", AUTHENTICATION_FAILED).await;
}

/// The message of a wrong user or password.
const AUTHENTICATION_FAILED: &str = "refused this server: authentication failed: the user or password is wrong; check --etcd-user (SNOWKEEP_ETCD_USER) and the file --etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE) names";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_user_stops_the_server_at_start_naming_the_flags() {
    let etcd = EtcdProcess::start_secured().await;
    let args = with_flag(&etcd.server_args(), "--etcd-user", Some("nobody"));
    refused_at_start(&etcd, &args, "wrong-user", AUTHENTICATION_FAILED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_user_where_etcd_wants_one_stops_the_server_naming_the_certificates_user() {
    // etcd takes the client certificate's common name as the user, which
    // has no role here.
    let etcd = EtcdProcess::start_secured().await;
    let args = with_flag(&etcd.server_args(), "--etcd-user", None);
    let args = with_flag(&args, "--etcd-password-file", None);
    refused_at_start(
        &etcd,
        &args,
        "no-user",
        "refused this server: permission denied: etcd user \"snowkeep-client\" (the common name of --etcd-cert-file, which etcd takes as the user without --etcd-user) needs a role with readwrite permission on the key prefix /snowkeep/",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_permission_on_the_prefix_stops_the_server_at_start() {
    let etcd = EtcdProcess::start_secured().await;
    etcd.add_user("outsider", Permission::read_write("/other/").with_prefix())
        .await;
    let args = with_flag(&etcd.server_args(), "--etcd-user", Some("outsider"));
    refused_at_start(
        &etcd,
        &args,
        "outsider",
        "refused this server: permission denied: etcd user \"outsider\" (--etcd-user) needs a role with readwrite permission on the key prefix /snowkeep/ (etcdctl role grant-permission ROLE --prefix=true readwrite /snowkeep/, then etcdctl user grant-role USER ROLE)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_that_may_only_read_the_prefix_stops_the_server_at_start() {
    let etcd = EtcdProcess::start_secured().await;
    etcd.add_user("reader", Permission::read("/snowkeep/").with_prefix())
        .await;
    // The namespace exists, so the reader's start reads it and would then
    // claim: its write permission is checked before that.
    let mut argv = etcd.server_args();
    argv.extend(["--namespace", "read-only", "--create-namespace-only"].map(String::from));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut create = ServerProcess::spawn(&argv);
    assert!(
        create.wait_exit(REFUSED_WITHIN).await.success(),
        "{}",
        create.log()
    );
    let args = with_flag(&etcd.server_args(), "--etcd-user", Some("reader"));
    refused_after_namespace(
        &etcd,
        &args,
        "read-only",
        "refused this server: permission denied: etcd user \"reader\" (--etcd-user) needs a role with readwrite permission on the key prefix /snowkeep/",
    )
    .await;
    let write_check = etcd
        .client()
        .await
        .get("/snowkeep/v1/ns/read-only/write-check", None)
        .await
        .unwrap();
    assert_eq!(write_check.kvs().len(), 0, "the check never writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_client_certificate_stops_the_server_at_start() {
    let etcd = EtcdProcess::start_secured().await;
    let args = with_flag(&etcd.server_args(), "--etcd-cert-file", None);
    let args = with_flag(&args, "--etcd-key-file", None);
    refused_at_start(
        &etcd,
        &args,
        "no-cert",
        "refused this server: it requires a client certificate signed by a CA it trusts (its --trusted-ca-file) and none was given: give --etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE) and --etcd-key-file (SNOWKEEP_ETCD_KEY_FILE)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_another_ca_stops_the_server_at_start() {
    let etcd = EtcdProcess::start_secured().await;
    let args = with_client_certificate(&etcd.server_args(), &etcd.pki().stranger_client());
    refused_at_start(
        &etcd,
        &args,
        "stranger",
        "refused this server: it requires a client certificate signed by a CA it trusts (its --trusted-ca-file) and refused the one in --etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE): check that a CA in that file signed it, that it is valid now, that it allows client authentication (extended key usage clientAuth) and that --etcd-key-file is its key",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_one_endpoint_while_the_other_is_down_stops_the_server() {
    let etcd = EtcdProcess::start_secured().await;
    // Nothing listens on the first endpoint.
    let down = format!("https://127.0.0.1:{}", snowkeep_test_support::free_port());
    let endpoints = format!("{down},{}", etcd.endpoint());
    let args = with_flag(&etcd.server_args(), "--etcd-endpoints", Some(&endpoints));
    let args = with_client_certificate(&args, &etcd.pki().stranger_client());
    refused_at_start(
        &etcd,
        &args,
        "one-down",
        &format!(
            "etcd at {} refused this server: it requires a client certificate signed by a CA it trusts (its --trusted-ca-file) and refused the one in --etcd-cert-file",
            etcd.endpoint()
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_client_certificate_stops_the_server_at_start() {
    let etcd = EtcdProcess::start_secured().await;
    let args = with_client_certificate(&etcd.server_args(), &etcd.pki().expired_client());
    refused_at_start(
        &etcd,
        &args,
        "expired",
        "refused this server: it requires a client certificate signed by a CA it trusts (its --trusted-ca-file) and refused the one in --etcd-cert-file (SNOWKEEP_ETCD_CERT_FILE), which has expired (its notAfter is past): renew it, then restart the server",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_stops_the_server_at_start() {
    let etcd = EtcdProcess::start_secured().await;
    let other = etcd.pki().other_ca_file();
    let args = with_flag(
        &etcd.server_args(),
        "--etcd-ca-file",
        Some(other.to_str().unwrap()),
    );
    refused_at_start(
        &etcd,
        &args,
        "wrong-ca",
        "refused this server: its server certificate is not trusted: it must be signed by a CA in --etcd-ca-file (SNOWKEEP_ETCD_CA_FILE)",
    )
    .await;
}

/// etcd's simple auth tokens expire `--auth-token-ttl` after their last use.
/// With a 2 s token TTL and a 30 s lease TTL, the server's requests (lease
/// renewal and namespace check every 10 s, capacity read every 5 s) come
/// further apart than a token lives, so nearly every one finds its token
/// expired: the server must log in again, keep its lease and machine id,
/// and keep issuing, over many token lifetimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_keeps_its_lease_across_many_auth_token_expiries() {
    let etcd = EtcdProcess::start_secured_with(SecureOptions {
        auth_token_ttl: Some(2),
    })
    .await;
    let s = server(
        &etcd.server_args(),
        "token-ttl",
        &["--lease-ttl", "30s", "--outage-budget", "30s"],
    );
    s.wait_serving(READY).await;
    let machine_id = s.machine_id().await;
    let logins_before = etcd.authentications().await;
    let start = tokio::time::Instant::now();
    // Five lease renewals, twelve token lifetimes and more.
    let mut issued = 0;
    let mut last = 0;
    while start.elapsed() < Duration::from_secs(50) {
        let ids = s.next_ids(100).await.unwrap();
        assert_eq!(ids.len(), 100);
        assert!(ids[0] > last);
        last = *ids.last().unwrap();
        issued += ids.len();
        assert_eq!(s.machine_id().await, machine_id);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(issued >= 5_000, "{issued}");
    // The server logged in again and again (the test's own clients made
    // none meanwhile), and never lost its lease.
    let logins = etcd.authentications().await - logins_before;
    assert!(logins >= 4, "only {logins} logins in 50 s of 2 s tokens");
    assert_eq!(
        s.metric("snowkeep_lease_losses_total{reason=\"expired\"}")
            .await,
        0.0
    );
    assert_eq!(
        s.metric("snowkeep_lease_losses_total{reason=\"deadline\"}")
            .await,
        0.0
    );
    let held = holders(&etcd, "token-ttl").await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        held[0].0,
        format!("/snowkeep/v1/ns/token-ttl/holder/{machine_id:05}")
    );
    let log = s.log();
    assert!(!log.contains("lease lost"), "{log}");
    eventually("the server to still serve", READY, || async {
        s.next_ids(1).await.is_ok()
    })
    .await;
}
