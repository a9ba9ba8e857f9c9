//! The nemesis: each fault with its heal step. A fault returns the window it
//! ran in, with the moment each server slot's heal ended; recovery is counted
//! from there.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use snowkeep_client::{Clock, Layout, SystemClock};
use tokio::time::sleep;

use crate::checker::{Expect, FaultWindow, Outage, Recorder, Zombie};
use crate::topology::{self, lead, Topology, WallClock, BUDGET, NAMESPACE, TTL};
use snowkeep_test_support::server::ServerProcess;

/// Every kind of fault the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of a server, restarted under the same stable instance id.
    KillServerSameId,
    /// `kill -9` of a server, restarted under a new instance id.
    KillServerNewId,
    /// SIGSTOP of a server for longer than its TTL while a replacement takes
    /// its machine id (waiting out the paused holder's fence, up to 1.5
    /// budgets ahead), then SIGCONT: the zombie must mint nothing more under it.
    PauseServer,
    /// `kill -9` of the etcd leader, restarted after a TTL.
    KillEtcdLeader,
    /// Every etcd member killed, restarted after a TTL.
    StopAllEtcd,
    /// Every etcd member SIGSTOPped for half the outage budget (10 s): every
    /// server issues on through it, then recovers without a restart.
    PauseEtcdWithinBudget,
    /// Every etcd member SIGSTOPped past the farthest fence (35 s): every
    /// server issues for at least the budget, stops at its fence, and
    /// recovers without a restart.
    PauseEtcdPastBudget,
    /// One server's connections to etcd black-holed while its clients still
    /// reach it.
    PartitionServer,
    /// Every server's connections to etcd black-holed for half the outage
    /// budget, while their clients still reach them: as
    /// [`Fault::PauseEtcdWithinBudget`].
    PartitionAllWithinBudget,
    /// Every server's connections to etcd black-holed past the farthest
    /// fence: as [`Fault::PauseEtcdPastBudget`].
    PartitionAllPastBudget,
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
    pub const ALL: [Fault; 16] = [
        Fault::KillServerSameId,
        Fault::KillServerNewId,
        Fault::PauseServer,
        Fault::KillEtcdLeader,
        Fault::StopAllEtcd,
        Fault::PauseEtcdWithinBudget,
        Fault::PauseEtcdPastBudget,
        Fault::PartitionServer,
        Fault::PartitionAllWithinBudget,
        Fault::PartitionAllPastBudget,
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
            Fault::PauseEtcdWithinBudget => "pause-etcd-within-budget",
            Fault::PauseEtcdPastBudget => "pause-etcd-past-budget",
            Fault::PartitionServer => "partition",
            Fault::PartitionAllWithinBudget => "partition-all-within-budget",
            Fault::PartitionAllPastBudget => "partition-all-past-budget",
            Fault::ClockAhead => "clock-ahead",
            Fault::ClockBehind => "clock-behind",
            Fault::ClockStepBack => "clock-step-back",
            Fault::DeleteHolder => "delete-holder",
            Fault::RollingRestart => "rolling-restart",
            Fault::FiftyServers => "fifty-servers",
        }
    }

    /// The fault as the results table names it.
    pub fn name(self) -> String {
        let s = |d: Duration| format!("{} s", d.as_secs());
        let within = || format!("{} (half the {} budget)", s(WITHIN_BUDGET), s(BUDGET));
        let past = || format!("{} (past the {} fences)", s(past_budget()), s(lead()));
        match self {
            Fault::KillServerSameId => "kill -9 server, restart same instance id".into(),
            Fault::KillServerNewId => "kill -9 server, restart new instance id".into(),
            Fault::PauseServer => "SIGSTOP server past its TTL, replacement, SIGCONT".into(),
            Fault::KillEtcdLeader => "kill -9 etcd leader, restart it".into(),
            Fault::StopAllEtcd => "all etcd members killed, restarted".into(),
            Fault::PauseEtcdWithinBudget => format!("all etcd members SIGSTOPped {}", within()),
            Fault::PauseEtcdPastBudget => format!("all etcd members SIGSTOPped {}", past()),
            Fault::PartitionServer => "server cut off from etcd (black hole)".into(),
            Fault::PartitionAllWithinBudget => {
                format!("every server cut off from etcd {}", within())
            }
            Fault::PartitionAllPastBudget => format!("every server cut off from etcd {}", past()),
            Fault::ClockAhead => "server wall clock 3 s ahead".into(),
            Fault::ClockBehind => "server wall clock 3 s behind".into(),
            Fault::ClockStepBack => "server wall clock stepped back 2 s mid-run".into(),
            Fault::DeleteHolder => "operator deletes a holder key".into(),
            Fault::RollingRestart => "SIGTERM rolling restart of all servers".into(),
            Fault::FiftyServers => "50 servers started at once".into(),
        }
    }

    /// How an etcd outage fault cuts the servers off, and for how long;
    /// `None` for other faults.
    fn outage(self) -> Option<(Cut, Duration, Expect)> {
        let past = Expect::StopAtFence {
            not_before: STOP_NOT_BEFORE,
            by: lead() + STOP_SEEN_WITHIN,
        };
        match self {
            Fault::PauseEtcdWithinBudget => Some((Cut::Pause, WITHIN_BUDGET, Expect::IssueThrough)),
            Fault::PauseEtcdPastBudget => Some((Cut::Pause, past_budget(), past)),
            Fault::PartitionAllWithinBudget => {
                Some((Cut::Partition, WITHIN_BUDGET, Expect::IssueThrough))
            }
            Fault::PartitionAllPastBudget => Some((Cut::Partition, past_budget(), past)),
            _ => None,
        }
    }
}

/// How an etcd outage cuts every server off.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// SIGSTOP of every etcd member: etcd hangs, connections stay open.
    Pause,
    /// Every server's etcd proxies black-holed; their clients still reach them.
    Partition,
}

/// An etcd outage inside the budget: half of it (10 s).
const WITHIN_BUDGET: Duration = Duration::from_secs(BUDGET.as_secs() / 2);

/// An etcd outage past the farthest fence a busy server holds (1.5 budgets,
/// 30 s) by a TTL (35 s). An outage of exactly 1.5 budgets could end the
/// moment a server whose fence was raised just before it began reaches that
/// fence, so its stop would not be seen; 5 s more makes every stop certain
/// and leaves seconds of refusals to check.
fn past_budget() -> Duration {
    lead() + TTL
}

/// The earliest a busy server may stop after an outage begins: one budget,
/// less 500 ms. Its fences are raised once they are one budget or less
/// ahead; the raise can lag that moment by one etcd round trip, plus one
/// renewal or namespace check the claim loop may be doing first (a few ms on
/// loopback, tens on 2 busy cores), and the outage start is read after the
/// last member was stopped or proxy cut.
const STOP_NOT_BEFORE: Duration = Duration::from_millis(BUDGET.as_millis() as u64 - 500);

/// How long after its fence a stopped server's refusal is recorded at the
/// latest: no fence is more than 1.5 budgets ahead when the outage begins
/// (nothing can raise it during the outage); the next unary call comes within
/// 50 ms and is answered or times out within 1 s.
const STOP_SEEN_WITHIN: Duration = Duration::from_secs(2);

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
    /// pass) and returns its window. After an etcd outage, every slot must
    /// still run the process it ran before (recovery without a restart).
    pub async fn run(&mut self, fault: Fault) -> FaultWindow {
        if let Some((cut, length, expect)) = fault.outage() {
            let start_ms = self.rec.now_ms();
            println!(
                "[{start_ms:>7} ms] {} ids so far; fault: {}",
                self.rec.id_count(),
                fault.name()
            );
            let pids = self.topo.pids();
            let outage = self.etcd_outage(cut, length, expect).await;
            let heal = vec![self.rec.now_ms(); self.slots()];
            let mut window = self.finish(fault, start_ms, heal, None).await;
            window.outage = Some(outage);
            for (i, slot) in self.topo.slots.iter_mut().enumerate() {
                let p = slot.process.as_mut().expect("slot is running");
                assert!(
                    p.is_running() && p.pid() == pids[i],
                    "slot {i} must recover from {} without a restart (pid {} before)",
                    fault.name(),
                    pids[i]
                );
            }
            return window;
        }
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
                if fault == Fault::KillServerSameId {
                    // A stable instance takes its own machine id back, after
                    // its crashed predecessor's etcd lease and fence (up to
                    // one fence lead ahead): healed once it serves again.
                    self.topo
                        .wait_serving_within(slot, lead() + TTL + Duration::from_secs(30))
                        .await;
                }
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
            Fault::PauseEtcdWithinBudget
            | Fault::PauseEtcdPastBudget
            | Fault::PartitionAllWithinBudget
            | Fault::PartitionAllPastBudget => unreachable!("run as an outage above"),
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
            name: fault.name(),
            start_ms,
            heal_ms,
            end_ms: self.rec.now_ms(),
            zombie,
            outage: None,
        }
    }

    /// Cuts every server off from etcd (`cut`) for `length`, then heals; the
    /// outage's start is when the cut is in place, its heal when the heal
    /// begins. Midway it prints each server's remaining budget (the gauge).
    async fn etcd_outage(&mut self, cut: Cut, length: Duration, expect: Expect) -> Outage {
        let set = |topo: &Topology, on: bool| match cut {
            Cut::Pause if on => topo.etcd.pause(),
            Cut::Pause => topo.etcd.resume(),
            Cut::Partition => {
                for p in topo.slots.iter().flat_map(|s| &s.proxies) {
                    if on {
                        p.blackhole();
                    } else {
                        p.heal();
                    }
                }
            }
        };
        set(&self.topo, true);
        let start = tokio::time::Instant::now();
        let start_ms = self.rec.now_ms();
        let probe = (length / 2).min(Duration::from_secs(20));
        sleep(probe).await;
        let mut left = Vec::new();
        for s in &self.topo.slots {
            left.push(
                s.server()
                    .metric(&format!(
                        "snowkeep_outage_budget_remaining_seconds{{namespace=\"{NAMESPACE}\"}}"
                    ))
                    .await,
            );
        }
        println!(
            "    {:?} into the outage, budget left per slot (s): {left:?}",
            start.elapsed()
        );
        tokio::time::sleep_until(start + length).await;
        let heal_ms = self.rec.now_ms();
        set(&self.topo, false);
        if let Cut::Pause = cut {
            let healed = tokio::time::Instant::now();
            while self.topo.etcd.leader().await.is_none() && healed.elapsed() < TTL {
                sleep(Duration::from_millis(50)).await;
            }
            println!(
                "    etcd names a leader {:?} after SIGCONT",
                healed.elapsed()
            );
        }
        Outage {
            start_ms,
            heal_ms,
            expect,
        }
    }

    fn next_extra(&mut self, kind: &str) -> String {
        self.extra += 1;
        format!("{kind}-{}", self.extra)
    }

    /// Records `calls` NextIds batches of `count` from an extra server.
    async fn take_ids(&self, server: &ServerProcess, holder: &str, calls: u32, count: u32) {
        let source = self.rec.source(&format!("{holder} unary"), holder, None);
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
        // The paused holder, busy, left its fence up to 1.5 budgets ahead:
        // the replacement may wait that out, and serves once its clock is
        // past it.
        let wait = lead() + Duration::from_secs(10);
        let mut args = self.topo.args(&self.topo.etcd.endpoints(), &id);
        args.extend([
            "--machine-id-range".to_owned(),
            range,
            "--max-fence-wait".to_owned(),
            format!("{}s", wait.as_secs()),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut replacement = topology::spawn(&args, &WallClock::Real);
        let waited = replacement
            .wait_serving(wait + Duration::from_secs(20))
            .await;
        println!("    the replacement served after {waited:?}");
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
            let args = self.topo.args(&endpoints, &id);
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
