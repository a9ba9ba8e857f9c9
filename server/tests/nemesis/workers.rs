//! The checker's clients: per server slot a unary caller (whose outcomes are
//! the availability record) and a streamer, one embedded generator, and the
//! etcd watch that records every fence a holder persists. Each runs until
//! `stop` and records into the shared [`Recorder`].

use std::sync::Arc;
use std::time::Duration;

use snowkeep_client::{EmbeddedConfig, EmbeddedGenerator, SystemClock};
use snowkeep_proto::v1 as pb;
use tokio::sync::watch;
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use crate::checker::{Recorder, Refusal, REQUESTER};

/// Where a server slot's current process listens, and who it is.
#[derive(Clone, Debug)]
pub struct Target {
    pub url: String,
    /// The instance id it claims under (its holder value in etcd).
    pub holder: String,
}

/// Ids per unary call.
const UNARY_COUNT: u32 = 50;
/// Pause between unary calls, and after a refused one.
const UNARY_PACE: Duration = Duration::from_millis(10);
const RETRY_PACE: Duration = Duration::from_millis(50);
/// Ids per stream and per stream message; pause between messages.
const STREAM_TOTAL: u64 = 20_000;
const STREAM_BATCH: u32 = 500;
const STREAM_PACE: Duration = Duration::from_millis(40);
/// Ids per embedded batch and pause between batches.
const EMBEDDED_BATCH: u64 = 500;
const EMBEDDED_PACE: Duration = Duration::from_millis(40);

fn channel(url: &str, call_timeout: Option<Duration>) -> Channel {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .expect("url")
        .connect_timeout(Duration::from_millis(300));
    match call_timeout {
        Some(t) => endpoint.timeout(t),
        None => endpoint,
    }
    .connect_lazy()
}

/// Calls `NextIds(50)` on slot `slot` over and over, on a fresh channel for
/// each process the slot runs, recording ids and whether each call was served,
/// or else its code and message (a slot with no process counts as refusing).
pub async fn unary(
    slot: usize,
    mut target: watch::Receiver<Option<Target>>,
    rec: Arc<Recorder>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let Some(t) = target.borrow_and_update().clone() else {
            rec.refused(slot, Refusal::no_process());
            sleep(RETRY_PACE).await;
            continue;
        };
        let source = rec.source(&format!("{} unary", t.holder), &t.holder, Some(slot));
        let mut client = pb::id_service_client::IdServiceClient::new(channel(
            &t.url,
            Some(Duration::from_secs(1)),
        ));
        while !stop.is_cancelled() && !target.has_changed().unwrap_or(true) {
            match client
                .next_ids(pb::NextIdsRequest {
                    count: UNARY_COUNT,
                    ..Default::default()
                })
                .await
            {
                Ok(r) => {
                    rec.batch(source, rec.unit(), r.into_inner().ids);
                    rec.served(slot);
                    sleep(UNARY_PACE).await;
                }
                Err(status) => {
                    rec.refused(
                        slot,
                        Refusal {
                            code: status.code(),
                            message: status.message().to_owned(),
                        },
                    );
                    sleep(RETRY_PACE).await;
                }
            }
        }
    }
}

/// Opens `StreamIds` streams on slot `slot` one after another and records
/// each message; a stream that errs or stalls for 2 s is dropped and another
/// opened.
pub async fn stream(
    slot: usize,
    mut target: watch::Receiver<Option<Target>>,
    rec: Arc<Recorder>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let Some(t) = target.borrow_and_update().clone() else {
            sleep(RETRY_PACE).await;
            continue;
        };
        let source = rec.source(&format!("{} stream", t.holder), &t.holder, Some(slot));
        let mut client = pb::id_service_client::IdServiceClient::new(channel(&t.url, None))
            .max_decoding_message_size(16 * 1024 * 1024);
        while !stop.is_cancelled() && !target.has_changed().unwrap_or(true) {
            let request = pb::StreamIdsRequest {
                total: STREAM_TOTAL,
                batch_size: STREAM_BATCH,
                ..Default::default()
            };
            let Ok(Ok(resp)) = timeout(Duration::from_secs(2), client.stream_ids(request)).await
            else {
                sleep(RETRY_PACE).await;
                continue;
            };
            let mut messages = resp.into_inner();
            let unit = rec.unit();
            while let Ok(Ok(Some(batch))) =
                timeout(Duration::from_secs(2), messages.message()).await
            {
                rec.batch(source, unit, batch.ids);
                if stop.is_cancelled() {
                    break;
                }
                sleep(STREAM_PACE).await;
            }
        }
    }
}

/// Runs an embedded generator leased through `endpoint` (a proxy that follows
/// server slot 0) and takes batches from it; when it stops for good it is
/// shut down and a new one started, as an application would.
pub async fn embedded(
    endpoint: String,
    namespace: String,
    rec: Arc<Recorder>,
    stop: CancellationToken,
) {
    let source = rec.source("embedded", REQUESTER, None);
    while !stop.is_cancelled() {
        let mut config = EmbeddedConfig::new(endpoint.clone(), namespace.clone());
        config.acquire_backoff = (Duration::from_millis(200), Duration::from_secs(1));
        config.request_timeout = Duration::from_secs(2);
        let generator = tokio::select! {
            _ = stop.cancelled() => return,
            g = EmbeddedGenerator::start(config, SystemClock::shared()) => g,
        };
        let Ok(generator) = generator else {
            sleep(RETRY_PACE).await;
            continue;
        };
        while !stop.is_cancelled() {
            match generator.next_ids(EMBEDDED_BATCH).await {
                Ok(ids) => {
                    rec.batch(source, rec.unit(), ids);
                    sleep(EMBEDDED_PACE).await;
                }
                Err(_) if generator.stopped().is_some() => break,
                Err(_) => sleep(RETRY_PACE).await,
            }
        }
        generator.shutdown().await;
    }
}

/// Watches every key under `prefix` from revision `from` on, feeding holder
/// and fence puts to the recorder's fence log; after an error (a member
/// killed, etcd stopped) it watches again from the next unseen revision.
pub async fn watch_fences(
    endpoints: Vec<String>,
    prefix: String,
    rec: Arc<Recorder>,
    stop: CancellationToken,
) {
    use snowkeep_etcd::etcd_client::{EventType, WatchOptions};
    while !stop.is_cancelled() {
        let next = rec.fences.lock().unwrap().revision + 1;
        let attempt = async {
            let mut client =
                snowkeep_etcd::etcd_client::Client::connect(endpoints.clone(), None).await?;
            let mut events = client
                .watch(
                    prefix.clone(),
                    Some(WatchOptions::new().with_prefix().with_start_revision(next)),
                )
                .await?;
            while let Some(resp) = events.message().await? {
                let mut log = rec.fences.lock().unwrap();
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    if ev.event_type() == EventType::Put {
                        let key = kv.key_str().unwrap_or_default();
                        let key = key.strip_prefix(&prefix).unwrap_or(key);
                        log.put(key, kv.value_str().unwrap_or_default(), kv.mod_revision());
                    } else {
                        log.revision = log.revision.max(kv.mod_revision());
                    }
                }
            }
            Ok::<(), snowkeep_etcd::etcd_client::Error>(())
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = attempt => sleep(Duration::from_millis(200)).await,
        }
    }
}
