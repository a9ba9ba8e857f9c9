//! The seam between the claim loop and where claims are kept: what
//! [`super::ClaimManager`] needs from a store, and nothing a single backend
//! alone knows about. The etcd store (`snowkeep_etcd`) and the
//! single-instance store (`crate::single_instance`) implement [`ClaimStore`]; this
//! module imports neither.
//!
//! Static dispatch (`impl Future` in the trait, the manager generic over its
//! store): there are two stores and a test double, chosen once at start, so
//! nothing needs a `dyn ClaimStore` and no future is boxed on the renew path.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use snowkeep_client::{MachineId, Millis};

use super::{LossReason, StoreError};

/// One claimed machine id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldId {
    /// The machine id.
    pub machine_id: MachineId,
    /// The previous holder's fence, read after the claim committed (layout
    /// ms): stamped timestamps must be above it.
    pub floor: Millis,
    /// The fence persisted now (layout ms; starts at `floor`).
    pub fence: Millis,
}

/// The machine ids claimed together, and what the store alone needs to act
/// on them again (`lease`: the etcd lease and claim revision; `()` for a store
/// without leases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim<L = ()> {
    /// The machine ids, in generator slot order.
    pub held: Vec<HeldId>,
    /// Local deadline of the lease by the monotonic clock; `None` when the
    /// store's claims never expire, so there is nothing to renew.
    pub deadline: Option<Instant>,
    /// The store's own handle on this claim.
    pub lease: L,
    /// The machine ids of `held` this instance id held before and took
    /// back (a stable instance restarting after a crash, or a claim after a
    /// lost lease that finds its holder keys still standing): their floors
    /// are its own fences, waited for up to one fence lead (1.5 outage
    /// budgets) instead of `--max-fence-wait`. Every other machine id of the
    /// claim keeps `--max-fence-wait` (design.md, *Claim lifecycle*).
    pub own_fences: Vec<MachineId>,
}

impl<L> Claim<L> {
    /// The highest floor (layout ms): issuance starts once the clock is past it.
    pub fn max_floor(&self) -> Millis {
        self.held.iter().map(|h| h.floor).max().unwrap_or_default()
    }

    /// The lowest fence (layout ms): issuance stops once the clock passes it.
    pub fn min_fence(&self) -> Millis {
        self.held.iter().map(|h| h.fence).min().unwrap_or_default()
    }

    /// The machine ids, for logs.
    pub fn machine_ids(&self) -> Vec<u16> {
        self.held.iter().map(|h| h.machine_id.get()).collect()
    }
}

/// Machine ids of a namespace (or of this instance's range of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Machine ids in the range.
    pub total: u32,
    /// Machine ids with a holder.
    pub held: u32,
}

impl Capacity {
    /// Machine ids without a holder.
    pub fn free(&self) -> u32 {
        self.total.saturating_sub(self.held)
    }
}

/// Resolves when a holder key of a claim changed under its holder: with the
/// reason (`HolderChanged`), or with an error that needs an operator (another
/// live process holds it under the same instance id). Dropping it stops the
/// watching.
pub type HolderWatch = Pin<Box<dyn Future<Output = Result<LossReason, StoreError>> + Send>>;

/// Where claims of machine ids are kept, as the claim loop sees it.
///
/// Every method answers [`StoreError::LeaseLost`] when the store *says* the
/// claim is gone (the loop stops issuing at once), and any other retryable
/// error when it could not be asked (the loop retries and, meanwhile, issues
/// on below the persisted fence).
pub trait ClaimStore: Send {
    /// What a claim of this store carries for the store alone.
    type Lease: Send + Sync;

    /// Claims as many machine ids as the loop has generator slots. Each
    /// floor is the previous holder's fence read after the claim committed.
    fn claim(&mut self) -> impl Future<Output = Result<Claim<Self::Lease>, StoreError>> + Send;

    /// Persists `fences[i]` (layout ms) as the fence of `claim.held[i]`
    /// before any of them may be used.
    fn advance_fences(
        &mut self,
        claim: &Claim<Self::Lease>,
        fences: &[Millis],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Renews the claim's lease; the new local deadline. Called only for a
    /// claim that has a deadline.
    fn renew(
        &mut self,
        claim: &Claim<Self::Lease>,
    ) -> impl Future<Output = Result<Instant, StoreError>> + Send;

    /// Lowers each fence to `last_used[i]` (layout ms, the last timestamp
    /// stamped under `claim.held[i]`) and gives the machine ids back.
    fn release(
        &mut self,
        claim: &Claim<Self::Lease>,
        last_used: &[Millis],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives up a claim that will not be used (lost, or fenced too far
    /// ahead), leaving its fences as they are. Best effort: never fails.
    fn abandon(&mut self, claim: &Claim<Self::Lease>) -> impl Future<Output = ()> + Send;

    /// Watches the claim's holder keys from just after the claim; a store
    /// without holder keys returns a watch that never resolves.
    fn watch_holders(&self, claim: &Claim<Self::Lease>) -> HolderWatch;

    /// Re-checks the namespace while holding: `NamespaceRolledBack` and
    /// `LayoutMismatch` end the hold, anything else is logged.
    fn check_namespace(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// After a claim refused with [`StoreError::NoFreeMachineId`]: how soon
    /// one of the etcd leases holding the range's machine ids ends, as the
    /// refused claim's read found them, when one ends within a fence lead
    /// (a frozen or crashed holder's counts down; an expired one counts as
    /// ending now). `Ok(None)` when none does, so waiting is pointless; an
    /// error when the store could not tell, which the loop retries with
    /// backoff rather than giving up. A store without leases answers
    /// `Ok(None)`.
    fn holder_lease_end(
        &mut self,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send;

    /// True when a new claim may come back with other machine ids (so a
    /// claim fenced too far ahead is abandoned and claimed again); false for
    /// a store that always claims the same ones.
    fn may_claim_others(&self) -> bool;
}
