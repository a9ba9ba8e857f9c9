//! Several etcd endpoints: one member dead (refused) or hung (SIGSTOP), in
//! any position of `--etcd-endpoints`, at start or mid-run, while the other
//! members keep the quorum. The server must start within a fixed bound, keep
//! issuing, keep its lease, answer the Lease API and release cleanly.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use snowkeep_client::{Layout, Requester};
use snowkeep_proto::v1 as pb;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, free_port};

/// Longest start with one member down: one request timeout (500 ms at the
/// 2 s TTL) on a hung member, a fence to wait out (up to one fence horizon,
/// 3 s, for a machine id the count cannot vouch for), and process start-up
/// on two busy cores. A server that restarts its connection
/// attempt on the dead member never serves.
const START_BOUND: Duration = Duration::from_secs(5);

/// An endpoint nothing listens on: connections are refused.
fn refused_endpoint() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// A client of one member only (etcd-client's own balancing may pick a dead one).
async fn client_of(url: &str) -> snowkeep_etcd::etcd_client::Client {
    snowkeep_etcd::etcd_client::Client::connect([url], None)
        .await
        .expect("connect etcd client")
}

/// How many keys start with `prefix`.
async fn count_keys(client: &mut snowkeep_etcd::etcd_client::Client, prefix: &str) -> i64 {
    client
        .get(
            prefix,
            Some(
                snowkeep_etcd::etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .expect("count keys")
        .count()
}

/// Starts one server per endpoint list in `namespace` at once and waits until
/// every one serves, each within [`START_BOUND`], and has renewed its lease
/// once.
async fn start_all(lists: &[String], namespace: &str) -> Vec<ServerProcess> {
    let servers: Vec<ServerProcess> = lists
        .iter()
        .map(|l| ServerProcess::on_etcd(l, namespace, &[]))
        .collect();
    join_all(servers.iter().map(|s| s.wait_serving(START_BOUND))).await;
    // A server serves as soon as it claimed a never-used machine id; its
    // keepalive stream opens with its first renewal, a third of the TTL
    // later. Tests that fail a member later expect it open by now.
    for server in &servers {
        eventually("a first renewal", Duration::from_secs(10), || async {
            renewed(server).await >= 1.0
        })
        .await;
    }
    servers
}

/// `count` ids from `server`, ascending; each must be new to `seen`.
async fn issue(server: &ServerProcess, count: u32, seen: &mut HashSet<u64>) {
    let ids = server
        .next_ids(count)
        .await
        .unwrap_or_else(|e| panic!("NextIds: {e}; log:\n{}", server.log()));
    assert_eq!(ids.len(), count as usize);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids not ascending");
    for id in ids {
        assert!(seen.insert(id), "id {id} issued twice");
    }
}

/// Asserts the server lost no lease, for any reason.
async fn assert_no_lease_lost(server: &ServerProcess) {
    for reason in ["deadline", "expired", "revoked", "holder_changed"] {
        let series = format!(r#"snowkeep_lease_losses_total{{reason="{reason}"}}"#);
        assert_eq!(
            server.metric(&series).await,
            0.0,
            "{series}; log:\n{}",
            server.log()
        );
    }
}

/// Lists with `down` in position 0, 1 and 2 of the live members' list.
fn each_position(down: &str, live: &[String; 2]) -> Vec<String> {
    (0..3)
        .map(|position| {
            let mut list = live.to_vec();
            list.insert(position, down.to_owned());
            list.join(",")
        })
        .collect()
}

/// A 3-member cluster with one follower down (killed, or paused with
/// SIGSTOP when `hang`), and three servers whose endpoint lists carry the
/// down member first, in the middle and last: each serves within
/// [`START_BOUND`] on its first connection attempt, issues 1000 ids, and
/// registers for the peer check.
async fn one_member_down_at_start(namespace: &str, hang: bool) {
    let mut etcd = EtcdProcess::cluster(3).await;
    let leader = etcd.wait_leader().await;
    let down = (leader + 1) % 3;
    let live = [etcd.member_url(leader), etcd.member_url((leader + 2) % 3)];
    if hang {
        etcd.pause_member(down);
    } else {
        etcd.kill_member(down);
    }
    let servers = start_all(&each_position(&etcd.member_url(down), &live), namespace).await;

    let mut seen = HashSet::new();
    for server in &servers {
        issue(server, 1000, &mut seen).await;
    }
    assert_eq!(seen.len(), 3000);
    for (position, server) in servers.iter().enumerate() {
        let log = server.log();
        assert!(
            !log.contains("etcd is not reachable yet"),
            "position {position}: the first connection attempt must get past the down member; log:\n{log}"
        );
        // The holder watch sat on a live member, which answers its progress
        // requests (one per request timeout of silence).
        assert!(
            !log.contains("holder watch got no answer"),
            "position {position}: log:\n{log}"
        );
        assert_no_lease_lost(server).await;
    }
    let mut client = client_of(&live[0]).await;
    let peers = snowkeep_etcd::keys::peer_prefix(namespace);
    assert_eq!(count_keys(&mut client, &peers).await, 3, "peer keys");
    if hang {
        etcd.resume_member(down);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_first_middle_or_last_at_start_delays_no_server_past_the_bound() {
    one_member_down_at_start("dead-at-start", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_first_middle_or_last_at_start_delays_no_server_past_the_bound() {
    one_member_down_at_start("hung-at-start", true).await;
}

/// What one traffic loop got: ids received, and failed calls.
type Outcome = Arc<Mutex<(Vec<u64>, Vec<tonic::Status>)>>;

/// NextIds(100) calls on each server, back to back, until stopped.
struct Traffic {
    stop: CancellationToken,
    /// Per server.
    results: Vec<Outcome>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    async fn start(servers: &[ServerProcess]) -> Self {
        let stop = CancellationToken::new();
        let mut results = Vec::new();
        let mut tasks = Vec::new();
        for server in servers {
            let result: Outcome = Arc::default();
            let mut ids = server.ids().await;
            let (stop, result2) = (stop.clone(), result.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let req = pb::NextIdsRequest {
                        count: 100,
                        ..Default::default()
                    };
                    match ids.next_ids(req).await {
                        Ok(r) => result2.lock().unwrap().0.extend(r.into_inner().ids),
                        Err(e) => result2.lock().unwrap().1.push(e),
                    }
                    // Pacing, so three loops leave the cores to the servers.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }));
            results.push(result);
        }
        Self {
            stop,
            results,
            tasks,
        }
    }

    /// Ids received so far by server `i`.
    fn received(&self, i: usize) -> usize {
        self.results[i].lock().unwrap().0.len()
    }

    /// Stops the loops; asserts no call failed and every id is new to
    /// `seen`; returns how many ids each server issued.
    async fn finish(self, seen: &mut HashSet<u64>) -> Vec<usize> {
        self.stop.cancel();
        for task in self.tasks {
            task.await.expect("traffic task");
        }
        let mut counts = Vec::new();
        for (i, result) in self.results.iter().enumerate() {
            let (ids, errors) = &*result.lock().unwrap();
            assert!(errors.is_empty(), "server {i}: failed calls {errors:?}");
            assert_eq!(ids.len() % 100, 0);
            for id in ids {
                assert!(seen.insert(*id), "id {id} issued twice");
            }
            counts.push(ids.len());
        }
        counts
    }
}

fn requester(n: u64) -> Requester {
    Requester {
        host_id: "endpoints-test".into(),
        pid: 7,
        start_unix_ms: 1_000 + n,
        nonce: format!("{n:016x}"),
    }
}

/// Acquire 2 machine ids, Renew, Release through `server`'s Lease API; each
/// call must succeed on its first try.
async fn lease_api_round_trip(server: &ServerProcess, namespace: &str, who: &Requester) {
    let mut api =
        pb::lease_service_client::LeaseServiceClient::<Channel>::new(server.channel().await);
    let grant = api
        .acquire(pb::AcquireRequest {
            requester: Some(who.to_pb()),
            namespace: namespace.into(),
            count: 2,
            client_time_unix_ms: None,
            lease_token: String::new(),
            supports_layout_shapes: true,
        })
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}; log:\n{}", server.log()))
        .into_inner();
    let ids: Vec<u32> = grant.machine_ids.iter().map(|m| m.machine_id).collect();
    assert_eq!(ids.len(), 2);
    let renewed = api
        .renew(pb::RenewRequest {
            requester: Some(who.to_pb()),
            namespace: namespace.into(),
            client_time_unix_ms: None,
            namespace_incarnation: grant.namespace_incarnation,
            lease_token: grant.lease_token.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("Renew: {e}; log:\n{}", server.log()))
        .into_inner();
    assert_eq!(
        renewed
            .machine_ids
            .iter()
            .map(|m| m.machine_id)
            .collect::<Vec<_>>(),
        ids
    );
    assert_eq!(renewed.lease_duration_ms, 48 * 3600 * 1000);
    let released = api
        .release(pb::ReleaseRequest {
            requester: Some(who.to_pb()),
            namespace: namespace.into(),
            last_used_ms: grant
                .machine_ids
                .iter()
                .map(|m| (m.machine_id, m.floor_ms))
                .collect(),
            lease_token: grant.lease_token.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("Release: {e}; log:\n{}", server.log()))
        .into_inner();
    assert_eq!(released.released, 2);
}

/// Successful lease renewals of `server` so far.
async fn renewed(server: &ServerProcess) -> f64 {
    server
        .metric(r#"snowkeep_lease_renewals_total{result="ok"}"#)
        .await
}

/// Sends SIGTERM to every server and asserts each exits with code 0.
async fn terminate_all(servers: &mut [ServerProcess]) {
    for server in servers.iter() {
        server.signal("TERM");
    }
    for server in servers.iter_mut() {
        let status = server.wait_exit(Duration::from_secs(15)).await;
        assert_eq!(status.code(), Some(0), "log:\n{}", server.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_under_each_position_costs_no_call_no_lease_and_no_release() {
    let ns = "killed-mid-run";
    let mut etcd = EtcdProcess::cluster(3).await;
    let leader = etcd.wait_leader().await;
    let (victim, other) = ((leader + 1) % 3, (leader + 2) % 3);
    let urls: Vec<String> = (0..3).map(|i| etcd.member_url(i)).collect();
    let url = |i: usize| urls[i].clone();
    // `other` is down while the servers start, so all three start on
    // `victim`: in position 0, 1 and 2 of their lists. From the last
    // position the next endpoint wraps around to the first.
    etcd.kill_member(other);
    let lists = [
        [url(victim), url(other), url(leader)],
        [url(other), url(victim), url(leader)],
        [url(other), refused_endpoint(), url(victim)],
    ]
    .map(|l| l.join(","));
    let mut servers = start_all(&lists, ns).await;
    etcd.restart().await;
    etcd.move_leader_off(victim).await;
    let mut seen = HashSet::new();
    for server in &servers {
        issue(server, 1000, &mut seen).await;
    }

    let traffic = Traffic::start(&servers).await;
    eventually(
        "traffic on every server",
        Duration::from_secs(10),
        || async { (0..3).all(|i| traffic.received(i) >= 500) },
    )
    .await;
    let mut renewals_before = Vec::new();
    for server in &servers {
        renewals_before.push(renewed(server).await);
    }
    etcd.kill_member(victim);
    // Right after the kill, before the claim loops may have noticed it.
    for (i, server) in servers.iter().enumerate() {
        lease_api_round_trip(server, ns, &requester(i as u64)).await;
    }
    // Three renewals after the kill: the lease has been kept alive through
    // another member for one whole TTL.
    for (i, server) in servers.iter().enumerate() {
        let before = renewals_before[i];
        eventually(
            &format!("server {i} to renew three times after the kill"),
            Duration::from_secs(10),
            || async { renewed(server).await >= before + 3.0 },
        )
        .await;
    }
    let counts = traffic.finish(&mut seen).await;
    assert!(counts.iter().all(|&c| c >= 500), "{counts:?}");
    assert_eq!(seen.len(), 3000 + counts.iter().sum::<usize>());
    let victim_url = format!("endpoint=\"{}\"", url(victim));
    for (position, server) in servers.iter().enumerate() {
        let log = server.log();
        assert!(
            log.contains("keepalive stream failed") && log.contains(&victim_url),
            "position {position}: the keepalive must have moved off the killed member; log:\n{log}"
        );
        assert_no_lease_lost(server).await;
    }

    // Now the member two servers moved to dies just before SIGTERM: their
    // release goes through the next live endpoint (for the last list, past
    // the refused one to the restarted `victim`).
    etcd.restart().await;
    etcd.move_leader_off(other).await;
    etcd.kill_member(other);
    terminate_all(&mut servers).await;
    let mut client = client_of(&url(leader)).await;
    for prefix in [
        snowkeep_etcd::keys::holder_prefix(ns),
        snowkeep_etcd::keys::peer_prefix(ns),
        snowkeep_etcd::keys::requester(ns, ""),
    ] {
        assert_eq!(count_keys(&mut client, &prefix).await, 0, "{prefix}");
    }
    let leases = client.leases().await.expect("leases");
    assert!(
        leases.leases().is_empty(),
        "leases left: {:?}",
        leases.leases()
    );
    for server in &servers {
        assert!(server.log().contains("released machine ids"));
    }
}

/// Longest time for a holder watch on a member that hangs to see a change:
/// the watch gives a silent stream up after two request timeouts (2 × 500 ms
/// at the 2 s TTL) and reopens on the next member, which replays the change.
const HUNG_WATCH_BOUND: Duration = Duration::from_millis(1600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_mid_run_costs_no_call_and_the_holder_watch_moves_off_it() {
    let ns = "hung-mid-run";
    let etcd = EtcdProcess::cluster(3).await;
    let leader = etcd.wait_leader().await;
    let (hung, other) = ((leader + 1) % 3, (leader + 2) % 3);
    etcd.move_leader_off(hung).await;
    let list = [hung, leader, other].map(|i| etcd.member_url(i)).join(",");
    // Both servers start on `hung`: the first issues across the hang, the
    // second has its holder key deleted while its watch sits on `hung`.
    let servers = start_all(&[list.clone(), list], ns).await;
    let mut seen = HashSet::new();
    for server in &servers {
        issue(server, 1000, &mut seen).await;
    }
    let watched = servers[1].machine_id().await;
    let traffic = Traffic::start(&servers[..1]).await;
    eventually("traffic", Duration::from_secs(10), || async {
        traffic.received(0) >= 500
    })
    .await;

    etcd.pause_member(hung);
    let paused_at = tokio::time::Instant::now();
    let mut client = client_of(&etcd.member_url(leader)).await;
    let holder = snowkeep_etcd::keys::holder(
        ns,
        snowkeep_client::MachineId(u16::try_from(watched).unwrap()),
    );
    client
        .delete(holder, None)
        .await
        .expect("delete holder key");
    // Meanwhile a Lease API round trip through the first server, whose
    // requests start on the hung member: each must move on, not fail.
    let who = requester(9);
    let (took, ()) = tokio::join!(
        eventually(
            "the second server to see its holder key deleted",
            Duration::from_secs(5),
            || async {
                servers[1]
                    .metric(r#"snowkeep_lease_losses_total{reason="holder_changed"}"#)
                    .await
                    == 1.0
            },
        ),
        lease_api_round_trip(&servers[0], ns, &who),
    );
    assert!(
        took <= HUNG_WATCH_BOUND,
        "seen after {took:?}; log:\n{}",
        servers[1].log()
    );

    // The first server issues across the hang, for two TTLs.
    let received = traffic.received(0);
    eventually("two TTLs of traffic", Duration::from_secs(10), || async {
        paused_at.elapsed() >= Duration::from_secs(4) && traffic.received(0) >= received + 500
    })
    .await;
    let counts = traffic.finish(&mut seen).await;
    assert_eq!(seen.len(), 2000 + counts[0]);
    let log = servers[0].log();
    assert!(
        log.contains("keepalive stream failed")
            && log.contains(&format!("endpoint=\"{}\"", etcd.member_url(hung))),
        "the keepalive must have moved off the hung member; log:\n{log}"
    );
    assert_no_lease_lost(&servers[0]).await;
    etcd.resume_member(hung);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_api_and_the_release_at_sigterm_work_with_a_dead_first_endpoint() {
    let ns = "dead-first";
    let etcd = EtcdProcess::start().await;
    let list = format!("{},{}", refused_endpoint(), etcd.endpoint());
    // One live member only: an 8 s TTL gives each request a 2 s timeout, so
    // a slow fsync on a busy machine is not taken for a dead member.
    let mut servers = vec![ServerProcess::spawn(&[
        "--etcd-endpoints",
        &list,
        "--namespace",
        ns,
        "--lease-ttl",
        "8s",
        "--instance-id",
        "dead-first",
        "--create-namespace",
    ])];
    servers[0].wait_serving(START_BOUND).await;
    let server = &servers[0];
    lease_api_round_trip(server, ns, &requester(1)).await;
    let mut seen = HashSet::new();
    issue(server, 1000, &mut seen).await;
    let machine_id = server.machine_id().await;
    let last_ids = server.next_ids(1).await.expect("NextIds");
    let last_ts = Layout::default().decode(last_ids[0]).unwrap().timestamp;

    terminate_all(&mut servers).await;
    let mut client = client_of(&etcd.endpoint()).await;
    for prefix in [
        snowkeep_etcd::keys::holder_prefix(ns),
        snowkeep_etcd::keys::requester(ns, ""),
    ] {
        assert_eq!(count_keys(&mut client, &prefix).await, 0, "{prefix}");
    }
    let fence = client
        .get(
            snowkeep_etcd::keys::fence(
                ns,
                snowkeep_client::MachineId(u16::try_from(machine_id).unwrap()),
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        fence.kvs()[0].value_str().unwrap(),
        last_ts.get().to_string(),
        "fence lowered to the last timestamp used"
    );
    let last = client
        .get(
            snowkeep_etcd::keys::last_holder(
                ns,
                snowkeep_client::MachineId(u16::try_from(machine_id).unwrap()),
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(last.kvs()[0].value_str().unwrap(), "dead-first");
    assert!(client.leases().await.unwrap().leases().is_empty());
}

/// The namespace is opened by the first requests to etcd, which fail over
/// like any other: with a dead first endpoint, the one-shot modes
/// (`--create-namespace-only`, `--confirm-namespace-floor`) and a server that
/// joins the namespace without `--create-namespace` all get past it on their
/// first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_shot_modes_and_a_joining_server_work_with_a_dead_first_endpoint() {
    let ns = "dead-first-setup";
    let etcd = EtcdProcess::start().await;
    let list = format!("{},{}", refused_endpoint(), etcd.endpoint());
    let key = snowkeep_etcd::keys::layout(ns);
    let mut client = client_of(&etcd.endpoint()).await;
    let record = |resp: snowkeep_etcd::etcd_client::GetResponse| {
        resp.kvs()
            .first()
            .map(|kv| kv.value_str().unwrap().to_owned())
    };
    let field = |record: &str, name: &str| {
        record
            .lines()
            .find_map(|l| Some(l.strip_prefix(name)?.strip_prefix(' ')?.to_owned()))
            .unwrap_or_else(|| panic!("no {name} in the record:\n{record}"))
    };
    let first_attempt = |server: &ServerProcess, mode: &str| {
        let log = server.log();
        assert!(
            !log.contains("etcd is not reachable yet"),
            "{mode}: the first attempt must get past the dead endpoint; log:\n{log}"
        );
    };

    let mut create = ServerProcess::joining(&list, ns, &["--create-namespace-only"]);
    assert_eq!(
        create.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0),
        "log:\n{}",
        create.log()
    );
    first_attempt(&create, "--create-namespace-only");
    let created = record(client.get(key.clone(), None).await.unwrap())
        .unwrap_or_else(|| panic!("no namespace record; log:\n{}", create.log()));
    assert_eq!(field(&created, "state"), "ok");
    assert_eq!(field(&created, "floor_ms"), "0");

    let mut confirm = ServerProcess::joining(&list, ns, &["--confirm-namespace-floor", "+2s"]);
    assert_eq!(
        confirm.wait_exit(Duration::from_secs(15)).await.code(),
        Some(0),
        "log:\n{}",
        confirm.log()
    );
    first_attempt(&confirm, "--confirm-namespace-floor");
    assert!(confirm.log().contains("confirmed the namespace floor"));
    let confirmed = record(client.get(key.clone(), None).await.unwrap()).unwrap();
    assert_eq!(
        field(&confirmed, "incarnation"),
        field(&created, "incarnation")
    );
    assert_ne!(field(&confirmed, "floor_ms"), "0");

    let mut servers = vec![ServerProcess::joining(&list, ns, &[])];
    servers[0].wait_serving(START_BOUND).await;
    first_attempt(&servers[0], "joining");
    let mut seen = HashSet::new();
    issue(&servers[0], 1000, &mut seen).await;
    assert_no_lease_lost(&servers[0]).await;
    terminate_all(&mut servers).await;
}

/// A fence write is guarded by the fence key's revision as its holder last
/// wrote it. A write that timed out on a hung member and was retried on
/// another one can still be applied when that member resumes (seen here with
/// etcd 3.4: a put that timed out on a SIGSTOPped member was applied after
/// SIGCONT, over a later put), so without the guard it could lower a fence
/// already in use. Here a client stands in for the late write.
///
/// The holder's own unanswered attempts are its writes, whatever their
/// value: a write that timed out while etcd hung and then committed once it
/// resumed must not read as tampering to the next, higher write (it did:
/// the server dropped its claim after every etcd restart that caught a
/// fence write in flight). Once a write is confirmed, those values are
/// foreign again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_write_lands_only_on_the_fence_its_holder_wrote_last() {
    use snowkeep_client::{Millis, SystemClock};
    use snowkeep_core::claim::{LossReason, StoreError};
    use snowkeep_etcd::namespace::NamespaceSetup;
    use snowkeep_etcd::{keys, EtcdSettings, EtcdStore};

    let ns = "fence-guard";
    let etcd = EtcdProcess::start().await;
    let settings = EtcdSettings {
        endpoints: vec![etcd.endpoint()],
        access: Default::default(),
        namespace: ns.into(),
        instance_id: "guarded".into(),
        lease_ttl: Duration::from_secs(2),
        machine_id_range: 0..4096,
        machine_ids: 1,
        stable_instance: false,
        fence_horizon: Duration::from_secs(3),
        max_fence_wait: Duration::from_secs(10),
        request_timeout: Duration::from_millis(500),
        advertise_address: None,
        namespace_setup: NamespaceSetup {
            create: true,
            confirm_floor: None,
            migration_floor: None,
        },
    };
    let mut store = EtcdStore::connect(settings, Layout::default(), SystemClock::shared())
        .await
        .unwrap();
    let claim = store.claim().await.unwrap();
    let key = keys::fence(ns, claim.held[0].machine_id);
    let floor = claim.held[0].floor.get();
    let mut client = client_of(&etcd.endpoint()).await;
    let reader = client.clone();
    let fence_now = || {
        let mut client = reader.clone();
        let key = key.clone();
        async move {
            let resp = client.get(key, None).await.unwrap();
            resp.kvs()[0].value_str().unwrap().parse::<u64>().unwrap()
        }
    };

    store
        .advance_fences(&claim, &[Millis(floor + 1000)])
        .await
        .unwrap();
    assert_eq!(fence_now().await, floor + 1000);

    // The next write's earlier attempt committed but its answer was lost:
    // the retry finds its own value and counts as done, and the write after
    // it goes on from there.
    client
        .put(key.clone(), (floor + 2000).to_string(), None)
        .await
        .unwrap();
    store
        .advance_fences(&claim, &[Millis(floor + 2000)])
        .await
        .unwrap();
    store
        .advance_fences(&claim, &[Millis(floor + 3000)])
        .await
        .unwrap();
    assert_eq!(fence_now().await, floor + 3000);

    // etcd hangs under a write, which times out; the write commits when
    // etcd resumes (the client's put stands in for it, so the test does not
    // hang on whether etcd applies the stalled request: if it does, before
    // the put, the value is the same; after it, its guard fails). The next,
    // higher write takes the committed value as its own and goes over it.
    etcd.pause();
    let timed_out = store
        .advance_fences(&claim, &[Millis(floor + 3500)])
        .await
        .unwrap_err();
    etcd.resume();
    assert!(
        matches!(timed_out, StoreError::Timeout { .. }),
        "{timed_out:?}"
    );
    client
        .put(key.clone(), (floor + 3500).to_string(), None)
        .await
        .unwrap();
    store
        .advance_fences(&claim, &[Millis(floor + 4000)])
        .await
        .unwrap();
    assert_eq!(fence_now().await, floor + 4000);

    // A late write lowers the fence, to the value of an attempt that is no
    // longer outstanding (a write was confirmed since): the holder's next
    // write changes nothing and reports the claim lost, so the server stops
    // issuing and claims again from what etcd holds.
    client
        .put(key.clone(), (floor + 3500).to_string(), None)
        .await
        .unwrap();
    let err = store
        .advance_fences(&claim, &[Millis(floor + 5000)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::LeaseLost {
                reason: LossReason::HolderChanged
            }
        ),
        "{err:?}"
    );
    assert_eq!(fence_now().await, floor + 3500);
}
