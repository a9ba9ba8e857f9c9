//! `EtcdProcess`: one real etcd member (`$ETCD_BIN` or `/usr/bin/etcd`) on free
//! ports with a temp data dir. Fails loudly when the binary is missing; never
//! uses an etcd that is already running. Killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use super::{eventually, free_port};

/// A running (or stopped) single-member etcd.
pub struct EtcdProcess {
    child: Option<Child>,
    dir: TempDir,
    client_port: u16,
    peer_port: u16,
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

impl EtcdProcess {
    /// Starts a fresh member and waits until it is healthy.
    pub async fn start() -> Self {
        let mut etcd = Self {
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
            client_port: free_port(),
            peer_port: free_port(),
        };
        etcd.launch().await;
        etcd
    }

    async fn launch(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).expect("etcd log");
        let child = Command::new(etcd_bin())
            .args(["--name", "t1", "--data-dir"])
            .arg(self.dir.path().join("data"))
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
            .args([
                "--initial-cluster",
                &format!("t1={peer}"),
                "--initial-cluster-state",
                "new",
            ])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let url = self.endpoint();
        eventually("etcd to become healthy", Duration::from_secs(20), || {
            let url = url.clone();
            async move { health(&url).await }
        })
        .await;
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A client for assertions on etcd state.
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.endpoint()], None)
            .await
            .expect("connect etcd client")
    }

    /// Stops the member with SIGKILL and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the member again on the same ports and data dir.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "restart a stopped etcd only");
        self.launch().await;
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// True when the member answers a Status request.
async fn health(url: &str) -> bool {
    let Ok(mut client) = etcd_client::Client::connect([url], None).await else {
        return false;
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), client.status()).await,
        Ok(Ok(_))
    )
}
