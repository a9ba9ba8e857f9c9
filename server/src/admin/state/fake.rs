//! A double of [`ClusterState`] for the handler's unit tests: one
//! namespace (`orders`, the default layout), a scripted eviction and
//! import, and a log of the calls the handler made.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use snowkeep_client::Layout;
use snowkeep_core::claim::{Capacity, StoreError};
use snowkeep_core::cluster_state::ClusterState;
use snowkeep_etcd::admin::{
    Evicted, ImportError, Imported, MachineIdRow, NamespaceInfo, RequesterRow, StateDocument,
};

use crate::service::status::ApiError;
use crate::service::Reach;

/// The double's state.
#[derive(Default)]
pub struct Book {
    /// What the next eviction finds: `None`, no holder.
    pub evicted: Option<Evicted>,
    /// What the next import answers (taken by it): `None`, nothing written.
    pub import: Option<Result<Imported, ImportError>>,
    /// The calls the handler made, in order.
    pub calls: Vec<&'static str>,
}

/// The double; clones share one [`Book`].
#[derive(Clone, Default)]
pub struct States(Arc<Mutex<Book>>);

impl States {
    /// The book, to script the store and read what the handler did.
    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Always connected to the double.
pub struct Connected(pub States);

impl Reach<States> for Connected {
    fn reach(&self) -> Result<Option<States>, ApiError> {
        Ok(Some(self.0.clone()))
    }
}

impl ClusterState for States {
    type Namespace = NamespaceInfo;
    type MachineIdRow = MachineIdRow;
    type RequesterRow = RequesterRow;
    type Evicted = Evicted;
    type Document = StateDocument;
    type Imported = Imported;
    type ImportError = ImportError;

    async fn namespaces(&self) -> Result<Vec<NamespaceInfo>, StoreError> {
        self.book().calls.push("namespaces");
        Ok(Vec::new())
    }

    async fn machine_ids(&self, _namespace: &str) -> Result<Vec<MachineIdRow>, StoreError> {
        self.book().calls.push("machine_ids");
        Ok(Vec::new())
    }

    async fn requesters(&self, _namespace: &str) -> Result<Vec<RequesterRow>, StoreError> {
        self.book().calls.push("requesters");
        Ok(Vec::new())
    }

    async fn layout(&self, namespace: &str) -> Result<Layout, StoreError> {
        self.book().calls.push("layout");
        match namespace {
            "orders" => Ok(Layout::default()),
            other => Err(StoreError::UnknownNamespace {
                namespace: other.to_owned(),
            }),
        }
    }

    async fn capacity(
        &self,
        _namespace: &str,
        layout: &Layout,
    ) -> Result<(Capacity, Range<u32>), StoreError> {
        self.book().calls.push("capacity");
        let total = layout.machine_id_count();
        Ok((Capacity { total, held: 0 }, 0..total))
    }

    async fn evict(
        &self,
        _namespace: &str,
        _machine_id: u16,
    ) -> Result<Option<Evicted>, StoreError> {
        let mut book = self.book();
        book.calls.push("evict");
        Ok(book.evicted.clone())
    }

    async fn export(&self) -> Result<StateDocument, StoreError> {
        self.book().calls.push("export");
        Err(StoreError::Timeout {
            op: "export",
            after: Duration::from_secs(5),
        })
    }

    async fn import(
        &self,
        _document: &StateDocument,
        _replace: bool,
        _lead: Duration,
    ) -> Result<Imported, ImportError> {
        let mut book = self.book();
        book.calls.push("import");
        book.import.take().unwrap_or(Ok(Imported::default()))
    }
}
