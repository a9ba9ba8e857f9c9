//! A cluster with `--auth on`: one etcd, two servers that share it, a
//! bootstrap admin key, and clients that send a key (or not).

use std::time::Duration;

use snowkeep_proto::v1 as pb;
use tempfile::TempDir;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::etcd::EtcdProcess;
use super::server::ServerProcess;
use super::{eventually, READY};

/// Sends `authorization` (as given, or nothing) with every call.
#[derive(Clone)]
pub struct Auth(Option<String>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut()
                .insert("authorization", v.parse().expect("ascii metadata"));
        }
        Ok(r)
    }
}

/// A channel with [`Auth`].
pub type Keyed = InterceptedService<Channel, Auth>;

/// `Bearer <key>`, or no metadata for `None`.
pub fn bearer(key: Option<&str>) -> Auth {
    Auth(key.map(|k| format!("Bearer {k}")))
}

/// A fresh key text `<id>.<secret>` that no server knows.
pub fn random_key(id: &str) -> String {
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    format!("{id}.{hex}")
}

/// One etcd, servers `a` and `b` on namespace `ns` with `--auth on` and the
/// bootstrap admin key `admin_key`.
pub struct AuthCluster {
    /// The etcd.
    pub etcd: EtcdProcess,
    /// The first server.
    pub a: ServerProcess,
    /// The second server.
    pub b: ServerProcess,
    /// The namespace.
    pub ns: String,
    /// The bootstrap admin key, `<id>.<secret>`.
    pub admin_key: String,
    /// Holds the key file.
    pub dir: TempDir,
}

impl AuthCluster {
    /// Starts it and waits until both servers serve and answer the admin
    /// key (their key caches loaded).
    pub async fn start(ns: &str) -> Self {
        Self::start_with(ns, &[]).await
    }

    /// Like [`AuthCluster::start`], both servers with `extra` flags too.
    pub async fn start_with(ns: &str, extra: &[&str]) -> Self {
        let etcd = EtcdProcess::start().await;
        let dir = tempfile::tempdir().unwrap();
        let admin_key = random_key("kbootstrap01");
        let file = dir.path().join("admin.key");
        std::fs::write(&file, format!("{admin_key}\n")).unwrap();
        let file = file.to_str().unwrap().to_owned();
        let mut flags = vec!["--auth", "on", "--bootstrap-admin-key-file", &file];
        flags.extend_from_slice(extra);
        let a = ServerProcess::on_etcd(&etcd.endpoint(), ns, &flags);
        a.wait_serving(READY).await;
        let b = ServerProcess::joining(&etcd.endpoint(), ns, &flags);
        b.wait_serving(READY).await;
        let cluster = Self {
            etcd,
            a,
            b,
            ns: ns.to_owned(),
            admin_key,
            dir,
        };
        for s in [&cluster.a, &cluster.b] {
            let admin_key = cluster.admin_key.clone();
            eventually("the admin key to work", Duration::from_secs(20), || {
                let admin_key = admin_key.clone();
                async move {
                    admin(s, Some(&admin_key))
                        .await
                        .list_keys(pb::ListKeysRequest {})
                        .await
                        .is_ok()
                }
            })
            .await;
        }
        cluster
    }

    /// Creates a key through server `a` with the admin key; returns `<id>.<secret>`
    /// and its record.
    pub async fn create_key(
        &self,
        permissions: &[pb::Permission],
        namespaces: &[&str],
        max_lease_machine_ids: u32,
    ) -> (String, pb::ApiKey) {
        let r = admin(&self.a, Some(&self.admin_key))
            .await
            .create_key(pb::CreateKeyRequest {
                description: "test key".into(),
                expires_unix_ms: 0,
                namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
                permissions: permissions.iter().map(|p| *p as i32).collect(),
                max_lease_machine_ids,
            })
            .await
            .unwrap()
            .into_inner();
        // Server b learns of the key through its watch: wait until both
        // servers know it (GetInfo checks any key it is sent), so a test
        // that uses it on either server at once does not race the watch.
        for server in [&self.a, &self.b] {
            let channel = server.channel().await;
            eventually(
                "both servers to know the new key",
                Duration::from_secs(10),
                || {
                    let mut info = pb::info_service_client::InfoServiceClient::with_interceptor(
                        channel.clone(),
                        bearer(Some(&r.secret)),
                    );
                    async move { info.get_info(pb::GetInfoRequest::default()).await.is_ok() }
                },
            )
            .await;
        }
        (r.secret, r.key.unwrap())
    }
}

/// An AdminService client of `server` sending `key`.
pub async fn admin(
    server: &ServerProcess,
    key: Option<&str>,
) -> pb::admin_service_client::AdminServiceClient<Keyed> {
    pb::admin_service_client::AdminServiceClient::with_interceptor(
        server.channel().await,
        bearer(key),
    )
}

/// A LeaseService client of `server` sending `key`.
pub async fn lease(
    server: &ServerProcess,
    key: Option<&str>,
) -> pb::lease_service_client::LeaseServiceClient<Keyed> {
    pb::lease_service_client::LeaseServiceClient::with_interceptor(
        server.channel().await,
        bearer(key),
    )
}

/// An IdService client of `server` sending `key`.
pub async fn ids(
    server: &ServerProcess,
    key: Option<&str>,
) -> pb::id_service_client::IdServiceClient<Keyed> {
    pb::id_service_client::IdServiceClient::with_interceptor(server.channel().await, bearer(key))
}

/// Imports `document` (without replace, the server's own lead) through
/// `server`, sending `key`: retried while the server does not accept
/// connections yet or answers UNAVAILABLE (before it reached etcd or loaded
/// its keys), for at most 20 s; the first other answer. Panics with the
/// last answer when none came.
pub async fn import_when_ready(
    server: &ServerProcess,
    key: Option<&str>,
    document: &str,
) -> Result<pb::ImportResponse, tonic::Status> {
    let start = tokio::time::Instant::now();
    let mut last = None;
    while start.elapsed() < Duration::from_secs(20) {
        let connected = Channel::from_shared(server.url())
            .expect("uri")
            .connect()
            .await;
        if let Ok(channel) = connected {
            let answer = pb::admin_service_client::AdminServiceClient::with_interceptor(
                channel,
                bearer(key),
            )
            .import(pb::ImportRequest {
                document: document.to_owned(),
                replace: false,
                lead_ms: 0,
            })
            .await;
            match answer {
                Err(e) if e.code() == tonic::Code::Unavailable => {
                    last = Some(format!("{:?}: {}", e.code(), e.message()))
                }
                other => return other.map(|r| r.into_inner()),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no answer but UNAVAILABLE to Import within 20 s, last: {last:?}; log:\n{}",
        server.log()
    );
}
