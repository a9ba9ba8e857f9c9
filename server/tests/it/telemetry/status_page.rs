//! The status page (`--admin-listen`), opened in Debian's headless chromium
//! and checked on the rendered DOM: both servers' machine ids with their
//! holders, a Lease API requester from Acquire to Release, an evicted holder
//! leaving, and the admin key it needs with `--auth on`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use snowkeep_client::{Clock, SystemClock};
use snowkeep_proto::v1 as pb;

use snowkeep_test_support::auth::{admin, bearer, lease, random_key};
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::lease::{acquire, ids_of, release, requester};
use snowkeep_test_support::server::ServerProcess;
use snowkeep_test_support::{eventually, free_port, READY};

const CHROMIUM: &str = "/usr/bin/chromium";
/// How long one page change may take to show: the page reads etcd on each
/// request, so this is chromium's start and one render, on a loaded machine.
const SHOWS: Duration = Duration::from_secs(15);

/// Runs headless chromium on `url` with `extra` arguments; its stdout. The
/// gRPC-Web page test (`http::browser`) runs chromium with it too.
pub(crate) async fn chromium(url: String, extra: Vec<String>) -> String {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} not found: install Debian's chromium package (scripts/ensure-deps --etcd does)"
    );
    tokio::task::spawn_blocking(move || {
        let profile = tempfile::tempdir().unwrap();
        let out = Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg(url)
            .output()
            .expect("run chromium");
        assert!(out.status.success(), "chromium failed: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    })
    .await
    .unwrap()
}

/// The page at `port` as chromium renders it, signed in with `key` (HTTP
/// Basic credentials in the URL, which chromium answers the 401 with).
async fn dom(port: u16, key: Option<&str>) -> String {
    let url = match key {
        Some(k) => format!("http://admin:{k}@127.0.0.1:{port}/"),
        None => format!("http://127.0.0.1:{port}/"),
    };
    chromium(url, vec!["--dump-dom".to_owned()]).await
}

/// Waits until the page at `port` satisfies `cond`; returns that DOM.
async fn page_until(port: u16, key: &str, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let last = std::sync::Mutex::new(String::new());
    eventually(what, SHOWS, || async {
        let page = dom(port, Some(key)).await;
        let ok = cond(&page);
        *last.lock().unwrap() = page;
        ok
    })
    .await;
    last.into_inner().unwrap()
}

/// A GET of the page with `authorization`: status, body.
async fn get(port: u16, authorization: Option<String>) -> (u16, String, Option<String>) {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent.get(format!("http://127.0.0.1:{port}/"));
        if let Some(a) = authorization {
            request = request.header("authorization", a);
        }
        let mut r = request.call().unwrap();
        let challenge = r
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        (
            r.status().as_u16(),
            r.body_mut().read_to_string().unwrap(),
            challenge,
        )
    })
    .await
    .unwrap()
}

/// GetInfo of `server` with `key` (without one, --auth on answers the
/// version and clock only).
async fn info(server: &ServerProcess, key: &str) -> pb::GetInfoResponse {
    pb::info_service_client::InfoServiceClient::with_interceptor(
        server.channel().await,
        bearer(Some(key)),
    )
    .get_info(pb::GetInfoRequest {})
    .await
    .unwrap()
    .into_inner()
}

fn holds(page: &str, machine_id: u32, holder: &str) -> bool {
    page.contains(&format!(
        r#"data-machine-id="{machine_id}" data-holder="{holder}""#
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_holders_requesters_and_evictions_behind_the_admin_key() {
    let ns = "page";
    let etcd = EtcdProcess::start().await;
    let dir = tempfile::tempdir().unwrap();
    let admin_key = random_key("kpageadmin01");
    let key_file = dir.path().join("admin.key");
    std::fs::write(&key_file, format!("{admin_key}\n")).unwrap();
    let key_file = key_file.to_str().unwrap().to_owned();
    let (page_a, page_b) = (free_port(), free_port());
    let flags = |port: u16| {
        vec![
            "--auth".to_owned(),
            "on".to_owned(),
            "--bootstrap-admin-key-file".to_owned(),
            key_file.clone(),
            "--admin-listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--peer-skew-interval".to_owned(),
            "1s".to_owned(),
        ]
    };
    let (flags_a, flags_b) = (flags(page_a), flags(page_b));
    let a = ServerProcess::on_etcd(
        &etcd.endpoint(),
        ns,
        &flags_a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    a.wait_serving(READY).await;
    let b = ServerProcess::joining(
        &etcd.endpoint(),
        ns,
        &flags_b.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    b.wait_serving(READY).await;
    for s in [&a, &b] {
        eventually("the admin key to work", READY, || async {
            admin(s, Some(&admin_key))
                .await
                .list_keys(pb::ListKeysRequest {})
                .await
                .is_ok()
        })
        .await;
    }

    // Without the admin key: 401, saying why, with a Basic challenge so a
    // browser asks for it.
    let (status, body, challenge) = get(page_a, None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body, "no API key: the status page needs an API key with the admin permission (the cluster's security mode is on): sign in with any user name and the key as password, or send `Authorization: Bearer <id>.<secret>`\n");
    assert_eq!(
        challenge.as_deref(),
        Some("Basic realm=\"snowkeep status page: any user name, the admin API key as password\", charset=\"UTF-8\"")
    );
    let unknown = random_key("knobody01");
    let (status, body, _) = get(page_a, Some(format!("Bearer {unknown}"))).await;
    assert_eq!(status, 401);
    assert!(
        body.starts_with("unknown API key id \"knobody01\""),
        "{body}"
    );
    // A key without the admin permission: 403.
    let lease_key = admin(&a, Some(&admin_key))
        .await
        .create_key(pb::CreateKeyRequest {
            description: "status page test".into(),
            expires_unix_ms: 0,
            namespaces: vec![],
            permissions: vec![pb::Permission::Lease as i32],
            max_lease_machine_ids: 4,
        })
        .await
        .unwrap()
        .into_inner();
    let lease_key_id = lease_key.key.unwrap().id;
    let lease_key = lease_key.secret;
    eventually("the lease key to reach server b", READY, || async {
        get(page_b, Some(format!("Bearer {lease_key}"))).await.0 == 403
    })
    .await;
    let (status, body, _) = get(page_a, Some(format!("Bearer {lease_key}"))).await;
    assert_eq!(status, 403);
    assert!(
        body.starts_with(&format!(
            "API key {lease_key_id} lacks the admin permission"
        )),
        "{body}"
    );
    // An admin key limited to namespaces (written straight into etcd: CreateKey
    // refuses it) is refused as AdminService refuses it.
    let scoped_secret = "s".repeat(64);
    let hash: String = {
        use sha2::{Digest, Sha256};
        Sha256::digest(scoped_secret.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let record = serde_json::json!({
        "id": "kscopedpage",
        "namespaces": ["page"],
        "permissions": ["admin"],
        "secret_sha256": hash,
    });
    etcd.client()
        .await
        .put("/snowkeep/v1/apikeys/kscopedpage", record.to_string(), None)
        .await
        .unwrap();
    let scoped = format!("Bearer kscopedpage.{scoped_secret}");
    eventually("the scoped admin key to reach server a", READY, || async {
        get(page_a, Some(scoped.clone())).await.0 == 403
    })
    .await;
    let (_, body, _) = get(page_a, Some(scoped.clone())).await;
    assert_eq!(
        body,
        "API key kscopedpage is limited to namespaces [\"page\"], but administration acts on the whole cluster: use an admin key without namespaces\n"
    );
    let (status, body, _) = get(page_a, Some(format!("Bearer {admin_key}"))).await;
    assert_eq!(status, 200);
    assert!(body.contains("<h1>snowkeep status</h1>"), "{body}");
    // The browser without credentials is refused too (headless chromium
    // cannot answer the challenge and renders nothing of the page).
    let refused = dom(page_a, None).await;
    assert!(!refused.contains("snowkeep status</h1>"), "{refused}");
    assert!(!refused.contains("data-machine-id"), "{refused}");

    // Both servers' machine ids with their holders, on both servers' pages.
    let (info_a, info_b) = (info(&a, &admin_key).await, info(&b, &admin_key).await);
    let (id_a, id_b) = (info_a.held[0].machine_id, info_b.held[0].machine_id);
    for port in [page_a, page_b] {
        let page = page_until(port, &admin_key, "both holders on the page", |p| {
            holds(p, id_a, &info_a.instance_id) && holds(p, id_b, &info_b.instance_id)
        })
        .await;
        assert!(
            page.contains(r#"<td id="ready"><span class="ok">yes</span>"#),
            "{page}"
        );
        assert!(page.contains(r#"data-namespace="page""#), "{page}");
        assert!(page.contains("2 of 4096 held"), "{page}");
        // The layout's lifetime (the default layout's, from GetInfo's end),
        // in years of 365 days as snowkeepctl shows them, rendered within
        // the last minute.
        let end = info_a.layout_end_unix_ms;
        assert_eq!(end, snowkeep_client::Layout::default().end_unix_ms());
        let now = SystemClock.unix_ms();
        let shown = |now: u64| {
            let t = (end - now) / (365 * 86_400_000 / 10);
            format!(
                r#"<td class="lifetime" title="years of 365 days until no id of this layout can be issued">{}.{} years left: the timestamp field runs out at 2095-09-07T15:47:35Z</td>"#,
                t / 10,
                t % 10
            )
        };
        assert!(
            page.contains(&shown(now)) || page.contains(&shown(now - 60_000)),
            "no {} in {page}",
            shown(now)
        );
        // Each holder's fence in words (three rows: this server's own
        // table and the namespace's two holders), ahead of the clock or, for
        // an idle holder, passed: never a signed number of ms.
        let fences: Vec<&str> = page
            .split(r#"<td class="num fence">"#)
            .skip(1)
            .map(|cell| cell.split("</td>").next().unwrap())
            .collect();
        assert_eq!(fences.len(), 3, "{page}");
        for fence in fences {
            assert!(
                fence.ends_with(" s ahead")
                    || fence.ends_with(" s ago: idle, raised by the next call"),
                "{fence}"
            );
        }
        // Each holder's last renewal, as seconds ago.
        assert!(
            page.contains(r#"<td class="num last-renewal">"#) && page.contains(" s ago</td>"),
            "{page}"
        );
    }
    // Server a's peer is b, with a clock offset.
    page_until(page_a, &admin_key, "server b as a's peer", |p| {
        p.contains(&format!(
            r#"class="peer" data-instance="{}""#,
            info_b.instance_id
        ))
    })
    .await;

    // A Lease API requester appears after Acquire and leaves after Release.
    let who = requester(1_700_000_000_000);
    let mut api = lease(&a, Some(&lease_key)).await;
    let grant = api
        .acquire(acquire(ns, &who, 1, None))
        .await
        .unwrap()
        .into_inner();
    let held = ids_of(&grant)[0];
    let page = page_until(page_a, &admin_key, "the requester on the page", |p| {
        p.contains(r#"class="requester" data-host="test-host" data-pid="4242""#)
            && p.contains(&format!(
                r#"data-machine-id="{held}" data-holder="requester:"#
            ))
    })
    .await;
    // Never a nonce or a lease token.
    assert!(!page.contains(&who.nonce), "the nonce is shown");
    assert!(
        !page.contains(&grant.lease_token),
        "the lease token is shown"
    );
    assert!(page.contains(r#"data-action="lease.acquire""#), "{page}");
    api.release(release(ns, &who, &grant.lease_token, &[]))
        .await
        .unwrap();
    page_until(page_a, &admin_key, "the requester to leave the page", |p| {
        !p.contains(r#"data-host="test-host""#)
            && !p.contains(&format!(
                r#"data-machine-id="{held}" data-holder="requester:"#
            ))
    })
    .await;

    // An evicted holder leaves the page within seconds.
    let second = requester(1_700_000_000_001);
    let grant = api
        .acquire(acquire(ns, &second, 1, None))
        .await
        .unwrap()
        .into_inner();
    let victim = ids_of(&grant)[0];
    page_until(
        page_b,
        &admin_key,
        "the second requester on b's page",
        |p| {
            p.contains(r#"data-host="test-host""#)
                && p.contains(&format!(
                    r#"data-machine-id="{victim}" data-holder="requester:"#
                ))
        },
    )
    .await;
    // Server a answered the Acquires: its page has audit events to show.
    screenshot(page_a, &admin_key).await;
    let evicted = admin(&a, Some(&admin_key))
        .await
        .evict(pb::EvictRequest {
            namespace: ns.into(),
            machine_id: victim,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(evicted.holder.starts_with("requester:"), "{evicted:?}");
    let holder_attr = format!(r#"data-holder="{}""#, evicted.holder);
    let start = tokio::time::Instant::now();
    page_until(page_b, &admin_key, "the evicted holder to leave", |p| {
        !p.contains(&holder_attr) && !p.contains(r#"data-host="test-host""#)
    })
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let page = dom(page_a, Some(&admin_key)).await;
    assert!(page.contains(r#"data-action="admin.evict""#), "{page}");
    assert!(holds(&page, id_a, &info_a.instance_id), "{page}");

    // The key never reaches a log.
    for s in [&a, &b] {
        let log = s.log();
        let secret = admin_key.split_once('.').unwrap().1;
        assert!(!log.contains(secret), "the admin key's secret is logged");
    }
}

/// Takes a screenshot of the page at `port`; checks it is a PNG and, when
/// `SNOWKEEP_STATUS_SCREENSHOT` names a file, copies it there (how
/// docs/status-page.png is made).
async fn screenshot(port: u16, key: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("status.png");
    chromium(
        format!("http://admin:{key}@127.0.0.1:{port}/"),
        vec![
            format!("--screenshot={}", file.display()),
            "--window-size=1400,1000".to_owned(),
            "--hide-scrollbars".to_owned(),
        ],
    )
    .await;
    let png = std::fs::read(&file).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    if let Ok(to) = std::env::var("SNOWKEEP_STATUS_SCREENSHOT") {
        std::fs::write(to, png).unwrap();
    }
}
