//! `ServerProcess`: the real `snowkeep-server` binary on free ports, with its
//! log in a temp dir, and gRPC helpers for IdService, InfoService and health.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use snowkeep_proto::v1 as pb;
use tempfile::TempDir;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use super::free_port;

/// The outage budget of [`ServerProcess::joining`]'s servers unless a test
/// sets its own.
pub const TEST_OUTAGE_BUDGET: &str = "2s";

/// A running snowkeep-server process.
pub struct ServerProcess {
    child: Option<Child>,
    /// The gRPC port.
    pub port: u16,
    /// The metrics port.
    pub metrics_port: u16,
    log: PathBuf,
    /// How it was started, for [`ServerProcess::restart`].
    command: Vec<String>,
    env: Vec<(String, String)>,
    _dir: TempDir,
}

impl ServerProcess {
    /// Spawns the server with `args` (plus free --listen/--metrics-listen).
    pub fn spawn(args: &[&str]) -> Self {
        Self::spawn_env(args, &[])
    }

    /// Spawns the server with `args` and extra environment variables `env`.
    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_wrapped(&[], args, env)
    }

    /// Spawns `wrapper… snowkeep-server args` (a command that execs the
    /// server, e.g. `prlimit --nofile=128:128 --`) with extra environment
    /// variables `env`; no wrapper runs the server itself.
    pub fn spawn_wrapped(wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let metrics_port = free_port();
        let server = super::server_binary();
        let mut command: Vec<String> = wrapper.iter().map(|s| (*s).to_owned()).collect();
        command.push(server.to_str().expect("UTF-8 path").to_owned());
        command.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
        command.extend([
            "--metrics-listen".into(),
            format!("127.0.0.1:{metrics_port}"),
        ]);
        command.extend(args.iter().map(|s| (*s).to_owned()));
        let mut s = Self {
            child: None,
            port,
            metrics_port,
            log: dir.path().join("server.log"),
            command,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            _dir: dir,
        };
        s.child = Some(s.start_child());
        s
    }

    /// Starts the process as [`ServerProcess::spawn_wrapped`] set it up,
    /// its stderr appended to the log.
    fn start_child(&self) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        Command::new(&self.command[0])
            .args(&self.command[1..])
            .env(
                "SNOWKEEP_LOG",
                "info,snowkeep_server=debug,snowkeep_guard=debug,snowkeep_etcd=debug,snowkeep_core=debug",
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(self._dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn snowkeep-server")
    }

    /// Starts the server again with the same flags and ports (its state dir
    /// and log kept) after it exited or was killed; a running one is killed
    /// (SIGKILL) first.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.child = Some(self.start_child());
    }

    /// Waits until the stopped or killed process is gone (reaped).
    pub fn reap(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Spawns a server on etcd `endpoint` in `namespace` with a 2 s lease
    /// TTL and, unless `extra` sets one, a 2 s outage budget (fences at most
    /// 3 s ahead, so a test's crashed or tampered machine ids come back within
    /// `--max-fence-wait`; the fault suite runs the 60 s default), creating
    /// the namespace if it does not exist (`--create-namespace`).
    pub fn on_etcd(endpoint: &str, namespace: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--create-namespace"];
        args.extend_from_slice(extra);
        Self::joining(endpoint, namespace, &args)
    }

    /// Like [`ServerProcess::on_etcd`], but the namespace must exist already:
    /// no `--create-namespace`, as every server but a namespace's first.
    pub fn joining(endpoint: &str, namespace: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--etcd-endpoints", endpoint, "--namespace", namespace];
        if !extra.contains(&"--lease-ttl") {
            args.extend(["--lease-ttl", "2s"]);
        }
        if !extra.contains(&"--outage-budget") {
            args.extend(["--outage-budget", TEST_OUTAGE_BUDGET]);
        }
        args.extend_from_slice(extra);
        Self::spawn(&args)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The gRPC URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts `n` servers on etcd `endpoint` in `namespace` and waits until
    /// all serve.
    pub async fn serving(n: usize, endpoint: &str, namespace: &str) -> Vec<Self> {
        let servers: Vec<Self> = (0..n)
            .map(|_| Self::on_etcd(endpoint, namespace, &[]))
            .collect();
        for s in &servers {
            s.wait_serving(std::time::Duration::from_secs(20)).await;
        }
        servers
    }

    /// A channel to the server.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .expect("uri")
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to server: {e}; log:\n{}", self.log()))
    }

    /// An IdService client.
    pub async fn ids(&self) -> pb::id_service_client::IdServiceClient<Channel> {
        pb::id_service_client::IdServiceClient::new(self.channel().await)
            .max_decoding_message_size(64 * 1024 * 1024)
    }

    /// GetInfo.
    pub async fn info(&self) -> pb::GetInfoResponse {
        pb::info_service_client::InfoServiceClient::new(self.channel().await)
            .get_info(pb::GetInfoRequest {})
            .await
            .expect("GetInfo")
            .into_inner()
    }

    /// GetCapacity.
    pub async fn capacity(&self) -> pb::Capacity {
        pb::info_service_client::InfoServiceClient::new(self.channel().await)
            .get_capacity(pb::GetCapacityRequest {})
            .await
            .expect("GetCapacity")
            .into_inner()
    }

    /// The machine id held now; panics when none is held.
    pub async fn machine_id(&self) -> u32 {
        let info = self.info().await;
        assert_eq!(
            info.held.len(),
            1,
            "expected one held machine id: {info:?}; log:\n{}",
            self.log()
        );
        info.held[0].machine_id
    }

    /// The health status of IdService, `None` when the server does not answer.
    pub async fn health(&self) -> Option<ServingStatus> {
        self.health_of("snowkeep.v1.IdService").await
    }

    /// The health status of `service`, `None` when the server does not answer.
    pub async fn health_of(&self, service: &str) -> Option<ServingStatus> {
        let channel = Channel::from_shared(self.url())
            .expect("uri")
            .connect_timeout(Duration::from_millis(300))
            .timeout(Duration::from_millis(1000))
            .connect()
            .await
            .ok()?;
        let resp = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .ok()?;
        ServingStatus::try_from(resp.into_inner().status).ok()
    }

    /// Waits until health says SERVING.
    pub async fn wait_serving(&self, within: Duration) -> Duration {
        let start = tokio::time::Instant::now();
        while start.elapsed() < within {
            if self.health().await == Some(ServingStatus::Serving) {
                return start.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The log goes with the temp dir: print it, it says why.
        panic!(
            "timed out after {within:?} waiting for: server SERVING; its log:\n{}",
            self.log()
        );
    }

    /// One NextIds call.
    pub async fn next_ids(&self, count: u32) -> Result<Vec<u64>, tonic::Status> {
        self.ids()
            .await
            .next_ids(pb::NextIdsRequest {
                count,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().ids)
    }

    /// The value of one series, written as the exporter renders it
    /// (`name` or `name{label="value"}`); 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        scrape(self.metrics_port)
            .await
            .lines()
            .filter_map(|l| l.rsplit_once(' '))
            .find(|(s, _)| *s == series)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits at most 15 s for this server's first peer clock measurement in
    /// `namespace` (the skew histogram's `source="peer"` series), or panics
    /// naming `what`.
    pub async fn wait_peer_measured(&self, namespace: &str, what: &str) {
        let port = self.metrics_port;
        let series = format!(
            "snowkeep_clock_skew_seconds_count{{namespace=\"{namespace}\",source=\"peer\"}}"
        );
        let series = &series;
        crate::eventually(what, Duration::from_secs(15), || async move {
            scrape(port).await.contains(series.as_str())
        })
        .await;
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends a signal (`TERM`, `KILL`, `STOP`, `CONT`) with kill(1).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} failed");
    }

    /// Waits for the process to exit (up to `within`) and returns its status.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let start = tokio::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if start.elapsed() > within {
                let _ = child.kill();
                panic!(
                    "server did not exit within {within:?}; log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits up to `within` for the process to exit; asserts it exited with
    /// `code` and that its log contains `log_says`.
    pub async fn assert_exits(&mut self, within: Duration, code: i32, log_says: &str) {
        assert_eq!(self.wait_exit(within).await.code(), Some(code));
        assert!(self.log().contains(log_says), "log:\n{}", self.log());
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// GET /metrics from the exporter.
pub async fn scrape(port: u16) -> String {
    try_scrape(port).await.expect("scrape /metrics")
}

/// GET /metrics from the exporter; `None` when nothing answers within 2 s
/// (a killed or restarting server, or a stopped one, whose kernel accepts
/// the connection and never answers).
pub async fn try_scrape(port: u16) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        ureq::get(&format!("http://127.0.0.1:{port}/metrics"))
            .config()
            .timeout_global(Some(Duration::from_secs(2)))
            .build()
            .call()
            .ok()?
            .body_mut()
            .read_to_string()
            .ok()
    })
    .await
    .expect("scrape task")
}
