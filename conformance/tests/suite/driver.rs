//! One client's driver process: JSON requests in, JSON lines out.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The longest one answer (or progress line) may take: a call's retry budget
/// is 10 s by default, a stream of the suite's largest size well under that.
const ANSWER_WITHIN: Duration = Duration::from_secs(90);

/// The repository whose drivers run: `$SNOWKEEP_CONFORMANCE_ROOT` when set
/// (another checkout's drivers, run by this build of the runner), else this
/// one.
fn root() -> PathBuf {
    match std::env::var_os("SNOWKEEP_CONFORMANCE_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// `conformance/drivers/<client>/<script>`.
pub fn script(client: &str, name: &str) -> PathBuf {
    root().join("conformance/drivers").join(client).join(name)
}

/// What the driver scripts of `client` get beside the environment: for this
/// repository's Rust driver, the binary cargo built for this very test run
/// (`SNOWKEEP_RUST_DRIVER_BIN`), so its build script does not build it
/// again, with `-p snowkeep-conformance`'s own features (20 s and more).
fn driver_env(client: &str) -> Vec<(&'static str, &'static str)> {
    match (client, std::env::var_os("SNOWKEEP_CONFORMANCE_ROOT")) {
        ("rust", None) => vec![(
            "SNOWKEEP_RUST_DRIVER_BIN",
            env!("CARGO_BIN_EXE_snowkeep-conformance-driver"),
        )],
        _ => Vec::new(),
    }
}

/// Runs `conformance/drivers/<client>/build` from the repository root;
/// panics with its output when it fails.
pub fn build(client: &str) {
    let out = std::process::Command::new(script(client, "build"))
        .current_dir(root())
        .envs(driver_env(client))
        .output()
        .unwrap_or_else(|e| panic!("cannot run the {client} driver's build: {e}"));
    assert!(
        out.status.success(),
        "the {client} driver's build failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running driver.
pub struct Driver {
    client: String,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Driver {
    /// Starts `conformance/drivers/<client>/run`, its stderr to a log file.
    pub fn start(client: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("driver.log");
        let mut child = Command::new(script(client, "run"))
            .current_dir(root())
            .envs(driver_env(client))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {client} driver: {e}"));
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            client: client.to_owned(),
            child,
            stdin,
            lines,
            log,
            _dir: dir,
        }
    }

    /// Kills the driver (SIGKILL: a crash, nothing released) and starts a
    /// new one, as a process that dies and is started again.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.child
            .kill()
            .await
            .map_err(|e| format!("cannot kill the {} driver: {e}", self.client))?;
        let client = self.client.clone();
        *self = Self::start(&client);
        Ok(())
    }

    /// What the driver wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends one request.
    pub async fn send(&mut self, request: &Value) -> Result<(), String> {
        let line = format!("{request}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("the driver's stdin: {e}"))
    }

    /// The next line: a progress line or the answer.
    pub async fn line(&mut self) -> Result<Value, String> {
        let line = tokio::time::timeout(ANSWER_WITHIN, self.lines.next_line())
            .await
            .map_err(|_| format!("no answer within {ANSWER_WITHIN:?}"))?
            .map_err(|e| format!("the driver's stdout: {e}"))?
            .ok_or_else(|| "the driver exited without answering".to_owned())?;
        serde_json::from_str(&line).map_err(|e| format!("not JSON ({e}): {line:.300}"))
    }

    /// Ends the driver: closes its stdin and waits for it to exit 0.
    pub async fn finish(mut self) -> Result<(), String> {
        drop(self.stdin);
        match tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await {
            Ok(Ok(s)) if s.success() => Ok(()),
            Ok(Ok(s)) => Err(format!(
                "the driver exited with {s} at the end of its input"
            )),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the driver did not exit within 20 s of the end of its input".into()),
        }
    }
}
