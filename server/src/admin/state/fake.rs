//! A double of [`ClusterState`] for the handler's unit tests: one
//! namespace (`orders`, the default layout), a scripted eviction and
//! import, and a log of every call the handler made with its arguments.

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

/// One call the handler made, with the arguments it passed.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `namespaces()`.
    Namespaces,
    /// `machine_ids(namespace)`.
    MachineIds(String),
    /// `requesters(namespace)`.
    Requesters(String),
    /// `layout(namespace)`.
    Layout(String),
    /// `capacity(namespace, layout)`.
    Capacity(String, Layout),
    /// `evict(namespace, machine_id)`.
    Evict { namespace: String, machine_id: u16 },
    /// `export()`.
    Export,
    /// `import(document, replace, lead)`.
    Import {
        document: StateDocument,
        replace: bool,
        lead: Duration,
    },
}

impl Call {
    /// The method's name.
    fn name(&self) -> &'static str {
        match self {
            Self::Namespaces => "namespaces",
            Self::MachineIds(_) => "machine_ids",
            Self::Requesters(_) => "requesters",
            Self::Layout(_) => "layout",
            Self::Capacity(..) => "capacity",
            Self::Evict { .. } => "evict",
            Self::Export => "export",
            Self::Import { .. } => "import",
        }
    }
}

/// The double's state.
#[derive(Default)]
pub struct Book {
    /// What the next eviction finds: `None`, no holder.
    pub evicted: Option<Evicted>,
    /// What the next import answers (taken by it): `None`, nothing written.
    pub import: Option<Result<Imported, ImportError>>,
    /// The calls the handler made, in order, with their arguments.
    pub received: Vec<Call>,
}

impl Book {
    /// The names of the calls the handler made, in order.
    pub fn calls(&self) -> Vec<&'static str> {
        self.received.iter().map(Call::name).collect()
    }
}

/// The double; clones share one [`Book`].
#[derive(Clone, Default)]
pub struct States(Arc<Mutex<Book>>);

impl States {
    /// The book, to script the store and read what the handler did.
    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs `call`.
    fn log(&self, call: Call) {
        self.book().received.push(call);
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
        self.log(Call::Namespaces);
        Ok(Vec::new())
    }

    async fn machine_ids(&self, namespace: &str) -> Result<Vec<MachineIdRow>, StoreError> {
        self.log(Call::MachineIds(namespace.to_owned()));
        Ok(Vec::new())
    }

    async fn requesters(&self, namespace: &str) -> Result<Vec<RequesterRow>, StoreError> {
        self.log(Call::Requesters(namespace.to_owned()));
        Ok(Vec::new())
    }

    async fn layout(&self, namespace: &str) -> Result<Layout, StoreError> {
        self.log(Call::Layout(namespace.to_owned()));
        match namespace {
            "orders" => Ok(Layout::default()),
            other => Err(StoreError::UnknownNamespace {
                namespace: other.to_owned(),
            }),
        }
    }

    async fn capacity(
        &self,
        namespace: &str,
        layout: &Layout,
    ) -> Result<(Capacity, Range<u32>), StoreError> {
        self.log(Call::Capacity(namespace.to_owned(), *layout));
        let total = layout.machine_id_count();
        Ok((Capacity { total, held: 0 }, 0..total))
    }

    async fn evict(&self, namespace: &str, machine_id: u16) -> Result<Option<Evicted>, StoreError> {
        self.log(Call::Evict {
            namespace: namespace.to_owned(),
            machine_id,
        });
        Ok(self.book().evicted.clone())
    }

    async fn export(&self) -> Result<StateDocument, StoreError> {
        self.log(Call::Export);
        Err(StoreError::Timeout {
            op: "export",
            after: Duration::from_secs(5),
        })
    }

    async fn import(
        &self,
        document: &StateDocument,
        replace: bool,
        lead: Duration,
    ) -> Result<Imported, ImportError> {
        self.log(Call::Import {
            document: document.clone(),
            replace,
            lead,
        });
        self.book().import.take().unwrap_or(Ok(Imported::default()))
    }
}
