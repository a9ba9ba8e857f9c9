//! Namespaces of one etcd that can issue equal ids.
//!
//! Ids are unique within one namespace only. Two namespaces with the same bit
//! split (timestamp/machine/sequence bits) whose servers use the same machine
//! ids stamp the same (timestamp, machine id, sequence) fields, so they issue
//! equal ids. Different epochs do not prevent it: one namespace's timestamp
//! field then repeats the other's, shifted in time.
//!
//! At start a server lists the other namespaces of its etcd and warns about
//! each with the same bit split that has used a machine id of its range (has
//! a fence or holder key in it), and sets
//! [`snowkeep_core::metrics::NAMESPACE_OVERLAPS`]. Namespaces on other etcd clusters
//! cannot be seen; docs/operations.md ("Server lifecycle on etcd") says so.

use std::ops::Range;
use std::time::Duration;

use etcd_client::GetOptions;
use snowkeep_client::Layout;
use tracing::{info, warn};

use super::{keys, Endpoints, EtcdStore};
use snowkeep_core::claim::StoreError;
use snowkeep_core::metrics as m;

/// Most namespaces looked at (three small reads each), so a huge etcd
/// cannot make the check run for long.
const MAX_NAMESPACES: usize = 1000;

/// Another namespace whose ids can equal this server's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// Its name.
    pub namespace: String,
    /// Its layout (same bits; the epoch may differ).
    pub layout: Layout,
    /// How many machine ids of this server's range it has used.
    pub machine_ids: u32,
}

/// Finds the namespaces of this server's etcd that overlap its own, on its
/// own copy of the endpoint clients.
#[derive(Clone)]
pub struct OverlapCheck {
    endpoints: Endpoints,
    namespace: String,
    layout: Layout,
    range: Range<u32>,
    timeout: Duration,
}

impl std::fmt::Debug for OverlapCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverlapCheck")
            .field("namespace", &self.namespace)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// A check of this store's namespace against the others of its etcd.
    pub fn overlap_check(&self) -> OverlapCheck {
        OverlapCheck {
            endpoints: self.endpoints.clone(),
            namespace: self.settings.namespace.clone(),
            layout: self.layout,
            range: self.settings.machine_id_range.clone(),
            timeout: self.settings.request_timeout,
        }
    }
}

impl OverlapCheck {
    /// Every other namespace of the etcd with this namespace's bit split that
    /// has a fence or holder key in this server's machine-id range, in name
    /// order (at most `MAX_NAMESPACES` namespaces are looked at).
    pub async fn find(&mut self) -> Result<Vec<Overlap>, StoreError> {
        let root = keys::namespaces_root();
        let end = keys::prefix_end(root);
        let mut from = root.as_bytes().to_vec();
        let mut found = Vec::new();
        for _ in 0..MAX_NAMESPACES {
            // Skip scan: one key per namespace. Every key of namespace N
            // starts with "N/", and "N0" sorts right after all of them.
            let resp = self
                .endpoints
                .call("list namespaces", self.timeout, |mut c| {
                    let (key, range_end) = (from.clone(), end.clone());
                    async move {
                        c.get(
                            key,
                            Some(
                                GetOptions::new()
                                    .with_range(range_end)
                                    .with_keys_only()
                                    .with_limit(1),
                            ),
                        )
                        .await
                    }
                })
                .await?;
            let Some(kv) = resp.kvs().first() else { break };
            let rest = &kv.key()[root.len()..];
            let name_len = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
            let name = String::from_utf8_lossy(&rest[..name_len]).into_owned();
            from = [root.as_bytes(), &rest[..name_len], b"0"].concat();
            if name == self.namespace || name.is_empty() {
                continue;
            }
            if let Some(overlap) = self.compare(&name).await? {
                found.push(overlap);
            }
        }
        Ok(found)
    }

    /// `namespace` as an [`Overlap`] when it has this layout's bits and has
    /// used machine ids of this range.
    async fn compare(&mut self, namespace: &str) -> Result<Option<Overlap>, StoreError> {
        let key = keys::layout(namespace);
        let (kv, _) = self
            .endpoints
            .get_key("read layout", self.timeout, &key)
            .await?;
        // The namespace record (or an older version's plain layout); one
        // that does not parse is left to that namespace's own servers.
        let Some(layout) = kv.and_then(|kv| {
            super::namespace::NamespaceRecord::parse(&key, kv.value())
                .ok()
                .map(|record| record.layout)
        }) else {
            return Ok(None);
        };
        let same_bits = (
            layout.timestamp_bits(),
            layout.machine_bits(),
            layout.sequence_bits(),
        ) == (
            self.layout.timestamp_bits(),
            self.layout.machine_bits(),
            self.layout.sequence_bits(),
        );
        if !same_bits {
            return Ok(None);
        }
        let fences = self.count(&keys::fence_prefix(namespace)).await?;
        let holders = self.count(&keys::holder_prefix(namespace)).await?;
        let machine_ids = fences.max(holders);
        Ok((machine_ids > 0).then(|| Overlap {
            namespace: namespace.to_owned(),
            layout,
            machine_ids,
        }))
    }

    /// Keys `prefix{id:05}` for the ids of this range (count only).
    async fn count(&mut self, prefix: &str) -> Result<u32, StoreError> {
        let start = format!("{prefix}{:05}", self.range.start);
        let end = format!("{prefix}{:05}", self.range.end);
        let count = self
            .endpoints
            .count("count used machine ids", self.timeout, start, end)
            .await?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    /// Runs [`Self::find`] once: logs each overlap at WARN and sets the
    /// gauge. A failed read is logged; the check is advice, never a reason
    /// to stop.
    pub async fn warn_once(mut self) {
        let ns = self.namespace.clone();
        let gauge = metrics::gauge!(m::NAMESPACE_OVERLAPS, "namespace" => ns.clone());
        gauge.set(0.0);
        match self.find().await {
            Ok(found) => {
                for o in &found {
                    warn!(
                        namespace = %ns,
                        other_namespace = %o.namespace,
                        "namespace {:?} on this etcd has the same bit layout ({}) as namespace {:?} ({}) and has used {} of the machine ids of this server's range {}..{}: ids are unique within one namespace only, so these two namespaces can issue equal ids; give them disjoint --machine-id-range values",
                        o.namespace,
                        o.layout,
                        ns,
                        self.layout,
                        o.machine_ids,
                        self.range.start,
                        self.range.end,
                    );
                }
                gauge.set(found.len() as f64);
                info!(namespace = %ns, overlapping = found.len(), "checked the other namespaces of this etcd for machine ids that overlap this server's range");
            }
            Err(e) => {
                warn!(namespace = %ns, error = %snowkeep_core::DisplayChain(&e), "could not check the other namespaces of this etcd for overlapping machine ids")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_skips_past_a_namespace_and_stops_at_the_root_end() {
        assert_eq!(keys::prefix_end("/snowkeep/v1/ns/"), b"/snowkeep/v1/ns0");
        // "a0" sorts after every "a/..." key and before "a0x/...", "b/...".
        assert!(b"a/zzzz".as_slice() < b"a0".as_slice());
        assert!(b"a0".as_slice() <= b"a0x/layout".as_slice());
        assert!(b"a-b/layout".as_slice() < b"a/layout".as_slice());
    }
}
