//! The scale benchmark's claimer (`snowkeep_server::scale::Claimer`) and its
//! binary, `snowkeep-scale`, against a real etcd: claimers run the
//! production claim loop, get distinct machine ids, release them and take
//! them back; the binary prints one table row and fails on bad arguments.

use std::collections::{HashMap, HashSet};
use std::process::Command;

use clap::Parser;
use snowkeep_core::claim::StoreError;
use snowkeep_server::config::{Args, ServerConfig};
use snowkeep_server::scale::{Claimer, ClaimerError};
use snowkeep_server::ServeError;
use tokio_util::sync::CancellationToken;

use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::READY;

fn config(extra: &[&str]) -> ServerConfig {
    let mut args = vec!["snowkeep-server"];
    args.extend_from_slice(extra);
    ServerConfig::try_from(Args::try_parse_from(args).unwrap()).unwrap()
}

/// Starts one claimer per instance id, waits for every first grant, and
/// returns each instance id's machine id (the claimers keep holding).
async fn claim_all(
    base: &ServerConfig,
    instances: &[&str],
    release: &CancellationToken,
) -> (HashMap<String, u16>, Vec<Claimer>) {
    let mut claimers = Vec::new();
    for instance in instances {
        let mut config = base.clone();
        config.instance_id = (*instance).to_string();
        config.stable_instance = true;
        claimers.push(Claimer::spawn(&config, release.clone()).unwrap());
    }
    let mut ids = HashMap::new();
    for (claimer, instance) in claimers.iter_mut().zip(instances) {
        tokio::time::timeout(READY, claimer.first_grant())
            .await
            .expect("first grant in time")
            .unwrap();
        let generator = &claimer.generators()[0];
        let machine_id = generator.grant().unwrap().machine_id;
        // The generator stamps under the grant the claim loop published.
        let id = generator.next_id().await.unwrap();
        let decoded = generator.layout().decode(id).unwrap();
        assert_eq!(decoded.machine_id, machine_id);
        ids.insert((*instance).to_string(), machine_id.get());
    }
    (ids, claimers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimers_hold_distinct_machine_ids_and_take_them_back_after_release() {
    let etcd = EtcdProcess::start().await;
    let base = config(&[
        "--etcd-endpoints",
        &etcd.endpoint(),
        "--namespace",
        "scale",
        "--lease-ttl",
        "2s",
    ]);
    let mut create = base.clone();
    create.namespace_setup.create = true;
    assert!(
        snowkeep_server::run::setup_namespace(create, CancellationToken::new())
            .await
            .unwrap()
    );
    let instances = ["scale-0", "scale-1", "scale-2", "scale-3", "scale-4"];

    let release = CancellationToken::new();
    let (first, claimers) = claim_all(&base, &instances, &release).await;
    let distinct: HashSet<u16> = first.values().copied().collect();
    assert_eq!(distinct.len(), 5, "machine ids: {first:?}");
    release.cancel();
    for claimer in claimers {
        claimer.join().await.unwrap();
    }
    // Released cleanly: every holder key is gone.
    let mut kv = etcd.client().await;
    let holders = kv
        .get(
            snowkeep_etcd::keys::holder_prefix("scale"),
            Some(snowkeep_etcd::etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(holders.count(), 0);

    // Each stable instance takes back the machine id it released.
    let release = CancellationToken::new();
    let (again, claimers) = claim_all(&base, &instances, &release).await;
    assert_eq!(again, first);
    release.cancel();
    for claimer in claimers {
        claimer.join().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_reports_why_its_claim_loop_stopped() {
    let etcd = EtcdProcess::start().await;
    // No namespace was created: the claim loop ends as a server would.
    let config = config(&["--etcd-endpoints", &etcd.endpoint(), "--namespace", "none"]);
    let mut claimer = Claimer::spawn(&config, CancellationToken::new()).unwrap();
    let err = tokio::time::timeout(READY, claimer.first_grant())
        .await
        .expect("the loop stops in time")
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClaimerError::Stopped(ServeError::Store(StoreError::NamespaceNotCreated { ref namespace, .. })) if namespace == "none"
        ),
        "{err:?}"
    );
    // Without etcd there is nothing to claim in.
    assert!(Claimer::spawn(&self::config(&[]), CancellationToken::new()).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snowkeep_scale_prints_one_row_for_its_claimers() {
    let etcd = EtcdProcess::start().await;
    let endpoint = etcd.endpoint();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_snowkeep-scale"))
            .args(["--claimers", "3", "--window", "1s", "--settle", "0s"])
            .args(["--etcd-metrics", &format!("{endpoint}/metrics")])
            .args(["--etcd-endpoints", &endpoint, "--namespace", "scale"])
            .args(["--lease-ttl", "2s"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let cells: Vec<&str> = lines[2]
        .trim_matches('|')
        .split('|')
        .map(str::trim)
        .collect();
    assert_eq!(cells.len(), 11, "{stdout}");
    assert_eq!(cells[0], "3", "claimers: {stdout}");
    assert_eq!(cells[1], "1", "machine ids each: {stdout}");
    // Holder, fence, fence-count marker, claim record (a stable instance
    // id's) and peer key of each claimer, the namespace record and the
    // namespace's fence count.
    assert_eq!(cells[7], "17", "keys: {stdout}");
    // A fresh claim is two raft proposals: the etcd lease grant and the
    // claim transaction (holder, fence at its first raise's value, marker,
    // claim record and peer key). No write-permission check without etcd
    // credentials, and no first fence raise of its own.
    assert_eq!(cells[3], "2.00", "proposals per fresh claim: {stdout}");
    assert_eq!(cells[10], "0", "failed claims: {stdout}");
}

#[test]
fn snowkeep_scale_refuses_bad_arguments_with_64() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_snowkeep-scale"))
            .args(args)
            .output()
            .unwrap()
    };
    let metrics = ["--etcd-metrics", "http://127.0.0.1:1/metrics"];
    let no_etcd = run(&[&["--claimers", "2"][..], &metrics[..]].concat());
    assert_eq!(no_etcd.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&no_etcd.stderr).contains("give --etcd-endpoints"),
        "{}",
        String::from_utf8_lossy(&no_etcd.stderr)
    );
    let etcd = ["--etcd-endpoints", "http://127.0.0.1:1"];
    let zero = run(&[&["--claimers", "0"][..], &metrics[..], &etcd[..]].concat());
    assert_eq!(zero.status.code(), Some(64));
    let bad_server_flag = run(&[
        &["--claimers", "2", "--lease-ttl", "1s"][..],
        &metrics[..],
        &etcd[..],
    ]
    .concat());
    assert_eq!(bad_server_flag.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad_server_flag.stderr).contains("invalid server flags"));
}
