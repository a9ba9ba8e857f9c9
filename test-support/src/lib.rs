//! Test harness of snowkeep's integration tests: real etcd processes and real
//! snowkeep-server processes on free loopback ports, a test PKI, and helpers
//! that read like the behaviour under test. `server/tests/it` and
//! `server/tests/nemesis` use it as a dev-dependency.
//!
//! The crate does not depend on snowkeep-server (the server package
//! dev-depends on it). It spawns the server binary that [`server_binary`]
//! names: `$SNOWKEEP_SERVER_BIN` when set, else the path cargo gives the
//! server package's tests. Tests call no setup function first.

// A test harness: helpers panic on anything unexpected, like the tests do.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

pub mod auth;
pub mod etcd;
pub mod lease;
pub mod pki;
pub mod server;

/// libfaketime's preload library (Debian's `faketime` package, multi-threaded
/// build) for running a server with its wall clock offset; panics naming the
/// package when it is missing.
pub fn libfaketime() -> String {
    let path = format!(
        "/usr/lib/{}-linux-gnu/faketime/libfaketimeMT.so.1",
        std::env::consts::ARCH
    );
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} not found: install Debian's faketime package (scripts/ensure-deps --etcd does)"
    );
    path
}

/// The `snowkeep-server` binary that [`server::ServerProcess`] spawns:
///
/// 1. `$SNOWKEEP_SERVER_BIN`, when set (a test binary run by hand, another
///    build of the server);
/// 2. `$CARGO_BIN_EXE_snowkeep-server`, which `cargo test` (1.94 and later)
///    sets when it runs the server package's tests;
/// 3. `snowkeep-server` in the profile folder above the running test binary
///    (`target/<profile>/deps/it-…` runs `target/<profile>/snowkeep-server`),
///    where cargo builds the package's binaries before its tests.
///
/// Panics naming all three when none exists.
pub fn server_binary() -> PathBuf {
    let from_env = ["SNOWKEEP_SERVER_BIN", "CARGO_BIN_EXE_snowkeep-server"]
        .into_iter()
        .find_map(|name| std::env::var_os(name).filter(|v| !v.is_empty()));
    let path = from_env.map(PathBuf::from).or_else(|| {
        let exe = std::env::current_exe().ok()?;
        let profile = exe.parent()?.parent()?;
        Some(profile.join("snowkeep-server"))
    });
    match path {
        Some(path) if path.exists() => path,
        _ => panic!(
            "no snowkeep-server binary: set SNOWKEEP_SERVER_BIN, or run the tests with \
             `cargo test -p snowkeep-server` (which sets CARGO_BIN_EXE_snowkeep-server and \
             builds target/<profile>/snowkeep-server); looked at {path:?}"
        ),
    }
}

/// How long a server on a fresh etcd may take to serve (a loaded machine
/// runs several test binaries at once).
pub const READY: Duration = Duration::from_secs(20);

/// Returns a TCP port free on 127.0.0.1, never the same twice in this test
/// binary. Ports come from below the kernel's ephemeral range (32768+ on
/// Linux): a port picked from that range can be taken by one of the tests'
/// many outgoing connections before etcd or a server binds it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        20_000 + (std::process::id() % 4_000) as u16,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    loop {
        let port = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(port < 32_000, "ran out of test ports");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Polls `cond` every 20 ms until it is true or `within` passes; returns how
/// long it took, or panics naming `what`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    loop {
        if cond().await {
            return start.elapsed();
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
