//! snowkeep-core: what a snowkeep server decides, with no etcd, gRPC or
//! HTTP in it. The claim loop runs over the [`claim::ClaimStore`] trait;
//! `snowkeep-etcd` implements it (and the Lease API's requester store) on
//! etcd, [`single_instance`] on a state file, and the claim loop's tests on
//! a double. The crates above this one wire it to the network.
//!
//! | module | owns |
//! | --- | --- |
//! | [`claim`] | the claim lifecycle: `ClaimManager` over the `ClaimStore` seam, the fence lead, the capacity gauges, candidate ranking, `StoreError` |
//! | [`single_instance`] | the single-instance store: one server, its claim in a state file |
//! | [`lease`] | what the Lease API grants and keeps, as data and pure rules: requester records and tokens, the fence rules, the client clock-skew rule, and the `RequesterStore` trait with its conformance clauses |
//! | [`cluster_state`] | the [`cluster_state::ClusterState`] interface the administration service reads and changes the cluster's state through |
//! | [`api_key`] | API keys as data: records, presented keys, verification, scopes, the bootstrap key |
//! | [`namespace`] | namespace names: the rule and its check |
//! | [`batch`] | the bounds of a batch of ids (`MAX_BATCH`, the default stream batch) |
//! | [`metrics`] | the metric catalog: every name, its help and labels, and the recording helpers |
//! | [`text`] | text forms of records and messages: hex, RFC 3339 times |
//!
//! No two of these modules import each other, directly or through others
//! (the workspace's layering test checks it).

pub mod api_key;
pub mod batch;
pub mod claim;
pub mod cluster_state;
pub mod lease;
pub mod metrics;
pub mod namespace;
pub mod single_instance;
pub mod text;

/// Displays an error with its whole source chain: `err: source: source…`.
pub struct DisplayChain<'a>(pub &'a dyn std::error::Error);

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
