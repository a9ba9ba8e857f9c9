//! [`StoreAccess`]: what the API handlers (here, in `crate::lease_api` and
//! in `crate::admin`) reach the lease store through, filled in as the
//! server connects to etcd. The handlers ask for their store through
//! [`Reach`], which `StoreAccess` implements for the etcd types and a unit
//! test implements for a double of the store trait the handler uses.

use std::sync::{Arc, OnceLock};

use super::status::ApiError;
use snowkeep_etcd::admin::StateStore;
use snowkeep_etcd::requesters::RequesterLeases;
use snowkeep_etcd::{CapacityReader, EtcdStore};

/// How a handler reaches its store of type `S` as each call arrives.
pub trait Reach<S>: Send + Sync {
    /// The store; `Ok(None)` on the single-instance store (no etcd),
    /// [`ApiError::StoreNotConnected`] before etcd answered.
    fn reach(&self) -> Result<Option<S>, ApiError>;
}

/// What the API handlers need from the lease store, once it is connected.
#[derive(Clone)]
pub enum StoreAccess {
    /// The single-instance store: no etcd, so no Lease API.
    SingleInstance {
        /// The machine ids this server holds, `[start, end)`.
        machine_ids: std::ops::Range<u32>,
    },
    /// etcd: filled in as the server connects.
    Etcd(Arc<EtcdCells>),
}

/// The etcd handles of [`StoreAccess::Etcd`], each set once.
#[derive(Default)]
pub struct EtcdCells {
    /// Capacity and the Lease API: once the namespace opened.
    handles: OnceLock<(CapacityReader, RequesterLeases)>,
    /// The administration service: as soon as the clients exist.
    state: OnceLock<StateStore>,
}

impl StoreAccess {
    /// Access to an etcd store that is not connected yet.
    pub fn etcd() -> Self {
        StoreAccess::Etcd(Arc::default())
    }

    /// Records that the etcd clients of `s` exist (its namespace may not be
    /// open yet): the administration service can use them.
    pub fn clients_ready(&self, s: &EtcdStore) {
        if let StoreAccess::Etcd(cells) = self {
            let _ = cells.state.set(s.state_store());
        }
    }

    /// Records that the etcd store `s` is connected.
    pub fn connected(&self, s: &EtcdStore) {
        if let StoreAccess::Etcd(cells) = self {
            let _ = cells.state.set(s.state_store());
            let _ = cells
                .handles
                .set((s.capacity_reader(), RequesterLeases::new(s)));
        }
    }

    /// The etcd handles; `Ok(None)` on the single-instance store,
    /// [`ApiError::StoreNotConnected`] before etcd answered.
    pub fn etcd_handles(&self) -> Result<Option<(CapacityReader, RequesterLeases)>, ApiError> {
        match self {
            StoreAccess::SingleInstance { .. } => Ok(None),
            StoreAccess::Etcd(cells) => cells
                .handles
                .get()
                .cloned()
                .map(Some)
                .ok_or(ApiError::StoreNotConnected),
        }
    }

    /// The administration service's etcd handle; `Ok(None)` on the
    /// single-instance store, [`ApiError::StoreNotConnected`] before the
    /// etcd clients exist.
    pub(crate) fn state_store(&self) -> Result<Option<StateStore>, ApiError> {
        match self {
            StoreAccess::SingleInstance { .. } => Ok(None),
            StoreAccess::Etcd(cells) => cells
                .state
                .get()
                .cloned()
                .map(Some)
                .ok_or(ApiError::StoreNotConnected),
        }
    }
}

impl Reach<RequesterLeases> for StoreAccess {
    /// The Lease API's store, once the namespace opened.
    fn reach(&self) -> Result<Option<RequesterLeases>, ApiError> {
        Ok(self.etcd_handles()?.map(|(_, store)| store))
    }
}

impl Reach<StateStore> for StoreAccess {
    /// The administration service's store, once the etcd clients exist.
    fn reach(&self) -> Result<Option<StateStore>, ApiError> {
        self.state_store()
    }
}
