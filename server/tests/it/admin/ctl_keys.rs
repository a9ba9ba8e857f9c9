//! `snowkeepctl key …` and `snowkeepctl audit tail` against a live cluster
//! with `--auth on`, asserting their JSON output.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::auth::{ids, AuthCluster};
use snowkeep_test_support::eventually;

/// Runs snowkeepctl with `args` against `url` with the key in `key_file`.
fn ctl(url: &str, key_file: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args([
            "--endpoint",
            url,
            "--api-key-file",
            key_file,
            "--output",
            "json",
        ])
        .args(args)
        .output()
        .expect("run snowkeepctl")
}

/// Runs it and parses its JSON output; panics on a failure.
fn ctl_json(url: &str, key_file: &str, args: &[&str]) -> Value {
    let out = ctl(url, key_file, args);
    assert!(
        out.status.success(),
        "snowkeepctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "snowkeepctl {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_commands_and_audit_tail_run_against_a_live_cluster() {
    let c = AuthCluster::start("ctlkeys").await;
    let key_file = c.dir.path().join("admin.key");
    let key_file = key_file.to_str().unwrap().to_owned();
    let (url_a, url_b) = (c.a.url(), c.b.url());

    let created = ctl_json(
        &url_a,
        &key_file,
        &[
            "key",
            "create",
            "--description",
            "orders service",
            "--expires",
            "30d",
            "--namespace",
            "ctlkeys",
            "--permission",
            "ids",
            "--permission",
            "lease",
            "--max-lease-machine-ids",
            "4",
        ],
    );
    let id = created["id"].as_str().unwrap().to_owned();
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert_eq!(secret.split_once('.').unwrap().0, id);
    assert_eq!(created["description"], "orders service");
    assert_eq!(created["namespaces"], serde_json::json!(["ctlkeys"]));
    assert_eq!(created["permissions"], serde_json::json!(["ids", "lease"]));
    assert_eq!(created["max_lease_machine_ids"], 4);
    assert_eq!(created["revoked"], false);
    let created_ms = created["created_unix_ms"].as_u64().unwrap();
    let expires_ms = created["expires_unix_ms"].as_u64().unwrap();
    // 30 days from snowkeepctl's clock, created by the server's a moment later.
    let month = 30 * 86_400_000;
    assert!(
        (month - 10_000..=month).contains(&(expires_ms - created_ms)),
        "{created}"
    );

    // The key works, then list shows it without its secret.
    let next = pb::NextIdsRequest {
        count: 1,
        ..Default::default()
    };
    assert!(ids(&c.a, Some(&secret)).await.next_ids(next).await.is_ok());
    let listed = ctl_json(&url_b, &key_file, &["key", "list"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "the bootstrap key and ours: {listed:?}");
    let ours = listed.iter().find(|k| k["id"] == id.as_str()).unwrap();
    assert!(ours.get("secret").is_none());
    assert!(!serde_json::to_string(listed)
        .unwrap()
        .contains(secret.split_once('.').unwrap().1));
    let boot = listed.iter().find(|k| k["id"] == "kbootstrap01").unwrap();
    assert_eq!(boot["permissions"], serde_json::json!(["admin"]));

    // Expire now through b: refused on a.
    let expired = ctl_json(&url_b, &key_file, &["key", "expire", &id]);
    assert!(expired["expires_unix_ms"].as_u64().unwrap() < expires_ms);
    eventually(
        "the expired key to be refused",
        Duration::from_secs(10),
        || {
            let (a, secret, next) = (&c.a, secret.clone(), next);
            async move {
                matches!(ids(a, Some(&secret)).await.next_ids(next).await,
                Err(s) if s.code() == Code::Unauthenticated && s.message().contains("expired at"))
            }
        },
    )
    .await;
    let revoked = ctl_json(&url_a, &key_file, &["key", "revoke", &id]);
    assert_eq!(revoked["revoked"], true);
    let missing = ctl(&url_a, &key_file, &["key", "revoke", "knosuchkey001"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no API key knosuchkey001"));

    // --secret-file: the key goes to a new 0600 file, the table says where
    // and shows no secret; an existing file is refused before any key exists.
    let secret_file = c.dir.path().join("orders.key");
    let secret_path = secret_file.to_str().unwrap().to_owned();
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args(["--endpoint", &url_a, "--api-key-file", &key_file])
        .args([
            "key",
            "create",
            "--description",
            "orders",
            "--permission",
            "ids",
        ])
        .args(["--secret-file", &secret_path])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(&secret_file).unwrap();
    let (file_id, file_secret) = written.trim_end().split_once('.').unwrap();
    assert!(
        written.ends_with('\n') && written.lines().count() == 1,
        "{written:?}"
    );
    assert!(
        stdout.contains(file_id) && !stdout.contains(file_secret),
        "{stdout}"
    );
    assert!(!stdout.contains("SECRET"), "{stdout}");
    assert!(
        stdout.ends_with(&format!(
            "the key (<id>.<secret>) is in {secret_path} (mode 0600): give it to the client\n"
        )),
        "{stdout}"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert!(ids(&c.a, Some(written.trim_end()))
        .await
        .next_ids(next)
        .await
        .is_ok());
    let keys_before = ctl_json(&url_a, &key_file, &["key", "list"])
        .as_array()
        .unwrap()
        .len();
    let again = ctl(
        &url_a,
        &key_file,
        &[
            "key",
            "create",
            "--description",
            "orders",
            "--permission",
            "ids",
            "--secret-file",
            &secret_path,
        ],
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(again.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&again.stderr).starts_with(&format!(
            "snowkeepctl: --secret-file {secret_path}: cannot create it (it must not exist yet): "
        )),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(std::fs::read_to_string(&secret_file).unwrap(), written);
    let keys_after = ctl_json(&url_a, &key_file, &["key", "list"])
        .as_array()
        .unwrap()
        .len();
    assert_eq!(keys_after, keys_before);

    // A flag wins over an environment variable, without a usage error:
    // --api-key over SNOWKEEP_API_KEY_FILE, --api-key-file over SNOWKEEP_API_KEY.
    let admin_key = std::fs::read_to_string(&key_file).unwrap();
    let admin_key = admin_key.lines().next().unwrap().trim().to_owned();
    let flag_over_env = |flag: &str, value: &str, env: &str, env_value: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
            .args(["--endpoint", &url_a, "--output", "json", "key", "list"])
            .args([flag, value])
            .env_remove("SNOWKEEP_API_KEY")
            .env_remove("SNOWKEEP_API_KEY_FILE")
            .env(env, env_value)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(
        flag_over_env(
            "--api-key",
            &admin_key,
            "SNOWKEEP_API_KEY_FILE",
            "/no/such/key"
        ),
        (Some(0), String::new())
    );
    assert_eq!(
        flag_over_env(
            "--api-key-file",
            &key_file,
            "SNOWKEEP_API_KEY",
            "kwrongkey0001.0000"
        ),
        (Some(0), String::new())
    );

    // No key: the canonical code name, and what to do.
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args(["--endpoint", &url_a, "key", "list"])
        .env_remove("SNOWKEEP_API_KEY")
        .env_remove("SNOWKEEP_API_KEY_FILE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("snowkeepctl: UNAUTHENTICATED: "), "{err}");
    assert!(
        err.ends_with(
            "\nhint: send an API key with --api-key-file FILE (or SNOWKEEP_API_KEY_FILE)\n"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 2, "{err}");

    // audit tail --count 2 exits after two events: make key events until it does.
    let mut tail = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
        .args([
            "--endpoint",
            &url_a,
            "--api-key-file",
            &key_file,
            "--output",
            "json",
        ])
        .args(["audit", "tail", "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tail.try_wait().unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "audit tail did not exit"
        );
        ctl_json(
            &url_a,
            &key_file,
            &[
                "key",
                "create",
                "--description",
                "audit",
                "--permission",
                "ids",
            ],
        );
    }
    let out = tail.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    for e in &events {
        assert_eq!(e["action"], "key.create");
        assert_eq!(e["key_id"], "kbootstrap01");
        assert_eq!(e["result"], "ok");
    }
}

/// `snowkeepctl key generate` prints a fresh key offline; a server started
/// with it as `--bootstrap-admin-key-file` accepts it as an admin key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_key_bootstraps_the_first_admin_key() {
    let generate = || {
        let out = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"))
            .args(["key", "generate"])
            .output()
            .expect("run snowkeepctl");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let key = generate();
    assert_ne!(generate(), key);
    let (id, secret) = key.split_once('.').unwrap();
    assert_eq!((id.len(), secret.len()), (13, 64));

    let etcd = snowkeep_test_support::etcd::EtcdProcess::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin.key");
    std::fs::write(&file, format!("{key}\n")).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let server = snowkeep_test_support::server::ServerProcess::on_etcd(
        &etcd.endpoint(),
        "generated",
        &["--auth", "on", "--bootstrap-admin-key-file", &file],
    );
    server.wait_serving(snowkeep_test_support::READY).await;
    let listed = ctl_json(&server.url(), &file, &["key", "list"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["permissions"], serde_json::json!(["admin"]));
    // The log never carries the secret.
    assert!(!server.log().contains(secret));
}
