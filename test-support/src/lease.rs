//! The Lease API from a test: requester identities, a client of a server,
//! the requests built the way a client sends them, and a fresh etcd with a
//! server and a client.

use snowkeep_client::{EmbeddedConfig, Requester};
use snowkeep_proto::v1 as pb;
use tonic::transport::Channel;

use super::etcd::EtcdProcess;
use super::server::ServerProcess;
use super::READY;

/// A requester identity of host `test-host`, pid 4242, started at `start`
/// (Unix ms), with `start` as its nonce.
pub fn requester(start: u64) -> Requester {
    Requester {
        host_id: "test-host".into(),
        pid: 4242,
        start_unix_ms: start,
        nonce: format!("{start:016x}"),
    }
}

/// A Lease API client of `server`.
pub async fn lease_client(
    server: &ServerProcess,
) -> pb::lease_service_client::LeaseServiceClient<Channel> {
    pb::lease_service_client::LeaseServiceClient::new(server.channel().await)
}

/// An Acquire of `count` machine ids of `ns` for `who`, without a lease token.
pub fn acquire(
    ns: &str,
    who: &Requester,
    count: u32,
    client_time: Option<u64>,
) -> pb::AcquireRequest {
    pb::AcquireRequest {
        requester: Some(who.to_pb()),
        namespace: ns.into(),
        count,
        client_time_unix_ms: client_time,
        lease_token: String::new(),
        supports_layout_shapes: true,
    }
}

/// A Renew of `who`'s lease with `token`.
pub fn renew(ns: &str, who: &Requester, token: &str, client_time: Option<u64>) -> pb::RenewRequest {
    pb::RenewRequest {
        requester: Some(who.to_pb()),
        namespace: ns.into(),
        client_time_unix_ms: client_time,
        lease_token: token.into(),
        ..Default::default()
    }
}

/// A Release of `who`'s lease with `token`, reporting `last_used`.
pub fn release(
    ns: &str,
    who: &Requester,
    token: &str,
    last_used: &[(u32, u64)],
) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        requester: Some(who.to_pb()),
        namespace: ns.into(),
        last_used_ms: last_used.iter().copied().collect(),
        lease_token: token.into(),
    }
}

/// A fresh etcd, one server on `namespace`, and a Lease API client of it.
pub async fn lease_api_server(
    namespace: &str,
) -> (
    EtcdProcess,
    ServerProcess,
    pb::lease_service_client::LeaseServiceClient<Channel>,
) {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), namespace, &[]);
    server.wait_serving(READY).await;
    let api = lease_client(&server).await;
    (etcd, server, api)
}

/// The machine ids of `grant`.
pub fn ids_of(grant: &pb::LeaseGrant) -> Vec<u32> {
    grant.machine_ids.iter().map(|m| m.machine_id).collect()
}

/// An embedded generator's settings: `machine_ids` machine ids of `ns` on
/// `server`, as `who`, with one Acquire attempt.
pub fn embedded(
    server: &ServerProcess,
    ns: &str,
    who: Requester,
    machine_ids: u32,
) -> EmbeddedConfig {
    EmbeddedConfig {
        machine_ids,
        requester: who,
        acquire_attempts: Some(1),
        ..EmbeddedConfig::new(server.url(), ns)
    }
}

/// A Check of `who`'s lease with its lease `token` and these comparisons.
pub fn check_request(
    who: &Requester,
    token: &str,
    ns: &str,
    incarnation: u64,
    machine_ids: Vec<u32>,
) -> pb::CheckRequest {
    pb::CheckRequest {
        requester: Some(who.to_pb()),
        namespace: ns.into(),
        namespace_incarnation: incarnation,
        machine_ids,
        lease_token: token.into(),
    }
}
