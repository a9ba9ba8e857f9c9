//! The authentication layer's judgement: open methods, permissions, namespaces, expiry, and the key kept on a connection.

use super::*;
use crate::auth::test_keys::{assert_expired_at_10_s, stored};

#[test]
fn health_and_reflection_are_open_and_each_service_needs_its_permission() {
    assert_eq!(required("/grpc.health.v1.Health/Check"), None);
    assert_eq!(
        required("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
        None
    );
    assert_eq!(
        required("/snowkeep.v1.IdService/NextIds"),
        Some(Some(Permission::Ids))
    );
    assert_eq!(
        required("/snowkeep.v1.LeaseService/Acquire"),
        Some(Some(Permission::Lease))
    );
    assert_eq!(
        required("/snowkeep.v1.AdminService/ListKeys"),
        Some(Some(Permission::Admin))
    );
    assert_eq!(required("/snowkeep.v1.InfoService/GetInfo"), Some(None));
    assert_eq!(required("/other.Service/X"), Some(None));
    assert_eq!(
        service_name("/snowkeep.v1.LeaseService/Acquire"),
        "LeaseService"
    );
}
#[test]
fn the_layer_judges_expiry_permission_and_namespace_at_the_clocks_time() {
    use snowkeep_client::ManualClock;
    use snowkeep_core::api_key::BootstrapKey;

    let key = PresentedKey::generate();
    let mut record = BootstrapKey::parse(&key.reveal()).unwrap().record(0);
    record.permissions = vec![Permission::Ids];
    record.namespaces = vec!["orders".into()];
    record.expires_unix_ms = 10_000;
    let cache = KeyCache::new();
    cache.replace_all(&[stored(&record, 1)], 1);
    let clock = ManualClock::new(9_000);
    let on = ClusterAuth::on_etcd(Some(crate::auth::AuthMode::On));
    let layer = AuthLayer::new(on.clone(), cache.clone(), clock.clone(), "orders".into());
    let header = format!("Bearer {}", key.reveal());
    let auth = Some(header.as_bytes());
    let verified = layer
        .judge("/snowkeep.v1.IdService/NextIds", auth, None)
        .unwrap()
        .unwrap();
    assert_eq!(verified.scope.key_id, key.id());
    assert_eq!(&*verified.caller, key.id());
    assert_eq!(verified.presented, key);
    assert!(layer
        .judge("/grpc.health.v1.Health/Check", None, None)
        .unwrap()
        .is_none());
    let denied = layer
        .judge("/snowkeep.v1.LeaseService/Acquire", auth, None)
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    assert!(
        denied.message().contains("lacks the lease permission"),
        "{denied:?}"
    );
    let elsewhere = AuthLayer::new(on, cache, clock.clone(), "billing".into());
    let denied = elsewhere
        .judge("/snowkeep.v1.IdService/NextIds", auth, None)
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    clock.set_unix_ms(10_000);
    let expired = layer
        .judge("/snowkeep.v1.InfoService/GetInfo", auth, None)
        .unwrap_err();
    assert_expired_at_10_s(&expired, &key);
    let missing = layer
        .judge("/snowkeep.v1.InfoService/GetInfo", None, None)
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated);
}

/// A key kept on the connection (see `super::memo`) is judged like a
/// fresh one: refused at once when revoked, at its expiry, and with a
/// wrong secret; its permissions still per method.
#[test]
fn a_key_kept_on_the_connection_is_refused_at_once_when_revoked_or_expired() {
    use snowkeep_client::ManualClock;
    use snowkeep_core::api_key::BootstrapKey;

    const NEXT_IDS: &str = "/snowkeep.v1.IdService/NextIds";
    let key = PresentedKey::generate();
    let mut record = BootstrapKey::parse(&key.reveal()).unwrap().record(0);
    record.permissions = vec![Permission::Ids];
    record.expires_unix_ms = 10_000;
    let cache = KeyCache::new();
    cache.replace_all(&[stored(&record, 1)], 1);
    let clock = ManualClock::new(9_000);
    let on = ClusterAuth::on_etcd(Some(crate::auth::AuthMode::On));
    let layer = AuthLayer::new(on, cache.clone(), clock.clone(), "default".into());
    let header = format!("Bearer {}", key.reveal());
    let auth = Some(header.as_bytes());
    let memo = Memo::default();

    let first = layer.judge(NEXT_IDS, auth, Some(&memo)).unwrap().unwrap();
    let again = layer.judge(NEXT_IDS, auth, Some(&memo)).unwrap().unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "the second call reuses the kept key"
    );
    let denied = layer
        .judge("/snowkeep.v1.LeaseService/Acquire", auth, Some(&memo))
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    let wrong = format!("Bearer {}.{}", key.id(), "0".repeat(64));
    let refused = layer
        .judge(NEXT_IDS, Some(wrong.as_bytes()), Some(&memo))
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert_eq!(
        refused.message(),
        format!(
            "wrong secret for API key {}: send the whole key `<id>.<secret>` exactly as key create printed it",
            key.id()
        )
    );

    // Revoked through another server: the watch applies it.
    record.revoked = true;
    cache.replace_all(&[stored(&record, 2)], 2);
    let revoked = layer.judge(NEXT_IDS, auth, Some(&memo)).unwrap_err();
    let fresh = layer.judge(NEXT_IDS, auth, None).unwrap_err();
    assert_eq!(revoked.code(), tonic::Code::Unauthenticated);
    assert_eq!(revoked.message(), fresh.message());

    // Restored, kept again, then past its expiry on the clock alone.
    record.revoked = false;
    cache.replace_all(&[stored(&record, 3)], 3);
    clock.set_unix_ms(9_999);
    let kept = layer.judge(NEXT_IDS, auth, Some(&memo)).unwrap().unwrap();
    assert!(
        !Arc::ptr_eq(&kept, &first),
        "checked again after the change"
    );
    assert!(Arc::ptr_eq(
        &kept,
        &layer.judge(NEXT_IDS, auth, Some(&memo)).unwrap().unwrap()
    ));
    clock.set_unix_ms(10_000);
    let expired = layer.judge(NEXT_IDS, auth, Some(&memo)).unwrap_err();
    assert_expired_at_10_s(&expired, &key);
}
