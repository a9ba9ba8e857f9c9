//! The API-key half of `AdminService`: create, list, expire and revoke keys,
//! and tail the audit trail.

use std::pin::Pin;

use futures_util::Stream;
use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::service::StoreAccess;

/// The stream TailAudit answers with.
pub type AuditStream = Pin<Box<dyn Stream<Item = Result<pb::TailAuditResponse, Status>> + Send>>;

/// Answers the key and audit RPCs.
#[derive(Clone)]
pub struct KeyAdmin {
    #[allow(dead_code)]
    access: StoreAccess,
}

fn todo(what: &str) -> Status {
    Status::unimplemented(format!("{what} is not implemented yet"))
}

impl KeyAdmin {
    /// Creates it on the server's store.
    pub fn new(access: StoreAccess) -> Self {
        Self { access }
    }

    /// See `AdminService.CreateKey`.
    pub async fn create_key(
        &self,
        _request: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::CreateKeyResponse>, Status> {
        Err(todo("CreateKey"))
    }

    /// See `AdminService.ListKeys`.
    pub async fn list_keys(
        &self,
        _request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        Err(todo("ListKeys"))
    }

    /// See `AdminService.ExpireKey`.
    pub async fn expire_key(
        &self,
        _request: Request<pb::ExpireKeyRequest>,
    ) -> Result<Response<pb::ExpireKeyResponse>, Status> {
        Err(todo("ExpireKey"))
    }

    /// See `AdminService.RevokeKey`.
    pub async fn revoke_key(
        &self,
        _request: Request<pb::RevokeKeyRequest>,
    ) -> Result<Response<pb::RevokeKeyResponse>, Status> {
        Err(todo("RevokeKey"))
    }

    /// See `AdminService.TailAudit`.
    pub async fn tail_audit(
        &self,
        _request: Request<pb::TailAuditRequest>,
    ) -> Result<Response<AuditStream>, Status> {
        Err(todo("TailAudit"))
    }
}
