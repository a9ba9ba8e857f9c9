//! `AdminService`: the administration RPCs snowkeepctl and the status page
//! use. The handler only routes: the cluster's state (namespaces, machine
//! ids, requesters, eviction, export and import) is [`state::StateAdmin`]'s,
//! over the `snowkeep_core::cluster_state::ClusterState` trait,
//! their streamed forms are in [`transfer`], API keys, the cluster's
//! security mode and the audit trail are [`keys::KeyAdmin`]'s.

pub mod keys;
mod mode;
pub mod state;
pub mod transfer;

use snowkeep_etcd::admin::StateStore;
use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status, Streaming};

use state::AdminStore;

/// Serves `snowkeep.v1.AdminService`, the cluster state from the store `S`
/// (etcd's [`StateStore`] unless a test names another).
#[derive(Clone)]
pub struct AdminHandler<S = StateStore> {
    state: state::StateAdmin<S>,
    keys: keys::KeyAdmin,
}

impl<S: AdminStore> AdminHandler<S> {
    /// Creates the handler from its two halves.
    pub fn new(state: state::StateAdmin<S>, keys: keys::KeyAdmin) -> Self {
        Self { state, keys }
    }
}

#[tonic::async_trait]
impl<S: AdminStore> pb::admin_service_server::AdminService for AdminHandler<S> {
    async fn list_namespaces(
        &self,
        request: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        self.state.list_namespaces(request).await
    }

    async fn list_machine_ids(
        &self,
        request: Request<pb::ListMachineIdsRequest>,
    ) -> Result<Response<pb::ListMachineIdsResponse>, Status> {
        self.state.list_machine_ids(request).await
    }

    async fn list_requesters(
        &self,
        request: Request<pb::ListRequestersRequest>,
    ) -> Result<Response<pb::ListRequestersResponse>, Status> {
        self.state.list_requesters(request).await
    }

    async fn get_namespace_capacity(
        &self,
        request: Request<pb::GetNamespaceCapacityRequest>,
    ) -> Result<Response<pb::GetNamespaceCapacityResponse>, Status> {
        self.state.get_namespace_capacity(request).await
    }

    async fn evict(
        &self,
        request: Request<pb::EvictRequest>,
    ) -> Result<Response<pb::EvictResponse>, Status> {
        self.state.evict(request).await
    }

    async fn create_key(
        &self,
        request: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::CreateKeyResponse>, Status> {
        self.keys.create_key(request).await
    }

    async fn list_keys(
        &self,
        request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        self.keys.list_keys(request).await
    }

    async fn expire_key(
        &self,
        request: Request<pb::ExpireKeyRequest>,
    ) -> Result<Response<pb::ExpireKeyResponse>, Status> {
        self.keys.expire_key(request).await
    }

    async fn revoke_key(
        &self,
        request: Request<pb::RevokeKeyRequest>,
    ) -> Result<Response<pb::RevokeKeyResponse>, Status> {
        self.keys.revoke_key(request).await
    }

    async fn export(
        &self,
        request: Request<pb::ExportRequest>,
    ) -> Result<Response<pb::ExportResponse>, Status> {
        self.state.export(request).await
    }

    async fn import(
        &self,
        request: Request<pb::ImportRequest>,
    ) -> Result<Response<pb::ImportResponse>, Status> {
        self.state.import(request).await
    }

    async fn set_auth_mode(
        &self,
        request: Request<pb::SetAuthModeRequest>,
    ) -> Result<Response<pb::SetAuthModeResponse>, Status> {
        self.keys.set_auth_mode(request).await
    }

    type ExportStreamStream = transfer::ExportStream;

    async fn export_stream(
        &self,
        request: Request<pb::ExportStreamRequest>,
    ) -> Result<Response<Self::ExportStreamStream>, Status> {
        self.state.export_stream(request).await
    }

    async fn import_stream(
        &self,
        request: Request<Streaming<pb::ImportStreamRequest>>,
    ) -> Result<Response<pb::ImportStreamResponse>, Status> {
        self.state.import_stream(request).await
    }

    type TailAuditStream = keys::AuditStream;

    async fn tail_audit(
        &self,
        request: Request<pb::TailAuditRequest>,
    ) -> Result<Response<Self::TailAuditStream>, Status> {
        self.keys.tail_audit(request).await
    }
}
