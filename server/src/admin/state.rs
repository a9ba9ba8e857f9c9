//! The cluster-state half of `AdminService`: namespaces, machine ids,
//! requesters, capacity, eviction, export and import, all read from etcd.

use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::service::StoreAccess;

/// Answers the cluster-state RPCs from the etcd store.
#[derive(Clone)]
pub struct StateAdmin {
    #[allow(dead_code)]
    access: StoreAccess,
}

fn todo(what: &str) -> Status {
    Status::unimplemented(format!("{what} is not implemented yet"))
}

impl StateAdmin {
    /// Creates it on the server's store.
    pub fn new(access: StoreAccess) -> Self {
        Self { access }
    }

    /// See `AdminService.ListNamespaces`.
    pub async fn list_namespaces(
        &self,
        _request: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        Err(todo("ListNamespaces"))
    }

    /// See `AdminService.ListMachineIds`.
    pub async fn list_machine_ids(
        &self,
        _request: Request<pb::ListMachineIdsRequest>,
    ) -> Result<Response<pb::ListMachineIdsResponse>, Status> {
        Err(todo("ListMachineIds"))
    }

    /// See `AdminService.ListRequesters`.
    pub async fn list_requesters(
        &self,
        _request: Request<pb::ListRequestersRequest>,
    ) -> Result<Response<pb::ListRequestersResponse>, Status> {
        Err(todo("ListRequesters"))
    }

    /// See `AdminService.GetNamespaceCapacity`.
    pub async fn get_namespace_capacity(
        &self,
        _request: Request<pb::GetNamespaceCapacityRequest>,
    ) -> Result<Response<pb::GetNamespaceCapacityResponse>, Status> {
        Err(todo("GetNamespaceCapacity"))
    }

    /// See `AdminService.Evict`.
    pub async fn evict(
        &self,
        _request: Request<pb::EvictRequest>,
    ) -> Result<Response<pb::EvictResponse>, Status> {
        Err(todo("Evict"))
    }

    /// See `AdminService.Export`.
    pub async fn export(
        &self,
        _request: Request<pb::ExportRequest>,
    ) -> Result<Response<pb::ExportResponse>, Status> {
        Err(todo("Export"))
    }

    /// See `AdminService.Import`.
    pub async fn import(
        &self,
        _request: Request<pb::ImportRequest>,
    ) -> Result<Response<pb::ImportResponse>, Status> {
        Err(todo("Import"))
    }
}
