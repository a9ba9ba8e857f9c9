//! A double of [`RequesterStore`] for the handler's unit tests: requesters'
//! holdings in memory, answering as etcd's `RequesterLeases` does (the token
//! rule of `snowkeep_core::lease::records::authorize`, checked only when the
//! requester holds something; a retry's count must match; the stored
//! description is kept; machine ids come from a range, lowest free first,
//! fenced at the lease's expiry plus `FENCE_MARGIN` by the system clock and
//! never lowered while held), a key quota, and a log of every call the
//! handler made with its arguments. It keeps the store contract
//! (`snowkeep_core::lease::conformance`, run in `conformance.rs`).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use snowkeep_client::{Clock, Layout, MachineId, Millis, SystemClock};
use snowkeep_core::claim::{Capacity, HeldId, StoreError};
use snowkeep_core::lease::records::{
    authorize, KeyQuota, LeaseCheck, LeaseToken, Renewal, RequesterAbout, RequesterGrant,
    RequesterId, RequesterStore, FENCE_MARGIN,
};

use crate::service::status::ApiError;
use crate::service::Reach;

/// The incarnation every namespace of the double has.
pub const INCARNATION: u64 = 7;

/// One call the handler made, with the arguments it passed.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `layout(namespace)`.
    Layout(String),
    /// `admit(namespace)`.
    Admit(String),
    /// `acquire(…)`.
    Acquire {
        namespace: String,
        layout: Layout,
        requester: RequesterId,
        count: u32,
        duration: Duration,
        token: Option<LeaseToken>,
        quota: Option<KeyQuota>,
        about: RequesterAbout,
    },
    /// `renew(…)`.
    Renew {
        namespace: String,
        requester: RequesterId,
        duration: Duration,
        token: Option<LeaseToken>,
        incarnation: u64,
    },
    /// `release(…)`.
    Release {
        namespace: String,
        layout: Option<Layout>,
        requester: RequesterId,
        last_used: HashMap<MachineId, Millis>,
        token: Option<LeaseToken>,
    },
    /// `capacity(namespace)`.
    Capacity(String),
    /// `check(…)`.
    Check {
        namespace: String,
        requester: RequesterId,
        token: Option<LeaseToken>,
        incarnation: u64,
        machine_ids: Vec<u32>,
    },
}

impl Call {
    /// The method's name.
    fn name(&self) -> &'static str {
        match self {
            Self::Layout(_) => "layout",
            Self::Admit(_) => "admit",
            Self::Acquire { .. } => "acquire",
            Self::Renew { .. } => "renew",
            Self::Release { .. } => "release",
            Self::Capacity(_) => "capacity",
            Self::Check { .. } => "check",
        }
    }
}

/// What one requester holds.
struct Holding {
    token: [u8; 32],
    ids: Vec<u16>,
    /// The lease's duration: what a check reports as remaining.
    duration: Duration,
    /// The fence of every machine id it holds, layout ms.
    fence: Millis,
    key_id: Option<String>,
    /// The description its first Acquire stored.
    about: RequesterAbout,
}

/// The double's state.
pub struct Book {
    held: HashMap<[u8; 32], Holding>,
    /// The machine ids it grants, lowest free first.
    range: Range<u16>,
    /// The calls the handler made, in order, with their arguments.
    pub received: Vec<Call>,
}

impl Default for Book {
    /// Machine ids `0..u16::MAX`, none held, no calls.
    fn default() -> Self {
        Self {
            held: HashMap::new(),
            range: 0..u16::MAX,
            received: Vec::new(),
        }
    }
}

impl Book {
    /// The names of the calls the handler made, in order.
    pub fn calls(&self) -> Vec<&'static str> {
        self.received.iter().map(Call::name).collect()
    }

    /// Every machine id held, by any requester, in order.
    pub fn held_ids(&self) -> Vec<u16> {
        let mut ids: Vec<u16> = self.held.values().flat_map(|h| h.ids.clone()).collect();
        ids.sort_unstable();
        ids
    }

    /// The description stored for `requester`, when it holds machine ids.
    pub fn about(&self, requester: &RequesterId) -> Option<&RequesterAbout> {
        self.held.get(&requester.digest()).map(|h| &h.about)
    }

    /// The lowest `count` machine ids of the range nobody holds;
    /// `NoFreeMachineId` (as etcd words it) when fewer are free.
    fn free_ids(&self, namespace: &str, count: u32) -> Result<Vec<u16>, StoreError> {
        let held = self.held_ids();
        let free: Vec<u16> = self
            .range
            .clone()
            .filter(|id| !held.contains(id))
            .take(count as usize)
            .collect();
        if free.len() < count as usize {
            let (start, end) = (u32::from(self.range.start), u32::from(self.range.end));
            return Err(StoreError::NoFreeMachineId {
                namespace: namespace.to_owned(),
                capacity: end - start,
                start,
                end,
            });
        }
        Ok(free)
    }

    /// The machine ids `quota`'s key holds.
    fn key_holdings(&self, quota: &KeyQuota) -> u32 {
        self.held
            .values()
            .filter(|h| h.key_id.as_deref() == Some(quota.key_id.as_str()))
            .map(|h| u32::try_from(h.ids.len()).unwrap_or(u32::MAX))
            .sum()
    }
}

/// The double; clones share one [`Book`].
#[derive(Clone, Default)]
pub struct Requesters(Arc<Mutex<Book>>);

impl Requesters {
    /// A double granting machine ids of `range` only.
    pub fn with_range(range: Range<u16>) -> Self {
        let book = Book {
            range,
            ..Book::default()
        };
        Self(Arc::new(Mutex::new(book)))
    }

    /// The book, to read what the handler did.
    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs `call`.
    fn log(&self, call: Call) {
        self.book().received.push(call);
    }

    /// A grant of `ids` (floors 0, fences at `fence`) in the default layout.
    fn grant(
        ids: &[u16],
        fence: Millis,
        duration: Duration,
        token: Option<LeaseToken>,
    ) -> RequesterGrant {
        RequesterGrant {
            held: ids
                .iter()
                .map(|&id| HeldId {
                    machine_id: MachineId(id),
                    floor: Millis(0),
                    fence,
                })
                .collect(),
            duration,
            layout: Layout::default(),
            token,
            known: !ids.is_empty(),
        }
    }
}

/// Always connected to the double.
pub struct Connected(pub Requesters);

impl Reach<Requesters> for Connected {
    fn reach(&self) -> Result<Option<Requesters>, ApiError> {
        Ok(Some(self.0.clone()))
    }
}

/// The fence of a lease of `duration` granted now, as etcd sets it: the
/// lease's expiry plus [`FENCE_MARGIN`], in the default layout's ms, never
/// below the `current` fence.
fn fence_for(duration: Duration, current: Millis) -> Millis {
    let now = SystemClock.layout_ms(&Layout::default());
    now.saturating_add(duration + FENCE_MARGIN).max(current)
}

/// Whether a call of `incarnation` finds the namespace standing (0 skips
/// the comparison, as in etcd); `NamespaceGone` otherwise.
fn standing(incarnation: u64) -> Result<(), LeaseCheck> {
    if incarnation == 0 || incarnation == INCARNATION {
        Ok(())
    } else {
        Err(LeaseCheck::NamespaceGone)
    }
}

impl RequesterStore for Requesters {
    /// The default layout, or `js53` for a namespace whose name starts
    /// with "js53" (a namespace keeps the layout it was created with).
    async fn layout(&mut self, namespace: &str) -> Result<Layout, StoreError> {
        self.log(Call::Layout(namespace.to_owned()));
        Ok(match namespace.starts_with("js53") {
            true => Layout::js53(),
            false => Layout::default(),
        })
    }

    async fn admit(&mut self, namespace: &str) -> Result<u64, StoreError> {
        self.log(Call::Admit(namespace.to_owned()));
        Ok(INCARNATION)
    }

    /// As etcd: a requester that holds machine ids gets them back for its
    /// token (the same token, the lease never shortened, its stored
    /// description kept), `TokenRefused` without it and `CountMismatch` for
    /// another count; a new one is refused over its key's quota with
    /// nothing claimed.
    async fn acquire(
        &mut self,
        namespace: &str,
        layout: Layout,
        requester: &RequesterId,
        count: u32,
        duration: Duration,
        token: Option<&LeaseToken>,
        quota: Option<&KeyQuota>,
        about: &RequesterAbout,
    ) -> Result<RequesterGrant, StoreError> {
        self.log(Call::Acquire {
            namespace: namespace.to_owned(),
            layout,
            requester: *requester,
            count,
            duration,
            token: token.cloned(),
            quota: quota.cloned(),
            about: about.clone(),
        });
        let mut book = self.book();
        if let Some(h) = book.held.get_mut(&requester.digest()) {
            authorize(Some(&h.token), token)?;
            if h.ids.len() != count as usize {
                return Err(StoreError::CountMismatch {
                    held: h.ids.len(),
                    asked: count,
                });
            }
            h.duration = h.duration.max(duration);
            h.fence = fence_for(h.duration, h.fence);
            return Ok(Self::grant(&h.ids, h.fence, h.duration, token.cloned()));
        }
        if let Some(q) = quota {
            let held = book.key_holdings(q);
            if held.saturating_add(count) > q.max {
                return Err(StoreError::KeyQuotaExceeded {
                    key_id: q.key_id.clone(),
                    held,
                    max: q.max,
                    asked: count,
                });
            }
        }
        let ids = book.free_ids(namespace, count)?;
        let new = LeaseToken::generate();
        let fence = fence_for(duration, Millis(0));
        let holding = Holding {
            token: new.digest(),
            ids: ids.clone(),
            duration,
            fence,
            key_id: quota.map(|q| q.key_id.clone()),
            about: about.clone(),
        };
        book.held.insert(requester.digest(), holding);
        let mut grant = Self::grant(&ids, fence, duration, Some(new));
        grant.known = false;
        Ok(grant)
    }

    /// As etcd: the token is checked only when the requester holds machine
    /// ids; one that holds nothing gets an empty grant.
    async fn renew(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        duration: Duration,
        token: Option<&LeaseToken>,
        incarnation: u64,
    ) -> Result<Renewal, StoreError> {
        self.log(Call::Renew {
            namespace: namespace.to_owned(),
            requester: *requester,
            duration,
            token: token.cloned(),
            incarnation,
        });
        let mut book = self.book();
        let held = book.held.get_mut(&requester.digest());
        if let Some(h) = &held {
            authorize(Some(&h.token), token)?;
        }
        if let Err(gone) = standing(incarnation) {
            return Ok(Renewal::Gone(gone));
        }
        let (ids, fence) = held.map_or_else(
            || (Vec::new(), Millis(0)),
            |h| {
                h.duration = duration;
                h.fence = fence_for(duration, h.fence);
                (h.ids.clone(), h.fence)
            },
        );
        Ok(Renewal::Granted {
            grant: Self::grant(&ids, fence, duration, None),
            incarnation: INCARNATION,
        })
    }

    async fn release(
        &mut self,
        namespace: &str,
        layout: Option<Layout>,
        requester: &RequesterId,
        last_used: &HashMap<MachineId, Millis>,
        token: Option<&LeaseToken>,
    ) -> Result<u32, StoreError> {
        self.log(Call::Release {
            namespace: namespace.to_owned(),
            layout,
            requester: *requester,
            last_used: last_used.clone(),
            token: token.cloned(),
        });
        let mut book = self.book();
        let Some(h) = book.held.get(&requester.digest()) else {
            return Ok(0);
        };
        authorize(Some(&h.token), token)?;
        let h = book.held.remove(&requester.digest());
        Ok(h.map_or(0, |h| u32::try_from(h.ids.len()).unwrap_or(u32::MAX)))
    }

    async fn capacity(&mut self, namespace: &str) -> Result<(Capacity, Range<u32>), StoreError> {
        self.log(Call::Capacity(namespace.to_owned()));
        let book = self.book();
        let range = u32::from(book.range.start)..u32::from(book.range.end);
        let held = u32::try_from(book.held_ids().len()).unwrap_or(u32::MAX);
        let total = range.end - range.start;
        Ok((Capacity { total, held }, range))
    }

    /// As etcd: the token first (when it holds machine ids), then the
    /// namespace's incarnation, then `LeaseGone` when it holds nothing or
    /// other machine ids than `machine_ids` (empty: not compared); else
    /// `Valid` with its lease's duration remaining.
    async fn check(
        &mut self,
        namespace: &str,
        requester: &RequesterId,
        token: Option<&LeaseToken>,
        incarnation: u64,
        machine_ids: &[u32],
    ) -> Result<LeaseCheck, StoreError> {
        self.log(Call::Check {
            namespace: namespace.to_owned(),
            requester: *requester,
            token: token.cloned(),
            incarnation,
            machine_ids: machine_ids.to_vec(),
        });
        let book = self.book();
        let held = book.held.get(&requester.digest());
        if let Some(h) = held {
            authorize(Some(&h.token), token)?;
        }
        if let Err(gone) = standing(incarnation) {
            return Ok(gone);
        }
        let Some(h) = held else {
            return Ok(LeaseCheck::LeaseGone);
        };
        let mut asked = machine_ids.to_vec();
        let mut have: Vec<u32> = h.ids.iter().map(|&id| u32::from(id)).collect();
        asked.sort_unstable();
        have.sort_unstable();
        if !asked.is_empty() && asked != have {
            return Ok(LeaseCheck::LeaseGone);
        }
        Ok(LeaseCheck::Valid {
            remaining: h.duration,
        })
    }
}
