//! Reads about the namespace that live beside the claim loop on their own
//! copy of the endpoint clients: the peer directory (for the peer clock
//! check) and the capacity of this instance's range.

use std::ops::Range;
use std::time::Duration;

use etcd_client::GetOptions;
use snowkeep_client::MachineId;

use super::endpoints::Endpoints;
use super::{keys, EtcdStore};
use snowkeep_core::claim::capacity::CapacitySource;
use snowkeep_core::claim::{Capacity, StoreError};

impl EtcdStore {
    /// The namespace's peer directory, on its own copy of the endpoint clients.
    pub fn peer_directory(&self) -> PeerDirectory {
        PeerDirectory {
            endpoints: self.endpoints.clone(),
            namespace: self.settings.namespace.clone(),
            instance_id: self.settings.instance_id.clone(),
            timeout: self.settings.request_timeout,
        }
    }

    /// A reader of this store's namespace capacity that can live elsewhere
    /// (the InfoService handler), on its own copy of the endpoint clients.
    pub fn capacity_reader(&self) -> CapacityReader {
        CapacityReader {
            endpoints: self.endpoints.clone(),
            namespace: self.settings.namespace.clone(),
            range: self.settings.machine_id_range.clone(),
            timeout: self.settings.request_timeout,
        }
    }
}

/// Lists the other servers registered under a namespace's peer keys.
#[derive(Clone)]
pub struct PeerDirectory {
    endpoints: Endpoints,
    namespace: String,
    instance_id: String,
    timeout: Duration,
}

impl std::fmt::Debug for PeerDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerDirectory")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl PeerDirectory {
    /// `(instance id, host:port)` of every registered server but this one.
    pub async fn others(&mut self) -> Result<Vec<(String, String)>, StoreError> {
        let prefix = keys::peer_prefix(&self.namespace);
        let resp = self
            .endpoints
            .call("list peers", self.timeout, |mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let instance = kv.key_str().ok()?.strip_prefix(&prefix)?.to_owned();
                let address = kv.value_str().ok()?.to_owned();
                (instance != self.instance_id).then_some((instance, address))
            })
            .collect())
    }
}

/// Counts the holders of a namespace range with one count-only range read.
#[derive(Clone)]
pub struct CapacityReader {
    pub(super) endpoints: Endpoints,
    pub(super) namespace: String,
    pub(super) range: Range<u32>,
    pub(super) timeout: Duration,
}

impl std::fmt::Debug for CapacityReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacityReader")
            .field("namespace", &self.namespace)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

impl CapacityReader {
    /// The range `[start, end)` counted.
    pub fn range(&self) -> Range<u32> {
        self.range.clone()
    }

    /// Counts the machine ids of the range that have a holder.
    pub async fn read(&mut self) -> Result<Capacity, StoreError> {
        let start = keys::holder(
            &self.namespace,
            MachineId(u16::try_from(self.range.start).unwrap_or(u16::MAX)),
        );
        let end = keys::holder_range_end(&self.namespace, self.range.end);
        let count = self
            .endpoints
            .count("count holders", self.timeout, start, end)
            .await?;
        let total = self.range.end - self.range.start;
        let held = u32::try_from(count).unwrap_or(u32::MAX).min(total);
        Ok(Capacity { total, held })
    }
}

impl CapacitySource for CapacityReader {
    async fn read(&mut self) -> Result<Capacity, StoreError> {
        CapacityReader::read(self).await
    }
}
