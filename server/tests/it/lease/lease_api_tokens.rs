//! Lease tokens: only the holder of a requester's lease token can renew or
//! release its machine ids. Anyone who knows (or guesses) the requester's
//! identity, which names it but is no secret, gets PERMISSION_DENIED and
//! changes nothing in etcd.

use std::time::Duration;

use snowkeep_client::{EmbeddedGenerator, Requester, StopReason, SystemClock};
use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, embedded, lease_client, release, renew, requester};
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

/// Every key of the namespace that belongs to one requester holding
/// `machine_id`: its holder and fence keys, its record and its token key,
/// with value, lease and revisions, so a comparison is byte for byte.
async fn requester_keys(etcd: &EtcdProcess, ns: &str, machine_id: u32) -> Vec<String> {
    let mut client = etcd.client().await;
    let mut out = Vec::new();
    for (key, prefix) in [
        (
            format!("/snowkeep/v1/ns/{ns}/holder/{machine_id:05}"),
            false,
        ),
        (format!("/snowkeep/v1/ns/{ns}/fence/{machine_id:05}"), false),
        (format!("/snowkeep/v1/ns/{ns}/requester/"), true),
        (format!("/snowkeep/v1/ns/{ns}/token/"), true),
    ] {
        let options = prefix.then(|| snowkeep_etcd::etcd_client::GetOptions::new().with_prefix());
        let resp = client.get(key.clone(), options).await.unwrap();
        assert!(!resp.kvs().is_empty(), "no key {key}");
        for kv in resp.kvs() {
            out.push(format!(
                "{} = {:?} lease {} create {} mod {} version {}",
                kv.key_str().unwrap(),
                kv.value(),
                kv.lease(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version()
            ));
        }
    }
    out
}

/// The lease of `machine_id`'s holder key and its time to live, seconds.
async fn holder_lease(etcd: &EtcdProcess, ns: &str, machine_id: u32) -> (i64, i64) {
    let mut client = etcd.client().await;
    let holder = client
        .get(format!("/snowkeep/v1/ns/{ns}/holder/{machine_id:05}"), None)
        .await
        .unwrap();
    let lease = holder.kvs()[0].lease();
    let ttl = client.lease_time_to_live(lease, None).await.unwrap().ttl();
    (lease, ttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_or_renew_with_a_stolen_identity_changes_nothing() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "stolen",
        &["--machine-id-range", "10..12"],
    );
    server.wait_serving(READY).await;
    // A live embedded client ...
    let victim = requester(100);
    let config = embedded(&server, "stolen", victim.clone(), 1);
    let generator = EmbeddedGenerator::start(config, SystemClock::shared())
        .await
        .unwrap();
    let id = u32::from(generator.machine_ids()[0].get());
    // ... past its first renewal (first lease 10 min, renewed 48 h).
    eventually("the first renewal", Duration::from_secs(10), || async {
        holder_lease(&etcd, "stolen", id).await.1 > 3600
    })
    .await;
    let before = requester_keys(&etcd, "stolen", id).await;
    let issued_before = generator.next_ids(1000).await.unwrap();

    // Someone who knows its identity (host, pid, start time, nonce).
    let mut api = lease_client(&server).await;
    let wrong = "ab".repeat(32);
    for token in ["", wrong.as_str()] {
        let refused = api
            .release(release("stolen", &victim, token, &[(id, 0)]))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        let refused = api
            .renew(renew("stolen", &victim, token, Some(0)))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        let refused = api
            .acquire(pb::AcquireRequest {
                lease_token: token.into(),
                ..acquire("stolen", &victim, 1, None)
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    let malformed = api
        .release(release("stolen", &victim, "not-a-token", &[(id, 0)]))
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert_eq!(
        malformed.message(),
        "invalid lease_token: send the 64 hex digits that Acquire returned, or leave it empty"
    );
    let denied = api
        .release(release("stolen", &victim, &wrong, &[]))
        .await
        .unwrap_err();
    assert_eq!(
        denied.message(),
        "permission denied for this requester's lease: the lease_token does not match. Send the lease_token that this requester's Acquire returned; a process without it must start over as a new requester (a new nonce). Machine ids whose grant was lost free themselves when their lease ends"
    );

    // Nothing changed: not a byte, not a revision.
    assert_eq!(requester_keys(&etcd, "stolen", id).await, before);
    // The client keeps issuing, above everything it issued before.
    let issued_after = generator.next_ids(1000).await.unwrap();
    assert!(issued_after[0] > *issued_before.last().unwrap());
    assert_eq!(generator.stopped(), None);
    // A new server does not get its machine id.
    let mut other = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "stolen",
        &["--machine-id-range", &format!("{id}..{}", id + 1)],
    );
    other
        .assert_exits(Duration::from_secs(15), 1, "no free machine id")
        .await;
    // The identity never reached the log.
    assert!(!server.log().contains(&victim.nonce), "{}", server.log());
    assert_eq!(generator.shutdown().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_only_in_the_acquire_answer_and_its_hash_only_in_etcd() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "secret", &[]);
    server.wait_serving(READY).await;
    let mut api = lease_client(&server).await;
    let who = requester(101);
    let grant = api
        .acquire(acquire("secret", &who, 1, None))
        .await
        .unwrap()
        .into_inner();
    let token = grant.lease_token.clone();
    api.renew(renew("secret", &who, &token, None))
        .await
        .unwrap();
    // etcd keeps the SHA-256 of the token, on the requester's lease.
    let mut client = etcd.client().await;
    let stored = client
        .get(
            "/snowkeep/v1/ns/secret/token/",
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(stored.kvs().len(), 1);
    let bytes: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&token[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(stored.kvs()[0].value_str().unwrap(), hash);
    assert_ne!(stored.kvs()[0].lease(), 0);
    // Keys name the requester by the SHA-256 of its identity; the log by the
    // first 12 hex digits of it.
    let identity = format!(
        "{}:{}:{}:{}",
        who.host_id, who.pid, who.start_unix_ms, who.nonce
    );
    let id_hash: String = sha2::Sha256::digest(identity.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        stored.kvs()[0].key_str().unwrap(),
        format!("/snowkeep/v1/ns/secret/token/{id_hash}")
    );
    let released = api
        .release(release("secret", &who, &token, &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, 1);
    // Release deleted every key of the requester.
    for prefix in ["requester", "token"] {
        let left = client
            .get(
                format!("/snowkeep/v1/ns/secret/{prefix}/"),
                Some(
                    snowkeep_etcd::etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .unwrap();
        assert_eq!(left.count(), 0, "{prefix} keys left");
    }
    let log = server.log();
    assert!(log.contains(&format!("requester={}", who.tag())), "{log}");
    assert!(log.contains(&id_hash[..12]));
    for secret in [&token, &who.nonce, &identity] {
        assert!(!log.contains(secret.as_str()), "{secret} logged:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generator_whose_identity_already_holds_machine_ids_starts_over_as_a_new_requester() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "lost", &[]);
    server.wait_serving(READY).await;
    // An Acquire was granted but its answer (and the token) never arrived.
    let who = requester(102);
    let lost = api_acquire(&server, &who).await;
    let config = embedded(&server, "lost", who.clone(), 1);
    let generator = EmbeddedGenerator::start(config, SystemClock::shared())
        .await
        .unwrap();
    assert_ne!(u32::from(generator.machine_ids()[0].get()), lost);
    let now = generator.requester();
    assert_eq!(
        (&now.host_id, now.pid, now.start_unix_ms),
        (&who.host_id, who.pid, who.start_unix_ms)
    );
    assert_ne!(now.nonce, who.nonce);
    assert_eq!(generator.next_ids(100).await.unwrap().len(), 100);
    assert_eq!(generator.shutdown().await, 1);
}

async fn api_acquire(server: &ServerProcess, who: &Requester) -> u32 {
    lease_client(server)
        .await
        .acquire(acquire("lost", who, 1, None))
        .await
        .unwrap()
        .into_inner()
        .machine_ids[0]
        .machine_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generator_whose_token_is_refused_stops_for_good() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "taken",
        &["--renewed-lease-duration", "6s"],
    );
    server.wait_serving(READY).await;
    let who = requester(103);
    let config = embedded(&server, "taken", who.clone(), 1);
    let generator = EmbeddedGenerator::start(config, SystemClock::shared())
        .await
        .unwrap();
    let id = u32::from(generator.machine_ids()[0].get());
    eventually("the first renewal", Duration::from_secs(10), || async {
        let (_, ttl) = holder_lease(&etcd, "taken", id).await;
        (1..=6).contains(&ttl)
    })
    .await;
    // Its lease ends at etcd, and someone acquires under its identity.
    let (lease, _) = holder_lease(&etcd, "taken", id).await;
    etcd.client().await.lease_revoke(lease).await.unwrap();
    lease_client(&server)
        .await
        .acquire(acquire("taken", &who, 1, None))
        .await
        .unwrap();
    // Its next renewal (at half of 6 s) is refused: it stops at once.
    eventually("the generator to stop", Duration::from_secs(8), || async {
        generator.stopped().is_some()
    })
    .await;
    assert_eq!(generator.stopped(), Some(StopReason::TokenRefused));
    assert!(generator.next_id().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_carry_the_token_and_a_stolen_identity_cannot_check() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "checked", &[]);
    server.wait_serving(READY).await;
    let who = requester(104);
    let config = snowkeep_client::EmbeddedConfig {
        check_interval: Duration::from_millis(300),
        ..embedded(&server, "checked", who.clone(), 1)
    };
    let generator = EmbeddedGenerator::start(config, SystemClock::shared())
        .await
        .unwrap();
    let id = u32::from(generator.machine_ids()[0].get());
    // The generator's own Checks carry its token: answered OK, and it issues on.
    let checks = r#"snowkeep_grpc_requests_total{service="snowkeep.v1.LeaseService",method="Check",protocol="grpc",code="OK"}"#;
    eventually("three Checks answered", Duration::from_secs(10), || async {
        server.metric(checks).await >= 3.0
    })
    .await;
    assert_eq!(generator.stopped(), None);
    assert_eq!(generator.next_ids(100).await.unwrap().len(), 100);

    // Anyone else with its identity but not its token is refused, before
    // anything else is read, and nothing changes.
    let before = requester_keys(&etcd, "checked", id).await;
    let mut api = lease_client(&server).await;
    for token in [String::new(), "ab".repeat(32)] {
        let refused = api
            .check(pb::CheckRequest {
                requester: Some(who.to_pb()),
                namespace: "checked".into(),
                lease_token: token,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    assert_eq!(requester_keys(&etcd, "checked", id).await, before);
    assert_eq!(generator.stopped(), None);

    // The lease now answers to another token (as when its lease ended and
    // someone acquired under its identity; here in one write, so no Check
    // can find the lease gone in between): its next Check (not a Renew: the
    // next is a day away) is refused, and it stops for good.
    let mut client = etcd.client().await;
    let stored = client
        .get(
            "/snowkeep/v1/ns/checked/token/",
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let kv = &stored.kvs()[0];
    client
        .put(
            kv.key().to_vec(),
            "cd".repeat(32),
            Some(snowkeep_etcd::etcd_client::PutOptions::new().with_lease(kv.lease())),
        )
        .await
        .unwrap();
    eventually("the generator to stop", Duration::from_secs(5), || async {
        generator.stopped().is_some()
    })
    .await;
    assert_eq!(generator.stopped(), Some(StopReason::TokenRefused));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_never_lowers_a_fence_below_the_servers_clock() {
    let etcd = EtcdProcess::start().await;
    let server =
        ServerProcess::on_etcd(&etcd.endpoint(), "lower", &["--machine-id-range", "30..32"]);
    server.wait_serving(READY).await;
    let mut api = lease_client(&server).await;
    let layout_now = || {
        snowkeep_client::Layout::default()
            .to_layout_ms(snowkeep_client::Clock::unix_ms(&SystemClock))
            .unwrap()
            .get()
    };
    // A first holder gives its (never-used) machine id back, reporting a
    // last timestamp of 1: its floor is the namespace floor (0), so the
    // fence goes down to the server's clock, no lower.
    let first = requester(104);
    let grant = api
        .acquire(acquire("lower", &first, 1, None))
        .await
        .unwrap()
        .into_inner();
    let id = grant.machine_ids[0].machine_id;
    assert_eq!(grant.machine_ids[0].floor_ms, 0);
    let before = layout_now();
    api.release(release("lower", &first, &grant.lease_token, &[(id, 1)]))
        .await
        .unwrap();
    let after = layout_now();
    let mut client = etcd.client().await;
    let key = format!("/snowkeep/v1/ns/lower/fence/{id:05}");
    let fence = |client: &mut snowkeep_etcd::etcd_client::Client| {
        let mut client = client.clone();
        let key = key.clone();
        async move {
            client.get(key, None).await.unwrap().kvs()[0]
                .value_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        }
    };
    let floor = fence(&mut client).await;
    assert!(
        (before..=after).contains(&floor),
        "fence {floor}, clock {before}..{after}"
    );
    // Once the clock has passed that fence, the next holder of the id (its
    // floor) reports a last timestamp of 1: again the fence goes no lower
    // than the server's clock.
    eventually(
        "the clock to pass the floor",
        Duration::from_secs(10),
        || async { layout_now() > floor },
    )
    .await;
    let second = requester(105);
    let grant = api
        .acquire(acquire("lower", &second, 1, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids[0].machine_id, id);
    let before = layout_now();
    api.release(release("lower", &second, &grant.lease_token, &[(id, 1)]))
        .await
        .unwrap();
    let after = layout_now();
    let lowered = fence(&mut client).await;
    assert!(
        (before..=after).contains(&lowered),
        "fence {lowered}, clock {before}..{after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_three_machine_ids_renew_and_release_within_etcds_transaction_limit() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "wide", &[]);
    server.wait_serving(READY).await;
    let mut api = lease_client(&server).await;
    let who = requester(106);
    let grant = api
        .acquire(acquire("wide", &who, 63, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 63);
    // 63 × (holder + fence) + record + token = 128 operations, etcd's limit.
    let renewed = api
        .renew(renew("wide", &who, &grant.lease_token, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.machine_ids.len(), 63);
    // The description moved to the renewed lease too (in its own
    // transaction): the administration service still lists the requester.
    let mut admin = pb::admin_service_client::AdminServiceClient::new(server.channel().await);
    let listed = admin
        .list_requesters(pb::ListRequestersRequest {
            namespace: "wide".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .requesters;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].pid, listed[0].machine_ids.len()), (4242, 63));
    let last: Vec<(u32, u64)> = grant
        .machine_ids
        .iter()
        .map(|m| (m.machine_id, m.floor_ms))
        .collect();
    let released = api
        .release(release("wide", &who, &grant.lease_token, &last))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, 63);
}
