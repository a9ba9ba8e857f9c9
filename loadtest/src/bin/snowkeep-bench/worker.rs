//! Workers: what the run shares between them, the rate and concurrency
//! schedules they follow, and the loop each runs, counting codes, errors and
//! latency.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use snowkeep_bench::report::SHORT_STREAM;
use snowkeep_bench::schedule::Schedule;
use snowkeep_bench::{CallRecord, IdLog};
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;

use crate::args::{Args, Format};
use crate::call::{one_call, Call, CallContext, Progress};

/// What the run shares between workers.
pub(crate) struct Shared {
    pub(crate) args: Args,
    pub(crate) call: Call,
    pub(crate) metadata: MetadataMap,
    pub(crate) started: AtomicU64,
    pub(crate) done: AtomicU64,
    pub(crate) t0: Instant,
    pub(crate) deadline: Option<Instant>,
    pub(crate) rate: Option<Schedule>,
    pub(crate) concurrency: Schedule,
    /// Next free call slot of the rate schedule, seconds since `t0`.
    pub(crate) next_slot: Mutex<f64>,
    /// Latency of every call, µs: one histogram for all workers (one each
    /// would cost 160 kB a worker).
    pub(crate) latency_us: Mutex<Histogram<u64>>,
    /// Workers allowed to call now (the concurrency schedule), refreshed by
    /// a ticker while the schedule changes.
    pub(crate) level: tokio::sync::watch::Receiver<u32>,
}

/// What one worker measured.
pub(crate) struct WorkerResult {
    pub(crate) log: IdLog,
    pub(crate) codes: BTreeMap<String, u64>,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) ids: u64,
    pub(crate) details: Vec<CallRecord>,
}

pub(crate) fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3).context("histogram bounds")
}

impl Shared {
    /// Waits for the rate schedule's next free slot (none without a rate).
    /// False when no slot will come before the run ends: the schedule fell to
    /// 0 for good, or the next slot lies past `-z`.
    pub(crate) async fn pace(&self) -> bool {
        let Some(rate) = self.rate else { return true };
        loop {
            let elapsed = self.t0.elapsed().as_secs_f64();
            // Each slot is spaced by the rate at that slot's own time, so a
            // falling schedule is followed and not what it was when reserved.
            let reserved = {
                let mut next = self.next_slot.lock().unwrap_or_else(|p| p.into_inner());
                let slot = next.max(elapsed);
                let r = Duration::try_from_secs_f64(slot).map_or(0.0, |t| rate.at(t));
                if r > 0.0 {
                    *next = slot + 1.0 / r;
                    Some(slot)
                } else {
                    None
                }
            };
            let Some(slot) = reserved else {
                if !rate.rises() || self.over() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let Some(at) = Duration::try_from_secs_f64(slot)
                .ok()
                .and_then(|d| self.t0.checked_add(d))
            else {
                return false;
            };
            if self.deadline.is_some_and(|d| at >= d) {
                return false;
            }
            tokio::time::sleep_until(at).await;
            return true;
        }
    }

    /// What each call reads of the run.
    pub(crate) fn call_context(&self) -> CallContext<'_> {
        CallContext {
            args: &self.args,
            call: &self.call,
            metadata: &self.metadata,
            deadline: self.deadline,
        }
    }

    pub(crate) fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// Worker `index`: calls on `channel` while the run lasts and its turn
/// under the concurrency schedule holds, paced by the rate schedule.
pub(crate) async fn worker(index: u32, channel: Channel, shared: Arc<Shared>) -> WorkerResult {
    let mut result = WorkerResult {
        log: IdLog::new(shared.args.check),
        codes: BTreeMap::new(),
        errors: BTreeMap::new(),
        ids: 0,
        details: Vec::new(),
    };
    let keep_details = shared.args.format == Format::Csv;
    let mut level = shared.level.clone();
    loop {
        if shared.over() {
            break;
        }
        // A worker above the concurrency schedule's value waits for it to
        // rise, and stops when it never will.
        if index >= *level.borrow_and_update() {
            if !wait_for_turn(&shared, &mut level).await {
                break;
            }
            continue;
        }
        if !shared.pace().await {
            break;
        }
        let n = shared.started.fetch_add(1, Ordering::Relaxed);
        if shared.deadline.is_none() && n >= shared.args.total {
            break;
        }
        if shared.over() {
            break;
        }
        let t0 = Instant::now();
        let (progress, outcome) =
            one_call(&channel, shared.call_context(), n, &mut result.log).await;
        let us = u64::try_from(t0.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        shared
            .latency_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .saturating_record(us);
        let code = result.count(&progress, outcome);
        if keep_details {
            result.details.push(CallRecord {
                offset_ms: (t0 - shared.t0).as_secs_f64() * 1000.0,
                latency_us: us,
                code,
            });
        }
        shared.done.fetch_add(1, Ordering::Relaxed);
    }
    result
}

/// Waits for the concurrency schedule's value to change; false when the
/// worker should stop: the schedule never rises, or the run ended.
async fn wait_for_turn(shared: &Shared, level: &mut tokio::sync::watch::Receiver<u32>) -> bool {
    if !shared.concurrency.rises() {
        return false;
    }
    let wake = async {
        match shared.deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        changed = level.changed() => changed.is_ok(),
        _ = wake => false,
    }
}

impl WorkerResult {
    /// Counts one call's ids, its code and its error, if any; returns the
    /// code (`Ok`, a gRPC code name or [`SHORT_STREAM`]).
    fn count(&mut self, progress: &Progress, outcome: Result<(), tonic::Status>) -> String {
        self.ids += progress.delivered;
        let short_of = progress.short_of();
        if let Some(asked) = short_of {
            self.log.record_stream_end(asked, progress.delivered);
        }
        let code = match (outcome, short_of) {
            (Ok(()), None) => "Ok".to_owned(),
            // A server that ends a stream early with OK (older snowkeep
            // servers at shutdown) must not pass for a whole stream.
            (Ok(()), Some(asked)) => {
                let key = format!(
                    "{SHORT_STREAM}: the server ended the stream with OK after {} of {asked} ids",
                    progress.delivered
                );
                *self.errors.entry(key).or_default() += 1;
                SHORT_STREAM.to_owned()
            }
            (Err(status), _) => {
                let key = format!("{:?}: {}", status.code(), status.message());
                *self.errors.entry(key).or_default() += 1;
                format!("{:?}", status.code())
            }
        };
        *self.codes.entry(code.clone()).or_default() += 1;
        code
    }
}
