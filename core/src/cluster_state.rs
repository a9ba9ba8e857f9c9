//! [`ClusterState`]: what the administration service (the server's
//! `AdminService` handler) reads and changes of a cluster's state, as a
//! trait, so the handler runs on etcd (`snowkeep_etcd::admin::StateStore`
//! implements it) and, in its unit tests, on a double.
//!
//! The store names its own rows, document and import outcome (associated
//! types): they are the store's data, which this crate does not define;
//! the handler turns them into protobuf messages.

use std::future::Future;
use std::ops::Range;
use std::time::Duration;

use snowkeep_client::Layout;

use crate::claim::{Capacity, StoreError};

/// The cluster's state as the administration service sees it: namespaces,
/// machine ids, requesters, eviction, export and import. Reads and
/// evictions fail with [`StoreError`]s (the handler maps them to gRPC
/// statuses); an import fails with the store's own
/// [`ClusterState::ImportError`].
pub trait ClusterState: Clone + Send + Sync + 'static {
    /// One namespace as listed.
    type Namespace: Send;
    /// One machine id with a holder or a fence.
    type MachineIdRow: Send;
    /// One Lease API requester.
    type RequesterRow: Send;
    /// What an eviction did.
    type Evicted: Send;
    /// The state document: what an export writes and an import reads.
    type Document: Send + Sync;
    /// What an import wrote.
    type Imported: Send;
    /// Why an import was refused.
    type ImportError: Send;

    /// Every namespace with a record, by name.
    fn namespaces(&self) -> impl Future<Output = Result<Vec<Self::Namespace>, StoreError>> + Send;

    /// The machine ids of `namespace` with a holder or a fence, by id;
    /// [`StoreError::UnknownNamespace`] for a namespace without a record.
    fn machine_ids(
        &self,
        namespace: &str,
    ) -> impl Future<Output = Result<Vec<Self::MachineIdRow>, StoreError>> + Send;

    /// The Lease API requesters holding machine ids of `namespace`.
    fn requesters(
        &self,
        namespace: &str,
    ) -> impl Future<Output = Result<Vec<Self::RequesterRow>, StoreError>> + Send;

    /// The layout of `namespace`; [`StoreError::UnknownNamespace`] when it
    /// has no record.
    fn layout(&self, namespace: &str) -> impl Future<Output = Result<Layout, StoreError>> + Send;

    /// The capacity of `namespace`'s machine ids (of `layout`) in this
    /// deployment's range, and that range cut to the layout.
    fn capacity(
        &self,
        namespace: &str,
        layout: &Layout,
    ) -> impl Future<Output = Result<(Capacity, Range<u32>), StoreError>> + Send;

    /// Revokes the lease of `machine_id`'s holder in `namespace` (with every
    /// machine id of that lease); `None` when it has no holder.
    fn evict(
        &self,
        namespace: &str,
        machine_id: u16,
    ) -> impl Future<Output = Result<Option<Self::Evicted>, StoreError>> + Send;

    /// The whole state as one document.
    fn export(&self) -> impl Future<Output = Result<Self::Document, StoreError>> + Send;

    /// Writes `document` into the store: without `replace` only into a store
    /// without state; every fence at least the clock plus `lead`.
    fn import(
        &self,
        document: &Self::Document,
        replace: bool,
        lead: Duration,
    ) -> impl Future<Output = Result<Self::Imported, Self::ImportError>> + Send;
}
