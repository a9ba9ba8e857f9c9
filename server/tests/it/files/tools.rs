//! Paths of the tools the tests run that `scripts/ensure-deps --etcd` installs
//! into folders of the repository rather than system-wide: Python with
//! kubernetes-validate, grpcio and grpcio-tools in a virtual environment at
//! `target/py` (Debian refuses `pip install` into its own Python), and buf at
//! `target/node`. Each helper panics, naming the fix, when its tool is missing.

use std::path::PathBuf;

/// The repository root (this package's parent folder).
pub fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// `<repo>/<relative>` if it exists; otherwise panics saying what installs it.
fn installed(relative: &str, what: &str) -> PathBuf {
    let path = repo().join(relative);
    assert!(
        path.exists(),
        "{} not found: it is {what}. Run scripts/ensure-deps --etcd from the repository root \
         (scripts/test does), which installs it there.",
        path.display()
    );
    path
}

/// The virtual environment's interpreter, `<repo>/target/py/bin/python`.
pub fn python() -> PathBuf {
    installed(
        "target/py/bin/python",
        "the Python of the virtual environment with kubernetes-validate, grpcio and grpcio-tools",
    )
}

/// buf, the protobuf linter and compiler: `<repo>/target/node/node_modules/.bin/buf`.
pub fn buf() -> PathBuf {
    installed(
        "target/node/node_modules/.bin/buf",
        "buf, from the npm package @bufbuild/buf",
    )
}
