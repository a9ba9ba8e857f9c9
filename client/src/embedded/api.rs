//! What the embedded generator's renew, check and release paths call on the
//! Lease API: a seam so their decisions can be tested without a server. The
//! tonic client implements it; tests implement a scripted double.

use std::future::Future;
use std::pin::Pin;

use snowkeep_proto::v1 as pb;

use crate::api_key::KeyedChannel;

/// The generated client (its own methods take `&mut self`, so they are
/// named through the type to keep them apart from this trait's).
type Client = pb::lease_service_client::LeaseServiceClient<KeyedChannel>;

/// One Lease API call in flight: the answer, or the status it failed with.
pub(crate) type ApiCall<T> = Pin<Box<dyn Future<Output = Result<T, tonic::Status>> + Send>>;

/// The Lease API calls made after Acquire. Boxed futures so the generator
/// holds one `Arc<dyn LeaseApi>` (a call every few minutes: the box costs
/// nothing that matters).
pub(crate) trait LeaseApi: Send + Sync {
    /// `LeaseService.Renew`.
    fn renew(&self, request: pb::RenewRequest) -> ApiCall<pb::LeaseGrant>;
    /// `LeaseService.Check`.
    fn check(&self, request: pb::CheckRequest) -> ApiCall<pb::CheckResponse>;
    /// `LeaseService.Release`.
    fn release(&self, request: pb::ReleaseRequest) -> ApiCall<pb::ReleaseResponse>;
}

impl LeaseApi for Client {
    fn renew(&self, request: pb::RenewRequest) -> ApiCall<pb::LeaseGrant> {
        let mut client = self.clone();
        Box::pin(async move {
            Client::renew(&mut client, request)
                .await
                .map(tonic::Response::into_inner)
        })
    }

    fn check(&self, request: pb::CheckRequest) -> ApiCall<pb::CheckResponse> {
        let mut client = self.clone();
        Box::pin(async move {
            Client::check(&mut client, request)
                .await
                .map(tonic::Response::into_inner)
        })
    }

    fn release(&self, request: pb::ReleaseRequest) -> ApiCall<pb::ReleaseResponse> {
        let mut client = self.clone();
        Box::pin(async move {
            Client::release(&mut client, request)
                .await
                .map(tonic::Response::into_inner)
        })
    }
}
