//! The single-instance store: no etcd. An operator assigns machine
//! ids statically, one range per single-instance server: the server holds the first
//! `--machine-ids` of `--machine-id-range` (`5..6` means machine id 5; the
//! default range starts at 0). Each machine id's fence is persisted in a
//! local state file, so a restart with the clock set back is detected (the
//! file plays etcd's part: a holder stamps only up to the fence it persisted,
//! and a new holder only above it).
//!
//! `{state_dir}/{namespace}.state` holds the layout and one fence per machine
//! id ever held from this file, so a restart with another range never starts
//! from the fence of another machine id, and a later restart with the old
//! range finds its fences again. It is replaced atomically (write, fsync,
//! rename, fsync dir) on every fence change:
//!
//! ```text
//! namespace default
//! layout 41/12/10@1767225600000
//! fence_ms 5 123456789
//! ```
//!
//! A file written before fences were kept per machine id has one line
//! `fence_ms F` for all the machine ids it served. Which ones is not recorded,
//! so F stays the fence of every machine id the file does not list
//! (`unlisted_fence_ms F`): at worst a restart waits, never reuses.
//!
//! `{namespace}.lock` is held with an exclusive lock for the life of the
//! process, so a second server on the same state dir refuses to start.
//! Nothing stops two servers on *different* state dirs: each single-instance server
//! of a namespace must have its own disjoint `--machine-id-range`.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use snowkeep_client::{Grant, Layout, MachineId, Millis};
use tokio::sync::watch;

use crate::claim::capacity::CapacitySource;
use crate::claim::{Capacity, Claim, ClaimStore, HeldId, HolderWatch, StoreError};
use crate::namespace::is_valid_namespace;

/// Fences kept in a local file, one per machine id.
#[derive(Debug)]
pub struct SingleInstanceStore {
    path: PathBuf,
    namespace: String,
    layout: Layout,
    /// The machine ids this store hands out, in generator slot order.
    machine_ids: Vec<MachineId>,
    /// Every machine id the file records a fence for.
    fences: BTreeMap<MachineId, Millis>,
    /// The fence of every machine id not in `fences` (a file of the old
    /// one-fence format), 0 otherwise.
    unlisted: Millis,
    _lock: File,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl SingleInstanceStore {
    /// Opens (or creates) the state of `namespace` under `dir` for
    /// `machine_ids` (the first `--machine-ids` of `--machine-id-range`, each
    /// below the layout's `2^machine_bits`) and takes its lock.
    ///
    /// Errors: [`StoreError::InvalidNamespace`] for a name that breaks
    /// [`crate::namespace::NAMESPACE_RULE`] (it becomes a file name),
    /// [`StoreError::StateLocked`] when another process holds the lock,
    /// [`StoreError::LayoutMismatch`] when the file was written under another
    /// layout, [`StoreError::Corrupt`] for an unreadable file.
    pub fn open(
        dir: &Path,
        namespace: &str,
        layout: Layout,
        machine_ids: &[MachineId],
    ) -> Result<Self, StoreError> {
        if !is_valid_namespace(namespace) {
            return Err(StoreError::InvalidNamespace {
                namespace: namespace.to_owned(),
            });
        }
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
                return Err(StoreError::StateLocked {
                    path: lock_path.display().to_string(),
                })
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_err(&lock_path)(e)),
        }
        let path = dir.join(format!("{namespace}.state"));
        let (fences, unlisted) = match fs::read_to_string(&path) {
            Ok(text) => {
                let state = parse_state(&text).ok_or_else(|| StoreError::Corrupt {
                    key: path.display().to_string(),
                    value: text.clone(),
                })?;
                if state.layout != layout {
                    return Err(StoreError::LayoutMismatch {
                        namespace: namespace.to_owned(),
                        stored: state.layout,
                        configured: layout,
                    });
                }
                (state.fences, state.unlisted)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (BTreeMap::new(), Millis(0)),
            Err(e) => return Err(io_err(&path)(e)),
        };
        Ok(Self {
            path,
            namespace: namespace.to_owned(),
            layout,
            machine_ids: machine_ids.to_vec(),
            fences,
            unlisted,
            _lock: lock,
        })
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many machine ids this store hands out.
    pub fn machine_ids(&self) -> u32 {
        self.machine_ids.len() as u32
    }

    /// The persisted fence of `machine_id` (layout ms).
    pub fn fence(&self, machine_id: MachineId) -> Millis {
        self.fences
            .get(&machine_id)
            .copied()
            .unwrap_or(self.unlisted)
    }

    /// Claims this store's machine ids, each with its own persisted fence as
    /// its floor.
    pub fn claim(&mut self) -> Claim {
        Claim {
            held: self
                .machine_ids
                .iter()
                .map(|&machine_id| HeldId {
                    machine_id,
                    floor: self.fence(machine_id),
                    fence: self.fence(machine_id),
                })
                .collect(),
            deadline: None,
            lease: (),
            // Its machine ids are always its own.
            own_fences: self.machine_ids.clone(),
        }
    }

    /// Persists `fences[i]` as the fence of `claim.held[i]` (durably) before
    /// any of them may be used; the fences of other machine ids are kept.
    pub fn write_fences(&mut self, claim: &Claim, fences: &[Millis]) -> Result<(), StoreError> {
        let mut next = self.fences.clone();
        for (h, f) in claim.held.iter().zip(fences) {
            next.insert(h.machine_id, *f);
        }
        let tmp = self.path.with_extension("state.tmp");
        let mut body = format!(
            "# snowkeep single-instance store; do not edit while the server runs\nnamespace {}\nlayout {}\n",
            self.namespace, self.layout,
        );
        if self.unlisted > Millis(0) {
            body.push_str(&format!("unlisted_fence_ms {}\n", self.unlisted.get()));
        }
        for (id, fence) in &next {
            body.push_str(&format!("fence_ms {} {}\n", id.get(), fence.get()));
        }
        let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
        file.write_all(body.as_bytes()).map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
        fs::rename(&tmp, &self.path).map_err(io_err(&self.path))?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(dir))?;
        }
        self.fences = next;
        Ok(())
    }
}

/// The single-instance store's claims never expire and it has no holder keys: it
/// claims the same machine ids each time, renews nothing, and a release
/// only lowers the fences.
impl ClaimStore for SingleInstanceStore {
    type Lease = ();

    async fn claim(&mut self) -> Result<Claim, StoreError> {
        Ok(SingleInstanceStore::claim(self))
    }

    async fn advance_fences(&mut self, claim: &Claim, fences: &[Millis]) -> Result<(), StoreError> {
        self.write_fences(claim, fences)
    }

    /// Never called: the claims have no deadline.
    async fn renew(&mut self, _claim: &Claim) -> Result<std::time::Instant, StoreError> {
        Err(StoreError::LeaseLost {
            reason: crate::claim::LossReason::Expired,
        })
    }

    async fn release(&mut self, claim: &Claim, last_used: &[Millis]) -> Result<(), StoreError> {
        self.write_fences(claim, last_used)
    }

    async fn abandon(&mut self, _claim: &Claim) {}

    fn watch_holders(&self, _claim: &Claim) -> HolderWatch {
        Box::pin(std::future::pending())
    }

    /// The state file's layout was checked at open; there is no namespace record.
    async fn check_namespace(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Never full: its machine ids are its own.
    async fn holder_lease_end(&mut self) -> Result<Option<std::time::Duration>, StoreError> {
        Ok(None)
    }

    fn may_claim_others(&self) -> bool {
        false
    }
}

/// The single-instance store's capacity: its machine ids, all held while the lease
/// loop issues under them (a grant is published), none otherwise.
#[derive(Debug)]
pub struct SingleInstanceCapacity {
    total: u32,
    grants: Vec<watch::Receiver<Option<Grant>>>,
}

impl SingleInstanceCapacity {
    /// The capacity of `store`, held as far as `grants` (one per generator
    /// slot) carry a grant.
    pub fn new(store: &SingleInstanceStore, grants: Vec<watch::Receiver<Option<Grant>>>) -> Self {
        Self {
            total: store.machine_ids(),
            grants,
        }
    }
}

impl CapacitySource for SingleInstanceCapacity {
    async fn read(&mut self) -> Result<Capacity, StoreError> {
        let held = self.grants.iter().filter(|g| g.borrow().is_some()).count();
        Ok(Capacity {
            total: self.total,
            held: u32::try_from(held).unwrap_or(u32::MAX),
        })
    }
}

/// A parsed state file.
struct State {
    layout: Layout,
    fences: BTreeMap<MachineId, Millis>,
    unlisted: Millis,
}

fn parse_state(text: &str) -> Option<State> {
    let mut layout = None;
    let mut fences = BTreeMap::new();
    let mut unlisted = Millis(0);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("layout"), Some(v), None, None) => layout = Some(v.parse().ok()?),
            // The old format: one fence for every machine id the file served.
            (Some("fence_ms" | "unlisted_fence_ms"), Some(v), None, None) => {
                unlisted = unlisted.max(Millis(v.parse().ok()?))
            }
            (Some("fence_ms"), Some(id), Some(v), None) => {
                fences.insert(MachineId(id.parse().ok()?), Millis(v.parse().ok()?));
            }
            (Some("fence_ms" | "unlisted_fence_ms" | "layout"), ..) => return None,
            _ => {}
        }
    }
    Some(State {
        layout: layout?,
        fences,
        unlisted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(range: std::ops::Range<u16>) -> Vec<MachineId> {
        range.map(MachineId).collect()
    }

    fn floors(store: &mut SingleInstanceStore) -> Vec<(u16, u64)> {
        store
            .claim()
            .held
            .iter()
            .map(|h| (h.machine_id.get(), h.floor.get()))
            .collect()
    }

    #[test]
    fn fence_survives_reopen_and_lock_excludes_a_second_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut store =
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(0..1)).unwrap();
        let claim = store.claim();
        assert_eq!(claim.max_floor(), Millis(0));
        store.write_fences(&claim, &[Millis(123_456)]).unwrap();
        assert!(matches!(
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(0..1)),
            Err(StoreError::StateLocked { .. })
        ));
        drop(store);
        let mut again =
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(0..1)).unwrap();
        assert_eq!(again.claim().max_floor(), Millis(123_456));
    }

    #[test]
    fn holds_the_configured_machine_ids_each_with_its_own_fence() {
        let dir = tempfile::tempdir().unwrap();
        let mut store =
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(5..7)).unwrap();
        assert_eq!(floors(&mut store), vec![(5, 0), (6, 0)]);
        let claim = store.claim();
        store
            .write_fences(&claim, &[Millis(1_000), Millis(2_000)])
            .unwrap();
        drop(store);

        // Another range: machine id 9 never inherits 5's or 6's fence, and 6
        // keeps its own.
        let mut other =
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(6..8)).unwrap();
        assert_eq!(floors(&mut other), vec![(6, 2_000), (7, 0)]);
        let claim = other.claim();
        other
            .write_fences(&claim, &[Millis(2_500), Millis(3_000)])
            .unwrap();
        drop(other);

        // Back to the first range: 5's fence was kept through the other run.
        let mut back =
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(5..7)).unwrap();
        assert_eq!(floors(&mut back), vec![(5, 1_000), (6, 2_500)]);
        let text = std::fs::read_to_string(back.path()).unwrap();
        assert!(
            text.ends_with("fence_ms 5 1000\nfence_ms 6 2500\nfence_ms 7 3000\n"),
            "{text}"
        );
    }

    #[test]
    fn a_one_fence_state_file_fences_every_machine_id_until_listed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("ns.state"),
            format!("namespace ns\nlayout {}\nfence_ms 777\n", Layout::default()),
        )
        .unwrap();
        let mut store =
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(3..4)).unwrap();
        assert_eq!(floors(&mut store), vec![(3, 777)]);
        let claim = store.claim();
        store.write_fences(&claim, &[Millis(900)]).unwrap();
        drop(store);
        let mut again =
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(0..4)).unwrap();
        assert_eq!(
            floors(&mut again),
            vec![(0, 777), (1, 777), (2, 777), (3, 900)]
        );
    }

    #[test]
    fn refuses_a_state_file_of_another_layout() {
        let dir = tempfile::tempdir().unwrap();
        let mut store =
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(0..1)).unwrap();
        let claim = store.claim();
        store.write_fences(&claim, &[Millis(5)]).unwrap();
        drop(store);
        let other: Layout = "40/13/10".parse().unwrap();
        assert!(matches!(
            SingleInstanceStore::open(dir.path(), "ns", other, &ids(0..1)),
            Err(StoreError::LayoutMismatch { .. })
        ));
    }

    #[test]
    fn refuses_an_unreadable_state_file() {
        for body in [
            "layout 41/12/10@1767225600000\nfence_ms x\n",
            "layout 41/12/10@1767225600000\nfence_ms 5 1 2\n",
            "layout 41/12/10@1767225600000\nfence_ms 70000 1\n",
            "fence_ms 5 1\n",
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("ns.state"), body).unwrap();
            assert!(
                matches!(
                    SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(0..1)),
                    Err(StoreError::Corrupt { .. })
                ),
                "{body:?}"
            );
        }
    }

    #[test]
    fn refuses_a_namespace_that_is_not_a_plain_file_name() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [".", "..", "a/b", ""] {
            assert!(
                matches!(
                    SingleInstanceStore::open(dir.path(), bad, Layout::default(), &ids(0..1)),
                    Err(StoreError::InvalidNamespace { .. })
                ),
                "{bad:?}"
            );
        }
    }

    /// The [`ClaimStore`] contract (`crate::claim::conformance`), clause by
    /// clause, each on a state dir of its own holding two machine ids.
    #[tokio::test]
    async fn keeps_the_claim_store_contract() {
        use crate::claim::conformance as c;
        let open = |dir: &tempfile::TempDir| {
            SingleInstanceStore::open(dir.path(), "ns", Layout::default(), &ids(3..5)).unwrap()
        };
        let dirs: Vec<_> = (0..7).map(|_| tempfile::tempdir().unwrap()).collect();
        c::claim_holds_distinct_machine_ids_fenced_at_or_above_their_floor(&mut open(&dirs[0]), 2)
            .await;
        c::persisted_fences_are_the_next_claims_floors(&mut open(&dirs[1])).await;
        c::a_release_leaves_the_last_used_timestamps_as_floors(&mut open(&dirs[2])).await;
        let mut holder = open(&dirs[3]);
        // A second store on the same state dir is refused at open: the lock.
        assert!(matches!(
            SingleInstanceStore::open(dirs[3].path(), "ns", Layout::default(), &ids(3..5)),
            Err(StoreError::StateLocked { .. })
        ));
        c::a_held_machine_id_is_not_claimed_by_another_store(&mut holder, None).await;
        c::a_renewal_moves_the_deadline_ahead(&mut open(&dirs[4])).await;
        c::a_store_that_claims_the_same_ids_says_so(&mut open(&dirs[5])).await;
        c::the_fences_a_claim_reports_are_the_next_claims_floors(&mut open(&dirs[6])).await;
    }
}
