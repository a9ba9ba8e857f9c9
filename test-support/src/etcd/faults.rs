//! The faults and disasters an [`EtcdProcess`] plays: pausing (SIGSTOP)
//! and killing members, starting them again, losing their data, and the
//! runbook's snapshot backup and restore (`scripts/etcd-snapshot`), or a
//! restore that skips it.

use std::process::Command;

use super::{signal, EtcdProcess, CLUSTER_TOKEN};

impl EtcdProcess {
    /// SIGSTOPs member `i` only: it hangs without closing connections, and
    /// the others keep the quorum.
    pub fn pause_member(&self, i: usize) {
        signal(
            self.members[i].child.as_ref().expect("running member"),
            "STOP",
        );
    }

    /// SIGCONTs member `i`.
    pub fn resume_member(&self, i: usize) {
        signal(
            self.members[i].child.as_ref().expect("running member"),
            "CONT",
        );
    }

    /// Kills member `i` with SIGKILL and waits for it to exit.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills every member.
    pub fn kill(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
    }

    /// Starts every stopped member again on its ports and data dir.
    pub async fn restart(&mut self) {
        let stopped: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].child.is_none())
            .collect();
        for &i in &stopped {
            self.launch(i);
        }
        for &i in &stopped {
            self.wait_healthy(i).await;
        }
    }

    /// Loses every member's data: kills them and starts a new, empty cluster
    /// on the same ports (as after a disk loss, or `rm -rf` of the data dirs).
    pub async fn wipe(&mut self) {
        self.kill();
        for (i, m) in self.members.iter_mut().enumerate() {
            m.data = m.dir.path().join(format!("wiped-{i}"));
            m.fresh = true;
        }
        self.relaunch_all().await;
    }

    /// Runs `scripts/etcd-snapshot save` (the runbook's backup step) against
    /// the first member, into `file`.
    pub fn snapshot_save(&self, file: &std::path::Path) {
        run_script(&[
            "save".as_ref(),
            self.members[0].client_url().as_ref(),
            file.as_os_str(),
        ]);
    }

    /// Runs `scripts/etcd-snapshot mark` of `file` (the marking step of the
    /// runbook's restore, done once for all members).
    pub fn snapshot_mark(&self, file: &std::path::Path) {
        run_script(&["mark".as_ref(), file.as_os_str()]);
    }

    /// The runbook's restore: kills every member, runs `scripts/etcd-snapshot
    /// restore` of `file` into a new data dir for each, and starts them.
    pub async fn restore(&mut self, file: &std::path::Path) {
        self.kill();
        let initial_cluster = self.initial_cluster();
        for (i, m) in self.members.iter_mut().enumerate() {
            let data = m.dir.path().join(format!("restored-{i}"));
            let peer = m.peer_url();
            run_script(&[
                "restore".as_ref(),
                file.as_os_str(),
                "--name".as_ref(),
                m.name.as_ref(),
                "--data-dir".as_ref(),
                data.as_os_str(),
                "--peer-url".as_ref(),
                peer.as_ref(),
                "--initial-cluster".as_ref(),
                initial_cluster.as_ref(),
                "--initial-cluster-token".as_ref(),
                CLUSTER_TOKEN.as_ref(),
            ]);
            m.data = data;
            m.fresh = false;
        }
        self.relaunch_all().await;
    }

    /// A restore that skips the runbook's script: kills every member, runs
    /// `etcdctl snapshot restore` of `file` itself (so nothing is marked
    /// rolled-back) into a new data dir for each, and starts them.
    pub async fn restore_raw(&mut self, file: &std::path::Path) {
        self.kill();
        let initial_cluster = self.initial_cluster();
        for (i, m) in self.members.iter_mut().enumerate() {
            let data = m.dir.path().join(format!("raw-restored-{i}"));
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["snapshot", "restore"])
                .arg(file)
                .args(["--name", &m.name, "--data-dir"])
                .arg(&data)
                .args(["--initial-advertise-peer-urls", &m.peer_url()])
                .args(["--initial-cluster", &initial_cluster])
                .args(["--initial-cluster-token", CLUSTER_TOKEN])
                .output()
                .expect("run etcdctl snapshot restore");
            assert!(
                out.status.success(),
                "etcdctl snapshot restore failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            m.data = data;
            m.fresh = false;
        }
        self.relaunch_all().await;
    }

    /// SIGSTOPs every member: etcd hangs without closing connections.
    pub fn pause(&self) {
        for m in &self.members {
            signal(m.child.as_ref().expect("running member"), "STOP");
        }
    }

    /// SIGCONTs every member.
    pub fn resume(&self) {
        for m in &self.members {
            signal(m.child.as_ref().expect("running member"), "CONT");
        }
    }

    /// Starts every member again (after a wipe or a restore gave each a new
    /// data dir) and waits until each is healthy.
    async fn relaunch_all(&mut self) {
        for i in 0..self.members.len() {
            self.launch(i);
        }
        for i in 0..self.members.len() {
            self.wait_healthy(i).await;
        }
    }
}

/// Runs `scripts/etcd-snapshot` with `args`; panics with its output on failure.
fn run_script(args: &[&std::ffi::OsStr]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/etcd-snapshot");
    let out = Command::new(script)
        .args(args)
        .output()
        .expect("run scripts/etcd-snapshot");
    assert!(
        out.status.success(),
        "scripts/etcd-snapshot {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
