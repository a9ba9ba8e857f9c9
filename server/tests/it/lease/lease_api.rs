//! The Lease API and the Rust clients, against real etcd and real servers.

use std::collections::HashSet;
use std::time::Duration;

use snowkeep_client::{
    EmbeddedGenerator, RemoteClient, RemoteConfig, Requester, StopReason, SystemClock,
};
use snowkeep_proto::v1 as pb;
use tonic::transport::Channel;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{
    acquire, embedded, ids_of, lease_api_server, lease_client, release, renew, requester,
};
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

/// Starts an embedded generator with one machine id and waits until it issues.
async fn start_ready(server: &ServerProcess, ns: &str, who: Requester) -> EmbeddedGenerator {
    let generator = EmbeddedGenerator::start(embedded(server, ns, who, 1), SystemClock::shared())
        .await
        .unwrap();
    eventually(
        "the generator to issue",
        Duration::from_secs(10),
        || async { generator.is_ready() },
    )
    .await;
    generator
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_round_trip() {
    let (_etcd, _server, mut api) = lease_api_server("api").await;
    let who = requester(1);

    let grant = api
        .acquire(acquire("api", &who, 2, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 2);
    assert_eq!(grant.lease_duration_ms, 600_000, "first lease: 10 min");
    assert_eq!(grant.expires_in_ms, 600_000);
    assert_eq!(grant.layout.unwrap().machine_bits, 12);
    let token = grant.lease_token.clone();
    assert_eq!(token.len(), 64, "32 random bytes in hex: {token}");
    assert!(token.chars().all(|c| c.is_ascii_hexdigit()));
    for m in &grant.machine_ids {
        // Never-used ids of a new namespace: the namespace floor (0).
        assert_eq!(m.floor_ms, 0, "{m:?}");
        assert!(m.fence_ms > m.floor_ms, "{m:?}");
    }
    let renew = renew("api", &who, &token, None);
    let renewed = api.renew(renew.clone()).await.unwrap().into_inner();
    assert_eq!(ids_of(&renewed), ids_of(&grant));
    assert_eq!(renewed.lease_token, "", "only Acquire hands the token out");
    assert_eq!(
        renewed.lease_duration_ms,
        48 * 3600 * 1000,
        "renewed lease: 48 h"
    );
    // The same floors (a repeated grant must not move a requester's floor).
    let floors = |g: &pb::LeaseGrant| g.machine_ids.iter().map(|m| m.floor_ms).collect::<Vec<_>>();
    assert_eq!(floors(&renewed), floors(&grant));

    let capacity = |api: &mut pb::lease_service_client::LeaseServiceClient<Channel>| {
        let mut api = api.clone();
        async move {
            api.capacity(pb::CapacityRequest {
                namespace: "api".into(),
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let c = capacity(&mut api).await;
    assert_eq!(
        (c.total, c.held, c.free),
        (4096, 3, 4093),
        "2 leased + the server's own"
    );

    let released = api
        .release(release("api", &who, &token, &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, 2);
    assert_eq!(capacity(&mut api).await.held, 1);
    let gone = api.renew(renew).await.unwrap().into_inner();
    assert!(
        gone.machine_ids.is_empty(),
        "renew after release answers empty"
    );
    assert_eq!(gone.expires_in_ms, 0);
    let v = api
        .version(pb::VersionRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.api, "snowkeep.v1");

    let unknown = api
        .acquire(acquire("no-such-ns", &who, 1, None))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let bad = api
        .acquire(acquire("api", &who, 0, None))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert_eq!(bad.message(), "count must be between 1 and 63, got 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_acquire_returns_the_same_machine_ids_and_another_count_fails() {
    let (_etcd, _server, mut api) = lease_api_server("idem").await;
    let who = requester(2);
    let first = api
        .acquire(acquire("idem", &who, 3, None))
        .await
        .unwrap()
        .into_inner();
    let retry = |count| pb::AcquireRequest {
        lease_token: first.lease_token.clone(),
        ..acquire("idem", &who, count, None)
    };
    let again = api.acquire(retry(3)).await.unwrap().into_inner();
    assert_eq!(ids_of(&again), ids_of(&first));
    assert_eq!(again.expires_in_ms, 600_000);
    assert_eq!(again.lease_token, first.lease_token, "the same token back");
    // The same identity without the token is someone else: refused.
    let stranger = api
        .acquire(acquire("idem", &who, 3, None))
        .await
        .unwrap_err();
    assert_eq!(stranger.code(), tonic::Code::PermissionDenied);
    assert!(
        stranger
            .message()
            .starts_with("permission denied for this requester's lease: no lease_token was sent. Send the lease_token that this requester's Acquire returned"),
        "{}",
        stranger.message()
    );
    let other = api.acquire(retry(2)).await.unwrap_err();
    assert_eq!(other.code(), tonic::Code::AlreadyExists);
    assert_eq!(
        other.message(),
        "requester already holds 3 machine ids but asked for 2; Release them first or Acquire 3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_fifteen_minutes_behind_is_refused_on_acquire_and_only_warned_on_renew() {
    let (etcd, server, mut api) = lease_api_server("skew").await;
    let who = requester(3);
    let behind = snowkeep_client::Clock::unix_ms(&SystemClock) - 15 * 60 * 1000;

    let refused = api
        .acquire(acquire("skew", &who, 1, Some(behind)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().starts_with("client clock is 15m ")
            && refused
                .message()
                .ends_with("behind the server, over the 10m threshold: sync this host with NTP (chrony/ntpd), then retry"),
        "{}",
        refused.message()
    );
    assert_eq!(
        server.metric("snowkeep_clock_skew_rejections_total").await,
        1.0
    );

    // Renew is never refused for skew.
    let token = api
        .acquire(acquire("skew", &who, 1, None))
        .await
        .unwrap()
        .into_inner()
        .lease_token;
    let renewed = api
        .renew(renew("skew", &who, &token, Some(behind)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.machine_ids.len(), 1);
    assert!(server
        .log()
        .contains("client clock skew over half the threshold"));
    // The skew is kept in the server's memory, never in etcd: one requester
    // over the threshold, and no key beyond the lease's own.
    assert_eq!(
        server
            .metric("snowkeep_client_clock_skew_requesters{namespace=\"skew\",over=\"threshold\"}")
            .await,
        1.0
    );
    let mut client = etcd.client().await;
    let skew_keys = client
        .get(
            "/snowkeep/v1/ns/skew/skew/",
            Some(
                snowkeep_etcd::etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(skew_keys.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_generator_outlives_its_server_until_its_own_deadline() {
    let etcd = EtcdProcess::start().await;
    let mut server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "outlive",
        &["--renewed-lease-duration", "5s"],
    );
    server.wait_serving(READY).await;
    // The first renewal (immediately after start) brings the lease to 5 s.
    let generator = start_ready(&server, "outlive", requester(4)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("KILL");
    server.wait_exit(Duration::from_secs(5)).await;
    let killed = tokio::time::Instant::now();
    let mut issued = generator.next_ids(1000).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    issued.extend(
        generator
            .next_ids(1000)
            .await
            .expect("still inside its own lease"),
    );
    eventually(
        "the generator to stop at its deadline",
        Duration::from_secs(8),
        || async { generator.stopped().is_some() },
    )
    .await;
    let stopped_after = killed.elapsed();
    assert_eq!(generator.stopped(), Some(StopReason::Expired));
    assert!(
        stopped_after <= Duration::from_millis(5500),
        "stopped after {stopped_after:?}"
    );
    assert!(!generator.is_ready());
    assert!(generator.next_ids(1).await.is_err());
    assert_eq!(issued.iter().collect::<HashSet<_>>().len(), 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answering_empty_stops_issuance_at_once() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "empty",
        &["--renewed-lease-duration", "6s"],
    );
    server.wait_serving(READY).await;
    let who = requester(5);
    let generator = start_ready(&server, "empty", who.clone()).await;
    // The requester's lease ends at etcd (an operator revokes it).
    let mut client = etcd.client().await;
    let holder = client
        .get(
            format!(
                "/snowkeep/v1/ns/empty/holder/{:05}",
                generator.machine_ids()[0].get()
            ),
            None,
        )
        .await
        .unwrap();
    client.lease_revoke(holder.kvs()[0].lease()).await.unwrap();
    // The next renewal (at half of 6 s) answers empty: stop then, not at the deadline.
    let took = eventually("the generator to stop", Duration::from_secs(5), || async {
        generator.stopped().is_some()
    })
    .await;
    assert_eq!(generator.stopped(), Some(StopReason::LeaseGone));
    assert!(took < Duration::from_secs(4), "stopped after {took:?}");
    assert!(generator.next_id().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_generators_of_one_host_and_pid_get_eight_machine_ids() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "eight", &[]);
    server.wait_serving(READY).await;
    let starts = (0..8).map(|i| {
        let config = embedded(&server, "eight", requester(1_000 + i), 1);
        tokio::spawn(async move { EmbeddedGenerator::start(config, SystemClock::shared()).await })
    });
    let mut machine_ids = HashSet::new();
    let mut generators = Vec::new();
    for s in starts {
        let g = s.await.unwrap().unwrap();
        machine_ids.insert(g.machine_ids()[0]);
        generators.push(g);
    }
    assert_eq!(machine_ids.len(), 8);
    for g in generators {
        assert_eq!(g.shutdown().await, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_client_over_three_servers_survives_one_killed() {
    let etcd = EtcdProcess::start().await;
    let mut servers = ServerProcess::serving(3, &etcd.endpoint(), "remote").await;
    let endpoints: Vec<String> = servers.iter().map(ServerProcess::url).collect();
    let client = RemoteClient::new(&endpoints, RemoteConfig::default()).unwrap();
    let mut seen = HashSet::new();
    for _ in 0..30 {
        seen.extend(client.next_ids(100).await.unwrap());
    }
    servers[1].signal("KILL");
    servers[1].wait_exit(Duration::from_secs(5)).await;
    for i in 0..300 {
        let batch = client
            .next_ids(100)
            .await
            .unwrap_or_else(|e| panic!("call {i} after the kill failed: {e}"));
        assert!(batch.windows(2).all(|w| w[0] < w[1]));
        seen.extend(batch);
    }
    assert_eq!(seen.len(), 33_000);
    // The pool hands out the same ids locally.
    let pool = snowkeep_client::IdPool::new(client, snowkeep_client::PoolConfig::default());
    for _ in 0..5_000 {
        assert!(seen.insert(pool.next_id().await.unwrap()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_generators_servers_and_remote_clients_never_share_an_id() {
    let etcd = EtcdProcess::start().await;
    let servers = ServerProcess::serving(2, &etcd.endpoint(), "together").await;
    let endpoints: Vec<String> = servers.iter().map(ServerProcess::url).collect();
    let client = RemoteClient::new(&endpoints, RemoteConfig::default()).unwrap();
    let mut gens = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let config = embedded(server, "together", requester(2_000 + i as u64), 2);
        gens.push(
            EmbeddedGenerator::start(config, SystemClock::shared())
                .await
                .unwrap(),
        );
    }
    for g in &gens {
        eventually(
            "embedded generator ready",
            Duration::from_secs(10),
            || async { g.is_ready() },
        )
        .await;
    }
    let mut all: Vec<u64> = Vec::with_capacity(1_000_000);
    let remote = async {
        let mut ids = Vec::new();
        for _ in 0..2 {
            let mut stream = client.stream_ids(200_000, 10_000).await.unwrap();
            while let Some(b) = stream.message().await.unwrap() {
                ids.extend(b.ids);
            }
        }
        ids
    };
    let local = async {
        let mut ids = Vec::new();
        for g in &gens {
            for _ in 0..3 {
                ids.extend(g.next_ids(100_000).await.unwrap());
            }
        }
        ids
    };
    let (r, l) = tokio::join!(remote, local);
    all.extend(r);
    all.extend(l);
    assert_eq!(all.len(), 1_000_000);
    let unique: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(unique.len(), 1_000_000);
    for g in gens {
        assert_eq!(g.shutdown().await, 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_renewals_of_one_requester_never_void_its_lease() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "race", &[]);
    server.wait_serving(READY).await;
    let api = lease_client(&server).await;
    let who = requester(6);
    let first = api
        .clone()
        .acquire(acquire("race", &who, 2, None))
        .await
        .unwrap()
        .into_inner();
    let (held, token) = (ids_of(&first), first.lease_token);
    // Renew racing Acquire retries, as a client whose Acquire answer was lost:
    // 20 calls over 4 connections, released together.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(lease_client(&server).await);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let mut api = clients[i % 4].clone();
            let who = who.clone();
            let barrier = barrier.clone();
            let token = token.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                if i % 2 == 0 {
                    api.renew(renew("race", &who, &token, None)).await
                } else {
                    api.acquire(pb::AcquireRequest {
                        lease_token: token,
                        ..acquire("race", &who, 2, None)
                    })
                    .await
                }
            })
        })
        .collect();
    for call in calls {
        let grant = call.await.unwrap().unwrap().into_inner();
        assert_eq!(
            ids_of(&grant),
            held,
            "a concurrent renewal voided the lease"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requesters_get_machine_ids_from_the_deployment_range_only() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "ranged",
        &["--machine-id-range", "100..103"],
    );
    server.wait_serving(READY).await;
    let mut api = lease_client(&server).await;
    let grant = api
        .acquire(acquire("ranged", &requester(7), 2, None))
        .await
        .unwrap()
        .into_inner();
    let mut got = ids_of(&grant);
    got.push(server.machine_id().await);
    got.sort();
    assert_eq!(got, vec![100, 101, 102]);
    let c = api
        .capacity(pb::CapacityRequest {
            namespace: "ranged".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (c.total, c.held, c.free, c.range_start, c.range_end),
        (3, 3, 0, 100, 103)
    );
    let full = api
        .acquire(acquire("ranged", &requester(8), 1, None))
        .await
        .unwrap_err();
    assert_eq!(full.code(), tonic::Code::ResourceExhausted);
    // Nothing is recorded for a namespace that does not exist.
    let unknown = api
        .acquire(acquire("nosuch", &requester(9), 1, Some(1)))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let mut client = etcd.client().await;
    let stray = client
        .get(
            "/snowkeep/v1/ns/nosuch/",
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(stray.kvs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_generators_in_one_process_never_share_a_machine_id() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "twins", &[]);
    server.wait_serving(READY).await;
    // Two libraries of one process, each starting its own generator with the
    // process's identity: the same host, pid and start time.
    let me = Requester::current();
    let a = EmbeddedGenerator::start(
        embedded(&server, "twins", me.clone(), 1),
        SystemClock::shared(),
    )
    .await
    .unwrap();
    let b = EmbeddedGenerator::start(
        embedded(&server, "twins", me.renewed_nonce(), 1),
        SystemClock::shared(),
    )
    .await
    .unwrap();
    assert_ne!(a.machine_ids(), b.machine_ids());
    let (x, y) = tokio::join!(a.next_ids(50_000), b.next_ids(50_000));
    let all: HashSet<u64> = x.unwrap().into_iter().chain(y.unwrap()).collect();
    assert_eq!(all.len(), 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requesters_machine_id_stays_held_while_its_record_lives() {
    let etcd = EtcdProcess::start().await;
    let server =
        ServerProcess::on_etcd(&etcd.endpoint(), "held", &["--machine-id-range", "10..12"]);
    server.wait_serving(READY).await;
    let mut api = lease_client(&server).await;
    let grant = api
        .acquire(acquire("held", &requester(10), 1, None))
        .await
        .unwrap()
        .into_inner();
    let id = grant.machine_ids[0].machine_id;
    // An operator deletes the requester's holder and fence keys; its record
    // (and the embedded generator, fenced a whole lease ahead) lives on.
    let mut client = etcd.client().await;
    client
        .delete(format!("/snowkeep/v1/ns/held/holder/{id:05}"), None)
        .await
        .unwrap();
    client
        .delete(format!("/snowkeep/v1/ns/held/fence/{id:05}"), None)
        .await
        .unwrap();
    let mut other = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "held",
        &["--machine-id-range", &format!("{id}..{}", id + 1)],
    );
    other
        .assert_exits(Duration::from_secs(15), 1, "no free machine id")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_never_raises_a_fence_and_a_late_acquire_never_shortens_a_lease() {
    let (etcd, _server, mut api) = lease_api_server("caps").await;
    let who = requester(11);
    let token = api
        .acquire(acquire("caps", &who, 1, None))
        .await
        .unwrap()
        .into_inner()
        .lease_token;
    let renewed = api
        .renew(renew("caps", &who, &token, None))
        .await
        .unwrap()
        .into_inner();
    let m = renewed.machine_ids[0];
    // A repeated Acquire (10 min) after the Renew (48 h) keeps the 48 h lease.
    api.acquire(pb::AcquireRequest {
        lease_token: token.clone(),
        ..acquire("caps", &who, 1, None)
    })
    .await
    .unwrap();
    let mut client = etcd.client().await;
    let holder = client
        .get(
            format!("/snowkeep/v1/ns/caps/holder/{:05}", m.machine_id),
            None,
        )
        .await
        .unwrap();
    let ttl = client
        .lease_time_to_live(holder.kvs()[0].lease(), None)
        .await
        .unwrap()
        .ttl();
    assert!(ttl > 47 * 3600, "lease cut to {ttl} s");
    // A release reporting an absurd last timestamp keeps the fence where it was.
    api.release(release("caps", &who, &token, &[(m.machine_id, u64::MAX)]))
        .await
        .unwrap();
    let fence = client
        .get(
            format!("/snowkeep/v1/ns/caps/fence/{:05}", m.machine_id),
            None,
        )
        .await
        .unwrap();
    assert_eq!(fence.kvs()[0].value_str().unwrap(), m.fence_ms.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_api_follows_the_server_off_a_dead_etcd_member() {
    let mut etcd = EtcdProcess::cluster(3).await;
    let server = ServerProcess::spawn(&[
        "--etcd-endpoints",
        &etcd.endpoints(),
        "--namespace",
        "api3",
        "--create-namespace",
        "--lease-ttl",
        "5s",
    ]);
    server.wait_serving(READY).await;
    etcd.kill_member(0);
    // Killing the first member may cost an election: calls during it fail
    // with a retryable UNAVAILABLE ("leader changed"). Once one succeeds, the
    // Lease API must stay off the dead member: every later call succeeds.
    let mut api = lease_client(&server).await;
    let mut n = 0;
    eventually(
        "a Lease API call to succeed after the kill",
        Duration::from_secs(15),
        || {
            n += 1;
            let mut api = api.clone();
            let who = requester(200 + n);
            async move { api.acquire(acquire("api3", &who, 1, None)).await.is_ok() }
        },
    )
    .await;
    for i in 0..10 {
        api.acquire(acquire("api3", &requester(100 + i), 1, None))
            .await
            .unwrap_or_else(|e| panic!("Acquire {i} after failover: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_pool_with_no_server_reports_the_error_instead_of_waiting_forever() {
    let dead = format!("http://127.0.0.1:{}", snowkeep_test_support::free_port());
    let client = RemoteClient::new(
        &[dead],
        RemoteConfig {
            attempts: 1,
            ..RemoteConfig::default()
        },
    )
    .unwrap();
    let pool = snowkeep_client::IdPool::new(
        client,
        snowkeep_client::PoolConfig {
            max_wait: Duration::from_millis(500),
            ..Default::default()
        },
    );
    // The refill's own error (one attempt, refused connection), well before
    // max_wait: UNAVAILABLE.
    let err = pool.next_id().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generator_whose_clock_is_far_behind_its_floor_refuses_the_grant() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "behind",
        &[
            "--client-skew-threshold",
            "0s",
            "--first-lease-duration",
            "1m",
        ],
    );
    server.wait_serving(READY).await;
    // Without its fence count (as a namespace of an older version) a machine
    // id without a fence key starts one fence horizon (3 s) ahead of the
    // server's clock.
    etcd.client()
        .await
        .delete(
            snowkeep_etcd::keys::fence_count_root("behind"),
            Some(snowkeep_etcd::etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    // This process's clock, two minutes behind the server's.
    let clock =
        snowkeep_client::ManualClock::new(snowkeep_client::Clock::unix_ms(&SystemClock) - 120_000);
    let err = EmbeddedGenerator::start(embedded(&server, "behind", requester(12), 1), clock)
        .await
        .unwrap_err();
    assert!(
        matches!(err, snowkeep_client::ClientError::ClockBehindFloor { .. }),
        "{err}"
    );
    // The refused grant was given back.
    let c = lease_client(&server)
        .await
        .capacity(pb::CapacityRequest {
            namespace: "behind".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(c.held, 1, "only the server's own machine id");
}

/// An explicit `client_time_unix_ms = 0` is "not given" on Acquire and
/// Renew (never a clock 56 years behind); Release names the layout's real
/// machine-id range; Acquire on an unreadable namespace record gets
/// FAILED_PRECONDITION naming the record's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_client_time_machine_id_range_and_a_garbage_namespace_record() {
    let (etcd, server, mut api) = lease_api_server("small").await;
    let who = requester(9100);
    let grant = api
        .acquire(acquire("small", &who, 1, Some(0)))
        .await
        .expect("Acquire with client time 0 is granted")
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 1);
    api.renew(renew("small", &who, &grant.lease_token, Some(0)))
        .await
        .expect("Renew with client time 0");
    assert_eq!(
        server.metric("snowkeep_clock_skew_rejections_total").await,
        0.0
    );
    assert_eq!(
        server
            .metric("snowkeep_clock_skew_clamped_total{namespace=\"small\",source=\"client\"}")
            .await,
        0.0
    );

    for bad in [4096, 65_536] {
        let err = api
            .release(release("small", &who, &grant.lease_token, &[(bad, 1)]))
            .await
            .expect_err("a machine id outside the layout");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            err.message(),
            format!(
                "machine id {bad} is out of range: the namespace's layout has 12 machine bits, so machine ids are 0 to 4095"
            )
        );
    }
    let id = ids_of(&grant)[0];
    let released = api
        .release(release("small", &who, &grant.lease_token, &[(id, 1)]))
        .await
        .expect("Release")
        .into_inner();
    assert_eq!(released.released, 1);

    let key = "/snowkeep/v1/ns/junk/layout";
    etcd.client().await.put(key, "garbage", None).await.unwrap();
    let err = api
        .acquire(acquire("junk", &requester(9101), 1, None))
        .await
        .expect_err("an unreadable namespace record");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().starts_with(&format!(
            "unreadable namespace record at {key}: \"garbage\" ("
        )),
        "{}",
        err.message()
    );
}
