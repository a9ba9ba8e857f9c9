//! The etcd store's settings for tests that claim straight through
//! `snowkeep_etcd` (no gRPC). Kept here, not in snowkeep-test-support,
//! which must not depend on snowkeep-server.

use std::time::Duration;

use snowkeep_test_support::etcd::EtcdProcess;

/// The settings of a test's own etcd store: instance `instance_id` in
/// `namespace` (created on connect) claiming one machine id of `range` on a
/// 2 s etcd lease, with a 3 s fence horizon, a 10 s fence wait and 5 s
/// requests. Tests set what they need on top (`..claimer_settings(..)`).
pub fn claimer_settings(
    etcd: &EtcdProcess,
    namespace: &str,
    instance_id: &str,
    range: std::ops::Range<u32>,
) -> snowkeep_etcd::EtcdSettings {
    snowkeep_etcd::EtcdSettings {
        endpoints: vec![etcd.endpoint()],
        access: Default::default(),
        namespace: namespace.into(),
        instance_id: instance_id.into(),
        lease_ttl: Duration::from_secs(2),
        machine_id_range: range,
        machine_ids: 1,
        stable_instance: false,
        fence_horizon: Duration::from_secs(3),
        max_fence_wait: Duration::from_secs(10),
        request_timeout: Duration::from_secs(5),
        advertise_address: None,
        namespace_setup: snowkeep_etcd::namespace::NamespaceSetup {
            create: true,
            confirm_floor: None,
            migration_floor: None,
        },
    }
}
