//! `EtcdProcess`: a real etcd cluster (`$ETCD_BIN` or `/usr/bin/etcd`) of one
//! or more members on free loopback ports, each with a temp data dir. Fails
//! loudly when the binary is missing; never uses an etcd that is already
//! running. Members are killed on drop.
//!
//! [`EtcdProcess::start_secured`] starts a member as a secured production
//! cluster runs: TLS on the client URL (certificates from [`TestPki`]),
//! client certificates required (`--client-cert-auth`), and etcd's auth
//! enabled with a `root` user and a `snowkeep` user whose role may read and
//! write only the `/snowkeep/` prefix. [`EtcdProcess::server_args`] gives the
//! server flags that reach it.
//!
//! The faults it plays (pausing and killing members, wiping their data,
//! the runbook's snapshot and restore) are in `faults`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

mod faults;

use super::pki::TestPki;
use super::{eventually, free_port};

/// The password of the secured cluster's `root` user.
pub const ROOT_PASSWORD: &str = "root-test-password";
/// The password of the secured cluster's `snowkeep` user.
pub const SNOWKEEP_PASSWORD: &str = "snowkeep-test-password";
/// The key prefix the `snowkeep` user's role may read and write.
pub const SNOWKEEP_PREFIX: &str = "/snowkeep/";

/// What secures a cluster started with [`EtcdProcess::start_secured_with`].
pub struct Security {
    /// The certificates (etcd's, the clients', the CAs).
    pub pki: TestPki,
    /// etcd's `--auth-token-ttl` (seconds); etcd's default (300) when `None`.
    pub auth_token_ttl: Option<u32>,
    /// True once `auth enable` ran: clients then log in as `root`.
    auth_enabled: bool,
    /// The plain-HTTP `--listen-metrics-urls` port of the (one) member.
    metrics_port: u16,
}

/// Options of a secured cluster.
#[derive(Debug, Clone, Copy, Default)]
pub struct SecureOptions {
    /// etcd's `--auth-token-ttl` in seconds (simple tokens expire this long
    /// after their last use); etcd's default 300 when `None`.
    pub auth_token_ttl: Option<u32>,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: TempDir,
    /// The data dir: `dir/data`, or a new one after a wipe or a restore.
    data: PathBuf,
    child: Option<Child>,
    /// False after the first launch: a restart joins the existing cluster.
    fresh: bool,
    /// `https` on a secured cluster, else `http`.
    scheme: &'static str,
}

impl Member {
    fn client_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.client_port)
    }
    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// The `--initial-cluster-token` of every test cluster.
const CLUSTER_TOKEN: &str = "snowkeep-test";

/// A running etcd cluster.
pub struct EtcdProcess {
    members: Vec<Member>,
    security: Option<Security>,
}

/// A new directory for one member's data and log: in tmpfs (`/dev/shm`)
/// when the machine has one, else in the temp dir. etcd fsyncs every write,
/// and on a disk shared by a dozen tests' etcd processes a request can queue
/// behind the others' fsyncs past the servers' 500 ms request timeout (a run
/// failed a call the test expected to succeed that way). On tmpfs an fsync
/// costs microseconds. Killing etcd (as the fault
/// tests do) loses nothing either way: written data is in the page cache.
fn member_dir() -> TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("snowkeep-etcd-")
            .tempdir_in(shm)
        {
            return dir;
        }
    }
    tempfile::tempdir().expect("temp dir")
}

fn etcd_bin() -> PathBuf {
    let bin = std::env::var_os("ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
    assert!(
        bin.exists(),
        "etcd binary not found at {} (install Debian's etcd-server or set ETCD_BIN)",
        bin.display()
    );
    bin
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} of etcd failed");
}

impl EtcdProcess {
    /// Starts a fresh single-member etcd and waits until it is healthy.
    pub async fn start() -> Self {
        Self::cluster(1).await
    }

    /// Starts a fresh cluster of `n` members and waits until all are healthy.
    pub async fn cluster(n: usize) -> Self {
        Self::start_members(n, None).await
    }

    /// Starts one secured member (see the module docs) with etcd's default
    /// token TTL and waits until it is healthy with auth enabled.
    pub async fn start_secured() -> Self {
        Self::start_secured_with(SecureOptions::default()).await
    }

    /// [`EtcdProcess::start_secured`] with `options`.
    pub async fn start_secured_with(options: SecureOptions) -> Self {
        let security = Security {
            pki: TestPki::new(),
            auth_token_ttl: options.auth_token_ttl,
            auth_enabled: false,
            metrics_port: free_port(),
        };
        std::fs::write(
            security.pki.dir().join("snowkeep.password"),
            format!("{SNOWKEEP_PASSWORD}\n"),
        )
        .expect("write password file");
        let mut etcd = Self::start_members(1, Some(security)).await;
        etcd.enable_auth().await;
        etcd
    }

    /// Adds the `root` user (role root) and the `snowkeep` user, whose role
    /// `snowkeep` may read and write only [`SNOWKEEP_PREFIX`], then enables
    /// etcd's authentication.
    async fn enable_auth(&mut self) {
        use snowkeep_etcd::etcd_client::Permission;
        let mut c = self.client().await;
        c.user_add("root", ROOT_PASSWORD, None)
            .await
            .expect("add root");
        c.user_grant_role("root", "root").await.expect("grant root");
        c.role_add("snowkeep").await.expect("add role");
        c.role_grant_permission(
            "snowkeep",
            Permission::read_write(SNOWKEEP_PREFIX).with_prefix(),
        )
        .await
        .expect("grant /snowkeep/");
        c.user_add("snowkeep", SNOWKEEP_PASSWORD, None)
            .await
            .expect("add snowkeep");
        c.user_grant_role("snowkeep", "snowkeep")
            .await
            .expect("grant snowkeep");
        c.auth_enable().await.expect("auth enable");
        self.security
            .as_mut()
            .expect("a secured cluster")
            .auth_enabled = true;
    }

    /// Adds the user `user` (password [`SNOWKEEP_PASSWORD`]) on a secured
    /// cluster with a role of its own (named like it) holding only
    /// `permission`, as `etcdctl role add`, `role grant-permission` and
    /// `user grant-role` would.
    pub async fn add_user(&self, user: &str, permission: snowkeep_etcd::etcd_client::Permission) {
        let mut c = self.client().await;
        c.role_add(user).await.expect("add role");
        c.role_grant_permission(user, permission)
            .await
            .expect("grant permission");
        c.user_add(user, SNOWKEEP_PASSWORD, None)
            .await
            .expect("add user");
        c.user_grant_role(user, user).await.expect("grant role");
    }

    /// How many logins (successful `Authenticate` calls) the secured
    /// member has answered, from its Prometheus metrics.
    pub async fn authentications(&self) -> u64 {
        let port = self
            .security
            .as_ref()
            .expect("a secured cluster")
            .metrics_port;
        let text = metrics_text(format!("http://127.0.0.1:{port}/metrics")).await;
        text.lines()
            .filter(|l| {
                l.starts_with("grpc_server_handled_total{")
                    && l.contains("grpc_code=\"OK\"")
                    && l.contains("grpc_method=\"Authenticate\"")
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// The certificates of a secured cluster; panics on a plain one.
    pub fn pki(&self) -> &TestPki {
        &self.security.as_ref().expect("a secured cluster").pki
    }

    /// The file holding the `snowkeep` user's password (with a trailing
    /// newline, as `echo` writes it).
    pub fn password_file(&self) -> std::path::PathBuf {
        self.pki().dir().join("snowkeep.password")
    }

    /// The server flags that reach a secured cluster as the `snowkeep`
    /// user: `--etcd-endpoints` (https), `--etcd-ca-file`, the client
    /// certificate (`--etcd-cert-file`, `--etcd-key-file`), `--etcd-user`
    /// and `--etcd-password-file`.
    pub fn server_args(&self) -> Vec<String> {
        let pki = self.pki();
        let client = pki.client();
        let path = |p: std::path::PathBuf| p.to_str().expect("UTF-8 path").to_owned();
        vec![
            "--etcd-endpoints".into(),
            self.endpoints(),
            "--etcd-ca-file".into(),
            path(pki.ca_file()),
            "--etcd-cert-file".into(),
            path(client.cert),
            "--etcd-key-file".into(),
            path(client.key),
            "--etcd-user".into(),
            "snowkeep".into(),
            "--etcd-password-file".into(),
            path(self.password_file()),
        ]
    }

    /// Connect options of the test's own clients: TLS with the root client
    /// certificate on a secured cluster, and the `root` user once auth is
    /// enabled.
    fn admin_options(&self) -> Option<snowkeep_etcd::etcd_client::ConnectOptions> {
        let security = self.security.as_ref()?;
        let read = |p: std::path::PathBuf| std::fs::read(p).expect("read PEM");
        let root = security.pki.root_client();
        let tls = snowkeep_etcd::etcd_client::TlsOptions::new()
            .ca_certificate(snowkeep_etcd::etcd_client::Certificate::from_pem(read(
                security.pki.ca_file(),
            )))
            .identity(snowkeep_etcd::etcd_client::Identity::from_pem(
                read(root.cert),
                read(root.key),
            ));
        let options = snowkeep_etcd::etcd_client::ConnectOptions::new().with_tls(tls);
        Some(match security.auth_enabled {
            true => options
                .with_user("root", ROOT_PASSWORD)
                .with_auto_token_refresh(true),
            false => options,
        })
    }

    async fn start_members(n: usize, security: Option<Security>) -> Self {
        let scheme = if security.is_some() { "https" } else { "http" };
        let mut etcd = Self {
            security,
            members: (0..n)
                .map(|i| {
                    let dir = member_dir();
                    Member {
                        name: format!("m{i}"),
                        client_port: free_port(),
                        peer_port: free_port(),
                        data: dir.path().join("data"),
                        dir,
                        child: None,
                        fresh: true,
                        scheme,
                    }
                })
                .collect(),
        };
        for i in 0..n {
            etcd.launch(i);
        }
        for i in 0..n {
            etcd.wait_healthy(i).await;
        }
        etcd
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn launch(&mut self, i: usize) {
        let initial_cluster = self.initial_cluster();
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.dir.path().join("etcd.log"))
            .expect("etcd log");
        let (client, peer) = (m.client_url(), m.peer_url());
        let mut command = Command::new(etcd_bin());
        if let Some(security) = &self.security {
            let server = security.pki.server();
            command
                .arg("--cert-file")
                .arg(&server.cert)
                .arg("--key-file")
                .arg(&server.key)
                .arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(security.pki.ca_file())
                // Tests log in often; the default cost 10 takes ~50 ms each.
                .args(["--bcrypt-cost", "4"]);
            command.args([
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{}", security.metrics_port),
            ]);
            if let Some(ttl) = security.auth_token_ttl {
                command.args(["--auth-token-ttl", &ttl.to_string()]);
            }
        }
        let child = command
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-token", CLUSTER_TOKEN])
            .args([
                "--initial-cluster-state",
                if m.fresh { "new" } else { "existing" },
            ])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        m.child = Some(child);
        m.fresh = false;
    }

    async fn wait_healthy(&self, i: usize) {
        let url = self.members[i].client_url();
        let options = self.admin_options();
        eventually(
            "etcd member to become healthy",
            Duration::from_secs(30),
            || {
                let (url, options) = (url.clone(), options.clone());
                async move { status(&url, options).await.is_some() }
            },
        )
        .await;
    }

    /// The first member's client URL.
    pub fn endpoint(&self) -> String {
        self.members[0].client_url()
    }

    /// All client URLs, comma-separated (the `--etcd-endpoints` form).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(Member::client_url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Each member's client address, `127.0.0.1:PORT`, in member order.
    pub fn member_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.members
            .iter()
            .map(|m| std::net::SocketAddr::from(([127, 0, 0, 1], m.client_port)))
            .collect()
    }

    /// The index of the member that leads the cluster now; `None` while no
    /// running member names a leader among the members that answer.
    pub async fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for m in &self.members {
            let status = match m.child {
                Some(_) => status(&m.client_url(), self.admin_options()).await,
                None => None,
            };
            ids.push(
                status
                    .as_ref()
                    .and_then(|s| s.header())
                    .map(|h| h.member_id()),
            );
            leader = leader.or(status.map(|s| s.leader()).filter(|&l| l != 0));
        }
        let leader = leader?;
        ids.iter().position(|&id| id == Some(leader))
    }

    /// A client for assertions on etcd state (all members).
    pub async fn client(&self) -> snowkeep_etcd::etcd_client::Client {
        let urls: Vec<String> = self.members.iter().map(Member::client_url).collect();
        snowkeep_etcd::etcd_client::Client::connect(urls, self.admin_options())
            .await
            .expect("connect etcd client")
    }

    /// Member `i`'s client URL, `http://127.0.0.1:PORT`.
    pub fn member_url(&self, i: usize) -> String {
        self.members[i].client_url()
    }

    /// Moves the leadership off member `avoid` when it leads, so stopping
    /// `avoid` later costs no election. Panics when the cluster has no leader
    /// within 10 s or the move does not happen within 10 s.
    pub async fn move_leader_off(&self, avoid: usize) {
        let leader = self.wait_leader().await;
        if leader != avoid {
            return;
        }
        let target = (0..self.members.len())
            .find(|&j| j != avoid && self.members[j].child.is_some())
            .expect("another running member");
        let target_id = status(&self.member_url(target), self.admin_options())
            .await
            .and_then(|s| s.header().map(|h| h.member_id()))
            .expect("member id of the new leader");
        let mut client = snowkeep_etcd::etcd_client::Client::connect(
            [self.member_url(avoid)],
            self.admin_options(),
        )
        .await
        .expect("connect to the leader");
        client.move_leader(target_id).await.expect("move leader");
        eventually(
            "the leadership to move",
            Duration::from_secs(10),
            || async { self.leader().await.is_some_and(|l| l != avoid) },
        )
        .await;
    }

    /// Waits (up to 10 s) until the cluster names a leader; returns its index.
    pub async fn wait_leader(&self) -> usize {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(leader) = self.leader().await {
                return leader;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no etcd leader within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The first member's mvcc revision and raft applied index.
    pub async fn progress(&self) -> (i64, u64) {
        let s = status(&self.members[0].client_url(), self.admin_options())
            .await
            .expect("etcd answers Status");
        (
            s.header().map(|h| h.revision()).unwrap_or(0),
            s.raft_applied_index(),
        )
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The member's answer to a Status request, `None` when it gives none in 500 ms.
async fn status(
    url: &str,
    options: Option<snowkeep_etcd::etcd_client::ConnectOptions>,
) -> Option<snowkeep_etcd::etcd_client::StatusResponse> {
    let mut client = tokio::time::timeout(
        Duration::from_millis(500),
        snowkeep_etcd::etcd_client::Client::connect([url], options),
    )
    .await
    .ok()?
    .ok()?;
    tokio::time::timeout(Duration::from_millis(500), client.status())
        .await
        .ok()?
        .ok()
}

/// The Prometheus text an etcd member serves at `url` (its `/metrics`).
pub async fn metrics_text(url: String) -> String {
    tokio::task::spawn_blocking(move || {
        ureq::get(&url)
            .call()
            .expect("etcd metrics")
            .body_mut()
            .read_to_string()
            .expect("metrics text")
    })
    .await
    .expect("metrics task")
}
