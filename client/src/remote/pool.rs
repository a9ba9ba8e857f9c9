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
    /// Longest `next_id` waits for ids (a refill failing sooner returns its
    /// error sooner). Default 10 s (the default retry budget).
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
    /// The last refill's error, while the latest refill failed.
    last_error: Option<ClientError>,
    /// Refills that failed so far: a waiter returns the error of a refill
    /// that failed after it began to wait, never an older one.
    failures: u64,
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
            failures: 0,
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
    /// The error of the refill it waited for, as the client returned it
    /// (the server's status and code: a refused key at once, a retryable
    /// failure once the retry budget is spent); [`ClientError::PoolEmpty`]
    /// after `max_wait` with no refill finished; [`ClientError::PoolClosed`]
    /// after [`IdPool::close`].
    pub async fn next_id(&self) -> Result<u64, ClientError> {
        // Set at the first wait (no clock read when the buffer has ids).
        let mut until = None;
        // Refill failures when this call began (read under the first pop's
        // lock: one lock per id on the fast path).
        let mut seen = None;
        loop {
            // Made before the closed check, so a close in between wakes it.
            let waiting = self.filled.notified();
            if self.closed.load(Ordering::Acquire) {
                return Err(ClientError::PoolClosed);
            }
            let (id, low, failed) = {
                let mut b = lock(&self.buffer);
                let id = b.pop(self.config.max_age);
                let failures = b.failures;
                let failed = (failures != *seen.get_or_insert(failures))
                    .then(|| b.last_error.as_ref().map(replay))
                    .flatten();
                (id, b.len <= self.config.low_watermark, failed)
            };
            if let Some(e) = failed.filter(|_| id.is_none()) {
                return Err(e);
            }
            if low {
                self.refill.notify_one();
            }
            if let Some(id) = id {
                return Ok(id);
            }
            let until = *until.get_or_insert_with(|| Instant::now() + self.config.max_wait);
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
        lock(&self.buffer)
            .last_error
            .as_ref()
            .map(ToString::to_string)
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

/// A waiter's copy of a refill's error: the server's status as it came
/// (code and message), anything else as [`ClientError::PoolEmpty`].
fn replay(e: &ClientError) -> ClientError {
    match e {
        ClientError::Status(s) => ClientError::Status(s.clone()),
        other => ClientError::PoolEmpty {
            waited: Duration::ZERO,
            last_error: other.to_string(),
        },
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
                // The call already retried what the retry rule retries; the
                // next refill starts when a `next_id` asks (never a loop
                // calling a server that refuses this client's key).
                warn!(error = %e, "id pool refill failed");
                // A wake-up stored while this refill ran came from a waiter
                // that gets this error: drop it (before the error is seen,
                // so no later ask is lost), then wait for a new ask.
                let _ = futures_util::FutureExt::now_or_never(refill.notified());
                {
                    let mut b = lock(&buffer);
                    b.last_error = Some(e);
                    b.failures += 1;
                }
                filled.notify_waiters();
                refill.notified().await;
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
            failures: 0,
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
