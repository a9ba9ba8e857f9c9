//! A prefetching id pool: a background task keeps a local buffer filled from
//! `NextIds`, refilling when it falls to the low watermark, so `next_id()` is a
//! local pop. Ids come out ascending within each fetched batch, not globally
//! (batches may come from different servers). Buffered ids older than
//! `max_age` are dropped, never handed out: Hazelcast's Flake ID client keeps
//! a batch of 100 for at most 10 minutes, the model of these defaults.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use super::RemoteClient;
use crate::error::ClientError;

/// Pool sizes and ages.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Ids fetched per refill (clamped to 1..=100000). Default 100.
    pub batch: u32,
    /// Refill when this many or fewer ids are buffered. Default 25.
    pub low_watermark: usize,
    /// Longest a fetched id is kept: older ones are dropped unused.
    /// Default 10 minutes.
    pub max_age: Duration,
    /// Longest `next_id` waits for a refill before it returns the last error.
    /// Default 10 s (the default retry budget).
    pub max_wait: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            batch: 100,
            low_watermark: 25,
            max_age: Duration::from_secs(600),
            max_wait: Duration::from_secs(10),
        }
    }
}

/// One fetched batch and when it arrived.
struct Batch {
    ids: VecDeque<u64>,
    fetched: Instant,
}

struct Buffer {
    batches: VecDeque<Batch>,
    /// Ids in `batches`.
    len: usize,
    last_error: Option<String>,
}

impl Buffer {
    /// Drops the batches older than `max_age`.
    fn drop_expired(&mut self, max_age: Duration) {
        while let Some(b) = self.batches.front() {
            if b.fetched.elapsed() < max_age {
                break;
            }
            self.len -= b.ids.len();
            self.batches.pop_front();
        }
    }

    fn pop(&mut self, max_age: Duration) -> Option<u64> {
        self.drop_expired(max_age);
        let front = self.batches.front_mut()?;
        let id = front.ids.pop_front();
        if front.ids.is_empty() {
            self.batches.pop_front();
        }
        self.len -= 1;
        id
    }
}

/// Ids fetched ahead of use.
pub struct IdPool {
    buffer: Arc<Mutex<Buffer>>,
    /// Wakes the refiller (low watermark) and waiters (ids arrived).
    refill: Arc<Notify>,
    filled: Arc<Notify>,
    task: JoinHandle<()>,
    closed: AtomicBool,
    config: PoolConfig,
}

impl std::fmt::Debug for IdPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdPool").finish_non_exhaustive()
    }
}

fn lock(buffer: &Mutex<Buffer>) -> std::sync::MutexGuard<'_, Buffer> {
    buffer.lock().unwrap_or_else(|p| p.into_inner())
}

impl IdPool {
    /// Starts a pool over `client`; the first refill starts at once.
    pub fn new(client: RemoteClient, mut config: PoolConfig) -> Self {
        config.batch = config.batch.clamp(1, super::MAX_COUNT);
        let buffer = Arc::new(Mutex::new(Buffer {
            batches: VecDeque::new(),
            len: 0,
            last_error: None,
        }));
        let refill = Arc::new(Notify::new());
        let filled = Arc::new(Notify::new());
        let task = tokio::spawn(refill_loop(
            client,
            config,
            buffer.clone(),
            refill.clone(),
            filled.clone(),
        ));
        refill.notify_one();
        Self {
            buffer,
            refill,
            filled,
            task,
            closed: AtomicBool::new(false),
            config,
        }
    }

    /// The next id: a local pop, waiting for a refill only when the pool ran
    /// dry, and at most `max_wait`.
    ///
    /// # Errors
    /// [`ClientError::PoolEmpty`] with the last refill error after
    /// `max_wait`; [`ClientError::PoolClosed`] after [`IdPool::close`].
    pub async fn next_id(&self) -> Result<u64, ClientError> {
        let until = Instant::now() + self.config.max_wait;
        loop {
            if self.closed.load(Ordering::Acquire) {
                return Err(ClientError::PoolClosed);
            }
            let waiting = self.filled.notified();
            let (id, low) = {
                let mut b = lock(&self.buffer);
                let id = b.pop(self.config.max_age);
                (id, b.len <= self.config.low_watermark)
            };
            if low {
                self.refill.notify_one();
            }
            if let Some(id) = id {
                return Ok(id);
            }
            if tokio::time::timeout_at(until, waiting).await.is_err() {
                return Err(ClientError::PoolEmpty {
                    waited: self.config.max_wait,
                    last_error: self.last_error().unwrap_or_else(|| "none yet".into()),
                });
            }
        }
    }

    /// Ids buffered now (ids past `max_age` included until the next pop).
    pub fn buffered(&self) -> usize {
        lock(&self.buffer).len
    }

    /// The last refill error, if the latest refill failed.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.buffer).last_error.clone()
    }

    /// Stops the background refill and drops the buffered ids; `next_id`
    /// fails with [`ClientError::PoolClosed`] from now on (waiters too).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.task.abort();
        let mut b = lock(&self.buffer);
        b.batches.clear();
        b.len = 0;
        drop(b);
        self.filled.notify_waiters();
    }
}

impl Drop for IdPool {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn refill_loop(
    client: RemoteClient,
    config: PoolConfig,
    buffer: Arc<Mutex<Buffer>>,
    refill: Arc<Notify>,
    filled: Arc<Notify>,
) {
    loop {
        let low = {
            let mut b = lock(&buffer);
            b.drop_expired(config.max_age);
            b.len <= config.low_watermark
        };
        if !low {
            refill.notified().await;
            continue;
        }
        match client.next_ids(config.batch).await {
            Ok(ids) => {
                let mut b = lock(&buffer);
                b.len += ids.len();
                b.batches.push_back(Batch {
                    ids: ids.into(),
                    fetched: Instant::now(),
                });
                b.last_error = None;
                drop(b);
                filled.notify_waiters();
            }
            Err(e) => {
                warn!(error = %e, "id pool refill failed; retrying");
                lock(&buffer).last_error = Some(e.to_string());
                filled.notify_waiters();
                tokio::time::sleep(client.config().backoff).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(ids: std::ops::Range<u64>, fetched: Instant) -> Batch {
        Batch {
            ids: ids.collect(),
            fetched,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ids_older_than_the_max_age_are_dropped_not_handed_out() {
        let start = Instant::now();
        let mut b = Buffer {
            batches: VecDeque::from([batch(1..4, start)]),
            len: 3,
            last_error: None,
        };
        tokio::time::advance(Duration::from_secs(5)).await;
        b.batches.push_back(batch(10..12, Instant::now()));
        b.len += 2;
        let max_age = Duration::from_secs(8);
        assert_eq!(b.pop(max_age), Some(1));
        tokio::time::advance(Duration::from_secs(4)).await;
        // The first batch is 9 s old now, the second 4 s.
        assert_eq!(b.pop(max_age), Some(10));
        assert_eq!(b.len, 1);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(b.pop(max_age), None);
        assert_eq!(b.len, 0);
    }
}
