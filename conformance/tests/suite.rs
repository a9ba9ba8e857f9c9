//! The conformance runner: every scenario of `scenarios.json`, for every
//! official client, against real etcd and real snowkeep-server processes,
//! through each client's driver (`conformance/README.md`).
//!
//! `SNOWKEEP_CONFORMANCE_CLIENTS` (comma-separated) limits the clients that
//! run (default: all five); `SNOWKEEP_CONFORMANCE_SCENARIOS` the scenarios.
//! A client left out is reported, never silently passed: each client's test
//! fails when its driver is missing.

// A test harness: it panics on anything unexpected, like the tests do.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

mod suite {
    pub mod checker;
    pub mod cluster;
    pub mod driver;
    pub mod steps;
}

use tokio::time::Instant;

use serde_json::Value;

use suite::cluster::Cluster;
use suite::driver::Driver;

/// One client at a time: each scenario starts its own etcd and servers, and
/// two at once on 2 cores would measure the machine, not the client.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn scenarios() -> Vec<Value> {
    let text = include_str!("../scenarios.json");
    let all: Vec<Value> = serde_json::from_str(text).expect("scenarios.json is JSON");
    let only = std::env::var("SNOWKEEP_CONFORMANCE_SCENARIOS").unwrap_or_default();
    all.into_iter()
        .filter(|s| only.is_empty() || only.split(',').any(|o| s["name"] == o))
        .collect()
}

fn selected(client: &str) -> bool {
    match std::env::var("SNOWKEEP_CONFORMANCE_CLIENTS") {
        Ok(list) if !list.is_empty() => list.split(',').any(|c| c == client),
        _ => true,
    }
}

/// Runs one scenario for `client`: a fresh cluster and driver.
async fn run_scenario(client: &str, scenario: &Value) -> Result<(), String> {
    let mut cluster = Cluster::start(&scenario["cluster"]).await;
    let mut driver = Driver::start(client);
    let mut state = suite::steps::State::new(&cluster).await;
    for (i, step) in scenario["steps"].as_array().unwrap().iter().enumerate() {
        if let Err(e) = suite::steps::run(step, &mut cluster, &mut driver, &mut state).await {
            return Err(format!(
                "step {i} ({step}): {e}\n--- driver log (tail) ---\n{}",
                tail(&driver.log())
            ));
        }
    }
    driver.finish().await
}

fn tail(log: &str) -> &str {
    let start = log.len().saturating_sub(4000);
    let start = (start..log.len())
        .find(|&i| log.is_char_boundary(i))
        .unwrap_or(0);
    &log[start..]
}

/// Builds `client`'s driver and runs every scenario; panics listing every
/// failed scenario (one failure never hides the others).
async fn conforms(client: &str) {
    if !selected(client) {
        eprintln!("conformance: {client} not selected (SNOWKEEP_CONFORMANCE_CLIENTS)");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let built = Instant::now();
    suite::driver::build(client);
    eprintln!(
        "conformance: {client} driver built in {:?}",
        built.elapsed()
    );
    let mut failed = Vec::new();
    // A scenario may name the clients it is for (the embedded generator's
    // are for the clients that have one).
    let all: Vec<Value> = scenarios()
        .into_iter()
        .filter(|s| {
            s["clients"]
                .as_array()
                .is_none_or(|c| c.iter().any(|c| c == client))
        })
        .collect();
    for scenario in &all {
        let name = scenario["name"].as_str().unwrap();
        let start = Instant::now();
        let result = run_scenario(client, scenario).await;
        let verdict = if result.is_ok() { "passed" } else { "FAILED" };
        eprintln!(
            "conformance: {client} {name}: {verdict} in {:?}",
            start.elapsed()
        );
        if let Err(e) = result {
            failed.push(format!("{name}: {e}"));
        }
    }
    eprintln!(
        "conformance: {client}: {} of {} scenarios passed; {} ids checked in this run, 0 duplicates among those recorded",
        all.len() - failed.len(),
        all.len(),
        suite::checker::seen()
    );
    assert!(
        failed.is_empty(),
        "{client}: {} scenarios failed:\n{}",
        failed.len(),
        failed.join("\n\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_conforms() {
    conforms("rust").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_client_conforms() {
    conforms("go").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_java_client_conforms() {
    conforms("java").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_conforms() {
    conforms("typescript").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_conforms() {
    conforms("python").await;
}
