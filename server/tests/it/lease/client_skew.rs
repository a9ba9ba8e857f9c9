//! Client clock skew through the Lease API, with real etcd, real servers and
//! the real `EmbeddedGenerator` on an injected clock: a skewed client is
//! refused or gives up at once, and never keeps machine ids it cannot use.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use snowkeep_client::{
    ClientError, Clock, EmbeddedConfig, EmbeddedGenerator, Requester, StopReason, SystemClock,
};
use snowkeep_proto::v1 as pb;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::eventually;
use snowkeep_test_support::server::ServerProcess;

const NS: &str = "skew";
const MINUTE: u64 = 60_000;
/// Longer than any fail-fast path, far shorter than the waits they replace.
const FAST: Duration = Duration::from_secs(20);

fn config(server: &ServerProcess, nonce: u64) -> EmbeddedConfig {
    EmbeddedConfig {
        requester: Requester {
            host_id: "skewed-host".into(),
            pid: 77,
            start_unix_ms: 1,
            nonce: format!("{nonce:016x}"),
        },
        acquire_attempts: Some(1),
        ..EmbeddedConfig::new(server.url(), NS)
    }
}

/// The namespace's machine ids held now, by the Lease API's count.
async fn held(server: &ServerProcess) -> u32 {
    let c = pb::lease_service_client::LeaseServiceClient::new(server.channel().await)
        .capacity(pb::CapacityRequest {
            namespace: NS.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(c.held + c.free, 4096);
    c.held
}

/// This host's clocks with the wall clock moved by an offset (either way)
/// that the test can change: a client host whose NTP is off.
struct SkewedClock(AtomicI64);

impl SkewedClock {
    fn set_offset(&self, offset_ms: i64) {
        self.0.store(offset_ms, Ordering::Relaxed);
    }
}

impl Clock for SkewedClock {
    fn unix_ms(&self) -> u64 {
        SystemClock
            .unix_ms()
            .checked_add_signed(self.0.load(Ordering::Relaxed))
            .unwrap()
    }
    fn now(&self) -> Instant {
        SystemClock.now()
    }
    fn monotonic_ns(&self) -> u64 {
        SystemClock.monotonic_ns()
    }
}

/// A clock `offset_ms` away from this host's.
fn skewed(offset_ms: i64) -> Arc<SkewedClock> {
    Arc::new(SkewedClock(AtomicI64::new(offset_ms)))
}

/// Two servers on one etcd: one with the defaults (10 min threshold, 10 min
/// first lease), one with a 15 min threshold and 5 s renewed leases.
async fn servers() -> (EtcdProcess, ServerProcess, ServerProcess) {
    let etcd = EtcdProcess::start().await;
    let plain = ServerProcess::on_etcd(&etcd.endpoint(), NS, &[]);
    let loose = ServerProcess::on_etcd(
        &etcd.endpoint(),
        NS,
        &[
            "--client-skew-threshold",
            "15m",
            "--renewed-lease-duration",
            "5s",
        ],
    );
    plain.wait_serving(Duration::from_secs(20)).await;
    loose.wait_serving(Duration::from_secs(20)).await;
    (etcd, plain, loose)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clients_are_refused_or_give_up_at_once_and_hold_nothing() {
    let (etcd, plain, loose) = servers().await;
    assert_eq!(held(&plain).await, 2, "the two servers' own machine ids");
    // Without its fence count (as a namespace of an older version) the
    // namespace cannot vouch that a machine id without a fence key was never
    // used: each one starts one fence horizon (3 s) ahead of the server's
    // clock, a floor that a client behind the server must wait for.
    etcd.client()
        .await
        .delete(
            snowkeep_etcd::keys::fence_count_root(NS),
            Some(snowkeep_etcd::etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();

    // 20 minutes ahead (plus 400 ms, so the message rounds to 20m whatever
    // the call takes): refused at Acquire, nothing claimed.
    let clock = skewed(20 * MINUTE as i64 + 400);
    let started = tokio::time::timeout(FAST, EmbeddedGenerator::start(config(&plain, 1), clock))
        .await
        .expect("Acquire answers at once");
    let Err(ClientError::Status(status)) = started else {
        panic!("expected a refusal, got {started:?}");
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        status.message(),
        "client clock is 20m ahead of the server, over the 10m threshold: sync this host with NTP (chrony/ntpd), then retry"
    );
    assert_eq!(held(&plain).await, 2, "nothing held after the refusal");
    assert_eq!(
        plain.metric("snowkeep_clock_skew_rejections_total").await,
        1.0
    );
    assert!(plain
        .log()
        .contains("refused Acquire: client clock ahead of the server by more than the threshold"));

    // 7 minutes behind, inside the threshold: granted, but the clock would
    // need 7 minutes to pass the floor. start gives up at once, after
    // releasing the grant.
    let t0 = tokio::time::Instant::now();
    let started = tokio::time::timeout(
        FAST,
        EmbeddedGenerator::start(config(&plain, 2), skewed(-7 * MINUTE as i64)),
    )
    .await
    .expect("start gives up instead of waiting out the skew");
    let took = t0.elapsed();
    let err = started.unwrap_err();
    let ClientError::ClockBehindFloor { wait, max } = err else {
        panic!("expected ClockBehindFloor, got {err}");
    };
    assert_eq!(
        max,
        Duration::from_secs(30),
        "EmbeddedConfig::max_floor_wait"
    );
    assert!(took < max, "gave up after {took:?}");
    // The floor of a machine id without a fence key the count can vouch for
    // is one fence lead (3 s: 1.5 × the test servers' 2 s outage budget)
    // ahead of the server's clock.
    assert!(
        (Duration::from_secs(7 * 60)..Duration::from_secs(7 * 60 + 10)).contains(&wait),
        "{wait:?}"
    );
    assert!(
        err.to_string().ends_with(
            "behind the granted machine ids' floor, more than the 30s a start waits: sync this host with NTP (or raise EmbeddedConfig::max_floor_wait); the machine ids were released"
        ),
        "{err}"
    );
    assert_eq!(held(&plain).await, 2, "the grant was released");

    // 12 minutes ahead, inside a 15 min threshold, but past the fence of a
    // 10 min lease (+1 min margin): it could stamp nothing, so it gives up.
    let started = tokio::time::timeout(
        FAST,
        EmbeddedGenerator::start(config(&loose, 3), skewed(12 * MINUTE as i64)),
    )
    .await
    .expect("start gives up at once");
    let err = started.unwrap_err();
    let ClientError::ClockPastFence { past } = err else {
        panic!("expected ClockPastFence, got {err}");
    };
    // 12 min − (10 min + 1 min), plus the time from the server's reading
    // to the client's.
    assert!(
        (Duration::from_secs(60)..Duration::from_secs(65)).contains(&past),
        "{past:?}"
    );
    assert_eq!(held(&plain).await, 2, "the grant was released");

    // A clock that jumps 20 minutes ahead while running: the next renewal's
    // fence is behind it, so the generator stops and releases.
    let clock = skewed(0);
    let generator = tokio::time::timeout(
        FAST,
        EmbeddedGenerator::start(config(&loose, 4), clock.clone()),
    )
    .await
    .expect("start within the fence wait")
    .expect("a healthy clock is granted");
    generator.next_id().await.expect("issues");
    assert_eq!(held(&plain).await, 3);
    clock.set_offset(20 * MINUTE as i64);
    eventually(
        "the generator to stop at the renewed fence",
        Duration::from_secs(15),
        || async { generator.stopped().is_some() },
    )
    .await;
    assert!(
        matches!(generator.stopped(), Some(StopReason::ClockPastFence { .. })),
        "{:?}",
        generator.stopped()
    );
    // The generator marks itself stopped before its Release answers.
    eventually(
        "the generator to release its machine id",
        Duration::from_secs(5),
        || async { held(&plain).await == 2 },
    )
    .await;
    assert_eq!(held(&plain).await, 2, "released by the generator itself");
    assert_eq!(generator.shutdown().await, 0, "nothing left to release");
}
