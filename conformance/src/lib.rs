//! What the Rust driver and the conformance runner share: the canonical names
//! of gRPC codes, ids as JSON, and percentiles.
//!
//! The suite itself is `tests/suite.rs` (the runner) over `scenarios.json`;
//! the contract it checks is `README.md` in this folder.

use serde_json::Value;

/// The canonical name of a gRPC code in upper snake case
/// (`INVALID_ARGUMENT`), as every driver reports it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

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
