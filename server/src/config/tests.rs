//! The flags' parsing and checks, through `Args::try_parse_from` and
//! `ServerConfig::try_from`.

use snowkeep_core::namespace::is_valid_namespace;
use snowkeep_etcd::namespace::FloorSpec;

use crate::tls::TlsError;

use super::*;

fn parse(extra: &[&str]) -> Result<ServerConfig, ConfigError> {
    let mut argv = vec!["snowkeep-server"];
    argv.extend_from_slice(extra);
    ServerConfig::try_from(Args::try_parse_from(argv).expect("args parse"))
}

#[test]
fn defaults_run_the_single_instance_store_on_the_reference_layout() {
    let c = parse(&[]).unwrap();
    assert_eq!(
        c.store,
        StoreConfig::SingleInstance {
            state_dir: "snowkeep-state".into()
        }
    );
    assert_eq!(c.layout, Layout::default());
    assert_eq!(c.namespace, "default");
    assert_eq!(c.lease_ttl, Duration::from_secs(10));
    assert_eq!(c.machine_id_range, 0..4096);
    assert!(!c.stable_instance);
    assert_eq!(c.instance_id.split(':').count(), 3);
}

#[test]
fn endpoints_split_on_commas_and_mark_the_etcd_store() {
    let c = parse(&[
        "--etcd-endpoints",
        "http://a:1,http://b:2",
        "--instance-id",
        "pod-0",
    ])
    .unwrap();
    assert_eq!(
        c.store,
        StoreConfig::Etcd {
            endpoints: vec!["http://a:1".into(), "http://b:2".into()]
        }
    );
    assert!(c.stable_instance);
    assert_eq!(c.instance_id, "pod-0");
}

#[test]
fn rejects_bad_values_with_their_own_errors() {
    assert!(matches!(
        parse(&["--layout", "41/12/11"]),
        Err(ConfigError::Layout(_))
    ));
    assert!(matches!(
        parse(&["--namespace", "a/b"]),
        Err(ConfigError::Namespace(_))
    ));
    assert!(matches!(
        parse(&["--lease-ttl", "1500ms"]),
        Err(ConfigError::LeaseTtl(_))
    ));
    assert!(matches!(
        parse(&["--machine-ids", "0"]),
        Err(ConfigError::MachineIds { got: 0, max: 42 })
    ));
    assert!(matches!(
        parse(&["--machine-ids", "3", "--machine-id-range", "0..2"]),
        Err(ConfigError::MachineIds { got: 3, max: 2 })
    ));
    assert!(matches!(
        parse(&["--outage-budget", "500ms"]),
        Err(ConfigError::OutageBudget(d)) if d == Duration::from_millis(500)
    ));
    assert!(matches!(
        parse(&["--outage-budget", "61m"]),
        Err(ConfigError::TooLong { max, .. }) if max == Duration::from_secs(3600)
    ));
    assert!(matches!(
        parse(&["--lease-ttl", "2h"]),
        Err(ConfigError::TooLong { max, .. }) if max == Duration::from_secs(3600)
    ));
    for bad in ["0..4097", "5..5", "9..3", "1-2", "..4"] {
        assert!(
            matches!(
                parse(&["--machine-id-range", bad]),
                Err(ConfigError::MachineIdRange { max: 4096, .. })
            ),
            "{bad} must be refused"
        );
    }
}

#[test]
fn namespace_setup_flags_need_etcd_and_a_floor_makes_a_one_shot() {
    let etcd = ["--etcd-endpoints", "http://a:1"];
    let c = parse(&etcd).unwrap();
    assert_eq!(c.namespace_setup, NamespaceSetup::default());
    assert!(!c.setup_only);
    let c = parse(&[etcd[0], etcd[1], "--create-namespace"]).unwrap();
    assert!(c.namespace_setup.create && !c.setup_only);
    let c = parse(&[etcd[0], etcd[1], "--create-namespace-only"]).unwrap();
    assert!(c.namespace_setup.create && c.setup_only);
    let c = parse(&[etcd[0], etcd[1], "--confirm-namespace-floor", "+48h1m"]).unwrap();
    assert_eq!(
        c.namespace_setup.confirm_floor,
        Some(FloorSpec::After(Duration::from_secs(48 * 3600 + 60)))
    );
    assert!(!c.namespace_setup.create && c.setup_only);
    for flag in ["--create-namespace", "--create-namespace-only"] {
        let err = parse(&[flag]).unwrap_err().to_string();
        assert!(err.starts_with("--create-namespace, --create-namespace-only and --confirm-namespace-floor apply to namespaces in etcd: add --etcd-endpoints"), "{err}");
    }
    let bad = Args::try_parse_from(["snowkeep-server", "--confirm-namespace-floor", "48h"])
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("use +DURATION (like +48h1m) or an RFC 3339 UTC time"),
        "{bad}"
    );
}

#[test]
fn limits_default_to_the_documented_values() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.limits, Limits::default());
    assert_eq!(c.limits.max_connections, 256);
    assert_eq!(c.limits.http2_max_concurrent_streams, 64);
    assert_eq!(c.limits.max_concurrent_calls, 256);
    assert_eq!(c.limits.max_open_streams, 128);
    assert_eq!(c.limits.max_keyless_calls, 32);
    assert_eq!(c.limits.max_keyless_streams, 16);
    assert_eq!(c.limits.max_keyless_calls_per_peer, 8);
    assert_eq!(c.limits.max_calls_per_key, 64);
    assert_eq!(c.limits.max_streams_per_key, 32);
    assert_eq!(c.limits.request_timeout, Duration::from_secs(5));
    assert_eq!(c.limits.max_call_memory, 64 << 20);
    assert_eq!(c.limits.max_recv_message_size, 16 << 10);
    assert_eq!(c.limits.max_send_message_size, 1 << 20);
    assert_eq!(c.limits.http2_max_header_list_size, 16 << 10);
    assert_eq!(
        c.limits.http2_keepalive_interval,
        Some(Duration::from_secs(20))
    );
    assert_eq!(c.limits.http2_keepalive_timeout, Duration::from_secs(10));
    assert_eq!(c.limits.idle_timeout, Duration::from_secs(60));
    assert_eq!(c.limits.tcp_keepalive, Some(Duration::from_secs(60)));
    assert_eq!(c.limits.max_connections_per_peer, Some(64));
    assert_eq!(c.limits.stream_send_timeout, Some(Duration::from_secs(30)));
}

#[test]
fn the_per_peer_cap_and_the_send_timeout_turn_off_at_zero() {
    let c = parse(&[
        "--max-connections-per-peer",
        "0",
        "--stream-send-timeout",
        "0s",
    ])
    .unwrap();
    assert_eq!(c.limits.max_connections_per_peer, None);
    assert_eq!(c.limits.stream_send_timeout, None);
    let c = parse(&[
        "--max-connections-per-peer",
        "3",
        "--stream-send-timeout",
        "2s",
    ])
    .unwrap();
    assert_eq!(c.limits.max_connections_per_peer, Some(3));
    assert_eq!(c.limits.stream_send_timeout, Some(Duration::from_secs(2)));
    assert!(matches!(
        parse(&["--stream-send-timeout", "10ms"]),
        Err(ConfigError::OutOfRange { .. })
    ));
}

#[test]
fn limits_parse_sizes_and_turn_keepalives_off_at_zero() {
    let c = parse(&[
        "--max-call-memory",
        "8MiB",
        "--max-recv-message-size",
        "2048",
        "--max-send-message-size",
        "64KiB",
        "--http2-keepalive-interval",
        "0s",
        "--tcp-keepalive",
        "0s",
        "--idle-timeout",
        "500ms",
    ])
    .unwrap();
    assert_eq!(c.limits.max_call_memory, 8 << 20);
    assert_eq!(c.limits.max_recv_message_size, 2048);
    assert_eq!(c.limits.max_send_message_size, 64 << 10);
    assert_eq!(c.limits.http2_keepalive_interval, None);
    assert_eq!(c.limits.tcp_keepalive, None);
    assert_eq!(c.limits.idle_timeout, Duration::from_millis(500));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert_eq!(parse_size(" 12 "), Ok(12));
    for bad in ["", "MiB", "12MB", "1.5MiB", "-1", "99999999999GiB"] {
        assert!(parse_size(bad).is_err(), "{bad:?} must be refused");
    }
}

#[test]
fn limits_out_of_range_are_refused_naming_the_flag() {
    let err = parse(&["--max-open-streams", "0"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid --max-open-streams (SNOWKEEP_MAX_OPEN_STREAMS) 0: use 1 to 1000000"
    );
    assert!(matches!(
        parse(&["--max-call-memory", "1MiB"]),
        Err(ConfigError::LimitOutOfRange { min, .. }) if min == 4 << 20
    ));
    assert!(matches!(
        parse(&["--max-recv-message-size", "100"]),
        Err(ConfigError::LimitOutOfRange { min: 1024, .. })
    ));
    assert!(matches!(
        parse(&["--http2-keepalive-interval", "10ms"]),
        Err(ConfigError::OutOfRange { .. })
    ));
    assert!(matches!(
        parse(&["--idle-timeout", "0s"]),
        Err(ConfigError::OutOfRange { .. })
    ));
    assert!(Args::try_parse_from(["snowkeep-server", "--max-call-memory", "lots"]).is_err());
    assert_eq!(
        parse(&["--max-calls-per-key", "0"])
            .unwrap_err()
            .to_string(),
        "invalid --max-calls-per-key (SNOWKEEP_MAX_CALLS_PER_KEY) 0: use 1 to 1000000"
    );
    assert_eq!(
        parse(&["--max-keyless-streams", "0"])
            .unwrap_err()
            .to_string(),
        "invalid --max-keyless-streams (SNOWKEEP_MAX_KEYLESS_STREAMS) 0: use 1 to 1000000"
    );
    assert!(matches!(
        parse(&["--request-timeout", "50ms"]),
        Err(ConfigError::OutOfRange {
            flag: "--request-timeout (SNOWKEEP_REQUEST_TIMEOUT)",
            ..
        })
    ));
    assert!(matches!(
        parse(&["--request-timeout", "11m"]),
        Err(ConfigError::OutOfRange { .. })
    ));
}

#[test]
fn a_machine_id_range_is_half_open_and_bounded_by_the_layout() {
    let c = parse(&["--machine-id-range", "2048..4096"]).unwrap();
    assert_eq!(c.machine_id_range, 2048..4096);
    let c = parse(&["--machine-id-range", "0..2", "--layout", "52/1/10"]).unwrap();
    assert_eq!(c.machine_id_range, 0..2);
    assert!(matches!(
        parse(&["--machine-id-range", "0..3", "--layout", "52/1/10"]),
        Err(ConfigError::MachineIdRange { max: 2, .. })
    ));
}

mod etcd;

#[test]
fn cors_origins_are_off_by_default_and_parse_as_origins_only() {
    use super::CorsOrigins;
    let err = |args: &[&str]| parse(args).unwrap_err().to_string();
    assert_eq!(parse(&[]).unwrap().cors_allow_origins, CorsOrigins::None);
    assert_eq!(
        parse(&["--cors-allow-origins", " , "])
            .unwrap()
            .cors_allow_origins,
        CorsOrigins::None
    );
    assert_eq!(
        parse(&["--cors-allow-origins", "*"])
            .unwrap()
            .cors_allow_origins,
        CorsOrigins::Any
    );
    assert_eq!(
        parse(&[
            "--cors-allow-origins",
            "https://app.example.com/, http://127.0.0.1:8080"
        ])
        .unwrap()
        .cors_allow_origins,
        CorsOrigins::List(vec![
            "https://app.example.com".into(),
            "http://127.0.0.1:8080".into()
        ])
    );
    for bad in [
        "app.example.com",
        "https://app.example.com/page",
        "ftp://x.example",
        "*,https://a.example",
    ] {
        assert_eq!(
            err(&["--cors-allow-origins", bad]),
            format!(
                "invalid --cors-allow-origins (SNOWKEEP_CORS_ALLOW_ORIGINS) entry {:?}: use web origins like https://app.example.com or http://127.0.0.1:8080 (scheme, host, optional port; no path), comma-separated, or * for any",
                bad.split(',').find(|e| !e.trim().starts_with("http")).unwrap_or(bad).trim()
            ),
            "{bad}"
        );
    }
}

#[test]
fn tls_flags_go_in_pairs_and_allow_cidrs_parse() {
    let err = |args: &[&str]| parse(args).unwrap_err().to_string();
    assert_eq!(err(&["--tls-cert-file", "/nonexistent"]), "--tls-cert-file (SNOWKEEP_TLS_CERT_FILE) needs --tls-key-file (SNOWKEEP_TLS_KEY_FILE): give both, or neither to serve plaintext");
    assert_eq!(err(&["--tls-key-file", "/nonexistent"]), "--tls-key-file (SNOWKEEP_TLS_KEY_FILE) needs --tls-cert-file (SNOWKEEP_TLS_CERT_FILE): give both, or neither to serve plaintext");
    assert_eq!(
        err(&["--tls-client-ca-file", "/nonexistent"]),
        "--tls-client-ca-file (SNOWKEEP_TLS_CLIENT_CA_FILE) needs TLS: add --tls-cert-file and --tls-key-file"
    );
    assert!(matches!(
        parse(&[
            "--tls-cert-file",
            "/nonexistent/c",
            "--tls-key-file",
            "/nonexistent/k"
        ]),
        Err(ConfigError::Tls(TlsError::Read {
            flag: "--tls-cert-file",
            ..
        }))
    ));
    let c = parse(&[]).unwrap();
    assert!(c.tls.is_none() && c.allow_cidrs.is_empty());
    let c = parse(&["--allow-cidrs", "10.0.0.0/8, 127.0.0.1,fd00::/8,"]).unwrap();
    let want: Vec<IpNet> = ["10.0.0.0/8", "127.0.0.1/32", "fd00::/8"]
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(c.allow_cidrs, want);
    assert_eq!(
        err(&["--allow-cidrs", "10.0.0.0/8,10.0.0.0/33"]),
        "invalid --allow-cidrs (SNOWKEEP_ALLOW_CIDRS) entry \"10.0.0.0/33\": use CIDR ranges like 10.0.0.0/8 or fd00::/8 (or a single address), comma-separated"
    );
}

#[test]
fn namespaces_follow_one_rule() {
    for good in [
        "default",
        "a",
        "Orders",
        "orders.v2",
        "a_b-c",
        "0",
        &"x".repeat(64),
    ] {
        assert!(is_valid_namespace(good), "{good:?}");
        let flag = format!("--namespace={good}");
        assert_eq!(parse(&[&flag]).unwrap().namespace, good);
    }
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "-x",
        "_x",
        "a/b",
        "/",
        "a b",
        "é",
        &"x".repeat(65),
    ] {
        assert!(!is_valid_namespace(bad), "{bad:?}");
        let flag = format!("--namespace={bad}");
        assert!(
            matches!(parse(&[&flag]), Err(ConfigError::Namespace(n)) if n == bad),
            "{bad:?}"
        );
    }
    assert_eq!(
        parse(&["--namespace", ".."]).unwrap_err().to_string(),
        "invalid --namespace (SNOWKEEP_NAMESPACE) \"..\": a namespace is 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or a digit (so never \".\" or \"..\", and no \"/\")"
    );
}

#[test]
fn the_status_page_is_off_by_default_and_needs_etcd_and_its_own_address() {
    let etcd = ["--etcd-endpoints", "http://127.0.0.1:2379"];
    assert_eq!(parse(&etcd).unwrap().admin_listen, None);
    let on = parse(&[&etcd[..], &["--admin-listen", "127.0.0.1:9465"]].concat()).unwrap();
    assert_eq!(on.admin_listen, Some("127.0.0.1:9465".parse().unwrap()));
    // A port alone stays on the loopback address.
    let port = parse(&[&etcd[..], &["--admin-listen", "9465"]].concat()).unwrap();
    assert_eq!(port.admin_listen, Some("127.0.0.1:9465".parse().unwrap()));
    let v6 = parse(&[&etcd[..], &["--admin-listen", "[::1]:9465"]].concat()).unwrap();
    assert_eq!(v6.admin_listen, Some("[::1]:9465".parse().unwrap()));
    let bad = Args::try_parse_from(["snowkeep-server", "--admin-listen", "localhost:x"])
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("\"localhost:x\" is neither HOST:PORT (e.g. 127.0.0.1:9465, [::1]:9465) nor a port (e.g. 9465, which listens on 127.0.0.1)"),
        "{bad}"
    );
    // Any address is allowed when given.
    let wide = parse(&[&etcd[..], &["--admin-listen", "0.0.0.0:9465"]].concat()).unwrap();
    assert_eq!(wide.admin_listen, Some("0.0.0.0:9465".parse().unwrap()));
    assert_eq!(
        parse(&["--admin-listen", "127.0.0.1:9465"]).unwrap_err().to_string(),
        "invalid --admin-listen (SNOWKEEP_ADMIN_LISTEN) 127.0.0.1:9465: the status page shows a cluster's state, which is kept in etcd: add --etcd-endpoints (the single-instance store has no status page)"
    );
    for taken in [DEFAULT_LISTEN, DEFAULT_METRICS_LISTEN] {
        assert_eq!(
            parse(&[&etcd[..], &["--admin-listen", taken]].concat())
                .unwrap_err()
                .to_string(),
            format!("invalid --admin-listen (SNOWKEEP_ADMIN_LISTEN) {taken}: the status page needs an address of its own, not the one of --listen or --metrics-listen")
        );
    }
}
