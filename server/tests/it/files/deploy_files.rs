//! deploy/ and the repository's own files, read as an operator gets them:
//! the Grafana dashboards pick their datasource, job and cluster from
//! template variables, the alert rules name no scrape job, deploy/README.md states
//! the number of alert rules the rules file holds, and LICENSE is the Apache
//! License 2.0 the crates declare.

use std::process::Command;

use promql_parser::label::MatchOp;
use promql_parser::parser::{Expr, VectorSelector};
use promql_parser::util::{walk_expr, ExprVisitor};

use crate::files::tools::{self, repo};

/// Every vector selector of an expression (a range selector's too).
struct Selectors(Vec<VectorSelector>);

impl ExprVisitor for Selectors {
    type Error = ();
    fn pre_visit(&mut self, e: &Expr) -> Result<bool, ()> {
        match e {
            Expr::VectorSelector(vs) => self.0.push(vs.clone()),
            Expr::MatrixSelector(ms) => self.0.push(ms.vs.clone()),
            _ => {}
        }
        Ok(true)
    }
}

/// The selectors of `expr`, Grafana's interval variable filled in (the
/// other variables are strings PromQL parses as they are).
fn selectors_of(what: &str, expr: &str) -> Vec<VectorSelector> {
    let filled = expr.replace("$__rate_interval", "1m");
    let ast = promql_parser::parser::parse(&filled).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut found = Selectors(Vec::new());
    walk_expr(&mut found, &ast).unwrap();
    assert!(!found.0.is_empty(), "{what}: no selector in {expr}");
    found.0
}

/// Whether `vs` matches label `name` against `value`: with `=~` when
/// `regex`, else with `=`.
fn has_matcher(vs: &VectorSelector, name: &str, regex: bool, value: &str) -> bool {
    vs.matchers.matchers.iter().any(|m| {
        m.name == name
            && m.value == value
            && match m.op {
                MatchOp::Re(_) => regex,
                MatchOp::Equal => !regex,
                _ => false,
            }
    })
}

/// Every `"datasource"` object under `v`, with where it is.
fn datasources<'a>(
    v: &'a serde_json::Value,
    at: &str,
    out: &mut Vec<(String, &'a serde_json::Value)>,
) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map {
                let here = format!("{at}.{k}");
                if k == "datasource" {
                    out.push((here.clone(), child));
                }
                datasources(child, &here, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                datasources(child, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn dashboards() -> Vec<(String, serde_json::Value)> {
    let mut out: Vec<(String, serde_json::Value)> =
        std::fs::read_dir(repo().join("deploy/grafana/dashboards"))
            .unwrap()
            .map(|e| {
                let path = e.unwrap().path();
                let json = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                (
                    path.file_name().unwrap().to_string_lossy().into_owned(),
                    json,
                )
            })
            .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn every_dashboard_takes_its_datasource_job_and_cluster_from_variables() {
    let dashboards = dashboards();
    let names: Vec<&str> = dashboards.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "capacity.json",
            "clocks.json",
            "leases.json",
            "overview.json"
        ]
    );
    let mut queries = 0;
    for (name, json) in &dashboards {
        // The variables, in this order: the datasource first, so the others
        // query the one chosen.
        let vars = json["templating"]["list"].as_array().unwrap();
        let var_names: Vec<&str> = vars.iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert_eq!(
            var_names,
            ["datasource", "job", "cluster", "namespace"],
            "{name}"
        );
        assert_eq!(vars[0]["type"], "datasource", "{name}");
        assert_eq!(vars[0]["query"], "prometheus", "{name}");
        for v in &vars[1..3] {
            assert_eq!(v["type"], "query", "{name}: {v}");
            assert_eq!(v["includeAll"], true, "{name}: {v}");
            // "All" must match series without the label (a Prometheus with
            // no cluster label) as well.
            assert_eq!(v["allValue"], ".*", "{name}: {v}");
        }
        assert_eq!(vars[1]["query"], "label_values(snowkeep_build_info, job)");
        assert_eq!(
            vars[2]["query"],
            "label_values(snowkeep_build_info{job=~\"$job\"}, cluster)"
        );
        // No datasource uid written in: every reference is the variable.
        let mut found = Vec::new();
        datasources(json, name, &mut found);
        assert!(
            found.len() > 10,
            "{name}: {} datasource references",
            found.len()
        );
        for (at, ds) in found {
            assert_eq!(
                ds,
                &serde_json::json!({"type": "prometheus", "uid": "${datasource}"}),
                "{at}"
            );
        }
        // Every selector of every query (the variables' own included)
        // filters on the chosen job and cluster.
        let mut exprs: Vec<(String, String)> = json["panels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| {
                p["targets"].as_array().unwrap().iter().map(move |t| {
                    (
                        format!("{name} / {}", p["title"]),
                        t["expr"].as_str().unwrap().to_owned(),
                    )
                })
            })
            .collect();
        let ns_query = vars[3]["query"].as_str().unwrap();
        let inner = ns_query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(", namespace)"))
            .unwrap();
        exprs.push((format!("{name} / $namespace"), inner.to_owned()));
        for (what, expr) in exprs {
            for vs in selectors_of(&what, &expr) {
                assert!(
                    has_matcher(&vs, "job", true, "$job")
                        && has_matcher(&vs, "cluster", true, "$cluster"),
                    "{what}: {vs} lacks job=~\"$job\" or cluster=~\"$cluster\""
                );
                queries += 1;
            }
        }
    }
    assert!(queries >= 30, "{queries} selectors");
}

/// `path` (YAML, one or more documents) as JSON, through the virtual
/// environment's PyYAML (kubernetes-validate's own dependency).
fn yaml_documents(path: &str) -> Vec<serde_json::Value> {
    let out = Command::new(tools::python())
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
            path,
        ])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{path}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every alert rule of the rules file: name and expression.
fn alert_rules() -> Vec<(String, String)> {
    let docs = yaml_documents("deploy/prometheus/rules/snowkeep.rules.yml");
    docs[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_owned(),
                r["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_alert_rules_name_no_scrape_job_and_find_targets_by_one_label() {
    let rules = alert_rules();
    assert_eq!(rules.len(), 14);
    let mut on_up = Vec::new();
    for (alert, expr) in &rules {
        for vs in selectors_of(alert, expr) {
            assert!(
                vs.matchers.matchers.iter().all(|m| m.name != "job"),
                "{alert}: {vs} selects a scrape job by name"
            );
            if vs.name.as_deref() == Some("up") {
                assert!(
                    has_matcher(&vs, "app_kubernetes_io_name", false, "snowkeep"),
                    "{alert}: {vs}"
                );
                on_up.push(alert.as_str());
            }
        }
    }
    assert_eq!(
        on_up,
        [
            "SnowkeepTargetDown",
            "SnowkeepTargetsAbsent",
            "SnowkeepMetricsAbsent"
        ]
    );
    // The label the rules select is the one the shipped scrape configs set.
    let prometheus = yaml_documents("deploy/prometheus/prometheus.yml");
    let job = &prometheus[0]["scrape_configs"][0];
    for target in job["static_configs"].as_array().unwrap() {
        assert_eq!(target["labels"]["app_kubernetes_io_name"], "snowkeep");
    }
    let monitor = yaml_documents("deploy/kubernetes/servicemonitor.yaml");
    assert_eq!(
        monitor[0]["spec"]["targetLabels"],
        serde_json::json!(["app.kubernetes.io/name"])
    );
    let service = yaml_documents("deploy/kubernetes/service.yaml");
    assert_eq!(
        service[0]["metadata"]["labels"]["app.kubernetes.io/name"],
        "snowkeep"
    );
}

#[test]
fn the_readme_states_the_number_of_alert_rules_the_rules_file_holds() {
    let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
    let (_, after) = readme
        .split_once("- `prometheus/`: the scrape config and ")
        .expect("the README's deploy/prometheus bullet");
    let stated: usize = after
        .split_once(" alert rules")
        .unwrap()
        .0
        .parse()
        .unwrap_or_else(|e| panic!("the README's alert rule count: {e}"));
    assert_eq!(stated, alert_rules().len());
}

#[test]
fn license_is_the_apache_license_2_0_the_crates_declare_and_the_image_carries() {
    let license = std::fs::read_to_string(repo().join("LICENSE")).unwrap();
    assert!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
    );
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
    assert_eq!(license.lines().count(), 202);
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    assert!(cargo.contains("license = \"Apache-2.0\"\n"));
    let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    assert!(dockerfile.contains("COPY LICENSE /usr/share/doc/snowkeep/LICENSE\n"));
}

/// `kustomize build dir` (kustomize v5, the one `scripts/ensure-deps --etcd`
/// builds into target/tools/bin), written to a file in `tmp`; returns its
/// path and its documents.
fn kustomize(dir: &str, tmp: &std::path::Path) -> (String, Vec<serde_json::Value>) {
    let bin = repo().join("target/tools/bin/kustomize");
    let out = Command::new(&bin)
        .args(["build", dir])
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/ensure-deps --etcd)", bin.display()));
    assert!(out.status.success(), "kustomize build {dir}: {out:?}");
    let path = tmp.join(format!("{}.yaml", dir.replace('/', "_")));
    std::fs::write(&path, &out.stdout).unwrap();
    let path = path.to_str().unwrap().to_owned();
    let docs = yaml_documents(&path);
    (path, docs)
}

/// The one resource of `kind` and `name` in `docs`.
fn resource<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    let found: Vec<&serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{kind}/{name}");
    found[0]
}

/// The value of environment variable `name` in `container`, if it sets one.
fn env<'a>(container: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| &e["value"])
}

#[test]
fn every_kubernetes_overlay_renders_valid_manifests_with_one_place_for_the_etcd_endpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let mut endpoints_of = Vec::new();
    for (dir, passed) in [
        ("deploy/kubernetes", 11),
        ("deploy/kubernetes-tls", 11),
        ("deploy/kubernetes-etcd-tls", 11),
    ] {
        let (path, docs) = kustomize(dir, tmp.path());
        // Every resource with a bundled schema passes it strictly (no
        // unknown fields); cert-manager's kinds and the ServiceMonitor are
        // CRDs without one.
        let out = Command::new(tools::python())
            .args(["-m", "kubernetes_validate", "--strict", &path])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{dir}: {text}");
        assert_eq!(
            text.matches(" passed for resource ").count(),
            passed,
            "{dir}: {text}"
        );
        // The servers and the namespace Job take the endpoints and the
        // namespace from the one ConfigMap, and set neither themselves.
        let config = resource(&docs, "ConfigMap", "snowkeep-config");
        let deployment = resource(&docs, "Deployment", "snowkeep");
        let job = resource(&docs, "Job", "snowkeep-create-namespace");
        for workload in [deployment, job] {
            let container = &workload["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(
                container["envFrom"],
                serde_json::json!([{"configMapRef": {"name": "snowkeep-config"}}]),
                "{dir}"
            );
            assert_eq!(env(container, "SNOWKEEP_ETCD_ENDPOINTS"), None, "{dir}");
            assert_eq!(env(container, "SNOWKEEP_NAMESPACE"), None, "{dir}");
        }
        // The servers wait for the Job's namespace instead of exiting 64.
        let server = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            env(server, "SNOWKEEP_WAIT_FOR_NAMESPACE"),
            Some(&serde_json::json!("true")),
            "{dir}"
        );
        // Only snowkeep's pods (servers and the Job) reach etcd's client port.
        let policy = resource(&docs, "NetworkPolicy", "etcd");
        assert_eq!(
            policy["spec"]["podSelector"],
            serde_json::json!({"matchLabels": {"app.kubernetes.io/name": "etcd"}})
        );
        let client_port = &policy["spec"]["ingress"][0];
        assert_eq!(
            client_port["ports"],
            serde_json::json!([{"protocol": "TCP", "port": 2379}])
        );
        assert_eq!(
            client_port["from"][0]["podSelector"]["matchExpressions"][0]["values"],
            serde_json::json!(["snowkeep", "snowkeep-create-namespace"])
        );
        assert_eq!(
            deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
            "snowkeep"
        );
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
            "snowkeep-create-namespace"
        );
        endpoints_of.push((
            dir,
            config["data"]["SNOWKEEP_ETCD_ENDPOINTS"]
                .as_str()
                .unwrap()
                .to_owned(),
            docs,
        ));
    }
    let plain = "http://etcd-0.etcd:2379,http://etcd-1.etcd:2379,http://etcd-2.etcd:2379";
    assert_eq!(endpoints_of[0].1, plain);
    assert_eq!(endpoints_of[1].1, plain);
    assert_eq!(
        endpoints_of[2].1,
        "https://etcd-0.etcd:2379,https://etcd-1.etcd:2379,https://etcd-2.etcd:2379"
    );

    // The etcd-TLS overlay: etcd listens only with TLS, wants client
    // certificates on both ports, and its certificate names every endpoint.
    let docs = &endpoints_of[2].2;
    let etcd = resource(docs, "StatefulSet", "etcd");
    let script = etcd["spec"]["template"]["spec"]["containers"][0]["command"][2]
        .as_str()
        .unwrap();
    assert!(!script.contains("http://"), "{script}");
    for flag in [
        "--listen-client-urls https://0.0.0.0:2379",
        "--listen-peer-urls https://0.0.0.0:2380",
        "--client-cert-auth",
        "--peer-client-cert-auth",
        "--trusted-ca-file /etc/etcd/tls/ca.crt",
        "--peer-trusted-ca-file /etc/etcd/tls/ca.crt",
    ] {
        assert!(script.contains(flag), "{flag}: {script}");
    }
    let member = resource(docs, "Certificate", "etcd-member");
    assert_eq!(member["spec"]["secretName"], "etcd-member-tls");
    let names = member["spec"]["dnsNames"].as_array().unwrap();
    for host in ["etcd-0.etcd", "etcd-1.etcd", "etcd-2.etcd"] {
        assert!(names.contains(&serde_json::json!(host)), "{host}");
    }
    let client = resource(docs, "Certificate", "snowkeep-etcd-client");
    assert_eq!(client["spec"]["secretName"], "snowkeep-etcd-client");
    assert_eq!(
        client["spec"]["usages"],
        serde_json::json!(["digital signature", "key encipherment", "client auth"])
    );
    let server = &resource(docs, "Deployment", "snowkeep")["spec"]["template"]["spec"];
    assert_eq!(
        env(&server["containers"][0], "SNOWKEEP_ETCD_CERT_FILE"),
        Some(&serde_json::json!("/etc/snowkeep/etcd-tls/tls.crt"))
    );
    assert!(server["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["secret"]["secretName"] == "snowkeep-etcd-client"));
}
