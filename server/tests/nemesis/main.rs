//! The fault suite: a 3-member etcd cluster, three servers, an embedded
//! generator and checker clients, all real processes on loopback, while a
//! seeded nemesis kills, pauses, partitions and skews them. Every id is
//! checked: no duplicates, no order violation inside a batch or stream, none
//! stamped above a fence its holder persisted, nothing minted by a paused
//! server under its old machine id; every server serves again within the
//! TTL + 2 s of each heal; and through etcd outages every server issues on
//! inside its outage budget, stops at its fence past it, and recovers
//! without a restart.
//!
//! The CI tier (plain `cargo test`) runs every fault once in a seeded order on
//! the default layout, then one fault (a paused holder replaced, then
//! resumed) on a JavaScript-safe namespace (`js53`: 53 bits, 10 ms ticks),
//! where a fence falls inside a tick. `SNOWKEEP_NEMESIS_LAYOUT` runs the
//! first on another layout.
//! The soak tier (`scripts/soak --duration 10m --seed 7`) sets
//! `SNOWKEEP_NEMESIS_DURATION` and keeps drawing faults until it has passed.
//! `SNOWKEEP_NEMESIS_SEED` picks the order and targets; the table of results
//! is printed and written to `SNOWKEEP_NEMESIS_REPORT`
//! (default `target/tmp/nemesis-report.md`).

// A test binary: helpers panic on anything unexpected, like the tests do, and
// the progress and the results table go to the console.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod checker;
mod faults;
mod proxy;
mod topology;
mod workers;

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use snowkeep_client::Layout;
use tokio_util::sync::CancellationToken;

use checker::Recorder;
use faults::{Fault, Nemesis};
use topology::{Topology, NAMESPACE, TTL};

/// Ids the CI tier must check at the least.
const CI_MIN_IDS: u64 = 2_000_000;

/// One suite at a time: each starts an etcd cluster and three servers, and
/// its timing bounds assume the machine is not running another.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fault_makes_two_equal_ids_or_keeps_a_server_down() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let layout: Layout = env("SNOWKEEP_NEMESIS_LAYOUT")
        .as_deref()
        .unwrap_or(snowkeep_server::config::DEFAULT_LAYOUT)
        .parse()
        .expect("SNOWKEEP_NEMESIS_LAYOUT");
    let soak: Option<Duration> = env("SNOWKEEP_NEMESIS_DURATION")
        .map(|d| humantime::parse_duration(&d).expect("SNOWKEEP_NEMESIS_DURATION"));
    run(
        layout,
        env("SNOWKEEP_NEMESIS_ONLY"),
        soak,
        "nemesis-report.md",
    )
    .await;
}

/// The fault slot on a JavaScript-safe namespace: a holder paused past its
/// lease, its machine id taken over, then resumed, with fences that fall
/// inside 10 ms ticks. Skipped when `SNOWKEEP_NEMESIS_ONLY` or a soak asks
/// for a run of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_safe_namespace_keeps_its_ids_unique_through_a_fault() {
    if env("SNOWKEEP_NEMESIS_ONLY").is_some() || env("SNOWKEEP_NEMESIS_DURATION").is_some() {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().await;
    let layout: Layout = "js53".parse().unwrap();
    run(
        layout,
        Some("pause-server".into()),
        None,
        "nemesis-js53-report.md",
    )
    .await;
}

/// Runs the faults `only` names (every fault when `None`) once each in a
/// seeded order on a namespace of `layout`, then, for a `soak`, draws faults
/// until it has passed; checks every id and writes the table to
/// `SNOWKEEP_NEMESIS_REPORT` or `report_name` in the test's temp dir.
async fn run(layout: Layout, only: Option<String>, soak: Option<Duration>, report_name: &str) {
    let seed: u64 = env("SNOWKEEP_NEMESIS_SEED").map_or(1, |s| s.parse().expect("seed"));
    let report = env("SNOWKEEP_NEMESIS_REPORT")
        .unwrap_or_else(|| format!("{}/{report_name}", env!("CARGO_TARGET_TMPDIR")));
    println!("nemesis: seed {seed}, soak {soak:?}, layout {layout}");
    let rec = Arc::new(Recorder::new());
    let stop = CancellationToken::new();
    let topo = Topology::start(layout).await;

    let endpoints: Vec<String> = topo
        .etcd
        .endpoints()
        .split(',')
        .map(str::to_owned)
        .collect();
    let prefix = format!("/snowkeep/v1/ns/{NAMESPACE}/");
    let watcher = tokio::spawn(workers::watch_fences(
        endpoints,
        prefix.clone(),
        rec.clone(),
        // Its own token: it must outlive the clients to see their last fences.
        CancellationToken::new(),
    ));
    let mut clients = Vec::new();
    for i in 0..topo.slots.len() {
        clients.push(tokio::spawn(workers::unary(
            i,
            topo.target(i),
            rec.clone(),
            stop.clone(),
        )));
        clients.push(tokio::spawn(workers::stream(
            i,
            topo.target(i),
            rec.clone(),
            stop.clone(),
        )));
    }
    clients.push(tokio::spawn(workers::embedded(
        topo.embedded_proxy.url(),
        NAMESPACE.to_owned(),
        rec.clone(),
        stop.clone(),
    )));

    let mut rng = StdRng::seed_from_u64(seed);
    let mut schedule: Vec<Fault> = match &only {
        None => Fault::ALL.to_vec(),
        Some(only) => only
            .split(',')
            .map(|k| {
                *Fault::ALL
                    .iter()
                    .find(|f| f.key() == k.trim())
                    .unwrap_or_else(|| panic!("unknown fault {k:?} in SNOWKEEP_NEMESIS_ONLY"))
            })
            .collect(),
    };
    schedule.shuffle(&mut rng);
    let kinds = schedule.clone();
    let mut nemesis = Nemesis::new(topo, rec.clone(), rng, layout);
    tokio::time::sleep(Duration::from_secs(3)).await; // steady state, the table's first row
    let started = tokio::time::Instant::now();
    let mut windows = Vec::new();
    for fault in schedule {
        windows.push(nemesis.run(fault).await);
    }
    if let Some(soak) = soak {
        while started.elapsed() < soak {
            let fault = kinds[nemesis.rng.random_range(0..kinds.len())];
            windows.push(nemesis.run(fault).await);
        }
    }

    stop.cancel();
    for c in clients {
        c.await.unwrap();
    }
    // Every fence must be in the log before ids are held against it.
    let mut etcd = nemesis.topo.etcd.client().await;
    let last = etcd
        .get(
            prefix,
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| kv.mod_revision())
        .max()
        .unwrap_or(0);
    let fences = &rec.fences;
    snowkeep_test_support::eventually(
        "the fence watch to catch up",
        Duration::from_secs(30),
        || async { fences.lock().unwrap().revision >= last },
    )
    .await;
    watcher.abort();

    let verdict = checker::check(&rec, &windows, &layout, nemesis.topo.slots.len());
    let table = verdict.table();
    println!(
        "\nseed {seed}; {} faults; {} sources; fence log: {} events\n\n{table}",
        windows.len(),
        verdict.sources,
        rec.fences.lock().unwrap().events
    );
    for s in &verdict.samples {
        println!("  {s}");
    }
    for r in &verdict.rows {
        for p in &r.outage_problems {
            println!("  outage: {}: {p}", r.fault);
        }
    }
    std::fs::write(
        &report,
        format!("seed {seed}, {} faults\n\n{table}", windows.len()),
    )
    .unwrap();
    println!("report written to {report}");
    // The last process of each slot keeps its log past the run, for a failure.
    for (i, slot) in nemesis.topo.slots.iter().enumerate() {
        if let Some(p) = &slot.process {
            let kept = format!("{}/nemesis-slot{i}.log", env!("CARGO_TARGET_TMPDIR"));
            std::fs::write(&kept, p.log()).unwrap();
            println!("slot {i}'s last server log: {kept}");
        }
    }

    assert_eq!(verdict.total(|r| r.duplicates), 0, "duplicate ids");
    assert_eq!(verdict.total(|r| r.order_violations), 0, "order violations");
    assert_eq!(
        verdict.total(|r| r.fence_violations),
        0,
        "ids above their holder's fence"
    );
    assert_eq!(
        verdict.total(|r| r.zombie_ids),
        0,
        "ids minted by a resumed zombie"
    );
    assert_eq!(
        verdict.total(|r| r.outage_problems.len() as u64),
        0,
        "servers that did not issue through an outage inside the budget or stop at the fence past it"
    );
    let total = verdict.total(|r| r.ids);
    if only.is_none() {
        assert!(total >= CI_MIN_IDS, "only {total} ids checked");
    }
    assert!(total > 0, "no id checked");
    let bound = TTL + Duration::from_secs(2);
    for row in &verdict.rows {
        let recovery = row.max_recovery.unwrap_or(Duration::MAX);
        assert!(
            recovery <= bound,
            "{}: a server took {recovery:?} to serve after the heal (bound {bound:?})",
            row.fault
        );
    }
}
