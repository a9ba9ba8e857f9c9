//! `curl` gets ids, leases, info and health, and bad requests get a 400
//! naming the field, on the single-instance store and on etcd, with API
//! keys off and on.

use serde_json::json;
use snowkeep_client::Layout;
use snowkeep_proto::v1 as pb;
use snowkeep_test_support::auth::AuthCluster;
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::{scrape, ServerProcess};
use snowkeep_test_support::READY;

use super::{curl, ids_of, single_instance};

/// Exact status and body of `GET url`.
fn get(url: &str) -> (u16, String) {
    let got = curl(&[url]);
    (got.status, got.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_gets_ids_info_health_and_the_openapi_document_from_the_single_instance_store() {
    let (server, _state) = single_instance(&[]);
    server.wait_serving(READY).await;
    let base = server.url();
    let machine_id = server.machine_id().await;

    let got = curl(&[&format!("{base}/v1/ids?count=3")]);
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.header("content-type"), Some("application/json"));
    let ids = ids_of(&got.json(), "ids");
    assert_eq!(ids.len(), 3);
    assert!(ids[0] < ids[1] && ids[1] < ids[2], "{ids:?}");
    let layout = Layout::default();
    for id in &ids {
        assert_eq!(
            u32::from(layout.decode(*id).unwrap().machine_id.get()),
            machine_id
        );
    }
    // The body is exactly the proto3 JSON of NextIdsResponse.
    let expected = json!({"ids": ids.iter().map(u64::to_string).collect::<Vec<_>>(), "texts": []});
    assert_eq!(got.json(), expected);

    let decoded = curl(&[&format!("{base}/v1/ids:decode?id={}", ids[0])]).json();
    let parts = layout.decode(ids[0]).unwrap();
    assert_eq!(decoded["machine_id"], json!(machine_id));
    assert_eq!(decoded["sequence"], json!(parts.sequence));
    assert_eq!(
        decoded["timestamp_ms"],
        json!(parts.timestamp.0.to_string())
    );

    let info = curl(&[&format!("{base}/v1/info")]).json();
    assert_eq!(info["store"], "single-instance");
    assert_eq!(info["namespace"], "default");
    assert_eq!(info["held"][0]["machine_id"], json!(machine_id));
    assert_eq!(
        info["layout"],
        json!({"timestamp_bits": 41, "machine_bits": 12, "sequence_bits": 10, "epoch_unix_ms": "1767225600000", "time_unit_ms": 1})
    );
    assert_eq!(
        get(&format!("{base}/v1/version")),
        (
            200,
            format!(
                r#"{{"version":"{}","api":"snowkeep.v1"}}"#,
                env!("CARGO_PKG_VERSION")
            )
        )
    );
    assert_eq!(
        get(&format!("{base}/healthz")),
        (200, r#"{"status":"SERVING"}"#.into())
    );
    assert_eq!(
        get(&format!("{base}/livez")),
        (200, r#"{"status":"SERVING"}"#.into())
    );
    let openapi =
        std::fs::read_to_string(crate::files::tools::repo().join("docs/openapi.json")).unwrap();
    assert_eq!(get(&format!("{base}/openapi.json")), (200, openapi));

    // Requests and errors are counted under protocol="http".
    let metrics = scrape(server.metrics_port).await;
    let line = "snowkeep_grpc_requests_total{service=\"snowkeep.v1.IdService\",method=\"NextIds\",protocol=\"http\",code=\"OK\"} 1";
    assert!(
        metrics.lines().any(|l| l == line),
        "{line} not in:\n{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400_naming_the_field_and_nothing_else_changes() {
    let (server, _state) = single_instance(&[]);
    server.wait_serving(READY).await;
    let base = server.url();
    let status = |code: u16, text: &str| {
        (
            code,
            json!({"code": 3, "message": text, "details": []}).to_string(),
        )
    };
    let cases: [(&str, (u16, String)); 5] = [
        ("/v1/ids?count=0", status(400, "count must be between 1 and 100000, got 0")),
        ("/v1/ids?count=100001", status(400, "count must be between 1 and 100000, got 100001")),
        ("/v1/ids?count=x", status(400, "invalid field \"count\" (uint32): invalid digit found in string")),
        ("/v1/ids?count=-1", status(400, "invalid field \"count\" (uint32): invalid digit found in string")),
        (
            "/v1/ids?cnt=1",
            status(400, "unknown query parameter \"cnt\": GET /v1/ids takes count, client_time_unix_ms, format"),
        ),
    ];
    for (path, want) in cases {
        let got = curl(&[&format!("{base}{path}")]);
        assert_eq!((got.status, got.json().to_string()), want, "{path}");
    }
    let post = |body: &str| {
        let got = curl(&[
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &format!("{base}/v1/leases:acquire"),
        ]);
        (got.status, got.json())
    };
    let (code, body) = post("{\"count\":");
    assert_eq!(code, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("the body is not valid JSON: "),
        "{body}"
    );
    assert_eq!(
        post(r#"{"namespace": 5}"#).1["message"],
        "invalid field \"namespace\" (string): invalid type: integer `5`, expected a string"
    );
    assert_eq!(
        post(r#"{"bogus": 1}"#).1["message"],
        "invalid AcquireRequest: unrecognized field name 'bogus'"
    );
    assert_eq!(
        post(r#"[1]"#).1["message"],
        "the body of POST /v1/leases:acquire must be a JSON object (the AcquireRequest message)"
    );
    // Routes and methods that do not exist.
    let got = curl(&["-X", "POST", &format!("{base}/v1/ids")]);
    assert_eq!(got.status, 405);
    assert_eq!(got.header("allow"), Some("GET"));
    assert_eq!(
        got.json()["message"],
        "POST is not served at /v1/ids; it takes GET"
    );
    let got = curl(&[&format!("{base}/v2/ids")]);
    assert_eq!(got.status, 404);
    assert_eq!(
        got.json()["message"],
        "no route GET /v2/ids: the routes are listed in GET /openapi.json"
    );
    // Still serving, and the ids continue above those issued before.
    let before = ids_of(&curl(&[&format!("{base}/v1/ids?count=1")]).json(), "ids")[0];
    let after = server.next_ids(1).await.unwrap()[0];
    assert!(after > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_leases_machine_ids_on_etcd_without_auth() {
    let etcd = EtcdProcess::start().await;
    let server = ServerProcess::on_etcd(&etcd.endpoint(), "curlns", &[]);
    server.wait_serving(READY).await;
    let base = server.url();
    let info = curl(&[&format!("{base}/v1/info")]).json();
    assert_eq!(
        (info["store"].as_str(), info["namespace"].as_str()),
        (Some("etcd"), Some("curlns"))
    );
    assert_eq!(
        info["held"][0]["machine_id"],
        json!(server.machine_id().await)
    );
    assert_eq!(curl(&[&format!("{base}/healthz")]).status, 200);
    let requester = json!({"host_id": "curl-host", "pid": 7, "start_unix_ms": "1796000000000", "nonce": "00000000000000a1"});
    let acquire = json!({"requester": requester, "namespace": "curlns", "count": 2});
    let got = curl(&[
        "-X",
        "POST",
        "-d",
        &acquire.to_string(),
        &format!("{base}/v1/leases:acquire"),
    ]);
    assert_eq!(got.status, 200, "{got:?}");
    let grant = got.json();
    let token = grant["lease_token"].as_str().unwrap().to_owned();
    assert_eq!(grant["machine_ids"].as_array().unwrap().len(), 2, "{grant}");
    let renew = json!({"requester": requester, "namespace": "curlns", "lease_token": token});
    let renewed = curl(&[
        "-X",
        "POST",
        "-d",
        &renew.to_string(),
        &format!("{base}/v1/leases:renew"),
    ])
    .json();
    let ids = |g: &serde_json::Value| -> Vec<u64> {
        g["machine_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["machine_id"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(ids(&renewed), ids(&grant), "{renewed}");
    assert!(
        renewed["expires_in_ms"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0,
        "{renewed}"
    );
    let capacity = curl(&[&format!("{base}/v1/namespaces/curlns/capacity")]).json();
    // The server's own machine id and the two leased.
    assert_eq!(capacity["held"], json!(3), "{capacity}");
    let wrong =
        json!({"requester": requester, "namespace": "curlns", "lease_token": "0".repeat(64)});
    let got = curl(&[
        "-X",
        "POST",
        "-d",
        &wrong.to_string(),
        &format!("{base}/v1/leases:release"),
    ]);
    assert_eq!(got.status, 403, "{got:?}");
    let release = json!({"requester": requester, "namespace": "curlns", "lease_token": token});
    let released = curl(&[
        "-X",
        "POST",
        "-d",
        &release.to_string(),
        &format!("{base}/v1/leases:release"),
    ]);
    assert_eq!(
        (released.status, released.json()),
        (200, json!({"released": 2}))
    );
    let capacity = curl(&[&format!("{base}/v1/namespaces/curlns/capacity")]).json();
    assert_eq!(capacity["held"], json!(1), "{capacity}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_needs_a_key_with_the_right_permission_when_auth_is_on() {
    let cluster = AuthCluster::start("curlauth").await;
    let base = cluster.a.url();
    let url = format!("{base}/v1/ids?count=2");
    let got = curl(&[&url]);
    assert_eq!(got.status, 401, "{got:?}");
    assert_eq!(got.json()["code"], json!(16));
    assert_eq!(
        got.header("www-authenticate"),
        Some("Bearer realm=\"snowkeep\"")
    );
    let (lease_only, _) = cluster
        .create_key(&[pb::Permission::Lease], &["curlauth"], 4)
        .await;
    let got = curl(&["-H", &format!("authorization: Bearer {lease_only}"), &url]);
    assert_eq!(got.status, 403, "{got:?}");
    assert_eq!(got.json()["code"], json!(7));
    let (ids_key, _) = cluster
        .create_key(&[pb::Permission::Ids], &["curlauth"], 0)
        .await;
    let got = curl(&["-H", &format!("authorization: Bearer {ids_key}"), &url]);
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(ids_of(&got.json(), "ids").len(), 2);
    // Health stays open, as over gRPC.
    assert_eq!(curl(&[&format!("{base}/healthz")]).status, 200);
    // HEAD for health checkers that send it: the status, no body.
    for path in ["/healthz", "/livez"] {
        let got = curl(&["-I", &format!("{base}{path}")]);
        assert_eq!(
            (got.status, got.body.as_str()),
            (200, ""),
            "{path}: {got:?}"
        );
    }
    // Other methods there are a 405 naming those it takes, key or not.
    for (path, allowed) in [
        ("/healthz", "GET, HEAD"),
        ("/livez", "GET, HEAD"),
        ("/openapi.json", "GET"),
    ] {
        let got = curl(&["-X", "POST", &format!("{base}{path}")]);
        assert_eq!(
            (got.status, got.header("allow")),
            (405, Some(allowed)),
            "{path}: {got:?}"
        );
        assert_eq!(
            got.json()["message"],
            json!(format!("POST is not served at {path}; it takes {allowed}"))
        );
    }
    // The Lease API with the lease key, its machine id quota enforced.
    let requester = json!({"host_id": "curl-host", "pid": 8, "start_unix_ms": "1796000000000", "nonce": "00000000000000b2"});
    let acquire = |count: u32| {
        let body =
            json!({"requester": requester, "namespace": "curlauth", "count": count}).to_string();
        curl(&[
            "-H",
            &format!("authorization: Bearer {lease_only}"),
            "-X",
            "POST",
            "-d",
            &body,
            &format!("{base}/v1/leases:acquire"),
        ])
    };
    let got = acquire(5);
    assert_eq!(got.status, 429, "{got:?}");
    assert_eq!(got.header("retry-after"), Some("1"));
    let got = acquire(2);
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.json()["machine_ids"].as_array().unwrap().len(), 2);
}

/// A body over the bound (`--max-recv-message-size`, 16 KiB by default;
/// never over 64 KiB) is a 413 before any of it is parsed, and the server
/// goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_bound_is_a_413() {
    let (server, _state) = single_instance(&[]);
    server.wait_serving(READY).await;
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body.json");
    let big = format!("{{\"namespace\":\"{}\"}}", "a".repeat(16 * 1024));
    std::fs::write(&body, big).unwrap();
    let got = curl(&[
        "-H",
        "content-type: application/json",
        "--data-binary",
        &format!("@{}", body.display()),
        &format!("{}/v1/leases:check", server.url()),
    ]);
    assert_eq!(got.status, 413, "{got:?}");
    assert_eq!(
        got.json(),
        json!({"code": 8, "details": [], "message": "the body is over 16384 bytes (the bound of an HTTP/JSON body: 64 KiB, or --max-recv-message-size if smaller) or could not be read"})
    );
    let got = curl(&[&format!("{}/v1/ids?count=2", server.url())]);
    assert_eq!((got.status, ids_of(&got.json(), "ids").len()), (200, 2));
}
