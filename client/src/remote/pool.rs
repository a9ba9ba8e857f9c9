//! A prefetching id pool: a background task keeps a local buffer filled from
//! `NextIds`, refilling when it falls to the low watermark, so `next_id()` is a
//! local pop. Ids come out ascending within each fetched batch, not globally
//! (batches may come from different servers).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::warn;

use super::RemoteClient;
use crate::error::ClientError;

/// Pool sizes.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Ids fetched per refill (clamped to 1..=100000).
    pub batch: u32,
    /// Refill when this many or fewer ids are buffered.
    pub low_watermark: usize,
    /// Longest `next_id` waits for a refill before it returns the last error.
    pub max_wait: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            batch: 1000,
            low_watermark: 250,
            max_wait: Duration::from_secs(5),
        }
    }
}

struct Buffer {
    ids: VecDeque<u64>,
    last_error: Option<String>,
}

/// Ids fetched ahead of use.
pub struct IdPool {
    buffer: Arc<Mutex<Buffer>>,
    /// Wakes the refiller (low watermark) and waiters (ids arrived).
    refill: Arc<Notify>,
    filled: Arc<Notify>,
    task: JoinHandle<()>,
    max_wait: Duration,
}

impl std::fmt::Debug for IdPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdPool").finish_non_exhaustive()
    }
}

impl IdPool {
    /// Starts a pool over `client`.
    pub fn new(client: RemoteClient, mut config: PoolConfig) -> Self {
        config.batch = config.batch.clamp(1, 100_000);
        let buffer = Arc::new(Mutex::new(Buffer {
            ids: VecDeque::new(),
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
            max_wait: config.max_wait,
        }
    }

    /// The next id: a local pop, waiting for a refill only when the pool ran
    /// dry, and at most `max_wait` ([`ClientError::PoolEmpty`] then).
    pub async fn next_id(&self) -> Result<u64, ClientError> {
        let until = tokio::time::Instant::now() + self.max_wait;
        loop {
            let waiting = self.filled.notified();
            {
                let mut b = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(id) = b.ids.pop_front() {
                    drop(b);
                    self.refill.notify_one();
                    return Ok(id);
                }
            }
            self.refill.notify_one();
            if tokio::time::timeout_at(until, waiting).await.is_err() {
                return Err(ClientError::PoolEmpty {
                    waited: self.max_wait,
                    last_error: self.last_error().unwrap_or_else(|| "none yet".into()),
                });
            }
        }
    }

    /// Ids buffered now.
    pub fn buffered(&self) -> usize {
        self.buffer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .len()
    }

    /// The last refill error, if the latest refill failed.
    pub fn last_error(&self) -> Option<String> {
        self.buffer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_error
            .clone()
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
        let low =
            buffer.lock().unwrap_or_else(|p| p.into_inner()).ids.len() <= config.low_watermark;
        if !low {
            refill.notified().await;
            continue;
        }
        match client.next_ids(config.batch).await {
            Ok(ids) => {
                let mut b = buffer.lock().unwrap_or_else(|p| p.into_inner());
                b.ids.extend(ids);
                b.last_error = None;
                drop(b);
                filled.notify_waiters();
            }
            Err(e) => {
                warn!(error = %e, "id pool refill failed; retrying");
                buffer.lock().unwrap_or_else(|p| p.into_inner()).last_error = Some(e.to_string());
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}
