//! What the Lease API keeps for a requester, in words the store does not
//! choose: who a requester is ([`RequesterId`]), the secret that lets it act
//! on its lease ([`LeaseToken`]), what a grant holds ([`RequesterGrant`]),
//! what a check or a renewal found ([`LeaseCheck`], [`Renewal`]), the fence
//! rules ([`FENCE_MARGIN`], [`released_fence`]), the description kept beside
//! a record ([`RequesterAbout`]) and the interface a store implements to keep
//! them ([`RequesterStore`]). The etcd store implements it
//! in `snowkeep_etcd::requesters`; this module imports no store.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::time::Duration;

use sha2::{Digest, Sha256};
use snowkeep_client::{Layout, MachineId, Millis};
use subtle::ConstantTimeEq;

use crate::claim::{Capacity, HeldId, StoreError};
use crate::text::{hex, unhex32};

/// How far beyond the lease's expiry a requester's fence is set: covers a
/// requester clock running ahead of the server's.
pub const FENCE_MARGIN: Duration = Duration::from_secs(60);

/// Most machine ids one requester may hold. A renewal writes two keys per
/// machine id plus the record and the token key, and etcd allows 128
/// operations per transaction (`--max-txn-ops` default), so 63.
pub const MAX_REQUESTER_IDS: u32 = 63;

/// The description of an embedded requester kept beside its record, on its
/// lease, for `AdminService.ListRequesters`: never its nonce or lease token.
/// JSON; fields a version does not know are ignored, missing ones are empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RequesterAbout {
    /// The host's machine id, as the requester sent it.
    pub host_id: String,
    /// The process id.
    pub pid: u32,
    /// The process start time, ms since the Unix epoch.
    pub start_unix_ms: u64,
    /// Server clock minus client clock at the Acquire, ms; `None` when the
    /// client sent no time.
    pub skew_ms: Option<i64>,
    /// The API key id the requester acquired with; empty without one.
    pub key_id: String,
}

/// An embedded requester, as the SHA-256 of its identity
/// `host_id:pid:start_unix_ms:nonce`. Keys, logs and metrics name requesters
/// only through it: [`RequesterId::key`] in etcd keys, [`RequesterId::tag`] in
/// logs. Its `Debug` shows the tag.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequesterId([u8; 32]);

impl RequesterId {
    /// The id of the identity string `host_id:pid:start_unix_ms:nonce`.
    pub fn of(identity: &str) -> Self {
        Self(Sha256::digest(identity.as_bytes()).into())
    }

    /// The 64 hex digits of the SHA-256, as etcd keys carry it.
    pub fn key(&self) -> String {
        hex(&self.0)
    }

    /// The first 12 hex digits of the SHA-256 (48 bits), as logs carry it;
    /// the embedded client logs the same tag for itself.
    pub fn tag(&self) -> String {
        hex(&self.0[..6])
    }

    /// The SHA-256 itself.
    pub fn digest(&self) -> [u8; 32] {
        self.0
    }
}

impl std::fmt::Debug for RequesterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RequesterId({})", self.tag())
    }
}

/// The secret that lets a requester act on its lease: 32 random bytes from
/// the thread's cryptographically secure generator, 64 hex digits on the
/// wire. Only its SHA-256 is stored. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseToken([u8; 32]);

impl LeaseToken {
    /// A fresh random token.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    /// The token sent as `text`: `Ok(None)` for an empty string (no token),
    /// [`MalformedToken`] unless it is exactly 64 hex digits.
    pub fn parse(text: &str) -> Result<Option<Self>, MalformedToken> {
        if text.is_empty() {
            return Ok(None);
        }
        unhex32(text).map(|b| Some(Self(b))).ok_or(MalformedToken)
    }

    /// The 64 hex digits, for the one answer that hands the token out.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The SHA-256 of the token, as the token key stores it.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.0).into()
    }
}

/// A lease token that is not 64 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a lease token is 64 hex digits")]
pub struct MalformedToken;

impl std::fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseToken(<secret>)")
    }
}

/// A requester's machine ids after Acquire or Renew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequesterGrant {
    /// Machine ids with floors and fences; empty when the requester holds none.
    pub held: Vec<HeldId>,
    /// The lease duration of this grant.
    pub duration: Duration,
    /// The namespace layout.
    pub layout: Layout,
    /// The lease token: a new one from a first Acquire, the presented one
    /// from an Acquire retry, `None` from Renew.
    pub token: Option<LeaseToken>,
    /// True when the caller held these machine ids before the call and
    /// proved it with its token (a Renew or an Acquire retry that kept them):
    /// only then is what it reports (its clock) recorded.
    pub known: bool,
}

impl RequesterGrant {
    /// A grant of no machine ids (a requester that holds none), with the
    /// lease's duration and the namespace's layout.
    pub fn nothing(duration: Duration, layout: Layout) -> Self {
        Self {
            held: Vec::new(),
            duration,
            layout,
            token: None,
            known: false,
        }
    }
}

/// One fence key as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceRead {
    /// The fence, in layout milliseconds.
    Value(Millis),
    /// No fence key.
    Missing,
    /// Unreadable (already logged with its key and counted): the value, quoted.
    Corrupt(String),
}

/// The fence a Release leaves on a machine id whose holder reports `last` as
/// the last timestamp it stamped, at server layout time `now`: `last`, but
/// never below the `floor` (the previous holder may have stamped up to it) or
/// `now` (the holder may have stamped up to its own clock, which a healthy
/// client keeps near the server's; a client ahead reports a `last` past
/// `now`), and never above the `current` fence (a release never fences a
/// machine id further out of use). A fence key that went missing under the
/// holder is written as that lower bound. `None`: leave the key as it is (no
/// `last` reported, or the key is unreadable).
pub fn released_fence(
    floor: Millis,
    last: Option<Millis>,
    current: &FenceRead,
    now: Millis,
) -> Option<Millis> {
    let lower = last?.max(floor).max(now);
    match current {
        FenceRead::Value(fence) => Some(lower.min((*fence).max(floor))),
        FenceRead::Missing => Some(lower),
        FenceRead::Corrupt(_) => None,
    }
}

/// What [`RequesterStore::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCheck {
    /// The lease stands, with this much left at the server.
    Valid {
        /// Time left on the requester's etcd lease.
        remaining: Duration,
    },
    /// The requester holds nothing, or other machine ids.
    LeaseGone,
    /// The namespace does not exist, or is another incarnation than the grant's.
    NamespaceGone,
    /// etcd was restored from an older snapshot: the namespace is rolled back.
    RolledBack,
}

/// What [`RequesterStore::renew`] did.
#[derive(Debug)]
pub enum Renewal {
    /// The namespace stands: the renewed grant (empty when the requester
    /// holds nothing), in the namespace of this incarnation (0: a record an
    /// older version wrote).
    Granted {
        /// What the requester now holds.
        grant: RequesterGrant,
        /// The namespace's incarnation.
        incarnation: u64,
    },
    /// The namespace does not stand for the grant: nothing was renewed.
    Gone(LeaseCheck),
}

/// Checks a presented `token` against the `stored` SHA-256 of the lease's
/// token, in constant time: [`StoreError::TokenRefused`] saying why when no
/// hash is stored, no token was sent, or it does not match.
pub fn authorize(stored: Option<&[u8; 32]>, token: Option<&LeaseToken>) -> Result<(), StoreError> {
    let Some(stored) = stored else {
        return Err(StoreError::TokenRefused {
            reason: "no lease token is stored for this lease (its token key is missing)",
        });
    };
    let Some(token) = token else {
        return Err(StoreError::TokenRefused {
            reason: "no lease_token was sent",
        });
    };
    if bool::from(token.digest().ct_eq(stored)) {
        Ok(())
    } else {
        Err(StoreError::TokenRefused {
            reason: "the lease_token does not match",
        })
    }
}

/// An API key's Lease API quota, for an Acquire made with that key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyQuota {
    /// The key id.
    pub key_id: String,
    /// The most machine ids the key's requesters may hold at once,
    /// cluster-wide (`max_lease_machine_ids`).
    pub max: u32,
}

/// What a [`RequesterStore`] call answers: its value, or the store's error.
pub type StoreResult<T> = Result<T, StoreError>;

/// Where requesters' leases are kept: what the Lease API's handler asks of a
/// store. Every call that acts on a requester's lease (Renew, Release,
/// Check, an Acquire retry) checks the presented token with [`authorize`]
/// before it reads or writes anything else; a refused call changes nothing.
/// Errors are [`StoreError`]s, which the handler maps to gRPC statuses.
pub trait RequesterStore {
    /// The namespace's layout; [`StoreError::UnknownNamespace`] when none is
    /// recorded, [`StoreError::CorruptNamespace`] when its record is unreadable.
    fn layout(&mut self, namespace: &str) -> impl Future<Output = StoreResult<Layout>> + Send;

    /// Whether a new claim may be made in `namespace` now; returns its
    /// incarnation (0: a record an older version wrote). Refuses with
    /// [`StoreError::NamespaceRolledBack`] while the namespace is rolled back
    /// (or found restored now), and with [`StoreError::NamespaceFloorAhead`]
    /// while its confirmed floor is further ahead of the clock than a claim
    /// waits.
    fn admit(&mut self, namespace: &str) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Claims `count` machine ids (1 to [`MAX_REQUESTER_IDS`]) of `layout`
    /// for `requester` for `duration` and returns them with a new lease
    /// token. When the requester already holds machine ids, a call
    /// presenting their `token` gets them back with the lease reset to at
    /// least `duration` (an idempotent retry, the same token), failing with
    /// [`StoreError::CountMismatch`] when it holds another number; without
    /// the token it fails with [`StoreError::TokenRefused`]. A full range is
    /// [`StoreError::NoFreeMachineId`]. A new grant stores `about` beside
    /// the record for the administration service (a retry keeps the one
    /// stored). With a `quota` (an Acquire made
    /// with an API key), a new claim that would take the key's holdings
    /// over its quota is [`StoreError::KeyQuotaExceeded`] with nothing
    /// claimed; a retry of machine ids already held is never refused for it.
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &RequesterId,
        count: u32,
        duration: Duration,
        token: Option<&LeaseToken>,
        quota: Option<&KeyQuota>,
        about: &RequesterAbout,
    ) -> impl Future<Output = StoreResult<RequesterGrant>> + Send;

    /// Extends the requester's lease to `duration` and raises its fences, all
    /// or nothing, for the caller presenting its `token`. [`Renewal::Gone`]
    /// when the namespace does not stand for a grant of `incarnation` (0
    /// skips the comparison); an empty grant when the requester holds nothing.
    fn renew(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        duration: Duration,
        token: Option<&LeaseToken>,
        incarnation: u64,
    ) -> impl Future<Output = StoreResult<Renewal>> + Send;

    /// Gives the requester's machine ids back for the caller presenting its
    /// `token`: each fence in `last_used` (layout ms) is lowered as
    /// [`released_fence`] allows, the others are kept. Returns how many
    /// machine ids were released (0 when it held none). `layout` is the
    /// namespace's when the caller has read it already (it is read here
    /// otherwise, only once the requester is known to hold something).
    fn release(
        &mut self,
        namespace: &str,
        layout: Option<Layout>,
        requester: &RequesterId,
        last_used: &HashMap<MachineId, Millis>,
        token: Option<&LeaseToken>,
    ) -> impl Future<Output = StoreResult<u32>> + Send;

    /// Counts the machine ids of this deployment's range in `namespace`
    /// (the range cut to the layout); returns the counts and that range.
    fn capacity(
        &mut self,
        namespace: &str,
    ) -> impl Future<Output = StoreResult<(Capacity, Range<u32>)>> + Send;

    /// Whether `requester`'s lease still stands, for the caller presenting
    /// its `token`, by reads only. `incarnation` 0 and an empty
    /// `machine_ids` skip those comparisons. Errors only when the store does
    /// not answer or a record is unreadable.
    fn check(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        token: Option<&LeaseToken>,
        incarnation: u64,
        machine_ids: &[u32],
    ) -> impl Future<Output = StoreResult<LeaseCheck>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_64_hex_digits_and_only_its_hash_matches() {
        let token = LeaseToken::generate();
        let text = token.to_hex();
        assert_eq!(text.len(), 64);
        assert_eq!(LeaseToken::parse(&text), Ok(Some(token.clone())));
        assert_eq!(
            LeaseToken::parse(&text.to_uppercase()),
            Ok(Some(token.clone()))
        );
        assert_eq!(LeaseToken::parse(""), Ok(None));
        assert_eq!(LeaseToken::parse(&text[..63]), Err(MalformedToken));
        assert_eq!(
            LeaseToken::parse(&format!("{}g", &text[..63])),
            Err(MalformedToken)
        );
        assert_ne!(LeaseToken::generate(), token, "32 random bytes each");
        assert_eq!(format!("{token:?}"), "LeaseToken(<secret>)");

        let stored = token.digest();
        assert!(authorize(Some(&stored), Some(&token)).is_ok());
        let refused = |r: Result<(), StoreError>| match r {
            Err(StoreError::TokenRefused { reason }) => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            refused(authorize(Some(&stored), None)),
            "no lease_token was sent"
        );
        assert_eq!(
            refused(authorize(Some(&stored), Some(&LeaseToken::generate()))),
            "the lease_token does not match"
        );
        assert!(refused(authorize(None, Some(&token))).starts_with("no lease token is stored"));
    }

    #[test]
    fn a_requester_is_named_by_the_sha256_of_its_identity() {
        let id = RequesterId::of("abc");
        assert_eq!(
            id.key(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(id.tag(), "ba7816bf8f01");
        assert_eq!(format!("{id:?}"), "RequesterId(ba7816bf8f01)");
    }

    #[test]
    fn a_release_lowers_a_fence_to_the_last_timestamp_within_its_bounds() {
        let (floor, now) = (Millis(1_000), Millis(5_000));
        let fence = &FenceRead::Value(Millis(9_000));
        // The reported last timestamp, when it is past the clock and the floor.
        assert_eq!(
            released_fence(floor, Some(Millis(6_000)), fence, now),
            Some(Millis(6_000))
        );
        // Never below the server's clock, nor the floor.
        assert_eq!(
            released_fence(floor, Some(Millis(0)), fence, now),
            Some(now)
        );
        assert_eq!(
            released_fence(Millis(7_000), Some(Millis(0)), fence, now),
            Some(Millis(7_000))
        );
        // Never above the fence: an absurd report keeps it.
        assert_eq!(
            released_fence(floor, Some(Millis(u64::MAX)), fence, now),
            Some(Millis(9_000))
        );
        // A clock past the fence leaves the fence (never raised by a release).
        assert_eq!(
            released_fence(floor, Some(Millis(0)), fence, Millis(20_000)),
            Some(Millis(9_000))
        );
        // Not reported: left alone. Unreadable: left alone (quarantined).
        assert_eq!(released_fence(floor, None, fence, now), None);
        let corrupt = &FenceRead::Corrupt("x".into());
        assert_eq!(
            released_fence(floor, Some(Millis(6_000)), corrupt, now),
            None
        );
        // A fence key deleted under the holder comes back at the lower bound.
        assert_eq!(
            released_fence(floor, Some(Millis(6_000)), &FenceRead::Missing, now),
            Some(Millis(6_000))
        );
    }
}
