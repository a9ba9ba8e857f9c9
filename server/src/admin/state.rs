//! The cluster-state half of `AdminService`: namespaces, machine ids,
//! requesters, capacity, eviction, export and import, all read from etcd
//! ([`snowkeep_etcd::admin`]), so every server of a cluster answers alike.
//! [`StateAdmin`] reaches the store through the
//! [`ClusterState`] trait: etcd's `StateStore` in the server, a double in
//! the unit tests (`tests`).
//!
//! Statuses: FAILED_PRECONDITION on the single-instance store, UNAVAILABLE
//! while etcd does not answer (or before this server reached it),
//! INVALID_ARGUMENT for a malformed namespace name or document, NOT_FOUND for
//! an unknown namespace or a machine id nobody holds.

use std::sync::Arc;
use std::time::Duration;

use snowkeep_client::SharedClock;
use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::audit::{self, AuditEvent, Who};
use crate::service::convert::{capacity_to_pb, layout_to_pb};
use crate::service::status::ApiError;
use crate::service::{Reach, StoreAccess};
use snowkeep_core::claim::StoreError;
use snowkeep_core::cluster_state::ClusterState;
use snowkeep_etcd::admin::{
    Evicted, ImportError, Imported, MachineIdRow, NamespaceInfo, RequesterRow, StateDocument,
    StateStore,
};

/// What [`StateAdmin`] asks of its store: a [`ClusterState`] whose rows,
/// document and import outcome are etcd's data types, which the handler
/// turns into protobuf messages.
pub trait AdminStore:
    ClusterState<
    Namespace = NamespaceInfo,
    MachineIdRow = MachineIdRow,
    RequesterRow = RequesterRow,
    Evicted = Evicted,
    Document = StateDocument,
    Imported = Imported,
    ImportError = ImportError,
>
{
}

impl<S> AdminStore for S where
    S: ClusterState<
        Namespace = NamespaceInfo,
        MachineIdRow = MachineIdRow,
        RequesterRow = RequesterRow,
        Evicted = Evicted,
        Document = StateDocument,
        Imported = Imported,
        ImportError = ImportError,
    >
{
}

/// Answers the cluster-state RPCs from the store `S` (etcd's
/// [`StateStore`] unless a test names another).
pub struct StateAdmin<S = StateStore> {
    access: Arc<dyn Reach<S>>,
    clock: SharedClock,
    /// The largest piece ExportStream sends, bytes.
    export_chunk: usize,
}

impl<S> Clone for StateAdmin<S> {
    fn clone(&self) -> Self {
        Self {
            access: Arc::clone(&self.access),
            clock: self.clock.clone(),
            export_chunk: self.export_chunk,
        }
    }
}

fn store_status(e: StoreError) -> Status {
    Status::from(ApiError::Store(e))
}

fn checked(namespace: &str) -> Result<(), Status> {
    crate::lease_api::convert::check_namespace(namespace).map_err(Status::from)
}

impl StateAdmin {
    /// Creates it on the server's store; `clock` stamps audit events and
    /// measures fences ahead of now.
    pub fn new(access: StoreAccess, clock: SharedClock) -> Self {
        Self::reaching(access, clock)
    }
}

impl<S: AdminStore> StateAdmin<S> {
    /// Creates it on the store `access` reaches, as [`StateAdmin::new`]
    /// does on the server's.
    pub fn reaching(access: impl Reach<S> + 'static, clock: SharedClock) -> Self {
        Self {
            access: Arc::new(access),
            clock,
            export_chunk: super::transfer::export_chunk(usize::MAX),
        }
    }

    /// Sends ExportStream pieces that fit messages of `max_send` bytes
    /// (the server's `--max-send-message-size`).
    pub fn with_max_send_message_size(mut self, max_send: usize) -> Self {
        self.export_chunk = super::transfer::export_chunk(max_send);
        self
    }

    /// The largest piece ExportStream sends, bytes.
    pub(super) fn export_chunk(&self) -> usize {
        self.export_chunk
    }

    fn store(&self) -> Result<S, Status> {
        match self.access.reach() {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err(Status::failed_precondition(
                "the single-instance store has no cluster state; run with --etcd-endpoints",
            )),
            Err(e) => Err(Status::from(e)),
        }
    }

    /// See `AdminService.ListNamespaces`.
    pub async fn list_namespaces(
        &self,
        _request: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        let store = self.store()?;
        let namespaces = store
            .namespaces()
            .await
            .map_err(store_status)?
            .into_iter()
            .map(|n| pb::NamespaceSummary {
                layout: Some(layout_to_pb(&n.layout)),
                layout_end_unix_ms: n.layout.end_unix_ms(),
                capacity: Some(capacity_to_pb(&n.name, n.capacity, n.range)),
                name: n.name,
            })
            .collect();
        Ok(Response::new(pb::ListNamespacesResponse { namespaces }))
    }

    /// See `AdminService.ListMachineIds`.
    pub async fn list_machine_ids(
        &self,
        request: Request<pb::ListMachineIdsRequest>,
    ) -> Result<Response<pb::ListMachineIdsResponse>, Status> {
        let ns = request.into_inner().namespace;
        checked(&ns)?;
        let rows = self.store()?.machine_ids(&ns).await.map_err(store_status)?;
        Ok(Response::new(pb::ListMachineIdsResponse {
            machine_ids: rows
                .into_iter()
                .map(|r| pb::MachineIdState {
                    machine_id: u32::from(r.machine_id),
                    holder: r.holder,
                    fence_ms: r.fence.get(),
                    fence_ahead_ms: r.fence_ahead_ms,
                    lease_remaining_s: r.lease_remaining_s,
                    lease_renewed_ago_s: r.lease_renewed_ago_s,
                })
                .collect(),
        }))
    }

    /// See `AdminService.ListRequesters`.
    pub async fn list_requesters(
        &self,
        request: Request<pb::ListRequestersRequest>,
    ) -> Result<Response<pb::ListRequestersResponse>, Status> {
        let ns = request.into_inner().namespace;
        checked(&ns)?;
        let rows = self.store()?.requesters(&ns).await.map_err(store_status)?;
        Ok(Response::new(pb::ListRequestersResponse {
            requesters: rows
                .into_iter()
                .map(|r| pb::RequesterState {
                    requester_hash: r.tag,
                    host_id: r.about.host_id,
                    pid: r.about.pid,
                    start_unix_ms: r.about.start_unix_ms,
                    skew_ms: r.about.skew_ms.unwrap_or(0),
                    machine_ids: r.machine_ids.into_iter().map(u32::from).collect(),
                    lease_remaining_s: r.lease_remaining_s,
                    key_id: r.about.key_id,
                })
                .collect(),
        }))
    }

    /// See `AdminService.GetNamespaceCapacity`.
    pub async fn get_namespace_capacity(
        &self,
        request: Request<pb::GetNamespaceCapacityRequest>,
    ) -> Result<Response<pb::GetNamespaceCapacityResponse>, Status> {
        let ns = request.into_inner().namespace;
        checked(&ns)?;
        let store = self.store()?;
        let layout = store.layout(&ns).await.map_err(store_status)?;
        let (capacity, range) = store.capacity(&ns, &layout).await.map_err(store_status)?;
        Ok(Response::new(pb::GetNamespaceCapacityResponse {
            capacity: Some(capacity_to_pb(&ns, capacity, range)),
        }))
    }

    /// See `AdminService.Evict`.
    pub async fn evict(
        &self,
        request: Request<pb::EvictRequest>,
    ) -> Result<Response<pb::EvictResponse>, Status> {
        let who = Who::of(request.extensions());
        let req = request.into_inner();
        checked(&req.namespace)?;
        let result = self.evict_checked(&req).await;
        audit::record(AuditEvent {
            unix_ms: self.clock.unix_ms(),
            action: "admin.evict",
            who,
            requester: String::new(),
            namespace: req.namespace.clone(),
            subject: match &result {
                Ok(r) => format!(
                    "machine_id={} holder={} machine_ids={:?}",
                    req.machine_id, r.holder, r.machine_ids
                ),
                Err(_) => format!("machine_id={}", req.machine_id),
            },
            result: audit::result_of(&result),
        });
        result.map(Response::new)
    }

    async fn evict_checked(&self, req: &pb::EvictRequest) -> Result<pb::EvictResponse, Status> {
        let store = self.store()?;
        let layout = store.layout(&req.namespace).await.map_err(store_status)?;
        let count = layout.machine_id_count();
        let machine_id = u16::try_from(req.machine_id)
            .ok()
            .filter(|&m| u32::from(m) < count)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "machine id {} is out of range: namespace {:?} has machine ids 0 to {}",
                    req.machine_id,
                    req.namespace,
                    count - 1
                ))
            })?;
        match store
            .evict(&req.namespace, machine_id)
            .await
            .map_err(store_status)?
        {
            Some(e) => Ok(pb::EvictResponse {
                holder: e.holder,
                machine_ids: e.machine_ids.into_iter().map(u32::from).collect(),
                successor_wait_ms: e.successor_wait_ms,
            }),
            None => Err(Status::not_found(format!(
                "machine id {} of namespace {:?} has no holder: nothing to evict",
                req.machine_id, req.namespace
            ))),
        }
    }

    /// See `AdminService.Export`.
    pub async fn export(
        &self,
        _request: Request<pb::ExportRequest>,
    ) -> Result<Response<pb::ExportResponse>, Status> {
        let document = self.export_document().await?;
        Ok(Response::new(pb::ExportResponse { document }))
    }

    /// The state document, as Export and ExportStream send it.
    pub(super) async fn export_document(&self) -> Result<String, Status> {
        let doc = self.store()?.export().await.map_err(store_status)?;
        serde_json::to_string_pretty(&doc)
            .map_err(|e| Status::internal(format!("cannot encode the export: {e}")))
    }

    /// See `AdminService.Import`.
    pub async fn import(
        &self,
        request: Request<pb::ImportRequest>,
    ) -> Result<Response<pb::ImportResponse>, Status> {
        let who = Who::of(request.extensions());
        let req = request.into_inner();
        self.import_audited(who, &req).await.map(Response::new)
    }

    /// Imports `req` and records it in the audit trail, as Import and
    /// ImportStream do.
    pub(super) async fn import_audited(
        &self,
        who: Who,
        req: &pb::ImportRequest,
    ) -> Result<pb::ImportResponse, Status> {
        let result = self.import_checked(req).await;
        audit::record(AuditEvent {
            unix_ms: self.clock.unix_ms(),
            action: "state.import",
            who,
            requester: String::new(),
            namespace: String::new(),
            subject: match &result {
                Ok(r) => format!(
                    "namespaces={} fences={} keys={} replace={} lead_ms={}",
                    r.namespaces, r.fences, r.keys, req.replace, r.lead_ms
                ),
                Err(_) => format!("replace={}", req.replace),
            },
            result: audit::result_of(&result),
        });
        result
    }

    async fn import_checked(&self, req: &pb::ImportRequest) -> Result<pb::ImportResponse, Status> {
        let store = self.store()?;
        let status = |e: ImportError| match e {
            ImportError::Invalid(m) => Status::invalid_argument(m),
            ImportError::Conflict(m) => Status::failed_precondition(m),
            ImportError::Contended(m) => Status::aborted(m),
            ImportError::Store(e) => store_status(e),
        };
        let doc = StateDocument::parse(&req.document).map_err(status)?;
        let done = store
            .import(&doc, req.replace, Duration::from_millis(req.lead_ms))
            .await
            .map_err(status)?;
        Ok(pb::ImportResponse {
            namespaces: done.namespaces,
            fences: done.fences,
            keys: done.keys,
            lead_ms: done.lead_ms,
        })
    }
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
