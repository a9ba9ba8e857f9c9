//! The nemesis: each fault with its heal step. A fault returns the window it
//! ran in, with the moment each server slot's heal ended; recovery is counted
//! from there.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use snowkeep_client::{Clock, Layout, SystemClock};
use tokio::time::sleep;

use crate::checker::{FaultWindow, Recorder, Zombie};
use crate::support::server::ServerProcess;
use crate::topology::{self, Topology, WallClock, NAMESPACE, TTL};

/// Every kind of fault the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of a server, restarted under the same stable instance id.
    KillServerSameId,
    /// `kill -9` of a server, restarted under a new instance id.
    KillServerNewId,
    /// SIGSTOP of a server for longer than its TTL while a replacement takes
    /// its machine id, then SIGCONT: the zombie must mint nothing more under it.
    PauseServer,
    /// `kill -9` of the etcd leader, restarted after a TTL.
    KillEtcdLeader,
    /// Every etcd member killed, restarted after a TTL.
    StopAllEtcd,
    /// Every etcd member SIGSTOPped for longer than a TTL.
    PauseEtcd,
    /// One server's connections to etcd black-holed while its clients still
    /// reach it.
    PartitionServer,
    /// A server restarted with its wall clock 3 s ahead, then back on time.
    ClockAhead,
    /// A server restarted with its wall clock 3 s behind, then back on time.
    ClockBehind,
    /// A server's wall clock stepped back 2 s while it runs, then forward.
    ClockStepBack,
    /// An operator deletes a server's holder key.
    DeleteHolder,
    /// SIGTERM and restart of every server, one after another.
    RollingRestart,
    /// Fifty more servers started at once, each asked for ids, then stopped.
    FiftyServers,
}

impl Fault {
    pub const ALL: [Fault; 13] = [
        Fault::KillServerSameId,
        Fault::KillServerNewId,
        Fault::PauseServer,
        Fault::KillEtcdLeader,
        Fault::StopAllEtcd,
        Fault::PauseEtcd,
        Fault::PartitionServer,
        Fault::ClockAhead,
        Fault::ClockBehind,
        Fault::ClockStepBack,
        Fault::DeleteHolder,
        Fault::RollingRestart,
        Fault::FiftyServers,
    ];

    /// The short name `SNOWKEEP_NEMESIS_ONLY` takes.
    pub fn key(self) -> &'static str {
        match self {
            Fault::KillServerSameId => "kill-same-id",
            Fault::KillServerNewId => "kill-new-id",
            Fault::PauseServer => "pause-server",
            Fault::KillEtcdLeader => "kill-etcd-leader",
            Fault::StopAllEtcd => "stop-etcd",
            Fault::PauseEtcd => "pause-etcd",
            Fault::PartitionServer => "partition",
            Fault::ClockAhead => "clock-ahead",
            Fault::ClockBehind => "clock-behind",
            Fault::ClockStepBack => "clock-step-back",
            Fault::DeleteHolder => "delete-holder",
            Fault::RollingRestart => "rolling-restart",
            Fault::FiftyServers => "fifty-servers",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillServerSameId => "kill -9 server, restart same instance id",
            Fault::KillServerNewId => "kill -9 server, restart new instance id",
            Fault::PauseServer => "SIGSTOP server past its TTL, replacement, SIGCONT",
            Fault::KillEtcdLeader => "kill -9 etcd leader, restart it",
            Fault::StopAllEtcd => "all etcd members killed, restarted",
            Fault::PauseEtcd => "all etcd members SIGSTOPped past the TTL",
            Fault::PartitionServer => "server cut off from etcd (black hole)",
            Fault::ClockAhead => "server wall clock 3 s ahead",
            Fault::ClockBehind => "server wall clock 3 s behind",
            Fault::ClockStepBack => "server wall clock stepped back 2 s mid-run",
            Fault::DeleteHolder => "operator deletes a holder key",
            Fault::RollingRestart => "SIGTERM rolling restart of all servers",
            Fault::FiftyServers => "50 servers started at once",
        }
    }
}

/// Runs faults against a topology and records what they did.
pub struct Nemesis {
    pub topo: Topology,
    pub rec: Arc<Recorder>,
    pub rng: StdRng,
    pub layout: Layout,
    scratch: tempfile::TempDir,
    extra: u32,
}

fn unix_ms() -> u64 {
    SystemClock.unix_ms()
}

/// A fault's outage: long enough for a lease to expire.
const OUTAGE: Duration = Duration::from_secs(TTL.as_secs() + 1);

impl Nemesis {
    pub fn new(topo: Topology, rec: Arc<Recorder>, rng: StdRng, layout: Layout) -> Self {
        Self {
            topo,
            rec,
            rng,
            layout,
            scratch: tempfile::tempdir().expect("temp dir"),
            extra: 0,
        }
    }

    fn slots(&self) -> usize {
        self.topo.slots.len()
    }

    /// Injects `fault`, heals it, waits until every slot serves again (or 30 s
    /// pass) and returns its window.
    pub async fn run(&mut self, fault: Fault) -> FaultWindow {
        let start_ms = self.rec.now_ms();
        let slot = self.rng.random_range(0..self.slots());
        println!(
            "[{start_ms:>7} ms] {} ids so far; fault: {} (slot {slot})",
            self.rec.id_count(),
            fault.name()
        );
        let mut zombie = None;
        let heal_all = match fault {
            Fault::KillServerSameId | Fault::KillServerNewId => {
                self.topo.kill(slot).await;
                sleep(Duration::from_secs(1)).await;
                self.topo
                    .spawn(slot, fault == Fault::KillServerNewId, &WallClock::Real);
                self.rec.now_ms()
            }
            Fault::PauseServer => {
                let (heal, z) = self.pause_server(slot).await;
                zombie = Some(z);
                heal
            }
            Fault::KillEtcdLeader => {
                let etcd = &self.topo.etcd;
                let leader = tokio::time::timeout(Duration::from_secs(30), async {
                    loop {
                        match etcd.leader().await {
                            Some(l) => break l,
                            None => sleep(Duration::from_millis(100)).await,
                        }
                    }
                })
                .await
                .expect("etcd elects a leader within 30 s");
                println!("    etcd leader is member {leader}");
                self.topo.etcd.kill_member(leader);
                sleep(OUTAGE).await;
                self.topo.etcd.restart().await;
                self.rec.now_ms()
            }
            Fault::StopAllEtcd => {
                self.topo.etcd.kill();
                sleep(OUTAGE).await;
                self.topo.etcd.restart().await;
                self.rec.now_ms()
            }
            Fault::PauseEtcd => {
                self.topo.etcd.pause();
                sleep(OUTAGE).await;
                self.topo.etcd.resume();
                self.rec.now_ms()
            }
            Fault::PartitionServer => {
                for p in &self.topo.slots[slot].proxies {
                    p.blackhole();
                }
                sleep(OUTAGE).await;
                for p in &self.topo.slots[slot].proxies {
                    p.heal();
                }
                self.rec.now_ms()
            }
            Fault::ClockAhead => self.skewed_restart(slot, "+3", 2_000..4_500).await,
            Fault::ClockBehind => self.skewed_restart(slot, "-3", -4_500..-2_000).await,
            Fault::ClockStepBack => self.step_back(slot).await,
            Fault::DeleteHolder => {
                let m = self.topo.slots[slot].server().machine_id().await;
                let key = format!("/snowkeep/v1/ns/{NAMESPACE}/holder/{m:05}");
                let deleted = self
                    .topo
                    .etcd
                    .client()
                    .await
                    .delete(key, None)
                    .await
                    .expect("delete holder key")
                    .deleted();
                assert_eq!(deleted, 1, "holder key of machine id {m}");
                let deleted_at = self.rec.now_ms();
                // The server must notice: it refuses until it has claimed again.
                let rec = self.rec.clone();
                tokio::time::timeout(Duration::from_secs(5), async {
                    while !rec.refused_since(slot, deleted_at) {
                        sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
                .expect("the server notices its deleted holder key within 5 s");
                deleted_at
            }
            Fault::RollingRestart => {
                let mut heal = vec![0; self.slots()];
                for (i, h) in heal.iter_mut().enumerate() {
                    self.topo.terminate(i).await;
                    self.topo.spawn(i, false, &WallClock::Real);
                    *h = self.rec.now_ms();
                    self.topo.wait_serving(i).await;
                }
                return self.finish(fault, start_ms, heal, None).await;
            }
            Fault::FiftyServers => {
                self.fifty_servers().await;
                self.rec.now_ms()
            }
        };
        let heal = vec![heal_all; self.slots()];
        self.finish(fault, start_ms, heal, zombie).await
    }

    async fn finish(
        &mut self,
        fault: Fault,
        start_ms: u64,
        heal_ms: Vec<u64>,
        zombie: Option<Zombie>,
    ) -> FaultWindow {
        // Every slot must serve again after its heal and keep serving for a
        // second before the window closes, so a loss noticed late (or a
        // second refusal) falls inside this fault's window.
        let rec = &self.rec;
        let stable = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let serving = |since: &dyn Fn(usize) -> u64| {
                    (0..heal_ms.len()).all(|s| rec.serving_since(s, since(s)))
                };
                if serving(&|s| heal_ms[s]) {
                    let settled = rec.now_ms();
                    sleep(Duration::from_secs(1)).await;
                    if serving(&|_| settled)
                        && (0..heal_ms.len()).all(|s| !rec.refused_since(s, settled))
                    {
                        return;
                    }
                }
                sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if stable.is_err() {
            println!("    a slot did not serve steadily within 30 s of the heal");
        }
        FaultWindow {
            name: fault.name().to_owned(),
            start_ms,
            heal_ms,
            end_ms: self.rec.now_ms(),
            zombie,
        }
    }

    fn next_extra(&mut self, kind: &str) -> String {
        self.extra += 1;
        format!("{kind}-{}", self.extra)
    }

    /// Records `calls` NextIds batches of `count` from an extra server.
    async fn take_ids(&self, server: &ServerProcess, holder: &str, calls: u32, count: u32) {
        let source = self.rec.source(&format!("{holder} unary"), holder);
        for _ in 0..calls {
            let ids = server
                .next_ids(count)
                .await
                .unwrap_or_else(|s| panic!("{holder} refused NextIds: {s}"));
            self.rec.batch(source, self.rec.unit(), ids);
        }
    }

    /// SIGSTOPs `slot`; once its holder key has expired, a replacement limited
    /// to that machine id claims it and issues; then SIGCONT.
    async fn pause_server(&mut self, slot: usize) -> (u64, Zombie) {
        let m = self.topo.slots[slot].server().machine_id().await;
        let holder = self.topo.slots[slot].instance_id.clone();
        self.topo.slots[slot].server().signal("STOP");
        // Read after the stop has taken hold: anything stamped later under
        // `m` was minted after SIGCONT.
        sleep(Duration::from_millis(50)).await;
        let stopped_at = self
            .layout
            .to_layout_ms(unix_ms())
            .expect("clock after the epoch")
            .get();
        let key = format!("/snowkeep/v1/ns/{NAMESPACE}/holder/{m:05}");
        let mut etcd = self.topo.etcd.client().await;
        tokio::time::timeout(Duration::from_secs(30), async {
            while !etcd
                .get(key.clone(), None)
                .await
                .is_ok_and(|r| r.kvs().is_empty())
            {
                sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the paused server's holder key expires within 30 s");
        let id = self.next_extra("replacement");
        let range = format!("{m}..{}", m + 1);
        let mut args = Topology::args(&self.topo.etcd.endpoints(), &id);
        args.extend(["--machine-id-range".to_owned(), range]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut replacement = topology::spawn(&args, &WallClock::Real);
        replacement.wait_serving(Duration::from_secs(30)).await;
        assert_eq!(replacement.machine_id().await, m);
        self.take_ids(&replacement, &id, 5, 1_000).await;
        self.topo.slots[slot].server().signal("CONT");
        let heal = self.rec.now_ms();
        println!("    paused holder of machine id {m}; {id} took it over");
        // The zombie must come back under another machine id while the
        // replacement still holds this one.
        let rec = self.rec.clone();
        let _ = tokio::time::timeout(Duration::from_secs(30), async {
            while !rec.served_since(slot, heal) {
                sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        self.take_ids(&replacement, &id, 2, 1_000).await;
        // Once the replacement releases `m`, this slot may claim it again
        // under a new lease: the zombie check ends here.
        let until_ms = self.rec.now_ms();
        replacement.signal("TERM");
        replacement.wait_exit(Duration::from_secs(20)).await;
        (
            heal,
            Zombie {
                holder,
                machine_id: m as u16,
                stopped_at,
                until_ms,
            },
        )
    }

    /// Restarts `slot` with its clock at `offset`, checks the offset took
    /// (server time minus ours, ms, inside `expect`), lets it serve, then
    /// restarts it on time; the heal is that last restart.
    async fn skewed_restart(
        &mut self,
        slot: usize,
        offset: &'static str,
        expect: std::ops::Range<i64>,
    ) -> u64 {
        self.topo.terminate(slot).await;
        self.topo.spawn(slot, false, &WallClock::Offset(offset));
        self.topo.wait_serving(slot).await;
        let skew = self.topo.slots[slot]
            .server()
            .info()
            .await
            .server_time_unix_ms as i64
            - unix_ms() as i64;
        assert!(
            expect.contains(&skew),
            "libfaketime {offset}: server clock is {skew} ms off"
        );
        sleep(Duration::from_secs(3)).await;
        self.topo.terminate(slot).await;
        self.topo.spawn(slot, false, &WallClock::Real);
        self.rec.now_ms()
    }

    /// Restarts `slot` on a clock read from a file, steps it back 2 s, and
    /// after 3 s forward again (the heal). The slot keeps that clock until a
    /// later fault restarts it.
    async fn step_back(&mut self, slot: usize) -> u64 {
        let name = self.next_extra("clock");
        let file = self.scratch.path().join(name);
        std::fs::write(&file, "+0\n").expect("write clock file");
        self.topo.terminate(slot).await;
        self.topo.spawn(slot, false, &WallClock::File(file.clone()));
        self.topo.wait_serving(slot).await;
        sleep(Duration::from_secs(1)).await;
        std::fs::write(&file, "-2\n").expect("write clock file");
        sleep(Duration::from_secs(3)).await;
        let halted = self.topo.slots[slot]
            .server()
            .metric("snowkeep_clock_backward_steps_total{outcome=\"halted\"}")
            .await;
        assert!(halted >= 1.0, "the 2 s step back was not seen: {halted}");
        std::fs::write(&file, "+0\n").expect("write clock file");
        self.rec.now_ms()
    }

    /// Starts 50 servers at once, waits until all serve, takes ids from each,
    /// and stops them.
    async fn fifty_servers(&mut self) {
        let endpoints = self.topo.etcd.endpoints();
        let mut burst = Vec::new();
        for _ in 0..50 {
            let id = self.next_extra("burst");
            let args = Topology::args(&endpoints, &id);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            burst.push((id, topology::spawn(&args, &WallClock::Real)));
        }
        let started = tokio::time::Instant::now();
        for (_, s) in &burst {
            s.wait_serving(Duration::from_secs(90)).await;
        }
        println!("    50 servers serving after {:?}", started.elapsed());
        for (id, s) in &burst {
            self.take_ids(s, id, 1, 1_000).await;
        }
        for (_, s) in &burst {
            s.signal("TERM");
        }
        for (_, s) in &mut burst {
            let status = s.wait_exit(Duration::from_secs(30)).await;
            assert!(status.success(), "a burst server exited with {status}");
        }
    }
}
