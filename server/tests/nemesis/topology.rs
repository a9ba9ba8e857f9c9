//! The system under test: a 3-member etcd cluster, three server slots (each
//! reaching every etcd member through its own [`FaultProxy`], so one server
//! can be cut off alone), and a proxy that follows slot 0 for the embedded
//! generator's Lease API calls.

use std::net::SocketAddr;
use std::time::Duration;

use snowkeep_client::Layout;
use tokio::sync::watch;

use crate::proxy::FaultProxy;
use crate::workers::Target;
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::ServerProcess;

/// The namespace every process works in.
pub const NAMESPACE: &str = "nemesis";
/// The servers' lease TTL: 5 s, as a leader election on 2 busy cores can take
/// longer than 2 s.
pub const TTL: Duration = Duration::from_secs(5);
/// The servers' outage budget (`--outage-budget`): how long a busy server
/// issues on through an etcd outage. 20 s rather than the default 60 s: every
/// rule the suite checks is stated in budgets (issue through half of one,
/// stop at the fence 1.5 ahead, never before one), and a third of the budget
/// takes about 200 s of waiting off the run (four etcd outages and the
/// paused holder's fence, all scaled by it).
pub const BUDGET: Duration = Duration::from_secs(20);

/// How far ahead of its clock a busy server's fences can be: 1.5 budgets
/// (30 s). Every fence is raised to this lead once it is one budget or less
/// ahead.
pub fn lead() -> Duration {
    snowkeep_core::claim::fence_lead(BUDGET)
}

/// A wall clock for a server process, through libfaketime.
#[derive(Clone, Debug)]
pub enum WallClock {
    Real,
    /// Offset by whole seconds, e.g. `+3` or `-3`.
    Offset(&'static str),
    /// Offset read from this file (re-read every second), so it can be
    /// stepped while the process runs.
    File(std::path::PathBuf),
}

/// One long-lived server position: restarts replace its process.
pub struct Slot {
    pub process: Option<ServerProcess>,
    pub instance_id: String,
    generation: u32,
    pub proxies: Vec<FaultProxy>,
    target: watch::Sender<Option<Target>>,
}

impl Slot {
    /// The running process; panics when the slot is down.
    pub fn server(&self) -> &ServerProcess {
        self.process.as_ref().expect("slot is running")
    }
}

pub struct Topology {
    pub etcd: EtcdProcess,
    pub slots: Vec<Slot>,
    /// Follows slot 0: the embedded generator's Lease API endpoint.
    pub embedded_proxy: FaultProxy,
    /// The namespace's layout, every server's `--layout`.
    pub layout: Layout,
}

impl Topology {
    /// Starts etcd and three serving servers on a namespace of `layout`.
    pub async fn start(layout: Layout) -> Self {
        let etcd = EtcdProcess::cluster(3).await;
        let mut slots = Vec::new();
        for i in 0..3 {
            let mut proxies = Vec::new();
            for addr in etcd.member_addrs() {
                proxies.push(FaultProxy::start(addr).await);
            }
            slots.push(Slot {
                process: None,
                instance_id: format!("s{i}-g0"),
                generation: 0,
                proxies,
                target: watch::channel(None).0,
            });
        }
        let embedded_proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], 1))).await;
        let mut topo = Self {
            etcd,
            slots,
            embedded_proxy,
            layout,
        };
        for i in 0..3 {
            topo.spawn(i, false, &WallClock::Real);
        }
        for i in 0..3 {
            topo.wait_serving(i).await;
        }
        topo
    }

    /// Watches slot `i`'s current process.
    pub fn target(&self, i: usize) -> watch::Receiver<Option<Target>> {
        self.slots[i].target.subscribe()
    }

    /// `--etcd-endpoints` of slot `i`: its proxies.
    fn etcd_endpoints(&self, i: usize) -> String {
        self.slots[i]
            .proxies
            .iter()
            .map(FaultProxy::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Server arguments shared by every process of the run.
    pub fn args(&self, etcd_endpoints: &str, instance_id: &str) -> Vec<String> {
        let budget = format!("{}s", BUDGET.as_secs());
        let layout = self.layout.to_string();
        [
            "--layout",
            &layout,
            "--etcd-endpoints",
            etcd_endpoints,
            "--namespace",
            NAMESPACE,
            "--lease-ttl",
            "5s",
            "--outage-budget",
            &budget,
            "--instance-id",
            instance_id,
            // A test harness on its own fresh etcd: every server may create
            // the namespace (deployments create it once, see docs/operations.md).
            "--create-namespace",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// The process id of every slot's process, in slot order.
    pub fn pids(&self) -> Vec<u32> {
        self.slots.iter().map(|s| s.server().pid()).collect()
    }

    /// Starts a new process in slot `i` (which must be down); with
    /// `new_identity` it claims under a new instance id, else under the
    /// slot's stable one.
    pub fn spawn(&mut self, i: usize, new_identity: bool, clock: &WallClock) {
        assert!(self.slots[i].process.is_none(), "slot {i} still runs");
        if new_identity {
            self.slots[i].generation += 1;
            self.slots[i].instance_id = format!("s{i}-g{}", self.slots[i].generation);
        }
        let args = self.args(&self.etcd_endpoints(i), &self.slots[i].instance_id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let process = spawn(&args, clock);
        let target = Target {
            url: process.url(),
            holder: self.slots[i].instance_id.clone(),
        };
        if i == 0 {
            self.embedded_proxy
                .retarget(SocketAddr::from(([127, 0, 0, 1], process.port)));
        }
        self.slots[i].process = Some(process);
        self.slots[i].target.send_replace(Some(target));
    }

    /// Waits until slot `i` serves (health SERVING), up to 30 s.
    pub async fn wait_serving(&self, i: usize) {
        self.wait_serving_within(i, Duration::from_secs(30)).await;
    }

    /// [`Self::wait_serving`] with a bound of its own.
    pub async fn wait_serving_within(&self, i: usize, within: Duration) {
        self.slots[i].server().wait_serving(within).await;
    }

    /// Kills slot `i`'s process with SIGKILL and waits for it to die.
    pub async fn kill(&mut self, i: usize) {
        self.slots[i].target.send_replace(None);
        let mut p = self.slots[i].process.take().expect("running");
        p.signal("KILL");
        p.wait_exit(Duration::from_secs(10)).await;
    }

    /// Stops slot `i`'s process with SIGTERM (it drains and releases) and
    /// waits for it to exit.
    pub async fn terminate(&mut self, i: usize) {
        let mut p = self.slots[i].process.take().expect("running");
        p.signal("TERM");
        let status = p.wait_exit(Duration::from_secs(20)).await;
        self.slots[i].target.send_replace(None);
        assert!(
            status.success(),
            "slot {i} exited with {status} after SIGTERM"
        );
    }
}

/// Spawns a server process with `args` under `clock`.
pub fn spawn(args: &[&str], clock: &WallClock) -> ServerProcess {
    let (file, lib);
    let env: Vec<(&str, &str)> = match clock {
        WallClock::Real => vec![],
        WallClock::Offset(offset) => vec![
            ("LD_PRELOAD", {
                lib = snowkeep_test_support::libfaketime();
                &lib
            }),
            ("FAKETIME", offset),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
        WallClock::File(path) => {
            file = path.to_string_lossy().into_owned();
            lib = snowkeep_test_support::libfaketime();
            vec![
                ("LD_PRELOAD", &lib),
                ("FAKETIME_TIMESTAMP_FILE", &file),
                ("FAKETIME_CACHE_DURATION", "1"),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ]
        }
    };
    ServerProcess::spawn_env(args, &env)
}
