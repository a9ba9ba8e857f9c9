//! AdminService's state half against real etcd and real servers: exact
//! inventories, a Lease API requester coming and going, capacity, and an
//! eviction under load that repeats no id.

use std::collections::HashSet;
use std::time::Duration;

use snowkeep_client::{Clock, SystemClock};
use snowkeep_proto::v1 as pb;
use tonic::transport::Channel;
use tonic::Code;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, lease_client, release, requester};
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

type Admin = pb::admin_service_client::AdminServiceClient<Channel>;

async fn admin(server: &ServerProcess) -> Admin {
    Admin::new(server.channel().await)
}

async fn machine_ids(admin: &mut Admin, ns: &str) -> Vec<pb::MachineIdState> {
    admin
        .list_machine_ids(pb::ListMachineIdsRequest {
            namespace: ns.into(),
        })
        .await
        .expect("ListMachineIds")
        .into_inner()
        .machine_ids
}

async fn capacity(admin: &mut Admin, ns: &str) -> pb::Capacity {
    admin
        .get_namespace_capacity(pb::GetNamespaceCapacityRequest {
            namespace: ns.into(),
        })
        .await
        .expect("GetNamespaceCapacity")
        .into_inner()
        .capacity
        .expect("capacity")
}

fn unix_ms() -> u64 {
    SystemClock.unix_ms()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventories_are_exact_for_two_servers_and_a_requester() {
    let etcd = EtcdProcess::start().await;
    let ns = "adm-list";
    let servers = ServerProcess::serving(2, &etcd.endpoint(), ns).await;
    let mut admin = admin(&servers[0]).await;
    let mut expected = Vec::new();
    for s in &servers {
        let info = s.info().await;
        expected.push((info.held[0].machine_id, info.instance_id));
    }
    expected.sort();

    let list = admin
        .list_namespaces(pb::ListNamespacesRequest {})
        .await
        .unwrap()
        .into_inner()
        .namespaces;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, ns);
    assert_eq!(
        list[0].layout,
        Some(pb::Layout {
            timestamp_bits: 41,
            machine_bits: 12,
            sequence_bits: 10,
            epoch_unix_ms: 1_767_225_600_000,
            time_unit_ms: 1,
        })
    );
    let c = list[0].capacity.clone().unwrap();
    assert_eq!((c.total, c.held, c.free), (4096, 2, 4094));
    assert_eq!((c.range_start, c.range_end), (0, 4096));

    let rows = machine_ids(&mut admin, ns).await;
    let got: Vec<(u32, String)> = rows
        .iter()
        .map(|r| (r.machine_id, r.holder.clone()))
        .collect();
    assert_eq!(got, expected);
    for r in &rows {
        assert!(r.fence_ms > 0, "{r:?}");
        assert!((1..=2).contains(&r.lease_remaining_s), "{r:?}");
        // Renewed a moment ago: what is left plus the time since is the
        // lease's granted TTL, to the second.
        assert!(
            (1..=2).contains(&(r.lease_remaining_s + r.lease_renewed_ago_s)),
            "{r:?}"
        );
    }

    // A Lease API requester appears with its identity, and goes on Release.
    let who = requester(unix_ms() - 5_000);
    let mut lease = lease_client(&servers[1]).await;
    let grant = lease
        .acquire(acquire(ns, &who, 2, Some(unix_ms())))
        .await
        .expect("Acquire")
        .into_inner();
    let held: Vec<u32> = grant.machine_ids.iter().map(|m| m.machine_id).collect();
    assert_eq!(held.len(), 2);
    let reqs = admin
        .list_requesters(pb::ListRequestersRequest {
            namespace: ns.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .requesters;
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let r = &reqs[0];
    assert_eq!(r.host_id, "test-host");
    assert_eq!(r.pid, 4242);
    assert_eq!(r.start_unix_ms, who.start_unix_ms);
    assert_eq!(r.requester_hash.len(), 12);
    assert!(r.requester_hash.chars().all(|c| c.is_ascii_hexdigit()));
    let mut sorted = held.clone();
    sorted.sort();
    let mut theirs = r.machine_ids.clone();
    theirs.sort();
    assert_eq!(theirs, sorted);
    assert!(
        r.lease_remaining_s > 0 && r.lease_remaining_s <= 600,
        "{r:?}"
    );
    assert!(r.skew_ms.abs() < 5_000, "{r:?}");
    assert_eq!(r.key_id, "");
    let text = format!("{reqs:?}");
    assert!(!text.contains(&who.nonce), "the nonce leaked: {text}");
    assert!(
        !text.contains(&grant.lease_token),
        "the token leaked: {text}"
    );
    let rows = machine_ids(&mut admin, ns).await;
    assert_eq!(rows.len(), 4);
    for id in &held {
        let row = rows.iter().find(|x| x.machine_id == *id).unwrap();
        assert_eq!(row.holder, format!("requester:{}", r.requester_hash));
    }
    assert_eq!(capacity(&mut admin, ns).await.held, 4);

    lease
        .release(release(ns, &who, &grant.lease_token, &[]))
        .await
        .expect("Release");
    let reqs = admin
        .list_requesters(pb::ListRequestersRequest {
            namespace: ns.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .requesters;
    assert!(reqs.is_empty(), "{reqs:?}");
    let c = capacity(&mut admin, ns).await;
    assert_eq!((c.total, c.held, c.free), (4096, 2, 4094));

    // Unknown and malformed namespaces.
    for (name, code) in [
        ("no-such-ns", Code::NotFound),
        ("bad/name", Code::InvalidArgument),
    ] {
        let e = admin
            .list_machine_ids(pb::ListMachineIdsRequest {
                namespace: name.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        let e = admin
            .get_namespace_capacity(pb::GetNamespaceCapacityRequest {
                namespace: name.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_under_load_repeats_no_id() {
    let etcd = EtcdProcess::start().await;
    let ns = "adm-evict";
    let servers = ServerProcess::serving(2, &etcd.endpoint(), ns).await;
    let mut admin = admin(&servers[1]).await;
    let target = servers[0].info().await;
    let victim = target.held[0].machine_id;

    // A free machine id: nothing to evict.
    let other = servers[1].info().await.held[0].machine_id;
    let free = (0..4096u32).find(|m| *m != victim && *m != other).unwrap();
    let e = admin
        .evict(pb::EvictRequest {
            namespace: ns.into(),
            machine_id: free,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = admin
        .evict(pb::EvictRequest {
            namespace: ns.into(),
            machine_id: 4096,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Issue from the victim's server while it is evicted.
    let mut ids: Vec<u64> = Vec::new();
    for _ in 0..5 {
        ids.extend(servers[0].next_ids(500).await.expect("ids before"));
    }
    let url = servers[0].url();
    let load = tokio::spawn(async move {
        let mut client = pb::id_service_client::IdServiceClient::new(
            Channel::from_shared(url).unwrap().connect().await.unwrap(),
        );
        let mut got = Vec::new();
        let mut served_after_loss = 0;
        let mut failed = false;
        let start = tokio::time::Instant::now();
        while start.elapsed() < Duration::from_secs(12) && served_after_loss < 20 {
            match client
                .next_ids(pb::NextIdsRequest {
                    count: 200,
                    ..Default::default()
                })
                .await
            {
                Ok(r) => {
                    got.extend(r.into_inner().ids);
                    if failed {
                        served_after_loss += 1;
                    }
                }
                Err(_) => {
                    failed = true;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        (got, served_after_loss)
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // let the load start
    let evicted = admin
        .evict(pb::EvictRequest {
            namespace: ns.into(),
            machine_id: victim,
        })
        .await
        .expect("Evict")
        .into_inner();
    assert_eq!(evicted.holder, target.instance_id);
    assert_eq!(evicted.machine_ids, vec![victim]);
    // The fence runs at most one lead (1.5 × the 2 s budget) ahead.
    assert!(evicted.successor_wait_ms <= 3_000, "{evicted:?}");

    let admin2 = admin.clone();
    let instance = target.instance_id.clone();
    eventually("the evicted holder leaves the list", READY, || {
        let mut a = admin2.clone();
        let instance = instance.clone();
        async move {
            machine_ids(&mut a, ns)
                .await
                .iter()
                .find(|r| r.machine_id == victim)
                .is_some_and(|r| r.holder != instance)
        }
    })
    .await;
    let (during, served_after_loss) = load.await.unwrap();
    ids.extend(during);
    // The server claimed again and issues on.
    servers[0].wait_serving(READY).await;
    for _ in 0..5 {
        ids.extend(servers[0].next_ids(500).await.expect("ids after"));
    }
    let _ = served_after_loss;
    let unique: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(
        unique.len(),
        ids.len(),
        "an id repeated across the eviction"
    );
    // The fence stays behind the eviction.
    let rows = machine_ids(&mut admin, ns).await;
    let row = rows.iter().find(|r| r.machine_id == victim).unwrap();
    assert!(row.fence_ms > 0, "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_instance_store_has_no_cluster_state() {
    let state = tempfile::tempdir().unwrap();
    let server = ServerProcess::spawn(&["--state-dir", state.path().to_str().unwrap()]);
    server.wait_serving(READY).await;
    let mut admin = admin(&server).await;
    let e = admin
        .list_namespaces(pb::ListNamespacesRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        e.message(),
        "the single-instance store has no cluster state; run with --etcd-endpoints"
    );
}
