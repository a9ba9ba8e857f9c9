//! [`FenceDemand`]: how a caller that found its fence reached asks the lease
//! source for a higher one, and waits for it, instead of being refused.
//!
//! A server keeps its fences ahead of its clock, but a call can still find
//! one reached: after the clock jumped forward, or when the store answers
//! again after an outage that ran up to the fence. With a demand attached,
//! the generator then asks the lease source for a raise and waits (at most
//! [`FENCE_DEMAND_WAIT`]) for the grant carrying the new fence, instead of
//! waiting for the lease source's own next raise. The lease
//! source says whether a raise can happen now ([`FenceDemand::set_raisable`]:
//! it holds the machine ids and its store answers); when it cannot, the
//! caller is refused at once, as without a demand.
//!
//! Nothing here weakens the fence rule: the generator still stamps only
//! under a grant whose fence was persisted before it was published.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// The longest a call waits for a raise it asked for: 2 s, the default etcd
/// request timeout. A call still finding the fence reached after it is
/// refused with [`crate::GenerateError::FenceReached`].
pub const FENCE_DEMAND_WAIT: Duration = Duration::from_secs(2);

/// Requests for a fence raise, shared by the generators of one lease source
/// and the loop that raises their fences.
#[derive(Debug, Default)]
pub struct FenceDemand {
    /// True while a request would be acted on soon.
    raisable: AtomicBool,
    /// Wakes the lease source; holds one permit when it is not waiting.
    requests: Notify,
}

impl FenceDemand {
    /// A demand that nothing can satisfy until [`FenceDemand::set_raisable`].
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Called by the lease source: whether it can raise the fences now (it
    /// holds its machine ids and its store answers).
    pub fn set_raisable(&self, raisable: bool) {
        self.raisable.store(raisable, Ordering::Release);
    }

    /// True when a request would be acted on: callers that find the fence
    /// reached wait for the raise, and readiness stays SERVING.
    pub fn raisable(&self) -> bool {
        self.raisable.load(Ordering::Acquire)
    }

    /// Asks for a raise (called by a generator that found its fence reached).
    pub fn request(&self) {
        self.requests.notify_one();
    }

    /// Resolves at the next request (or at once for one made while the
    /// lease source was not waiting).
    pub async fn requested(&self) {
        self.requests.notified().await;
    }
}
