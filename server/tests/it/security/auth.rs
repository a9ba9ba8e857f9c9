//! API keys with `--auth on`, against real etcd and two real servers that
//! share it: exact statuses for each wrong key, revocation across servers,
//! namespace and permission scopes, Lease API quotas (also under concurrent
//! Acquires through both servers), an unauthenticated flood, and the audit
//! trail.

use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::auth::{admin, ids, lease, random_key, AuthCluster};
use snowkeep_test_support::eventually;
use snowkeep_test_support::lease::{acquire, ids_of, release, renew, requester};

use pb::Permission::{Ids, Lease};

/// Asserts `r` failed with `code` and a message containing `fragment`.
fn assert_status<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, fragment: &str) {
    let status = r.expect_err("expected a refusal");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(fragment),
        "{:?} lacks {fragment:?}",
        status.message()
    );
}

/// Machine ids that Lease API requesters of `c.ns` hold, read from their
/// records in etcd (the servers' own machine ids, which come and go with
/// their 2 s leases under load, are not counted).
async fn held(c: &AuthCluster, _key: &str) -> u32 {
    let prefix = format!("/snowkeep/v1/ns/{}/requester/", c.ns);
    let resp = c
        .etcd
        .client()
        .await
        .get(
            prefix,
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            let value = std::str::from_utf8(kv.value()).unwrap();
            let ids = value.split(';').next().unwrap();
            ids.split(',').count() as u32
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_wrong_key_gets_unauthenticated_and_a_revoke_reaches_the_other_server() {
    let c = AuthCluster::start("authkeys").await;
    let next = pb::NextIdsRequest {
        count: 1,
        ..Default::default()
    };
    // Health stays open.
    assert_eq!(
        c.a.health().await,
        Some(tonic_health::pb::health_check_response::ServingStatus::Serving)
    );
    assert_status(
        ids(&c.a, None).await.next_ids(next).await,
        Code::Unauthenticated,
        "no API key: authentication is on; send `authorization: Bearer <id>.<secret>`",
    );
    let mut malformed = ids(&c.a, Some("not-a-key")).await;
    assert_status(
        malformed.next_ids(next).await,
        Code::Unauthenticated,
        "malformed API key: a key is `<id>.<secret>` with one dot",
    );
    let unknown = random_key("knobody000001");
    assert_status(
        ids(&c.a, Some(&unknown)).await.next_ids(next).await,
        Code::Unauthenticated,
        "unknown API key id \"knobody000001\"",
    );
    let (key, record) = c.create_key(&[Ids], &[], 0).await;
    assert_eq!(key.split_once('.').unwrap().0, record.id);
    let wrong = random_key(&record.id);
    let refused = ids(&c.a, Some(&wrong)).await.next_ids(next).await;
    let message = refused.as_ref().unwrap_err().message().to_owned();
    assert_status(
        refused,
        Code::Unauthenticated,
        &format!("wrong secret for API key {}", record.id),
    );
    assert!(!message.contains(wrong.split_once('.').unwrap().1));
    // The key works on both servers (b learnt it through its watch).
    assert_eq!(
        ids(&c.a, Some(&key))
            .await
            .next_ids(next)
            .await
            .unwrap()
            .into_inner()
            .ids
            .len(),
        1
    );
    eventually(
        "server b to know the new key",
        Duration::from_secs(10),
        || {
            let (b, key, next) = (&c.b, key.clone(), next);
            async move { ids(b, Some(&key)).await.next_ids(next).await.is_ok() }
        },
    )
    .await;
    // An ids key may not administer.
    assert_status(
        admin(&c.a, Some(&key))
            .await
            .list_keys(pb::ListKeysRequest {})
            .await,
        Code::PermissionDenied,
        "lacks the admin permission that AdminService needs",
    );

    // Expired now, through b: refused on a, with the time.
    let expired = admin(&c.b, Some(&c.admin_key))
        .await
        .expire_key(pb::ExpireKeyRequest {
            id: record.id.clone(),
            expires_unix_ms: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .key
        .unwrap();
    assert!(expired.expires_unix_ms > 0);
    eventually(
        "the expired key to be refused on a",
        Duration::from_secs(10),
        || {
            let (a, key, next) = (&c.a, key.clone(), next);
            async move {
                matches!(ids(a, Some(&key)).await.next_ids(next).await,
                Err(s) if s.code() == Code::Unauthenticated && s.message().contains("expired at"))
            }
        },
    )
    .await;

    // Revoked through b: a refuses it within seconds.
    let (key2, record2) = c.create_key(&[Ids, Lease], &[], 1).await;
    assert!(ids(&c.a, Some(&key2)).await.next_ids(next).await.is_ok());
    eventually("server b to know key2", Duration::from_secs(10), || {
        let (b, key, next) = (&c.b, key2.clone(), next);
        async move { ids(b, Some(&key)).await.next_ids(next).await.is_ok() }
    })
    .await;
    let revoked = admin(&c.b, Some(&c.admin_key))
        .await
        .revoke_key(pb::RevokeKeyRequest {
            id: record2.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .key
        .unwrap();
    assert!(revoked.revoked);
    let want = format!(
        "API key {} is revoked: ask an administrator for a new key",
        record2.id
    );
    let took = eventually(
        "the revoked key to be refused on a",
        Duration::from_secs(5),
        || {
            let (a, key, next, want) = (&c.a, key2.clone(), next, want.clone());
            async move {
                matches!(ids(a, Some(&key)).await.next_ids(next).await,
                Err(s) if s.code() == Code::Unauthenticated && s.message() == want)
            }
        },
    )
    .await;
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_status(
        admin(&c.a, Some(&c.admin_key))
            .await
            .revoke_key(pb::RevokeKeyRequest {
                id: "knosuchkey001".into(),
            })
            .await,
        Code::NotFound,
        "no API key knosuchkey001",
    );
    // ListKeys shows both, never a secret or hash.
    let listed = admin(&c.a, Some(&c.admin_key))
        .await
        .list_keys(pb::ListKeysRequest {})
        .await
        .unwrap()
        .into_inner()
        .keys;
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().any(|k| k.id == record2.id && k.revoked));
    // The refusals were counted by key id.
    let series = format!(
        "snowkeep_auth_requests_total{{key_id=\"{}\",result=\"revoked\"}}",
        record2.id
    );
    assert!(c.a.metric(&series).await >= 1.0, "{series}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_held_to_its_namespaces_and_permissions() {
    let c = AuthCluster::start("authscope").await;
    let (other_ns, _) = c.create_key(&[Ids, Lease], &["elsewhere"], 4).await;
    assert_status(
        ids(&c.a, Some(&other_ns))
            .await
            .next_ids(pb::NextIdsRequest {
                count: 1,
                ..Default::default()
            })
            .await,
        Code::PermissionDenied,
        "may not use namespace \"authscope\" (it may use: elsewhere)",
    );
    assert_status(
        lease(&c.a, Some(&other_ns))
            .await
            .acquire(acquire(&c.ns, &requester(1), 1, None))
            .await,
        Code::PermissionDenied,
        "may not use namespace \"authscope\"",
    );
    let (ids_only, _) = c.create_key(&[Ids], &[], 4).await;
    assert_status(
        lease(&c.a, Some(&ids_only))
            .await
            .acquire(acquire(&c.ns, &requester(2), 1, None))
            .await,
        Code::PermissionDenied,
        "lacks the lease permission that LeaseService needs; use a key created with --permission lease",
    );
    // The refusal is an audit event naming the key, though no handler ran.
    let key_id = ids_only.split_once('.').unwrap().0.to_owned();
    let a = &c.a;
    eventually(
        "the refused Acquire in the audit trail",
        Duration::from_secs(10),
        || {
            let key_id = key_id.clone();
            async move {
                a.log().lines().any(|l| {
                    l.contains("snowkeep::audit")
                        && l.contains("lease.acquire")
                        && l.contains(&format!("key_id={key_id}"))
                        && l.contains("result=PermissionDenied")
                })
            }
        },
    )
    .await;
    let (scoped, _) = c.create_key(&[Lease], &["authscope"], 4).await;
    let grant = lease(&c.a, Some(&scoped))
        .await
        .acquire(acquire(&c.ns, &requester(3), 1, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_quota_is_refused_and_renewals_never_are() {
    let c = AuthCluster::start("authquota").await;
    let (key, record) = c.create_key(&[Lease], &[], 3).await;
    let mut api = lease(&c.a, Some(&key)).await;
    let (one, two) = (requester(10), requester(11));
    let first = api
        .acquire(acquire(&c.ns, &one, 2, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.machine_ids.len(), 2);
    let held_before = held(&c, &key).await;
    assert_status(
        lease(&c.b, Some(&key))
            .await
            .acquire(acquire(&c.ns, &two, 2, None))
            .await,
        Code::ResourceExhausted,
        &format!(
            "key {} holds 2 of its 3 machine ids; asking for 2 would exceed its quota; release some, or use a key with a larger quota (snowkeepctl key create --max-lease-machine-ids N; a key's quota never changes)",
            record.id
        ),
    );
    assert_eq!(held(&c, &key).await, held_before, "nothing was claimed");
    // Renewing what it holds is never refused for the quota.
    let renewed = api
        .renew(renew(&c.ns, &one, &first.lease_token, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids_of(&renewed), ids_of(&first));
    // A retry of the same Acquire (same token) is a renewal too.
    let mut retry = acquire(&c.ns, &one, 2, None);
    retry.lease_token = first.lease_token.clone();
    assert_eq!(
        ids_of(&api.acquire(retry).await.unwrap().into_inner()),
        ids_of(&first)
    );
    assert_eq!(
        api.release(release(&c.ns, &one, &first.lease_token, &[]))
            .await
            .unwrap()
            .into_inner()
            .released,
        2
    );
    let second = lease(&c.b, Some(&key))
        .await
        .acquire(acquire(&c.ns, &two, 2, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.machine_ids.len(), 2);

    // Quota 0: no Acquire at all.
    let (none, none_record) = c.create_key(&[Lease], &[], 0).await;
    assert_status(
        lease(&c.a, Some(&none))
            .await
            .acquire(acquire(&c.ns, &requester(12), 1, None))
            .await,
        Code::ResourceExhausted,
        &format!("key {} holds 0 of its 0 machine ids", none_record.id),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_through_both_servers_never_exceed_the_quota() {
    let c = AuthCluster::start("authrace").await;
    let (key, _) = c.create_key(&[Lease], &[], 5).await;
    let (a, b) = (lease(&c.a, Some(&key)).await, lease(&c.b, Some(&key)).await);
    let servers = held(&c, &key).await;
    assert_eq!(servers, 0, "no requester yet");
    let mut calls = Vec::new();
    for i in 0..12u64 {
        let mut api = if i % 2 == 0 { a.clone() } else { b.clone() };
        let ns = c.ns.clone();
        calls.push(tokio::spawn(async move {
            api.acquire(acquire(&ns, &requester(100 + i), 1, None))
                .await
        }));
    }
    let mut granted = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(g) => granted += g.into_inner().machine_ids.len(),
            Err(s) => assert!(
                matches!(s.code(), Code::ResourceExhausted | Code::Unavailable),
                "{s:?}"
            ),
        }
    }
    assert!((1..=5).contains(&granted), "granted {granted}");
    assert_eq!(held(&c, &key).await - servers, granted as u32);
    // One at a time, the key gets exactly up to its quota, never past it.
    let mut i = 200;
    loop {
        match a
            .clone()
            .acquire(acquire(&c.ns, &requester(i), 1, None))
            .await
        {
            Ok(_) => i += 1,
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert!(
                    s.message().contains("holds 5 of its 5 machine ids"),
                    "{s:?}"
                );
                break;
            }
        }
    }
    assert_eq!(held(&c, &key).await - servers, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_flood_pins_no_machine_id() {
    let c = AuthCluster::start("authflood").await;
    let (reader, _) = c.create_key(&[Lease], &[], 0).await;
    let before = held(&c, &reader).await;
    let series = "snowkeep_auth_requests_total{key_id=\"-\",result=\"missing\"}";
    let missing_before = c.a.metric(series).await;
    let no_key = lease(&c.a, None).await;
    // 32 in flight on the one connection: below the server's 64 concurrent
    // streams, which it enforces with REFUSED_STREAM before any layer runs.
    let results: Vec<Result<_, tonic::Status>> = futures_util::stream::iter(0..200u64)
        .map(|i| {
            let mut api = no_key.clone();
            let ns = c.ns.clone();
            async move {
                api.acquire(acquire(&ns, &requester(1_000 + i), 63, None))
                    .await
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert_eq!(results.len(), 200);
    for r in results {
        let s = r.expect_err("no key, no grant");
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    }
    assert_eq!(held(&c, &reader).await, before);
    assert_eq!(c.a.metric(series).await - missing_before, 200.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_names_key_and_requester_and_logs_no_secret() {
    let c = AuthCluster::start("authaudit").await;
    let (key, record) = c.create_key(&[Lease], &[], 2).await;
    let mut tail = admin(&c.a, Some(&c.admin_key))
        .await
        .tail_audit(pb::TailAuditRequest {})
        .await
        .unwrap()
        .into_inner();
    let who = requester(77);
    let mut api = lease(&c.a, Some(&key)).await;
    let grant = api
        .acquire(acquire(&c.ns, &who, 1, None))
        .await
        .unwrap()
        .into_inner();
    api.release(release(&c.ns, &who, &grant.lease_token, &[]))
        .await
        .unwrap();
    let identity = format!(
        "{}:{}:{}:{}",
        who.host_id, who.pid, who.start_unix_ms, who.nonce
    );
    let digest = Sha256::digest(identity.as_bytes());
    let tag: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), tail.message())
            .await
            .expect("an audit event within 10 s")
            .unwrap()
            .unwrap()
            .event
            .unwrap();
        if event.action.starts_with("lease.") {
            seen.push(event);
        }
    }
    assert_eq!(seen[0].action, "lease.acquire");
    assert_eq!(seen[1].action, "lease.release");
    for e in &seen {
        assert_eq!(e.key_id, record.id);
        assert_eq!(e.requester_hash, tag);
        assert_eq!(e.namespace, c.ns);
        assert_eq!(e.result, "ok");
        assert!(e.peer.starts_with("127.0.0.1:"), "{e:?}");
    }
    assert_eq!(
        seen[0].subject,
        format!("machine_ids {}", grant.machine_ids[0].machine_id)
    );
    let log = c.a.log();
    assert!(log.contains("snowkeep::audit"), "no audit line in:\n{log}");
    for secret in [
        who.nonce.as_str(),
        grant.lease_token.as_str(),
        key.split_once('.').unwrap().1,
        c.admin_key.split_once('.').unwrap().1,
    ] {
        assert!(!log.contains(secret), "the log holds a secret {secret}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_clients_send_their_api_key() {
    use snowkeep_client::{
        ApiKey, EmbeddedConfig, EmbeddedGenerator, RemoteClient, RemoteConfig, SystemClock,
    };
    let c = AuthCluster::start("authclients").await;
    let (key, _) = c.create_key(&[Ids, Lease], &[], 1).await;
    let one_try = RemoteConfig {
        attempts: 1,
        ..RemoteConfig::default()
    };
    let without = RemoteClient::new(&[c.a.url()], one_try.clone()).unwrap();
    let refused = without.next_ids(3).await.unwrap_err().to_string();
    assert!(refused.contains("no API key"), "{refused}");
    let with = RemoteClient::new(
        &[c.a.url(), c.b.url()],
        RemoteConfig {
            api_key: Some(ApiKey::new(&key).unwrap()),
            ..one_try
        },
    )
    .unwrap();
    assert_eq!(with.next_ids(3).await.unwrap().len(), 3);

    let config = EmbeddedConfig {
        api_key: Some(ApiKey::new(&key).unwrap()),
        acquire_attempts: Some(1),
        requester: requester(500),
        ..EmbeddedConfig::new(c.a.url(), c.ns.clone())
    };
    let generator = EmbeddedGenerator::start(config, SystemClock::shared())
        .await
        .unwrap();
    assert_eq!(generator.machine_ids().len(), 1);
    eventually(
        "the embedded generator to issue",
        Duration::from_secs(10),
        || async { generator.is_ready() },
    )
    .await;
    assert_eq!(generator.next_ids(10).await.unwrap().len(), 10);
    assert_eq!(generator.shutdown().await, 1, "released with its key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_without_etcd_or_with_a_bad_key_file_refuses_to_start_with_64() {
    use snowkeep_test_support::server::ServerProcess;
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "no-dot-here\n").unwrap();
    let bad = bad.to_str().unwrap().to_owned();
    let missing = dir.path().join("missing.key");
    let missing = missing.to_str().unwrap().to_owned();
    let etcd = "http://127.0.0.1:1";
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--auth", "on"],
            "--auth on and --bootstrap-admin-key-file need etcd, where API keys are kept: add --etcd-endpoints".to_owned(),
        ),
        (
            vec!["--etcd-endpoints", etcd, "--bootstrap-admin-key-file", &bad],
            format!("invalid --bootstrap-admin-key-file (SNOWKEEP_BOOTSTRAP_ADMIN_KEY_FILE) {bad}: malformed API key: a key is `<id>.<secret>` with one dot"),
        ),
        (
            vec!["--etcd-endpoints", etcd, "--bootstrap-admin-key-file", &missing],
            format!("invalid --bootstrap-admin-key-file (SNOWKEEP_BOOTSTRAP_ADMIN_KEY_FILE) {missing}: No such file"),
        ),
    ];
    for (args, message) in cases {
        let mut server = ServerProcess::spawn(&args);
        let code = server.wait_exit(Duration::from_secs(15)).await.code();
        let log = server.log();
        assert_eq!(code, Some(64), "{args:?}: log:\n{log}");
        assert!(
            log.contains(&message),
            "{args:?}: want {message}\nlog:\n{log}"
        );
        let secretless = !log.contains("no-dot-here");
        assert!(secretless, "the key file's content is never echoed:\n{log}");
    }
}

/// With `--auth on`, GetInfo without a key answers only the version and the
/// server's clock, which is what the servers' peer clock check reads: two
/// servers measure each other. A wrong key is still refused there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_measure_clocks_with_auth_on_and_anonymous_get_info_reveals_nothing_else() {
    use snowkeep_client::Clock;
    let etcd = snowkeep_test_support::etcd::EtcdProcess::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin.key");
    std::fs::write(&file, random_key("kpeers")).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let flags = [
        "--auth",
        "on",
        "--bootstrap-admin-key-file",
        &file,
        "--peer-skew-interval",
        "1s",
    ];
    let a =
        snowkeep_test_support::server::ServerProcess::on_etcd(&etcd.endpoint(), "peerauth", &flags);
    a.wait_serving(snowkeep_test_support::READY).await;
    let b =
        snowkeep_test_support::server::ServerProcess::joining(&etcd.endpoint(), "peerauth", &flags);
    b.wait_serving(snowkeep_test_support::READY).await;

    let mut info = pb::info_service_client::InfoServiceClient::new(a.channel().await);
    let before = snowkeep_client::SystemClock.unix_ms();
    let anonymous = info
        .get_info(pb::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let after = snowkeep_client::SystemClock.unix_ms();
    assert_eq!(
        pb::GetInfoResponse {
            server_time_unix_ms: 0,
            ..anonymous.clone()
        },
        pb::GetInfoResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        }
    );
    // One host, one clock.
    assert!((before..=after).contains(&anonymous.server_time_unix_ms));
    let mut wrong = pb::info_service_client::InfoServiceClient::with_interceptor(
        a.channel().await,
        snowkeep_test_support::auth::bearer(Some(&random_key("kpeers"))),
    );
    assert_status(
        wrong.get_info(pb::GetInfoRequest {}).await,
        Code::Unauthenticated,
        "",
    );

    for s in [&a, &b] {
        s.wait_peer_measured("peerauth", "a peer clock measurement under --auth on")
            .await;
    }
}
