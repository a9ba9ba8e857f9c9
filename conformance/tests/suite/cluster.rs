//! The cluster a scenario runs against: one real etcd and real
//! snowkeep-server processes on one namespace, with auth and TLS as the
//! scenario asks, and what the scenario's placeholders stand for.

use std::time::Duration;

use serde_json::{json, Value};
use snowkeep_client::Layout;
use snowkeep_proto::v1 as pb;
use snowkeep_test_support::auth::{bearer, random_key};
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::eventually;
use snowkeep_test_support::pki::TestPki;
use snowkeep_test_support::server::{try_scrape, ServerProcess};

/// The namespace every scenario's servers share.
pub const NAMESPACE: &str = "conformance";

/// Keys created in an auth cluster.
pub struct Keys {
    /// `ids` permission on [`NAMESPACE`].
    pub ids: String,
    /// The id of `ids` with another secret.
    pub wrong: String,
    /// `ids` permission on another namespace only.
    pub other_namespace: String,
    /// `lease` permission on [`NAMESPACE`], at most one machine id held
    /// at once (the Lease API quota).
    pub lease: String,
}

/// A running cluster.
pub struct Cluster {
    pub _etcd: EtcdProcess,
    pub servers: Vec<ServerProcess>,
    pub tls: Option<(TestPki, bool)>,
    pub keys: Option<Keys>,
    pub layout: Layout,
    _dir: tempfile::TempDir,
}

fn flags_of(spec: &Value, dir: &std::path::Path, pki: Option<&(TestPki, bool)>) -> Vec<String> {
    let mut flags: Vec<String> = Vec::new();
    if let Some(layout) = spec["layout"].as_str() {
        flags.extend(["--layout".into(), layout.into()]);
    }
    if spec["auth"].as_bool().unwrap_or(false) {
        let file = dir.join("admin.key");
        std::fs::write(&file, format!("{}\n", random_key("kbootstrap01"))).unwrap();
        flags.extend(["--auth".into(), "on".into()]);
        flags.extend([
            "--bootstrap-admin-key-file".into(),
            file.display().to_string(),
        ]);
    }
    // Flags a scenario passes through as they are (Lease API durations).
    for flag in spec["server_flags"].as_array().into_iter().flatten() {
        flags.push(flag.as_str().expect("server_flags are strings").to_owned());
    }
    if let Some((pki, mutual)) = pki {
        let server = pki.server();
        flags.extend(["--tls-cert-file".into(), server.cert.display().to_string()]);
        flags.extend(["--tls-key-file".into(), server.key.display().to_string()]);
        if *mutual {
            flags.extend([
                "--tls-client-ca-file".into(),
                pki.ca_file().display().to_string(),
            ]);
        }
    }
    flags
}

impl Cluster {
    /// Starts etcd and `spec.servers` servers (`auth`, `tls`: `off`, `tls`,
    /// `mtls`, `layout`) and waits until every one is ready to issue.
    pub async fn start(spec: &Value) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = match spec["tls"].as_str().unwrap_or("off") {
            "tls" => Some((TestPki::new(), false)),
            "mtls" => Some((TestPki::new(), true)),
            _ => None,
        };
        let flags = flags_of(spec, dir.path(), pki.as_ref());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let etcd = EtcdProcess::start().await;
        let n = spec["servers"].as_u64().unwrap_or(2) as usize;
        let mut servers = vec![ServerProcess::on_etcd(&etcd.endpoint(), NAMESPACE, &flags)];
        wait_ready(&servers[0]).await;
        for _ in 1..n {
            servers.push(ServerProcess::joining(&etcd.endpoint(), NAMESPACE, &flags));
        }
        for s in &servers {
            wait_ready(s).await;
        }
        let layout = match spec["layout"].as_str() {
            Some(text) => text.parse().expect("a layout snowkeep-client reads"),
            None => Layout::default(),
        };
        let mut cluster = Self {
            _etcd: etcd,
            servers,
            tls: pki,
            keys: None,
            layout,
            _dir: dir,
        };
        if spec["auth"].as_bool().unwrap_or(false) {
            cluster.keys = Some(cluster.create_keys().await);
        }
        cluster
    }

    /// The runbook's backup step (`scripts/etcd-snapshot save`) into the
    /// cluster's snapshot file.
    pub fn snapshot_save(&self) {
        self._etcd.snapshot_save(&self.snapshot_file());
    }

    /// The runbook's restore of the snapshot `snapshot_save` took
    /// (`scripts/etcd-snapshot mark`, then `restore` into every member):
    /// etcd loses every write since, and the namespace is marked rolled
    /// back before any server sees it.
    pub async fn restore(&mut self) {
        let file = self.snapshot_file();
        self._etcd.snapshot_mark(&file);
        self._etcd.restore(&file).await;
    }

    fn snapshot_file(&self) -> std::path::PathBuf {
        self._dir.path().join("snapshot.db")
    }

    /// Evicts the holder of each of `machine_ids` (AdminService.Evict, as
    /// `snowkeepctl evict` does); on a cluster without auth.
    pub async fn evict(&self, machine_ids: &[u16]) {
        let channel = self.servers[0].channel().await;
        let mut admin = pb::admin_service_client::AdminServiceClient::new(channel);
        for &m in machine_ids {
            let request = pb::EvictRequest {
                namespace: NAMESPACE.into(),
                machine_id: u32::from(m),
            };
            admin.evict(request).await.expect("evict a held machine id");
        }
    }

    /// The servers' endpoints, `https://` under TLS.
    pub fn endpoints(&self) -> Value {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        json!(self
            .servers
            .iter()
            .map(|s| format!("{scheme}://127.0.0.1:{}", s.port))
            .collect::<Vec<_>>())
    }

    /// The TLS settings of a driver's `open`: the CA, and with `identity`
    /// the client certificate and key.
    pub fn tls_settings(&self, identity: bool) -> Value {
        let (pki, _) = self.tls.as_ref().expect("a TLS cluster");
        let ca = pki.ca_file().display().to_string();
        if !identity {
            return json!({"ca": ca, "cert": null, "key": null});
        }
        let client = pki.client();
        json!({"ca": ca, "cert": client.cert.display().to_string(), "key": client.key.display().to_string()})
    }

    async fn create_keys(&self) -> Keys {
        let admin_key = std::fs::read_to_string(self._dir.path().join("admin.key")).unwrap();
        let admin_key = admin_key.trim().to_owned();
        let channel = self.servers[0].channel().await;
        let admin = pb::admin_service_client::AdminServiceClient::with_interceptor(
            channel,
            bearer(Some(&admin_key)),
        );
        let create = |namespace: &str, permission: pb::Permission| {
            let request = pb::CreateKeyRequest {
                description: "conformance".into(),
                expires_unix_ms: 0,
                namespaces: vec![namespace.to_owned()],
                permissions: vec![permission as i32],
                max_lease_machine_ids: 1,
            };
            let mut admin = admin.clone();
            async move {
                admin
                    .create_key(request)
                    .await
                    .map(|r| r.into_inner().secret)
            }
        };
        // The first server creates its bootstrap admin key at start; retry
        // until it answers (its key cache loaded).
        let start = tokio::time::Instant::now();
        let ids = loop {
            match create(NAMESPACE, pb::Permission::Ids).await {
                Ok(secret) => break secret,
                Err(e) if start.elapsed() < Duration::from_secs(20) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("create a key with the bootstrap admin key: {e}"),
            }
        };
        let other_namespace = create("another-namespace", pb::Permission::Ids)
            .await
            .expect("create a key");
        let lease = create(NAMESPACE, pb::Permission::Lease)
            .await
            .expect("create a key");
        let id = ids.split_once('.').unwrap().0;
        let keys = Keys {
            wrong: random_key(id),
            other_namespace,
            ids,
            lease,
        };
        for s in &self.servers {
            wait_key_known(s, &keys.ids).await;
            wait_key_known(s, &keys.other_namespace).await;
            wait_key_known(s, &keys.lease).await;
        }
        keys
    }

    /// Sum over every server of `snowkeep_grpc_requests_total` for `method`
    /// (every code): calls that reached a server. `Service/Method` counts
    /// one service's method only (`LeaseService/Check`, not health's).
    pub async fn calls(&self, method: &str) -> u64 {
        let needle = match method.split_once('/') {
            Some((service, m)) => {
                format!("service=\"snowkeep.v1.{service}\",method=\"{m}\"")
            }
            None => format!("method=\"{method}\""),
        };
        let mut total = 0.0;
        for s in &self.servers {
            let text = scrape_quiet(s.metrics_port).await;
            total += text
                .lines()
                .filter(|l| l.starts_with("snowkeep_grpc_requests_total{") && l.contains(&needle))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        total as u64
    }
}

/// Waits until `s` reports it can issue (`snowkeep_issuance_ready` 1): read
/// from its metrics, so it works with TLS and auth alike.
pub async fn wait_ready(s: &ServerProcess) {
    let series = format!("snowkeep_issuance_ready{{namespace=\"{NAMESPACE}\"}} 1");
    let port = s.metrics_port;
    let series = &series;
    eventually(
        "a server ready to issue",
        Duration::from_secs(30),
        || async move { scrape_quiet(port).await.contains(series.as_str()) },
    )
    .await;
}

/// The metrics of the server on `port`; empty when nothing answers (a
/// killed server).
async fn scrape_quiet(port: u16) -> String {
    try_scrape(port).await.unwrap_or_default()
}

/// Waits until `s` accepts `key` (its key cache caught up with etcd).
async fn wait_key_known(s: &ServerProcess, key: &str) {
    let channel = s.channel().await;
    eventually(
        "a server to know a new key",
        Duration::from_secs(10),
        || {
            let mut info = pb::info_service_client::InfoServiceClient::with_interceptor(
                channel.clone(),
                bearer(Some(key)),
            );
            async move { info.get_info(pb::GetInfoRequest::default()).await.is_ok() }
        },
    )
    .await;
}
