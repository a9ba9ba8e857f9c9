//! The Lease API's audit wrapper: the calls that act on machine ids
//! (Acquire, Release) each leave one event in the audit trail, written by
//! [`LeaseHandler::audited`] from what the request and the answer say.

use std::future::Future;

use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::convert;
use super::service::{LeaseHandler, LeaseStore};
use crate::audit;

/// A request the audit trail records: its action and the fields checked
/// before anything is recorded.
pub(super) trait AuditedRequest {
    /// The event's action (`lease.acquire`, `lease.release`).
    const ACTION: &'static str;

    /// The namespace, the requester and the lease token as sent.
    fn fields(&self) -> (&str, Option<&pb::Requester>, &str);
}

/// An answer the audit trail records: what a success acted on.
pub(super) trait AuditedAnswer {
    /// The event's subject for this answer.
    fn subject(&self) -> String;
}

impl AuditedRequest for pb::AcquireRequest {
    const ACTION: &'static str = "lease.acquire";

    fn fields(&self) -> (&str, Option<&pb::Requester>, &str) {
        (&self.namespace, self.requester.as_ref(), &self.lease_token)
    }
}

impl AuditedRequest for pb::ReleaseRequest {
    const ACTION: &'static str = "lease.release";

    fn fields(&self) -> (&str, Option<&pb::Requester>, &str) {
        (&self.namespace, self.requester.as_ref(), &self.lease_token)
    }
}

impl AuditedAnswer for pb::LeaseGrant {
    /// The machine ids granted: `machine_ids 3,7`.
    fn subject(&self) -> String {
        let list: Vec<String> = self
            .machine_ids
            .iter()
            .map(|m| m.machine_id.to_string())
            .collect();
        format!("machine_ids {}", list.join(","))
    }
}

impl AuditedAnswer for pb::ReleaseResponse {
    /// How many machine ids were released: `released 2`.
    fn subject(&self) -> String {
        format!("released {}", self.released)
    }
}

/// Checks the fields Acquire and Release share (namespace, requester,
/// lease token) before the call is audited: INVALID_ARGUMENT for any of
/// them malformed. Returns the requester's tag for the audit trail (never
/// its identity or nonce).
fn checked_fields(
    namespace: &str,
    requester: Option<&pb::Requester>,
    lease_token: &str,
) -> Result<String, Status> {
    convert::check_namespace(namespace)?;
    let requester = convert::requester_id(requester)?;
    convert::lease_token(lease_token)?;
    Ok(requester.tag())
}

impl<S: LeaseStore> LeaseHandler<S> {
    /// Runs `call` on `request` and records one audit event of its result.
    /// The shared fields are checked first: a malformed request acts on
    /// nothing, its strings are no one's to log, and it is not recorded.
    /// The event's subject is the answer's on success, empty on an error.
    pub(super) async fn audited<T, R, F>(
        &self,
        request: Request<T>,
        call: impl FnOnce(Request<T>) -> F,
    ) -> Result<Response<R>, Status>
    where
        T: AuditedRequest,
        R: AuditedAnswer,
        F: Future<Output = Result<Response<R>, Status>>,
    {
        let (namespace, requester, lease_token) = request.get_ref().fields();
        let requester = checked_fields(namespace, requester, lease_token)?;
        let namespace = namespace.to_owned();
        let who = audit::Who::of(request.extensions());
        let result = call(request).await;
        audit::record(audit::AuditEvent {
            unix_ms: self.clock().unix_ms(),
            action: T::ACTION,
            who,
            requester,
            namespace,
            subject: result
                .as_ref()
                .map_or_else(|_| String::new(), |r| r.get_ref().subject()),
            result: audit::result_of(&result),
        });
        result
    }
}
