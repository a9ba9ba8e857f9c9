//! The security mode is the cluster's (`/snowkeep/v1/auth-mode` in etcd),
//! against real etcd and two real servers: a server without `--auth` follows
//! it (so it hands out no admin key to a caller without one), a server whose
//! `--auth` disagrees with it exits 64, `snowkeepctl auth enable` reaches
//! running servers, and only an admin key turns it off.

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};
use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::auth::{admin, ids, random_key};
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, READY};

/// The refusal of a call without a key by a server that checks keys.
const NO_KEY: &str = "no API key: authentication is on; send `authorization: Bearer <id>.<secret>` metadata with the key an administrator created (snowkeepctl key create)";

/// Runs snowkeepctl against `url` with JSON output, with the key in
/// `key_file` or none.
fn ctl(url: &str, key_file: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_snowkeepctl"));
    command.args(["--endpoint", url, "--output", "json"]);
    if let Some(file) = key_file {
        command.args(["--api-key-file", file]);
    }
    command
        .args(args)
        .env_remove("SNOWKEEP_API_KEY")
        .env_remove("SNOWKEEP_API_KEY_FILE")
        .output()
        .expect("run snowkeepctl")
}

/// Asserts snowkeepctl failed (exit 1) with `first_line` on stderr.
fn assert_refused(out: &Output, first_line: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.lines().next(), Some(first_line), "stderr: {stderr}");
}

/// The JSON snowkeepctl printed; panics unless it succeeded.
fn printed(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "snowkeepctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// A NextIds of one id without a key.
async fn keyless_next_id(server: &ServerProcess) -> Result<usize, tonic::Status> {
    ids(server, None)
        .await
        .next_ids(pb::NextIdsRequest {
            count: 1,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().ids.len())
}

/// The value stored at the mode key, `None` when absent.
async fn stored_mode(etcd: &EtcdProcess) -> Option<String> {
    let resp = etcd
        .client()
        .await
        .get("/snowkeep/v1/auth-mode", None)
        .await
        .unwrap();
    resp.kvs()
        .first()
        .map(|kv| String::from_utf8(kv.value().to_vec()).unwrap())
}

/// The reproduction of the issue: server A with `--auth on`, server B on
/// the same etcd and namespace without the flag. B used to serve without
/// keys, so `snowkeepctl key create --permission admin` through B with no
/// key made an admin key that A accepted. Now A's `--auth on` set the
/// cluster's mode, B follows it, and the same command is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_auth_follows_the_cluster_and_makes_no_admin_key() {
    let etcd = EtcdProcess::start().await;
    let dir = tempfile::tempdir().unwrap();
    let admin_key = random_key("kbootstrap02");
    let file = dir.path().join("admin.key");
    std::fs::write(&file, format!("{admin_key}\n")).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let a = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "modeattack",
        &["--auth", "on", "--bootstrap-admin-key-file", &file],
    );
    a.wait_serving(READY).await;
    assert_eq!(stored_mode(&etcd).await.as_deref(), Some("on"));
    let b = ServerProcess::joining(&etcd.endpoint(), "modeattack", &[]);
    b.wait_serving(READY).await;

    let out = ctl(
        &b.url(),
        None,
        &[
            "key",
            "create",
            "--description",
            "attacker",
            "--permission",
            "admin",
        ],
    );
    assert_refused(&out, &format!("snowkeepctl: UNAUTHENTICATED: {NO_KEY}"));
    assert!(out.stdout.is_empty(), "a key was printed");
    let status = keyless_next_id(&b).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unauthenticated, NO_KEY)
    );
    // etcd holds the bootstrap key only, through either server.
    for s in [&a, &b] {
        let keys = admin(s, Some(&admin_key))
            .await
            .list_keys(pb::ListKeysRequest {})
            .await
            .unwrap()
            .into_inner()
            .keys;
        let ids: Vec<&str> = keys.iter().map(|k| k.id.as_str()).collect();
        assert_eq!(ids, ["kbootstrap02"]);
    }
}

/// The migration to API keys on a cluster that runs without them: an admin
/// key first, then one `snowkeepctl auth enable` that every running server
/// follows (one started with `--auth off` too); a server started with
/// `--auth off` then exits 64; turning keys
/// off needs the admin key; afterwards a server started with `--auth on`
/// exits 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_enable_reaches_running_servers_and_only_an_admin_key_turns_it_off() {
    let etcd = EtcdProcess::start().await;
    let ns = "modeswitch";
    // A says off explicitly (as a Deployment before the migration might),
    // B says nothing: both serve without keys while the mode is unset, and
    // both follow it once it is on.
    let a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &["--auth", "off"]);
    a.wait_serving(READY).await;
    let b = ServerProcess::joining(&etcd.endpoint(), ns, &[]);
    b.wait_serving(READY).await;
    assert_eq!(keyless_next_id(&a).await.unwrap(), 1);
    assert_eq!(keyless_next_id(&b).await.unwrap(), 1);
    assert_eq!(stored_mode(&etcd).await, None);

    // Enabling with no admin key in etcd would lock everyone out.
    assert_refused(
        &ctl(&b.url(), None, &["auth", "enable"]),
        "snowkeepctl: FAILED_PRECONDITION: etcd holds no usable admin key (admin permission, every namespace, not revoked or expired), so with API keys on nobody could administer the cluster: create one first (snowkeepctl key create --permission admin, or a server's --bootstrap-admin-key-file), then enable",
    );
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("admin.key");
    let key_file = key_file.to_str().unwrap().to_owned();
    printed(&ctl(
        &a.url(),
        None,
        &[
            "key",
            "create",
            "--description",
            "first admin",
            "--permission",
            "admin",
            "--secret-file",
            &key_file,
        ],
    ));
    // B's cache learns the key through its watch.
    let enabled = eventually("B to see the admin key", Duration::from_secs(10), || {
        let out = ctl(&b.url(), None, &["auth", "enable"]);
        async move { out.status.success() }
    })
    .await;
    assert_eq!(stored_mode(&etcd).await.as_deref(), Some("on"));
    for s in [&a, &b] {
        let took = eventually(
            "a keyless NextIds to be refused",
            Duration::from_secs(5),
            || async {
                keyless_next_id(s)
                    .await
                    .is_err_and(|e| e.code() == Code::Unauthenticated && e.message() == NO_KEY)
            },
        )
        .await;
        eprintln!("enforcing {took:?} after the enable (enable itself took {enabled:?})");
    }
    // Again: nothing to change.
    assert_eq!(
        printed(&ctl(&a.url(), Some(&key_file), &["auth", "enable"])),
        json!({"enabled": true, "changed": false})
    );

    let mut off = ServerProcess::joining(&etcd.endpoint(), ns, &["--auth", "off"]);
    off.assert_exits(
        Duration::from_secs(15),
        64,
        "--auth off, but the cluster's security mode in etcd (/snowkeep/v1/auth-mode) is on: every server requires API keys. Remove --auth off (env SNOWKEEP_AUTH) so this server follows the cluster; only an admin key can turn keys off, with `snowkeepctl --api-key-file ADMIN_KEY auth disable`",
    )
    .await;

    assert_refused(
        &ctl(&b.url(), None, &["auth", "disable"]),
        &format!("snowkeepctl: UNAUTHENTICATED: {NO_KEY}"),
    );
    assert_eq!(stored_mode(&etcd).await.as_deref(), Some("on"));
    assert_eq!(
        printed(&ctl(&b.url(), Some(&key_file), &["auth", "disable"])),
        json!({"enabled": false, "changed": true})
    );
    assert_eq!(stored_mode(&etcd).await.as_deref(), Some("off"));
    for s in [&a, &b] {
        eventually(
            "a keyless NextIds to be served",
            Duration::from_secs(5),
            || async { keyless_next_id(s).await.is_ok_and(|n| n == 1) },
        )
        .await;
    }
    let mut on = ServerProcess::joining(&etcd.endpoint(), ns, &["--auth", "on"]);
    on.assert_exits(
        Duration::from_secs(15),
        64,
        "--auth on, but the cluster's security mode in etcd (/snowkeep/v1/auth-mode) is off: an administrator turned API keys off for every server. Remove --auth (env SNOWKEEP_AUTH) so this server follows the cluster, or turn keys on for every server with `snowkeepctl auth enable`",
    )
    .await;
}

/// The status of a call admitted without a key that is still open when the
/// cluster turns keys on.
const MODE_TURNED_ON: &str = "the cluster turned API keys on (its security mode is now on) after this call was admitted without a key; call again with `authorization: Bearer <id>.<secret>` metadata (snowkeepctl --api-key-file)";

/// Waits at most 10 s for `stream` to end; its ending status.
async fn end_of<T>(what: &str, stream: &mut tonic::Streaming<T>) -> tonic::Status {
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await;
    end.unwrap_or_else(|_| panic!("{what} still runs 10 s after auth enable"))
        .unwrap_or_else(|| panic!("{what} ended cleanly, without a status"))
}

/// Streams opened without a key while the mode is off (an unbounded
/// StreamIds, a TailAudit) end UNAUTHENTICATED once `auth enable` turns it
/// on, like new keyless calls. Before, they kept running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_streams_opened_while_off_end_when_auth_is_enabled() {
    let etcd = EtcdProcess::start().await;
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "modeend", &[]);
    a.wait_serving(READY).await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("admin.key");
    let key_file = key_file.to_str().unwrap().to_owned();
    let create = [
        "key",
        "create",
        "--description",
        "admin",
        "--permission",
        "admin",
        "--secret-file",
    ];
    printed(&ctl(
        &a.url(),
        None,
        &[&create[..], &[key_file.as_str()]].concat(),
    ));

    let mut stream = ids(&a, None)
        .await
        .stream_ids(pb::StreamIdsRequest {
            total: 0,
            batch_size: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().ids.len(), 10);
    let mut tail = admin(&a, None)
        .await
        .tail_audit(pb::TailAuditRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        printed(&ctl(&a.url(), None, &["auth", "enable"])),
        json!({"enabled": true, "changed": true})
    );
    let (stream_end, tail_end) = (
        end_of("the keyless StreamIds", &mut stream).await,
        end_of("the keyless TailAudit", &mut tail).await,
    );
    for end in [stream_end, tail_end] {
        assert_eq!(
            (end.code(), end.message()),
            (Code::Unauthenticated, MODE_TURNED_ON)
        );
    }
    let status = keyless_next_id(&a).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unauthenticated, NO_KEY)
    );
}

/// Before a server has read the mode (its etcd does not answer), it serves
/// nothing that may need a key: a keyless TailAudit gets UNAVAILABLE, a
/// keyless GetInfo only the version and clock. Before, the TailAudit was
/// served without a key check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_served_keyless_before_the_mode_is_read() {
    let etcd = EtcdProcess::start().await;
    etcd.pause();
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "modeunknown", &[]);
    eventually("the server to listen", Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(a.url().trim_start_matches("http://"))
            .await
            .is_ok()
    })
    .await;
    let tail = admin(&a, None)
        .await
        .tail_audit(pb::TailAuditRequest {})
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        (tail.code(), tail.message()),
        (
            Code::Unavailable,
            "this server has not read the cluster's security mode from etcd yet, so it cannot tell whether this call needs an API key; retry shortly or on another server"
        )
    );
    let info = pb::info_service_client::InfoServiceClient::new(a.channel().await)
        .get_info(pb::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            info.namespace.as_str(),
            info.instance_id.as_str(),
            info.held.len()
        ),
        ("", "", 0)
    );
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    etcd.resume();
    a.wait_serving(READY).await;
    admin(&a, None)
        .await
        .tail_audit(pb::TailAuditRequest {})
        .await
        .expect("served once the mode (off) is read");
}

/// `--auth on` on an etcd whose mode was never set applies `auth enable`'s
/// rule: with no usable admin key it exits 64 and leaves the mode unset
/// (before, it wrote `on` and locked the cluster); with a bootstrap admin
/// key it writes the key, then `on`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_on_at_start_needs_a_usable_admin_key() {
    let etcd = EtcdProcess::start().await;
    let mut locked = ServerProcess::on_etcd(&etcd.endpoint(), "modefirst", &["--auth", "on"]);
    locked
        .assert_exits(
            Duration::from_secs(15),
            64,
            "--auth on would turn API keys on for the whole cluster (its security mode in etcd was never set), but etcd holds no usable admin key (admin permission, every namespace, not revoked or expired), so nobody could administer it. Give this server --bootstrap-admin-key-file FILE (make FILE with `snowkeepctl key generate`), or create an admin key first with `snowkeepctl key create --permission admin` while keys are off",
        )
        .await;
    assert_eq!(stored_mode(&etcd).await, None);

    let dir = tempfile::tempdir().unwrap();
    let admin_key = random_key("kbootstrap03");
    let file = dir.path().join("admin.key");
    std::fs::write(&file, format!("{admin_key}\n")).unwrap();
    let a = ServerProcess::on_etcd(
        &etcd.endpoint(),
        "modefirst",
        &[
            "--auth",
            "on",
            "--bootstrap-admin-key-file",
            file.to_str().unwrap(),
        ],
    );
    a.wait_serving(READY).await;
    assert_eq!(stored_mode(&etcd).await.as_deref(), Some("on"));
    let keys = eventually("the admin key to work", Duration::from_secs(10), || async {
        admin(&a, Some(&admin_key))
            .await
            .list_keys(pb::ListKeysRequest {})
            .await
            .is_ok()
    })
    .await;
    eprintln!("admin key usable {keys:?} after serving");
}
