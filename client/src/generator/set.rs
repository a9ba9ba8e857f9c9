//! Several generators, one per held machine id, behind one face.
//!
//! Spec/002: a process that needs more than one machine id's rate holds N of
//! them. A batch larger than one millisecond's sequence is spread across every
//! ready machine id and merged, so it comes back strictly ascending; smaller
//! batches go to one machine id at a time, round-robin. A *stream* must stay
//! ascending across its batches, which ids from different machine ids
//! interleaved in time cannot promise, so a stream draws from one machine id
//! ([`GeneratorSet::pick`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::Generator;
use crate::error::GenerateError;
use crate::layout::Layout;

/// The generators of all machine ids an instance holds.
#[derive(Debug)]
pub struct GeneratorSet {
    generators: Vec<Arc<Generator>>,
    next: AtomicUsize,
}

impl GeneratorSet {
    /// Wraps `generators` (at least one; all with one layout).
    pub fn new(generators: Vec<Arc<Generator>>) -> Arc<Self> {
        assert!(!generators.is_empty(), "a generator set needs a generator");
        Arc::new(Self {
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

    /// A ready generator, round-robin; the first one when none is ready (its
    /// error then says why issuance is stopped).
    pub fn pick(&self) -> Arc<Generator> {
        self.pick_ref().clone()
    }

    #[inline]
    fn pick_ref(&self) -> &Arc<Generator> {
        let n = self.generators.len();
        if n == 1 {
            // No choice to make: skip the readiness check and its clock reads.
            return &self.generators[0];
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|i| &self.generators[(start + i) % n])
            .find(|g| g.is_ready())
            .unwrap_or(&self.generators[0])
    }

    /// One id, from one machine id (round-robin over the ready ones).
    pub async fn next_id(&self) -> Result<u64, GenerateError> {
        // The call that needs no wait runs no nested async state machine.
        let g = self.pick_ref();
        match g.take_now(1)? {
            Some(t) => Ok(t.first),
            None => Ok(g.take_waiting(1).await?.first),
        }
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
}
