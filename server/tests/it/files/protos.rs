//! The protos as other languages see them: buf lints them clean under its
//! STANDARD rules and builds them, every file names its package for the
//! common code generators, and Python stubs generated with grpcio-tools call
//! a live server through the example in examples/python/.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};
use snowkeep_client::Layout;

use crate::files::tools::{self, repo};
use snowkeep_test_support::server::ServerProcess;

/// The buf modules of buf.yaml, relative to the repository root.
const MODULES: [&str; 2] = ["proto", "loadtest/proto"];

/// Every `.proto` file under `root`, as a path relative to `root`.
fn protos_under(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "proto") {
                let relative = path.strip_prefix(root).unwrap();
                out.insert(relative.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// Runs `program args` in the repository root; panics with its output when it
/// fails.
fn run(program: &Path, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?} exited with {}:\n{}{}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// "snowkeep" → "Snowkeep", "v1" → "V1".
fn title(part: &str) -> String {
    let mut chars = part.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

#[test]
fn buf_lints_every_proto_clean_and_builds_them_with_each_languages_package() {
    let buf = tools::buf();
    let lint = run(&buf, &["lint"]);
    assert_eq!(
        String::from_utf8_lossy(&lint.stdout),
        "",
        "buf lint reports nothing"
    );
    assert_eq!(String::from_utf8_lossy(&lint.stderr), "");

    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image.json");
    run(
        &buf,
        &[
            "build",
            "--exclude-source-info",
            "-o",
            image.to_str().unwrap(),
        ],
    );
    let image: Value = serde_json::from_slice(&std::fs::read(&image).unwrap()).unwrap();
    let files = image["file"].as_array().expect("files in the image");
    // buf adds the well-known types imported (google/protobuf/descriptor.proto,
    // which google/api/annotations.proto imports) from its own copies.
    let built: BTreeSet<String> = files
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .filter(|name| !name.starts_with("google/protobuf/"))
        .collect();
    // Exactly the protos of both modules: none left out of buf.yaml.
    let on_disk: BTreeSet<String> = MODULES
        .iter()
        .flat_map(|m| protos_under(&repo().join(m)))
        .collect();
    assert_eq!(built, on_disk);
    // snowkeep.v1's four, the floor's, and google/api/{annotations,http}.proto
    // (copied from googleapis for the google.api.http rules).
    assert_eq!(built.len(), 7, "{built:?}");

    // The Go module path is the workspace repository without its scheme.
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let go_module = cargo
        .lines()
        .find_map(|l| l.strip_prefix("repository = "))
        .expect("workspace repository")
        .trim_matches('"')
        .trim_start_matches("https://")
        .to_owned();
    assert_eq!(go_module, "example.invalid/snowkeep");
    for file in files {
        let name = file["name"].as_str().unwrap();
        let package = file["package"].as_str().unwrap();
        if package.starts_with("google.") {
            continue; // googleapis' and protobuf's own packages, not ours
        }
        let parts: Vec<&str> = package.split('.').collect();
        let dir = package.replace('.', "/");
        assert_eq!(Path::new(name).parent().unwrap(), Path::new(&dir), "{name}");
        let stem = Path::new(name).file_stem().unwrap().to_str().unwrap();
        let titled: Vec<String> = parts.iter().map(|p| title(p)).collect();
        // buf's managed-mode default: the initials of the package's parts
        // before its version, padded with X to three letters.
        let mut objc: String = parts[..parts.len() - 1]
            .iter()
            .map(|p| p[..1].to_ascii_uppercase())
            .collect();
        while objc.len() < 3 {
            objc.push('X');
        }
        let php = titled.join("\\");
        let expected = json!({
            "csharpNamespace": titled.join("."),
            "goPackage": format!(
                "{go_module}/gen/go/{dir};{}{}",
                parts[parts.len() - 2],
                parts[parts.len() - 1]
            ),
            "javaMultipleFiles": true,
            "javaOuterClassname": format!("{}Proto", title(stem)),
            "javaPackage": format!("dev.{package}"),
            "objcClassPrefix": objc,
            "phpMetadataNamespace": format!("{php}\\GPBMetadata"),
            "phpNamespace": php,
            "rubyPackage": titled.join("::"),
        });
        assert_eq!(file["options"], expected, "{name}");
    }
    // Spot-check one against the values documented in docs/api.md.
    let id = files
        .iter()
        .find(|f| f["name"] == "snowkeep/v1/id.proto")
        .unwrap();
    assert_eq!(
        id["options"]["goPackage"],
        "example.invalid/snowkeep/gen/go/snowkeep/v1;snowkeepv1"
    );
    assert_eq!(id["options"]["javaPackage"], "dev.snowkeep.v1");
}

/// The ids (carried as JSON strings) at `v[key]`.
fn ids(v: &Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_stubs_generated_with_grpcio_tools_call_a_live_server() {
    let python = tools::python();
    let gen = tempfile::tempdir().unwrap();
    let gen_dir = gen.path().to_str().unwrap().to_owned();
    // Every snowkeep.v1 file, and the standard health service.
    // (google/api/annotations.proto, which they import, comes with the
    // googleapis-common-protos package.)
    let mut protos: Vec<String> = protos_under(&repo().join("proto"))
        .into_iter()
        .filter(|p| p.starts_with("snowkeep/"))
        .map(|p| format!("proto/{p}"))
        .collect();
    assert_eq!(protos.len(), 4, "{protos:?}");
    protos.push("examples/python/proto/grpc_health/v1/health.proto".into());
    let mut args = vec![
        "-m",
        "grpc_tools.protoc",
        "-I",
        "proto",
        "-I",
        "examples/python/proto",
        "--python_out",
        &gen_dir,
        "--grpc_python_out",
        &gen_dir,
    ];
    args.extend(protos.iter().map(String::as_str));
    run(&python, &args);
    for proto in &protos {
        let module = proto
            .trim_start_matches("examples/python/")
            .trim_start_matches("proto/")
            .trim_end_matches(".proto");
        for suffix in ["_pb2.py", "_pb2_grpc.py"] {
            let path: PathBuf = gen.path().join(format!("{module}{suffix}"));
            assert!(path.exists(), "grpcio-tools made no {}", path.display());
        }
    }

    let state = tempfile::tempdir().unwrap();
    let server = ServerProcess::spawn(&["--state-dir", state.path().to_str().unwrap()]);
    server.wait_serving(Duration::from_secs(15)).await;
    let target = format!("127.0.0.1:{}", server.port);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&python)
            .arg("examples/python/snowkeep_example.py")
            .arg(&target)
            .env("PYTHONPATH", &gen_dir)
            .current_dir(repo())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the Python example exited with {}:\n{}{}\nserver log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));

    assert_eq!(
        v["health"],
        json!({
            "": "SERVING",
            "snowkeep.v1.IdService": "SERVING",
            "snowkeep.v1.InfoService": "SERVING",
        })
    );
    let next = ids(&v, "next_ids");
    assert_eq!(next.len(), 5, "{next:?}");
    assert!(next.windows(2).all(|w| w[0] < w[1]), "{next:?}");
    assert_eq!(v["stream_batch_sizes"], json!([1000, 1000, 500]));
    let streamed = ids(&v, "stream_ids");
    assert_eq!(streamed.len(), 2500);
    assert!(streamed.windows(2).all(|w| w[0] < w[1]), "not ascending");
    let all: BTreeSet<u64> = next.iter().chain(&streamed).copied().collect();
    assert_eq!(all.len(), 2505, "an id came back twice");
    assert_eq!(
        v["next_ids_count_0"],
        json!({
            "code": "INVALID_ARGUMENT",
            "details": "count must be between 1 and 100000, got 0",
        })
    );
    assert_eq!(
        v["info"],
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "namespace": "default",
            "store": "single-instance",
            "layout": {
                "timestamp_bits": 41,
                "machine_bits": 12,
                "sequence_bits": 10,
                "epoch_unix_ms": 1_767_225_600_000_u64,
            },
            "held_machine_ids": [0],
        })
    );
    // The server's DecodeId and the Rust layout split the first id alike.
    let decoded = Layout::default().decode(next[0]).unwrap();
    assert_eq!(v["first_id"]["timestamp_ms"], decoded.timestamp.get());
    assert_eq!(v["first_id"]["machine_id"], u64::from(decoded.machine_id.0));
    assert_eq!(v["first_id"]["sequence"], decoded.sequence);
}
