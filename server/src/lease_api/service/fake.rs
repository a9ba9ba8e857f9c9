//! A double of [`RequesterStore`] for the handler's unit tests: requesters'
//! holdings in memory, the token rule of `snowkeep_core::lease::records`
//! (`authorize`), a key quota, and a log of the calls the handler made.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use snowkeep_client::{Layout, MachineId, Millis};
use snowkeep_core::claim::{Capacity, HeldId, StoreError};
use snowkeep_core::lease::records::{
    authorize, KeyQuota, LeaseCheck, LeaseToken, Renewal, RequesterAbout, RequesterGrant,
    RequesterId, RequesterStore,
};

use crate::service::status::ApiError;
use crate::service::Reach;

/// The incarnation every namespace of the double has.
pub const INCARNATION: u64 = 7;

/// What one requester holds.
struct Holding {
    token: [u8; 32],
    ids: Vec<u16>,
    key_id: Option<String>,
}

/// The double's state.
#[derive(Default)]
pub struct Book {
    held: HashMap<[u8; 32], Holding>,
    next_id: u16,
    /// The calls the handler made, in order.
    pub calls: Vec<&'static str>,
    /// The quota of the last Acquire.
    pub quota: Option<KeyQuota>,
    /// The description of the last Acquire.
    pub about: Option<RequesterAbout>,
}

/// The double; clones share one [`Book`].
#[derive(Clone, Default)]
pub struct Requesters(Arc<Mutex<Book>>);

impl Requesters {
    /// The book, to read what the handler did.
    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn grant(ids: &[u16], duration: Duration, token: LeaseToken, known: bool) -> RequesterGrant {
        RequesterGrant {
            held: ids
                .iter()
                .map(|&id| HeldId {
                    machine_id: MachineId(id),
                    floor: Millis(0),
                    fence: Millis(0),
                })
                .collect(),
            duration,
            layout: Layout::default(),
            token: Some(token),
            known,
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

impl RequesterStore for Requesters {
    async fn layout(&mut self, _namespace: &str) -> Result<Layout, StoreError> {
        self.book().calls.push("layout");
        Ok(Layout::default())
    }

    async fn admit(&mut self, _namespace: &str) -> Result<u64, StoreError> {
        self.book().calls.push("admit");
        Ok(INCARNATION)
    }

    async fn acquire(
        &mut self,
        _namespace: &str,
        _layout: Layout,
        requester: &RequesterId,
        count: u32,
        duration: Duration,
        token: Option<&LeaseToken>,
        quota: Option<&KeyQuota>,
        about: &RequesterAbout,
    ) -> Result<RequesterGrant, StoreError> {
        let mut book = self.book();
        book.calls.push("acquire");
        book.quota = quota.cloned();
        book.about = Some(about.clone());
        if let Some(h) = book.held.get(&requester.digest()) {
            authorize(Some(&h.token), token)?;
            let (ids, token) = (
                h.ids.clone(),
                token.cloned().unwrap_or_else(LeaseToken::generate),
            );
            return Ok(Self::grant(&ids, duration, token, true));
        }
        if let Some(q) = quota {
            let held = book
                .held
                .values()
                .filter(|h| h.key_id.as_deref() == Some(q.key_id.as_str()))
                .map(|h| u32::try_from(h.ids.len()).unwrap_or(u32::MAX))
                .sum::<u32>();
            if held + count > q.max {
                return Err(StoreError::KeyQuotaExceeded {
                    key_id: q.key_id.clone(),
                    held,
                    max: q.max,
                    asked: count,
                });
            }
        }
        let start = book.next_id;
        let ids: Vec<u16> = (start..start + u16::try_from(count).unwrap_or(0)).collect();
        book.next_id = start + u16::try_from(count).unwrap_or(0);
        let new = LeaseToken::generate();
        let holding = Holding {
            token: new.digest(),
            ids: ids.clone(),
            key_id: quota.map(|q| q.key_id.clone()),
        };
        book.held.insert(requester.digest(), holding);
        Ok(Self::grant(&ids, duration, new, false))
    }

    async fn renew(
        &mut self,
        _namespace: &str,
        requester: &RequesterId,
        duration: Duration,
        token: Option<&LeaseToken>,
        _incarnation: u64,
    ) -> Result<Renewal, StoreError> {
        let mut book = self.book();
        book.calls.push("renew");
        let h = book.held.get(&requester.digest());
        authorize(h.map(|h| &h.token), token)?;
        let ids = h.map(|h| h.ids.clone()).unwrap_or_default();
        let mut grant = Self::grant(&ids, duration, LeaseToken::generate(), true);
        grant.token = None;
        Ok(Renewal::Granted {
            grant,
            incarnation: INCARNATION,
        })
    }

    async fn release(
        &mut self,
        _namespace: &str,
        _layout: Option<Layout>,
        requester: &RequesterId,
        _last_used: &HashMap<MachineId, Millis>,
        token: Option<&LeaseToken>,
    ) -> Result<u32, StoreError> {
        let mut book = self.book();
        book.calls.push("release");
        let Some(h) = book.held.get(&requester.digest()) else {
            return Ok(0);
        };
        authorize(Some(&h.token), token)?;
        let h = book.held.remove(&requester.digest());
        Ok(h.map_or(0, |h| u32::try_from(h.ids.len()).unwrap_or(u32::MAX)))
    }

    async fn capacity(&mut self, _namespace: &str) -> Result<(Capacity, Range<u32>), StoreError> {
        self.book().calls.push("capacity");
        Ok((Capacity { total: 0, held: 0 }, 0..0))
    }

    async fn check(
        &mut self,
        _namespace: &str,
        _requester: &RequesterId,
        _token: Option<&LeaseToken>,
        _incarnation: u64,
        _machine_ids: &[u32],
    ) -> Result<LeaseCheck, StoreError> {
        self.book().calls.push("check");
        Ok(LeaseCheck::LeaseGone)
    }
}
