//! The embedded single-instance store: no etcd, machine ids `0..N`, and one
//! fence (for all of them) persisted in a local state file so that a restart with the clock set back
//! is detected (DESIGN §2.3 with the file as the store).
//!
//! `{state_dir}/{namespace}.state` holds the layout and the fence; it is
//! replaced atomically (write, fsync, rename, fsync dir) on every fence
//! change. `{namespace}.lock` is held with an exclusive lock for the life of
//! the process, so a second server on the same state dir refuses to start.
//! Nothing stops two servers on *different* state dirs: this mode must never
//! run as more than one instance.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use snowkeep_client::{Layout, MachineId, Millis};

use crate::lease::{Claim, HeldId, LeaseError};

/// A fence kept in a local file.
#[derive(Debug)]
pub struct LocalStore {
    path: PathBuf,
    namespace: String,
    layout: Layout,
    machine_ids: u16,
    fence: Millis,
    _lock: File,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LeaseError + '_ {
    move |source| LeaseError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl LocalStore {
    /// Opens (or creates) the state of `namespace` under `dir` for machine ids
    /// `0..machine_ids` and takes its lock.
    /// Errors with [`LeaseError::StateLocked`] when another process holds it and
    /// [`LeaseError::LayoutMismatch`] when the file was written under another layout.
    pub fn open(
        dir: &Path,
        namespace: &str,
        layout: Layout,
        machine_ids: u16,
    ) -> Result<Self, LeaseError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        // Absolute paths in messages: the server's working directory is not
        // always the one the operator thinks of.
        let dir = &fs::canonicalize(dir).map_err(io_err(dir))?;
        let lock_path = dir.join(format!("{namespace}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(LeaseError::StateLocked {
                    path: lock_path.display().to_string(),
                })
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_err(&lock_path)(e)),
        }
        let path = dir.join(format!("{namespace}.state"));
        let fence = match fs::read_to_string(&path) {
            Ok(text) => {
                let (stored, fence) = parse_state(&text).ok_or_else(|| LeaseError::Corrupt {
                    key: path.display().to_string(),
                    value: text.clone(),
                })?;
                if stored != layout {
                    return Err(LeaseError::LayoutMismatch {
                        namespace: namespace.to_owned(),
                        stored,
                        configured: layout,
                    });
                }
                fence
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Millis(0),
            Err(e) => return Err(io_err(&path)(e)),
        };
        Ok(Self {
            path,
            namespace: namespace.to_owned(),
            layout,
            machine_ids,
            fence,
            _lock: lock,
        })
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many machine ids this store hands out.
    pub fn machine_ids(&self) -> u32 {
        u32::from(self.machine_ids)
    }

    /// Claims machine ids `0..N`, each with the persisted fence as its floor.
    pub fn claim(&mut self) -> Claim {
        Claim {
            held: (0..self.machine_ids)
                .map(|id| HeldId {
                    machine_id: MachineId(id),
                    floor: self.fence,
                    fence: self.fence,
                })
                .collect(),
            lease_id: None,
            deadline: None,
            revision: 0,
        }
    }

    /// Persists `fence` (durably) before it may be used.
    pub fn write_fence(&mut self, fence: Millis) -> Result<(), LeaseError> {
        let tmp = self.path.with_extension("state.tmp");
        let body = format!(
            "# snowkeep embedded store; do not edit while the server runs\nnamespace {}\nlayout {}\nfence_ms {}\n",
            self.namespace,
            self.layout,
            fence.get()
        );
        let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
        file.write_all(body.as_bytes()).map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
        fs::rename(&tmp, &self.path).map_err(io_err(&self.path))?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(dir))?;
        }
        self.fence = fence;
        Ok(())
    }
}

fn parse_state(text: &str) -> Option<(Layout, Millis)> {
    let mut layout = None;
    let mut fence = None;
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("layout", v)) => layout = v.trim().parse().ok(),
            Some(("fence_ms", v)) => fence = v.trim().parse().ok().map(Millis),
            _ => {}
        }
    }
    Some((layout?, fence?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_survives_reopen_and_lock_excludes_a_second_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LocalStore::open(dir.path(), "ns", Layout::default(), 1).unwrap();
        assert_eq!(store.claim().max_floor(), Millis(0));
        store.write_fence(Millis(123_456)).unwrap();
        assert!(matches!(
            LocalStore::open(dir.path(), "ns", Layout::default(), 1),
            Err(LeaseError::StateLocked { .. })
        ));
        drop(store);
        let mut again = LocalStore::open(dir.path(), "ns", Layout::default(), 1).unwrap();
        assert_eq!(again.claim().max_floor(), Millis(123_456));
    }

    #[test]
    fn refuses_a_state_file_of_another_layout() {
        let dir = tempfile::tempdir().unwrap();
        LocalStore::open(dir.path(), "ns", Layout::default(), 1)
            .unwrap()
            .write_fence(Millis(5))
            .unwrap();
        let other: Layout = "40/13/10".parse().unwrap();
        assert!(matches!(
            LocalStore::open(dir.path(), "ns", other, 1),
            Err(LeaseError::LayoutMismatch { .. })
        ));
    }
}
