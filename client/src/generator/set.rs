//! Several generators, one per held machine id, behind one face.
//!
//! Spec/002: a process that needs more than one machine id's rate holds N of
//! them. A batch larger than one millisecond's sequence is spread across every
//! ready machine id and merged, so it comes back strictly ascending; smaller
//! batches go to one machine id at a time, round-robin. A *stream* must stay
//! ascending across its batches, which ids from different machine ids
//! interleaved in time cannot promise, so a stream draws from one machine id
//! ([`GeneratorSet::pick`]).
//!
//! Single ids can be spread three ways (the reference design's three, for a
//! process that needs more than one machine id's rate):
//!
//! - **round robin** ([`GeneratorSet::next_id`]): every caller shares one
//!   counter, whose cache line all of them write (with one machine id there
//!   is no counter); each thread then takes its ids in runs, as a pinned
//!   handle does;
//! - **by key** ([`GeneratorSet::next_id_for`]): machine id `key % N`, the
//!   key the caller's (a worker or shard index); **by thread**
//!   ([`GeneratorSet::next_id_by_thread`]) is the same with a dense index
//!   this process gives each thread on its first id (Rust has no stable
//!   numeric thread id), so a thread always lands on one machine id;
//! - **pinned** ([`GeneratorSet::pin`]): a [`Pinned`] handle on one machine
//!   id, owned by one worker, that takes runs of ids under the machine id's
//!   lock and hands them out with no shared write. Two handles (or a handle
//!   and the other spreads) on one machine id share its lock, never its ids.
//!
//! Each skips a machine id that cannot issue now for the next one that can,
//! as round robin does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The next thread's index for [`GeneratorSet::next_id_by_thread`].
static NEXT_THREAD_INDEX: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's index: 0, 1, 2, … in the order threads take their
    /// first id by thread.
    static THREAD_INDEX: usize = NEXT_THREAD_INDEX.fetch_add(1, Ordering::Relaxed);
}

use super::pinned::{self, Pinned, SetToken};
use super::Generator;
use crate::error::GenerateError;
use crate::layout::Layout;

/// The generators of all machine ids an instance holds.
#[derive(Debug)]
pub struct GeneratorSet {
    generators: Vec<Arc<Generator>>,
    next: AtomicUsize,
    /// Names this set to each thread's runs for [`GeneratorSet::next_id`].
    token: SetToken,
}

impl GeneratorSet {
    /// Wraps `generators` (at least one; all with one layout).
    pub fn new(generators: Vec<Arc<Generator>>) -> Arc<Self> {
        assert!(!generators.is_empty(), "a generator set needs a generator");
        Arc::new(Self {
            token: Arc::new(()),
            generators,
            next: AtomicUsize::new(0),
        })
    }

    /// The layout ids are stamped with.
    pub fn layout(&self) -> Layout {
        self.generators[0].layout()
    }

    /// Every generator, in machine-id slot order.
    pub fn generators(&self) -> &[Arc<Generator>] {
        &self.generators
    }

    /// True when at least one machine id can issue now.
    pub fn is_ready(&self) -> bool {
        self.generators.iter().any(|g| g.is_ready())
    }

    /// The longest [`GeneratorSet::is_ready`]'s answer can hold while the
    /// grants stay the same: the soonest of its generators'
    /// [`Generator::readiness_holds_for`], `None` when no clock edge lies
    /// ahead for any of them.
    pub fn readiness_holds_for(&self) -> Option<std::time::Duration> {
        self.generators
            .iter()
            .filter_map(|g| g.readiness_holds_for())
            .min()
    }

    /// A ready generator, round-robin; the first one when none is ready (its
    /// error then says why issuance is stopped).
    pub fn pick(&self) -> Arc<Generator> {
        self.pick_ref().clone()
    }

    #[inline]
    fn pick_ref(&self) -> &Arc<Generator> {
        if self.generators.len() == 1 {
            // No choice to make: skip the counter.
            return &self.generators[0];
        }
        self.pick_from(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// The generator at slot `start % N` when it can issue now, else the
    /// next one after it that can; the one at `start % N` when none can
    /// (its error then says why issuance is stopped).
    #[inline]
    fn pick_from(&self, start: usize) -> &Arc<Generator> {
        &self.generators[self.ready_index(start)]
    }

    /// The slot [`GeneratorSet::pick_from`] picks.
    #[inline]
    fn ready_index(&self, start: usize) -> usize {
        let n = self.generators.len();
        if n == 1 {
            // No choice to make: skip the readiness check and its clock reads.
            return 0;
        }
        (0..n)
            .map(|i| (start + i) % n)
            .find(|&i| self.generators[i].is_ready())
            .unwrap_or(start % n)
    }

    /// One id, from one machine id (round-robin over the ready ones).
    ///
    /// Each thread takes the ids of a machine id in runs, as a [`Pinned`]
    /// handle does, and hands them out with no write any other thread
    /// sees. So the ids one thread gets ascend, while ids handed to
    /// different threads interleave within a millisecond: a task that moves
    /// to another thread between two calls may get a lower id after a
    /// higher one of the same millisecond (never a repeat), as ids of
    /// different machine ids already do.
    pub async fn next_id(&self) -> Result<u64, GenerateError> {
        let n = self.generators.len();
        let start = match n {
            // No choice to make: skip the counter (and the division).
            1 => 0,
            _ => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        if let Some(id) = pinned::from_thread_run(&self.token, start) {
            return Ok(id);
        }
        let at = self.ready_index(start);
        pinned::from_new_thread_run(&self.token, at, &self.generators[at]).await
    }

    /// One id from slot `start % N`, or from the next ready one when it
    /// cannot issue now. An open window of that slot serves at once;
    /// otherwise readiness (which reads the clocks) picks the slot.
    #[inline]
    async fn one_from(&self, start: usize) -> Result<u64, GenerateError> {
        let first = &self.generators[start % self.generators.len()];
        if let Some(id) = first.take_one_in_tick() {
            return Ok(id);
        }
        one_id(self.pick_from(start)).await
    }

    /// One id from the machine id in slot `key % N` (slot order, as
    /// [`GeneratorSet::generators`]), or from the next ready one when that
    /// one cannot issue now. The same key keeps to one machine id while it
    /// can issue, so a worker that passes its own index shares no machine
    /// id's lock with the others.
    pub async fn next_id_for(&self, key: u64) -> Result<u64, GenerateError> {
        // Only the remainder matters, so the key's high bits may go.
        let start = (key % self.generators.len() as u64) as usize;
        self.one_from(start).await
    }

    /// One id from the machine id of this thread's index `% N` (see the
    /// module docs: a dense index per thread, given on its first id).
    /// Under tokio, the thread is the worker thread polling the task, which
    /// can change between awaits; the id still comes from one machine id.
    pub async fn next_id_by_thread(&self) -> Result<u64, GenerateError> {
        let index = THREAD_INDEX.with(|i| *i);
        self.one_from(index).await
    }

    /// A handle on the machine id in slot `index % N` alone, for one
    /// worker. It never moves to another machine id: while its own cannot
    /// issue, its calls fail with the reason (as a one-machine-id set's do).
    pub fn pin(&self, index: usize) -> Pinned {
        Pinned::new(self.generators[index % self.generators.len()].clone())
    }

    /// Returns `count` strictly ascending ids. Batches above one millisecond's
    /// sequence are spread across all ready machine ids and merged. On an
    /// error the ids already taken are dropped (a gap, never a reuse).
    pub async fn next_ids(&self, count: u64) -> Result<Vec<u64>, GenerateError> {
        // Small batches (the common case) go to one machine id: decide that
        // before checking every generator's readiness, which reads the clock.
        if self.generators.len() == 1 || count <= self.layout().sequences_per_tick() {
            return self.pick_ref().next_ids(count).await;
        }
        let ready: Vec<&Arc<Generator>> = self.generators.iter().filter(|g| g.is_ready()).collect();
        if ready.len() <= 1 {
            return self.pick_ref().next_ids(count).await;
        }
        let k = ready.len() as u64;
        let parts = ready.iter().enumerate().map(|(i, g)| {
            let share = count / k + u64::from((i as u64) < count % k);
            g.next_ids(share)
        });
        let mut ids = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        for part in futures_util::future::join_all(parts).await {
            ids.extend(part?);
        }
        ids.sort_unstable();
        debug_assert!(ids.windows(2).all(|w| w[0] < w[1]));
        Ok(ids)
    }
}

/// One id from `g`; the call that needs no wait runs no nested async state
/// machine.
#[inline]
async fn one_id(g: &Generator) -> Result<u64, GenerateError> {
    match g.take_now(1)? {
        Some(t) => Ok(t.first),
        None => Ok(g.take_waiting(1).await?.first),
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::*;
    use crate::clock::ManualClock;
    use crate::generator::{GeneratorMetrics, Grant, DEFAULT_MAX_BACKWARD_WAIT};
    use crate::layout::{MachineId, Millis, DEFAULT_EPOCH_UNIX_MS};

    fn set_of(
        machine_ids: &[u16],
    ) -> (
        Arc<GeneratorSet>,
        Arc<ManualClock>,
        Vec<watch::Sender<Option<Grant>>>,
    ) {
        let clock = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1000);
        let mut senders = Vec::new();
        let mut generators = Vec::new();
        for &m in machine_ids {
            let (tx, rx) = watch::channel(Some(Grant {
                machine_id: MachineId(m),
                floor: Millis(0),
                fence: Millis(1_000_000),
                deadline: None,
            }));
            senders.push(tx);
            generators.push(Generator::new(
                Layout::default(),
                clock.clone(),
                rx,
                DEFAULT_MAX_BACKWARD_WAIT,
                GeneratorMetrics::default(),
            ));
        }
        (GeneratorSet::new(generators), clock, senders)
    }

    #[tokio::test]
    async fn a_large_batch_is_spread_across_machine_ids_and_ascending() {
        let (set, _clock, _tx) = set_of(&[3, 9]);
        // 2048 ids at one ms: exactly one ms of each machine id, no waiting.
        let ids = set.next_ids(2048).await.unwrap();
        assert_eq!(ids.len(), 2048);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        let layout = Layout::default();
        let on_3 = ids
            .iter()
            .filter(|&&id| layout.decode(id).unwrap().machine_id == MachineId(3))
            .count();
        assert_eq!(on_3, 1024);
        assert_eq!(ids[0], (1000 << 22) | (3 << 10));
        assert_eq!(ids[2047], (1000 << 22) | (9 << 10) | 1023);
    }

    #[tokio::test]
    async fn small_batches_rotate_over_ready_machine_ids_and_skip_stopped_ones() {
        let (set, _clock, tx) = set_of(&[1, 2, 3]);
        tx[1].send_replace(None);
        let layout = Layout::default();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let id = set.next_ids(1).await.unwrap()[0];
            seen.push(layout.decode(id).unwrap().machine_id.get());
        }
        seen.sort();
        assert_eq!(seen, vec![1, 1, 3, 3]);
    }

    #[tokio::test]
    async fn no_ready_machine_id_reports_why() {
        let (set, _clock, tx) = set_of(&[1, 2]);
        for t in &tx {
            t.send_replace(None);
        }
        assert!(!set.is_ready());
        assert_eq!(set.next_ids(5000).await, Err(GenerateError::NoGrant));
    }

    fn machine_of(id: u64) -> u16 {
        Layout::default().decode(id).unwrap().machine_id.get()
    }

    #[tokio::test]
    async fn by_key_takes_slot_key_mod_n_and_moves_on_only_when_it_cannot_issue() {
        let (set, _clock, tx) = set_of(&[3, 9, 12]);
        // Slot order: 3, 9, 12. Key 0 -> 3, 1 -> 9, 2 -> 12, 7 -> 9, u64::MAX -> 3 (2^64 - 1 = 0 mod 3).
        let mut got = Vec::new();
        for key in [0, 1, 2, 7, u64::MAX] {
            got.push(machine_of(set.next_id_for(key).await.unwrap()));
        }
        assert_eq!(got, vec![3, 9, 12, 9, 3]);
        // The first id of machine id 9 at this ms is sequence 0, then 1.
        assert_eq!(
            set.next_id_for(4).await.unwrap(),
            (1000 << 22) | (9 << 10) | 2
        );
        tx[1].send_replace(None);
        assert_eq!(machine_of(set.next_id_for(1).await.unwrap()), 12);
    }

    #[tokio::test]
    async fn by_thread_keeps_each_thread_on_one_machine_id() {
        let (set, _clock, _tx) = set_of(&[4, 5]);
        let mut per_thread = Vec::new();
        for _ in 0..2 {
            let set = set.clone();
            let thread = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let mut machines = Vec::new();
                    for _ in 0..50 {
                        machines.push(machine_of(set.next_id_by_thread().await.unwrap()));
                    }
                    machines
                })
            });
            per_thread.push(thread.join().unwrap());
        }
        // Which machine id a thread gets depends on its index, which other
        // tests' threads share; that it keeps to one does not.
        for machines in &per_thread {
            assert_eq!(machines.len(), 50);
            assert!(machines.iter().all(|&m| m == machines[0]), "{machines:?}");
        }
    }

    #[tokio::test]
    async fn a_pinned_handle_takes_from_its_machine_id_only_and_stops_with_it() {
        let (set, _clock, tx) = set_of(&[3, 9]);
        let mut pinned = set.pin(3); // 3 % 2 = slot 1: machine id 9
        assert_eq!(pinned.machine_id(), Some(MachineId(9)));
        assert_eq!(pinned.next_id().await.unwrap(), (1000 << 22) | (9 << 10));
        assert_eq!(
            pinned.next_ids(3).await.unwrap(),
            vec![
                (1000 << 22) | (9 << 10) | 1,
                (1000 << 22) | (9 << 10) | 2,
                (1000 << 22) | (9 << 10) | 3
            ]
        );
        // Machine id 3 can still issue, but a pinned handle never moves.
        tx[1].send_replace(None);
        assert_eq!(pinned.next_id().await, Err(GenerateError::NoGrant));
        assert_eq!(pinned.machine_id(), None);
        assert_eq!(machine_of(set.next_id().await.unwrap()), 3);
    }

    #[tokio::test]
    async fn every_spread_together_never_repeats_an_id() {
        let (set, clock, _tx) = set_of(&[1, 2]);
        let mut ids = Vec::new();
        for round in 0..300u64 {
            ids.push(set.next_id().await.unwrap());
            ids.push(set.next_id_for(round).await.unwrap());
            ids.push(set.next_id_by_thread().await.unwrap());
            ids.push(set.pin(round as usize).next_id().await.unwrap());
            if round % 100 == 99 {
                clock.advance(std::time::Duration::from_millis(1));
            }
        }
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
    }
}
