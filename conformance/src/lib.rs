//! What the Rust driver and the conformance runner share: the canonical names
//! of gRPC codes, ids as JSON, and percentiles.
//!
//! The suite itself is `tests/suite.rs` (the runner) over `scenarios.json`;
//! the contract it checks is `README.md` in this folder.

use serde_json::Value;

/// The canonical name of a gRPC code in upper snake case
/// (`INVALID_ARGUMENT`), as every driver reports it: the client's own.
pub use snowkeep_client::error::code_name;

/// Ids as a JSON array of decimal strings (ids do not fit a JSON number's
/// exact range in every reader).
pub fn ids_json(ids: &[u64]) -> Value {
    Value::Array(ids.iter().map(|i| Value::String(i.to_string())).collect())
}

/// The `q` quantile (0 to 1) of `sorted` values, nearest rank; 0 for none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
