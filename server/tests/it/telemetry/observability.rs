//! The metrics catalog against live servers, clock-skew telemetry, and the
//! deploy/ files: every dashboard query and alert rule parses and names only
//! catalog metrics, promtool and amtool accept the rules, their unit tests
//! and the Alertmanager example, the YAML is valid, and a real Prometheus
//! scraping two live servers evaluates a dashboard query and an alert.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use promql_parser::parser::Expr;
use promql_parser::util::{walk_expr, ExprVisitor};
use snowkeep_client::{Clock, SystemClock};
use snowkeep_proto::v1 as pb;
use snowkeep_server::metrics::CATALOG;

use crate::files::tools::{self, repo};
use snowkeep_test_support::etcd::EtcdProcess;
use snowkeep_test_support::server::{scrape, ServerProcess};
use snowkeep_test_support::{eventually, free_port, libfaketime};

/// `name → type` of every `snowkeep_` family in a scrape, from its `# TYPE`
/// lines; panics on a family without `# HELP`.
fn families(scrape: &str) -> BTreeMap<String, String> {
    let helped: BTreeSet<&str> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| name.starts_with("snowkeep_"))
        .map(|(name, kind)| {
            assert!(helped.contains(name), "{name} has no # HELP");
            (name.to_owned(), kind.to_owned())
        })
        .collect()
}

fn catalog() -> BTreeMap<String, String> {
    CATALOG
        .iter()
        .map(|(n, k)| ((*n).to_owned(), (*k).to_owned()))
        .collect()
}

/// Starts a server that waits out its first fence, issues by unary (with a
/// client time) and stream, and checks its peer's clock every second.
async fn busy_server(etcd: &EtcdProcess, ns: &str) -> ServerProcess {
    let s = ServerProcess::on_etcd(&etcd.endpoint(), ns, &["--peer-skew-interval", "1s"]);
    s.wait_serving(Duration::from_secs(20)).await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_scrape_holds_exactly_the_catalog_and_promtool_accepts_it() {
    let etcd = EtcdProcess::start().await;
    let a = busy_server(&etcd, "catalog").await;
    let _b = busy_server(&etcd, "catalog").await;
    let mut ids = a.ids().await;
    let client_time = SystemClock.unix_ms() - 1_000;
    ids.next_ids(pb::NextIdsRequest {
        count: 5_000,
        client_time_unix_ms: client_time,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = ids
        .stream_ids(pb::StreamIdsRequest {
            total: 3_000,
            batch_size: 1_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while stream.message().await.unwrap().is_some() {}
    // A Lease API Acquire: one audit event, so the audit counter has a series.
    let who = snowkeep_test_support::lease::requester(client_time);
    let grant = snowkeep_test_support::lease::lease_client(&a)
        .await
        .acquire(snowkeep_test_support::lease::acquire(
            "catalog",
            &who,
            1,
            Some(client_time),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grant.machine_ids.len(), 1);
    // A renewal (TTL 2 s) and a peer measurement (every 1 s) have happened.
    let port = a.metrics_port;
    eventually(
        "a renewal and a peer clock check",
        Duration::from_secs(10),
        || async move {
            let s = scrape(port).await;
            s.contains("snowkeep_lease_renewal_duration_seconds_count")
                && s.contains(
                    "snowkeep_clock_skew_seconds_count{namespace=\"catalog\",source=\"peer\"}",
                )
        },
    )
    .await;
    let text = scrape(a.metrics_port).await;
    let mut plaintext = catalog();
    for name in snowkeep_server::metrics::TLS_ONLY {
        plaintext.remove(*name);
    }
    assert_eq!(families(&text), plaintext, "scrape families vs the catalog");
    // Every label a dashboard query filters on is on the series it selects:
    // a filter on a missing label leaves the panel empty. `job` and
    // `cluster` are target labels Prometheus adds (`cluster` where it is
    // configured; the dashboards' "All" is `.*`, which matches it missing).
    for (what, names) in dashboard_selectors() {
        for (name, labels) in names {
            let series: Vec<&str> = text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .filter(|l| l.split(['{', ' ']).next() == Some(name.as_str()))
                .collect();
            assert!(!series.is_empty(), "{what}: no {name} series in the scrape");
            for label in labels
                .iter()
                .filter(|l| !["__name__", "job", "cluster"].contains(&l.as_str()))
            {
                assert!(
                    series.iter().all(|l| l.contains(&format!("{label}=\""))),
                    "{what}: {name} has no label {label}: {series:?}"
                );
            }
        }
    }

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/ensure-deps --etcd installs it)");
    use std::io::Write;
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_time_on_next_ids_lands_in_the_skew_histogram_buckets() {
    let etcd = EtcdProcess::start().await;
    let s = ServerProcess::on_etcd(&etcd.endpoint(), "skew", &[]);
    s.wait_serving(Duration::from_secs(20)).await;
    // 400 s behind: above half the default threshold (300 s), below it (600 s).
    let client_time = SystemClock.unix_ms() - 400_000;
    let resp = s
        .ids()
        .await
        .next_ids(pb::NextIdsRequest {
            count: 3,
            client_time_unix_ms: client_time,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(resp.into_inner().ids.len(), 3, "skew never refuses NextIds");
    let series = |le: &str| {
        format!("snowkeep_clock_skew_seconds_bucket{{namespace=\"skew\",source=\"caller\",le=\"{le}\"}}")
    };
    assert_eq!(s.metric(&series("300")).await, 0.0);
    assert_eq!(s.metric(&series("600")).await, 1.0);
    assert_eq!(
        s.metric("snowkeep_clock_skew_seconds_count{namespace=\"skew\",source=\"caller\"}")
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_two_seconds_ahead_shows_in_both_servers_peer_offset() {
    let etcd = EtcdProcess::start().await;
    let args = [
        "--etcd-endpoints",
        &etcd.endpoint(),
        "--namespace",
        "peers",
        "--create-namespace",
        "--lease-ttl",
        "2s",
        "--peer-skew-interval",
        "1s",
    ];
    let real = ServerProcess::spawn(&args);
    let lib = libfaketime();
    let ahead = ServerProcess::spawn_env(
        &args,
        &[
            ("LD_PRELOAD", &lib),
            ("FAKETIME", "+2"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    real.wait_serving(Duration::from_secs(20)).await;
    ahead.wait_serving(Duration::from_secs(20)).await;
    for s in [&real, &ahead] {
        let port = s.metrics_port;
        eventually(
            "a 2 s peer offset",
            Duration::from_secs(15),
            || async move {
                let v = scrape(port)
                    .await
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix(
                            "snowkeep_peer_clock_offset_max_seconds{namespace=\"peers\"} ",
                        )
                        .and_then(|v| v.parse::<f64>().ok())
                    })
                    .unwrap_or(0.0);
                (1.8..2.2).contains(&v)
            },
        )
        .await;
    }
    assert!(
        real.log()
            .contains("clock offset to a peer server is over the threshold"),
        "no warning logged:\n{}",
        real.log()
    );
}

/// Collects the metric names an expression selects, with the labels each
/// selector matches on.
struct Names(BTreeMap<String, BTreeSet<String>>);

impl ExprVisitor for Names {
    type Error = ();
    fn pre_visit(&mut self, e: &Expr) -> Result<bool, ()> {
        let vs = match e {
            Expr::VectorSelector(vs) => vs,
            Expr::MatrixSelector(ms) => &ms.vs,
            _ => return Ok(true),
        };
        if let Some(name) = &vs.name {
            self.0
                .entry(name.clone())
                .or_default()
                .extend(vs.matchers.matchers.iter().map(|m| m.name.clone()));
        }
        Ok(true)
    }
}

/// The metrics (and the labels matched on them) that every dashboard query
/// selects, Grafana's variables filled in.
fn dashboard_selectors() -> Vec<(String, BTreeMap<String, BTreeSet<String>>)> {
    let dir = repo().join("deploy/grafana/dashboards");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for panel in json["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let what = format!("{} / {}", path.display(), panel["title"]);
                let expr = target["expr"].as_str().unwrap();
                out.push((what.clone(), selectors(&what, expr)));
            }
        }
    }
    out
}

fn selectors(what: &str, expr: &str) -> BTreeMap<String, BTreeSet<String>> {
    let expr = expr
        .replace("$__rate_interval", "1m")
        .replace("$namespace", ".*")
        .replace("$job", ".*")
        .replace("$cluster", ".*");
    let ast = promql_parser::parser::parse(&expr).unwrap_or_else(|e| panic!("{what}: {e}\n{expr}"));
    let mut names = Names(BTreeMap::new());
    walk_expr(&mut names, &ast).unwrap();
    names.0
}

/// Parses `expr` (with Grafana's variables filled in) and checks that every
/// metric it names is in the catalog (a histogram's `_bucket`, `_count` and
/// `_sum` series included).
fn check_names(what: &str, expr: &str) {
    assert_in_catalog(&format!("{what}: {expr}"), &selectors(what, expr));
}

/// Asserts `names` (from one query) is not empty and holds catalog metrics only.
fn assert_in_catalog(what: &str, names: &BTreeMap<String, BTreeSet<String>>) {
    assert!(!names.is_empty(), "{what} names no metric");
    let cat = catalog();
    for n in names.keys() {
        assert!(
            cat.contains_key(base_name(n)),
            "{what} names {n}, which is not in the catalog"
        );
    }
}

/// The catalog name of a series name (a histogram's `_bucket`, `_count` and
/// `_sum` stripped).
fn base_name(n: &str) -> &str {
    let cat = catalog();
    ["_bucket", "_count", "_sum"]
        .iter()
        .find_map(|s| {
            n.strip_suffix(s)
                .filter(|b| cat.get(*b).is_some_and(|k| k == "histogram"))
        })
        .unwrap_or(n)
}

#[test]
fn every_dashboard_query_and_alert_parses_and_names_only_catalog_metrics() {
    let queries = dashboard_selectors();
    let dashboards: BTreeSet<&str> = queries
        .iter()
        .map(|(what, _)| what.split(" / ").next().unwrap())
        .collect();
    assert_eq!(dashboards.len(), 4, "overview, leases, capacity, clocks");
    assert!(queries.len() >= 24, "{} queries", queries.len());
    for (what, names) in &queries {
        assert_in_catalog(what, names);
    }
    // The rule file: promtool parses its expressions (test below); here every
    // metric name in it must be a catalog one.
    let rules =
        std::fs::read_to_string(repo().join("deploy/prometheus/rules/snowkeep.rules.yml")).unwrap();
    let alerts = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let mut names = 0;
    for (i, _) in rules.match_indices("snowkeep_") {
        let name: String = rules[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        check_names("the alert rules", &name);
        names += 1;
    }
    assert!(names >= 13, "{names} metric names in the rules");
    assert_eq!(alerts, 14);
}

/// Runs `program` in the repository root and returns its output; panics when
/// it is missing (naming what installs it) or fails.
fn run_ok(program: impl AsRef<OsStr>, args: &[&str], package: &str) -> String {
    let program = program.as_ref();
    let shown = program.to_string_lossy();
    let out = Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| {
            panic!("{shown}: {e} ({package}; scripts/ensure-deps --etcd installs it)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{shown} {args:?} failed:\n{text}");
    text
}

#[test]
fn promtool_checks_and_tests_every_rule_and_amtool_the_alertmanager_example() {
    let out = run_ok(
        "promtool",
        &[
            "check",
            "rules",
            "deploy/prometheus/rules/snowkeep.rules.yml",
        ],
        "Debian package prometheus",
    );
    assert!(out.contains("SUCCESS: 14 rules found"), "{out}");
    let out = run_ok(
        "promtool",
        &["test", "rules", "deploy/prometheus/tests/snowkeep.test.yml"],
        "Debian package prometheus",
    );
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert has at least one unit test case.
    let tests =
        std::fs::read_to_string(repo().join("deploy/prometheus/tests/snowkeep.test.yml")).unwrap();
    let rules =
        std::fs::read_to_string(repo().join("deploy/prometheus/rules/snowkeep.rules.yml")).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "no promtool test for {alert}"
        );
    }
    run_ok(
        "promtool",
        &[
            "check",
            "config",
            "--syntax-only",
            "deploy/prometheus/prometheus.yml",
        ],
        "Debian package prometheus",
    );
    let out = run_ok(
        "amtool",
        &["check-config", "deploy/prometheus/alertmanager.yml"],
        "Debian package prometheus-alertmanager",
    );
    assert!(out.contains("SUCCESS"), "{out}");
    assert!(out.contains("2 receivers"), "{out}");
}

#[test]
fn every_yaml_file_under_deploy_is_valid() {
    run_ok(
        "yamllint",
        &["--strict", "-c", "deploy/.yamllint", "deploy"],
        "Debian package yamllint",
    );
    // The kustomization lists exactly the manifests beside it.
    let dir = repo().join("deploy/kubernetes");
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let listed: BTreeSet<String> = kustomization
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter(|l| l.ends_with(".yaml"))
        .map(str::to_owned)
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present);
    // Each manifest against the Kubernetes API schemas (strict: no unknown
    // fields). The ServiceMonitor is a CRD without a bundled schema.
    let files: Vec<String> = present
        .iter()
        .map(|f| format!("deploy/kubernetes/{f}"))
        .collect();
    let mut args = vec!["-m", "kubernetes_validate", "--strict"];
    args.extend(files.iter().map(String::as_str));
    // Debian's own python3 refuses `pip install`: kubernetes-validate lives
    // in the virtual environment that scripts/ensure-deps makes.
    let out = run_ok(
        tools::python(),
        &args,
        "kubernetes-validate in the virtual environment target/py",
    );
    assert_eq!(out.matches(" passed for resource ").count(), 11, "{out}");

    // The TLS overlay: its kustomization names exactly the files beside it
    // (resources and the Deployment patch), and the patch is itself a valid
    // Deployment (cert-manager's kinds are CRDs without a bundled schema).
    let dir = repo().join("deploy/kubernetes-tls");
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let mut listed: BTreeSet<String> = kustomization
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("- path: ").or_else(|| l.strip_prefix("- "))
        })
        .filter(|l| l.ends_with(".yaml"))
        .map(str::to_owned)
        .collect();
    assert!(
        kustomization.contains("  - ../kubernetes\n"),
        "{kustomization}"
    );
    listed.insert("kustomization.yaml".into());
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, present);
    let out = run_ok(
        tools::python(),
        &[
            "-m",
            "kubernetes_validate",
            "--strict",
            "deploy/kubernetes-tls/snowkeep-tls.yaml",
            "deploy/kubernetes-tls/certificate.yaml",
        ],
        "kubernetes-validate in the virtual environment target/py",
    );
    assert_eq!(out.matches(" passed for resource ").count(), 1, "{out}");
    let patch = std::fs::read_to_string(dir.join("snowkeep-tls.yaml")).unwrap();
    assert_eq!(patch.matches("grpc: null").count(), 3, "{patch}");
    assert_eq!(
        patch
            .matches("- --endpoint=https://127.0.0.1:50051\n")
            .count(),
        3,
        "{patch}"
    );
}

/// The GitHub anchor of a Markdown heading's text: lower case, spaces to `-`,
/// every other character but letters, digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The `runbook_base` external label of deploy/prometheus/prometheus.yml: the
/// one setting every alert's runbook link starts with.
fn runbook_base() -> String {
    let config = std::fs::read_to_string(repo().join("deploy/prometheus/prometheus.yml")).unwrap();
    let bases: Vec<&str> = config
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_base: "))
        .collect();
    assert_eq!(
        bases.len(),
        1,
        "one runbook_base in prometheus.yml: {bases:?}"
    );
    bases[0].trim_matches('"').to_owned()
}

#[test]
fn every_alert_links_its_own_runbook_heading_through_the_one_runbook_base() {
    // The base is absolute: the repository's docs/operations.md.
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let repository = cargo
        .lines()
        .find_map(|l| l.strip_prefix("repository = "))
        .expect("workspace repository")
        .trim_matches('"');
    let base = runbook_base();
    assert_eq!(base, format!("{repository}/blob/main/docs/operations.md"));
    assert!(base.starts_with("https://"), "{base}");

    let runbook = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    // Each alert, with every runbook_url between its `- alert:` and the next.
    let rules =
        std::fs::read_to_string(repo().join("deploy/prometheus/rules/snowkeep.rules.yml")).unwrap();
    let mut links: Vec<(String, Vec<String>)> = Vec::new();
    for line in rules.lines().map(str::trim) {
        if let Some(alert) = line.strip_prefix("- alert: ") {
            links.push((alert.to_owned(), Vec::new()));
        } else if let Some(url) = line.strip_prefix("runbook_url: ") {
            links
                .last_mut()
                .expect("a runbook_url before the first alert")
                .1
                .push(url.trim_matches('"').to_owned());
        }
    }
    assert_eq!(links.len(), 14);
    for (alert, urls) in &links {
        assert_eq!(urls.len(), 1, "{alert} has {} runbook_url", urls.len());
        let fragment = urls[0]
            .strip_prefix("{{ $externalLabels.runbook_base }}#")
            .unwrap_or_else(|| {
                panic!(
                    "{alert}'s runbook_url does not start with runbook_base: {}",
                    urls[0]
                )
            });
        assert_eq!(fragment, alert.to_lowercase(), "{alert}'s anchor");
        assert!(
            anchors.contains(fragment),
            "{alert}: docs/operations.md has no heading with anchor #{fragment}"
        );
        assert!(
            runbook.contains(&format!("\n### {alert}\n")),
            "docs/operations.md has no section ### {alert}"
        );
    }
    // The promtool cases render the links with that same base, so their
    // expected runbook_url values are exactly what an operator is sent.
    let tests =
        std::fs::read_to_string(repo().join("deploy/prometheus/tests/snowkeep.test.yml")).unwrap();
    let groups = tests
        .lines()
        .filter(|l| l.starts_with("  - name: "))
        .count();
    let labelled = tests
        .lines()
        .filter(|l| l.trim() == format!("external_labels: {{ runbook_base: \"{base}\" }}"))
        .count();
    assert_eq!(
        labelled, groups,
        "every promtool group sets runbook_base to {base}"
    );
    let expected: Vec<&str> = tests
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .collect();
    assert!(expected.len() >= 12, "{expected:?}");
    for url in expected {
        assert!(url.starts_with(&format!("\"{base}#")), "{url}");
    }
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn query(port: u16, expr: &str) -> serde_json::Value {
    let url = format!("http://127.0.0.1:{port}/api/v1/query");
    let expr = expr.to_owned();
    tokio::task::spawn_blocking(move || {
        ureq::get(&url)
            .query("query", &expr)
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_json::<serde_json::Value>().ok())
            .unwrap_or(serde_json::Value::Null)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scraping_two_servers_evaluates_a_dashboard_query_and_an_alert() {
    let etcd = EtcdProcess::start().await;
    // A range of two machine ids held by two servers: no free capacity.
    let extra = ["--machine-id-range", "0..2"];
    let a = ServerProcess::on_etcd(&etcd.endpoint(), "prom", &extra);
    let b = ServerProcess::on_etcd(&etcd.endpoint(), "prom", &extra);
    a.wait_serving(Duration::from_secs(20)).await;
    b.wait_serving(Duration::from_secs(20)).await;

    let dir = tempfile::tempdir().unwrap();
    let rules = repo().join("deploy/prometheus/rules/snowkeep.rules.yml");
    let base = runbook_base();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  external_labels:\n    runbook_base: {base}\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: ids-test\n    static_configs:\n      - targets: ['127.0.0.1:{}', '127.0.0.1:{}']\n        labels:\n          app_kubernetes_io_name: snowkeep\n",
        rules.canonicalize().unwrap().display(),
        a.metrics_port,
        b.metrics_port
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let _prom = Prometheus(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (Debian's prometheus package)"),
    );

    // The overview dashboard's "Ready instances" query, as Grafana sends it.
    let overview: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo().join("deploy/grafana/dashboards/overview.json")).unwrap(),
    )
    .unwrap();
    let ready = overview["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == "Ready instances")
        .unwrap()["targets"][0]["expr"]
        .as_str()
        .unwrap()
        .replace("$namespace", ".*")
        .replace("$job", ".*")
        .replace("$cluster", ".*");
    eventually(
        "Prometheus to see two ready servers",
        Duration::from_secs(60),
        || {
            let ready = ready.clone();
            async move {
                let v = query(port, &ready).await;
                v["data"]["result"][0]["metric"]["namespace"] == "prom"
                    && v["data"]["result"][0]["value"][1] == "2"
            }
        },
    )
    .await;

    // The capacity alert's rule, evaluated by Prometheus itself: pending
    // (its `for` is 5 m) with the namespace's label and a 0 free share.
    eventually(
        "SnowkeepCapacityLow pending",
        Duration::from_secs(30),
        || async move {
            let v = query(port, "ALERTS{alertname=\"SnowkeepCapacityLow\"}").await;
            let r = &v["data"]["result"][0]["metric"];
            r["alertstate"] == "pending" && r["namespace"] == "prom" && r["severity"] == "warning"
        },
    )
    .await;
    // And not for a namespace with room. The same evaluation found both
    // targets up and exposing snowkeep's metrics.
    for alert in [
        "SnowkeepIssuanceNotReady",
        "SnowkeepTargetDown",
        "SnowkeepTargetsAbsent",
        "SnowkeepMetricsAbsent",
    ] {
        let v = query(port, &format!("ALERTS{{alertname=\"{alert}\"}}")).await;
        assert_eq!(v["data"]["result"], serde_json::json!([]), "{alert}: {v}");
    }

    // kill -9 one server: its target goes down and SnowkeepTargetDown goes
    // pending for it alone (it fires after its `for`, 1 m; the promtool case
    // covers that), with the runbook link built from runbook_base.
    b.signal("KILL");
    let down = format!("127.0.0.1:{}", b.metrics_port);
    let alerts = format!("http://127.0.0.1:{port}/api/v1/alerts");
    let target_down = || {
        let alerts = alerts.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                ureq::get(&alerts)
                    .call()
                    .ok()
                    .and_then(|mut r| r.body_mut().read_json::<serde_json::Value>().ok())
                    .unwrap_or(serde_json::Value::Null)
            })
            .await
            .unwrap()["data"]["alerts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| a["labels"]["alertname"] == "SnowkeepTargetDown")
                .cloned()
                .collect::<Vec<serde_json::Value>>()
        }
    };
    eventually(
        "SnowkeepTargetDown pending for the killed server",
        Duration::from_secs(30),
        || async { !target_down().await.is_empty() },
    )
    .await;
    let pending = target_down().await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    let alert = &pending[0];
    assert_eq!(alert["state"], "pending", "{alert}");
    assert_eq!(alert["labels"]["instance"], down.as_str(), "{alert}");
    // A job of any name: the rules find the target by its label.
    assert_eq!(alert["labels"]["job"], "ids-test", "{alert}");
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    assert_eq!(
        alert["annotations"]["runbook_url"],
        format!("{base}#snowkeeptargetdown").as_str(),
        "{alert}"
    );
}

mod otlp {
    use std::sync::{Arc, Mutex};

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };

    /// An OTLP trace receiver keeping `(service.name, span name)` pairs.
    #[derive(Clone, Default)]
    pub struct Collector(pub Arc<Mutex<Vec<(String, String)>>>);

    #[tonic::async_trait]
    impl TraceService for Collector {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let mut seen = self.0.lock().unwrap();
            for rs in request.into_inner().resource_spans {
                let service = rs
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|a| a.key == "service.name")
                    .and_then(|a| a.value.as_ref())
                    .map(|v| format!("{:?}", v.value))
                    .unwrap_or_default();
                for ss in rs.scope_spans {
                    for span in ss.spans {
                        seen.push((service.clone(), span.name));
                    }
                }
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// Serves the collector on `port`.
    pub fn serve(collector: Collector, port: u16) {
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector))
                .serve(([127, 0, 0, 1], port).into()),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_otlp_endpoint_every_call_is_exported_as_a_span() {
    let collector = otlp::Collector::default();
    let port = free_port();
    otlp::serve(collector.clone(), port);
    let etcd = EtcdProcess::start().await;
    let endpoint = format!("http://127.0.0.1:{port}");
    let s = ServerProcess::on_etcd(&etcd.endpoint(), "traces", &["--otlp-endpoint", &endpoint]);
    s.wait_serving(Duration::from_secs(20)).await;
    for _ in 0..3 {
        s.next_ids(10).await.unwrap();
    }
    let seen = collector.0.clone();
    // The batch processor exports every 5 s by default.
    eventually(
        "three NextIds spans at the collector",
        Duration::from_secs(15),
        || {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .iter()
                    .filter(|(svc, name)| {
                        svc.contains("snowkeep-server") && name == "/snowkeep.v1.IdService/NextIds"
                    })
                    .count()
                    == 3
            }
        },
    )
    .await;
}
