//! The store traits of `snowkeep_core` implemented by this crate's etcd
//! types, each by calling the type's own methods (no change in what they
//! do): [`ClusterState`] by [`StateStore`].

use std::ops::Range;
use std::time::Duration;

use snowkeep_client::Layout;
use snowkeep_core::claim::{Capacity, StoreError};
use snowkeep_core::cluster_state::ClusterState;

use crate::admin::{
    Evicted, ImportError, Imported, MachineIdRow, NamespaceInfo, RequesterRow, StateDocument,
    StateStore,
};

impl ClusterState for StateStore {
    type Namespace = NamespaceInfo;
    type MachineIdRow = MachineIdRow;
    type RequesterRow = RequesterRow;
    type Evicted = Evicted;
    type Document = StateDocument;
    type Imported = Imported;
    type ImportError = ImportError;

    async fn namespaces(&self) -> Result<Vec<NamespaceInfo>, StoreError> {
        StateStore::namespaces(self).await
    }

    async fn machine_ids(&self, namespace: &str) -> Result<Vec<MachineIdRow>, StoreError> {
        StateStore::machine_ids(self, namespace).await
    }

    async fn requesters(&self, namespace: &str) -> Result<Vec<RequesterRow>, StoreError> {
        StateStore::requesters(self, namespace).await
    }

    async fn layout(&self, namespace: &str) -> Result<Layout, StoreError> {
        Ok(self.record(namespace).await?.layout)
    }

    async fn capacity(
        &self,
        namespace: &str,
        layout: &Layout,
    ) -> Result<(Capacity, Range<u32>), StoreError> {
        StateStore::capacity(self, namespace, layout).await
    }

    async fn evict(&self, namespace: &str, machine_id: u16) -> Result<Option<Evicted>, StoreError> {
        StateStore::evict(self, namespace, machine_id).await
    }

    async fn export(&self) -> Result<StateDocument, StoreError> {
        StateStore::export(self).await
    }

    async fn import(
        &self,
        document: &StateDocument,
        replace: bool,
        lead: Duration,
    ) -> Result<Imported, ImportError> {
        StateStore::import(self, document, replace, lead).await
    }
}
