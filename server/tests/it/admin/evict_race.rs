//! An eviction racing a Lease API requester's renewals: each renewal moves
//! the requester's keys to a new etcd lease, so revoking the lease read a
//! moment earlier could miss them. Found by the conformance suite: an
//! embedded generator evicted while its first Renew was in flight kept its
//! machine id, and its Check kept answering "valid". Before the fix this
//! test failed in round 8 (of 150 tried): Check answered valid with 48 h
//! left.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use snowkeep_proto::v1 as pb;
use snowkeep_test_support::lease::{
    acquire, check_request, ids_of, lease_api_server, lease_client, renew, requester,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_racing_renewals_takes_the_machine_id_every_time() {
    let ns = "evict-race";
    let (_etcd, server, mut api) = lease_api_server(ns).await;
    let mut admin = pb::admin_service_client::AdminServiceClient::new(server.channel().await);
    let rounds = 60u64;
    let moved_during_eviction = Arc::new(AtomicU32::new(0));
    for round in 0..rounds {
        let who = requester(1_796_000_000_000 + round);
        let grant = api
            .acquire(acquire(ns, &who, 1, None))
            .await
            .unwrap()
            .into_inner();
        let token = grant.lease_token.clone();
        let machine_id = ids_of(&grant)[0];
        // Renew as fast as the server answers while the eviction runs:
        // every renewal moves the keys to a new lease.
        let stop = Arc::new(AtomicBool::new(false));
        let renewer = {
            let (stop, who, token) = (stop.clone(), who.clone(), token.clone());
            let moved = moved_during_eviction.clone();
            let mut api = lease_client(&server).await;
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = api.renew(renew(ns, &who, &token, None)).await.unwrap();
                    if r.into_inner().machine_ids.is_empty() {
                        return;
                    }
                    moved.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // Once renewals are under way.
        let before = moved_during_eviction.load(Ordering::Relaxed);
        while moved_during_eviction.load(Ordering::Relaxed) == before {
            tokio::task::yield_now().await;
        }
        let evicted = admin
            .evict(pb::EvictRequest {
                namespace: ns.into(),
                machine_id,
            })
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"))
            .into_inner();
        assert_eq!(evicted.machine_ids, [machine_id], "round {round}");
        stop.store(true, Ordering::Relaxed);
        renewer.await.unwrap();
        // Evicted for good: Check says so, and a renewal gets nothing.
        let check = api
            .check(check_request(&who, &token, ns, 0, vec![]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (check.valid, check.reason()),
            (false, pb::LeaseCheckReason::LeaseGone),
            "round {round}: {check:?}"
        );
        let renewed = api
            .renew(renew(ns, &who, &token, None))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ids_of(&renewed), Vec::<u32>::new(), "round {round}");
    }
}
