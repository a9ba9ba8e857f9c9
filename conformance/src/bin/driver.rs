//! The Rust client's conformance driver: reads one JSON request per line on
//! stdin and answers each on stdout, through `snowkeep-client`'s public API
//! only (`conformance/README.md`, "The driver protocol").

use std::io::Write;
use std::time::Duration;

use tokio::time::Instant;

use serde_json::{json, Value};
use snowkeep_client::{
    ApiKey, ClientError, ClientTls, Clock, EmbeddedConfig, EmbeddedGenerator, IdPool, PoolConfig,
    RemoteClient, RemoteConfig, Requester, SharedClock, StopReason, SystemClock,
};
use tokio::io::AsyncBufReadExt;

use snowkeep_conformance::{code_name, ids_json, percentile};

/// What a request handler returns: the answer's fields, or an error answer.
type Answer = Result<Value, Value>;

#[derive(Default)]
struct Driver {
    client: Option<RemoteClient>,
    pool: Option<IdPool>,
    embedded: Option<EmbeddedGenerator>,
}

/// The system clock moved by a fixed offset (`clock_offset_ms` of
/// `embedded_start`): a host whose clock is behind or ahead of the servers'.
struct OffsetClock(i64);

impl Clock for OffsetClock {
    fn unix_ms(&self) -> u64 {
        SystemClock.unix_ms().saturating_add_signed(self.0)
    }
    fn now(&self) -> std::time::Instant {
        SystemClock.now()
    }
    fn monotonic_ns(&self) -> u64 {
        SystemClock.monotonic_ns()
    }
}

/// The `requester` of an `embedded_start` (`{"host_id","pid",
/// "start_unix_ms","nonce"}`), if it names one.
fn requester_of(req: &Value) -> Option<Requester> {
    let q = req.get("requester")?;
    Some(Requester {
        host_id: q["host_id"].as_str()?.to_owned(),
        pid: u32::try_from(q["pid"].as_u64()?).ok()?,
        start_unix_ms: q["start_unix_ms"].as_u64()?,
        nonce: q["nonce"].as_str()?.to_owned(),
    })
}

/// The error answer of an embedded op sent before `embedded_start`.
fn no_generator() -> Value {
    json!({"ok": false, "code": "FAILED_PRECONDITION", "message": "no embedded generator: send embedded_start first"})
}

/// The protocol's name of a stop reason (`conformance/README.md`).
fn stop_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::LeaseGone => "lease_gone",
        StopReason::TokenRefused => "token_refused",
        StopReason::MachineIdsChanged { .. } => "machine_ids_changed",
        StopReason::Expired => "expired",
        StopReason::ShutDown => "shut_down",
        StopReason::ClockPastFence { .. } => "clock_past_fence",
        StopReason::NamespaceGone => "namespace_gone",
        StopReason::NamespaceRolledBack => "namespace_rolled_back",
    }
}

/// The protocol's name of a start that failed fast, `None` for a server's
/// refusal (its code says it).
fn start_refusal(e: &ClientError) -> Option<&'static str> {
    Some(match e {
        ClientError::BadLayout(_) => "invalid_layout",
        ClientError::MachineIdOutOfRange { .. } => "machine_id_out_of_range",
        ClientError::GrantExpired => "lease_expired",
        ClientError::GrantCount { .. } | ClientError::GrantDuplicate { .. } => "grant_count",
        ClientError::ClockBehindFloor { .. } => "clock_behind_floor",
        ClientError::ClockPastFence { .. } => "clock_past_fence",
        _ => return None,
    })
}

/// Writes one JSON line to stdout and flushes it.
fn emit(v: &Value) {
    let mut out = std::io::stdout().lock();
    // A closed stdout means the runner went away: nothing left to answer.
    let _ = writeln!(out, "{v}").and_then(|()| out.flush());
}

/// The error answer of `e`, with the ids delivered before it.
fn failure(e: &ClientError, ids: Option<&[u64]>) -> Value {
    let mut v = json!({"ok": false, "code": code_name(e.code()), "message": e.to_string()});
    if let Some(ids) = ids {
        v["ids"] = ids_json(ids);
    }
    v
}

fn invalid(parameter: &str, detail: impl std::fmt::Display) -> Value {
    json!({"ok": false, "code": "INVALID_ARGUMENT", "message": format!("invalid {parameter}: {detail}")})
}

fn u64_of(req: &Value, key: &str, default: u64) -> u64 {
    req[key].as_u64().unwrap_or(default)
}

fn ms(req: &Value, key: &str, default: u64) -> Duration {
    Duration::from_millis(u64_of(req, key, default))
}

/// A `u32` field; values above `u32::MAX` saturate (the client refuses them).
fn u32_of(req: &Value, key: &str, default: u32) -> u32 {
    u32::try_from(u64_of(req, key, u64::from(default))).unwrap_or(u32::MAX)
}

/// The request's `api_key`, checked; `None` when it is null or absent.
fn api_key_of(req: &Value) -> Result<Option<ApiKey>, Value> {
    req["api_key"]
        .as_str()
        .map(|k| ApiKey::new(k).map_err(|e| invalid("api_key", e)))
        .transpose()
}

fn tls_of(tls: &Value) -> Result<Option<ClientTls>, Value> {
    if tls.is_null() {
        return Ok(None);
    }
    let ca = tls["ca"]
        .as_str()
        .ok_or_else(|| invalid("tls.ca", "missing"))?;
    let mut settings = ClientTls::from_ca_file(ca).map_err(|e| failure(&e, None))?;
    match (tls["cert"].as_str(), tls["key"].as_str()) {
        (None, None) => {}
        (Some(cert), Some(key)) => {
            settings = settings
                .identity_files(cert, key)
                .map_err(|e| failure(&e, None))?;
        }
        (Some(_), None) => return Err(invalid("tls.key", "a certificate needs its key")),
        (None, Some(_)) => return Err(invalid("tls.cert", "a key needs its certificate")),
    }
    Ok(Some(settings))
}

impl Driver {
    fn client(&self) -> Result<&RemoteClient, Value> {
        self.client.as_ref().ok_or_else(|| {
            json!({"ok": false, "code": "FAILED_PRECONDITION", "message": "no client: send open first"})
        })
    }

    fn open(&mut self, req: &Value) -> Answer {
        self.close();
        let endpoints: Vec<String> = req["endpoints"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let api_key = api_key_of(req)?;
        let config = RemoteConfig {
            request_timeout: ms(req, "request_timeout_ms", 5000),
            retry_budget: ms(req, "retry_budget_ms", 10_000),
            backoff: ms(req, "backoff_ms", 20),
            max_backoff: ms(req, "max_backoff_ms", 1000),
            api_key,
            ..RemoteConfig::default()
        };
        let client = match tls_of(&req["tls"])? {
            Some(tls) => RemoteClient::new_with_tls(&endpoints, config, &tls),
            None => RemoteClient::new(&endpoints, config),
        };
        self.client = Some(client.map_err(|e| failure(&e, None))?);
        Ok(json!({}))
    }

    async fn next_ids(&self, req: &Value) -> Answer {
        let ids = self
            .client()?
            .next_ids(u32_of(req, "count", 0))
            .await
            .map_err(|e| failure(&e, None))?;
        Ok(json!({"ids": ids_json(&ids)}))
    }

    async fn stream(&self, req: &Value) -> Answer {
        let total = u64_of(req, "total", 0);
        let pace = ms(req, "pace_ms", 0);
        let every = u64_of(req, "progress_every", 0);
        let mut stream = self
            .client()?
            .stream(total, u32_of(req, "batch_size", 0))
            .map_err(|e| failure(&e, None))?;
        let mut ids = Vec::new();
        let mut batches = 0u64;
        loop {
            match stream.next_batch().await {
                Ok(Some(batch)) => ids.extend(batch),
                Ok(None) => return Ok(json!({"ids": ids_json(&ids)})),
                Err(e) => return Err(failure(&e, Some(&ids))),
            }
            batches += 1;
            if every != 0 && batches.is_multiple_of(every) {
                let last = ids.last().map(u64::to_string);
                emit(&json!({"progress": {"received": ids.len(), "last_id": last}}));
            }
            if !pace.is_zero() {
                tokio::time::sleep(pace).await;
            }
        }
    }

    fn pool_open(&mut self, req: &Value) -> Answer {
        let client = self.client()?.clone();
        let batch = u32_of(req, "batch", 100);
        let config = PoolConfig {
            batch,
            low_watermark: usize::try_from(u64_of(req, "low_water", u64::from(batch / 4)))
                .unwrap_or(usize::MAX),
            max_age: ms(req, "max_age_ms", 600_000),
            max_wait: client.config().retry_budget,
        };
        if let Some(old) = self.pool.replace(IdPool::new(client, config)) {
            old.close();
        }
        Ok(json!({}))
    }

    async fn pool_take(&self, req: &Value) -> Answer {
        let pool = self.pool.as_ref().ok_or_else(|| {
            json!({"ok": false, "code": "FAILED_PRECONDITION", "message": "the id pool is closed"})
        })?;
        let count = u64_of(req, "count", 0);
        let mut ids = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        for _ in 0..count {
            match pool.next_id().await {
                Ok(id) => ids.push(id),
                Err(e) => return Err(failure(&e, Some(&ids))),
            }
        }
        Ok(json!({"ids": ids_json(&ids)}))
    }

    async fn decode(&self, req: &Value) -> Answer {
        let id = req["id"]
            .as_str()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| invalid("id", "not a decimal string"))?;
        let client = self.client()?;
        let d = client.decode(id).await.map_err(|e| failure(&e, None))?;
        let layout = client.layout().await.map_err(|e| failure(&e, None))?;
        Ok(json!({
            "unix_ms": layout.to_unix_ms(d.timestamp),
            "machine_id": d.machine_id.0,
            "sequence": d.sequence,
        }))
    }

    async fn bench_stream(&self, req: &Value) -> Answer {
        let total = u64_of(req, "total", 1_000_000);
        let start = Instant::now();
        let mut stream = self
            .client()?
            .stream(total, u32_of(req, "batch_size", 10_000))
            .map_err(|e| failure(&e, None))?;
        let mut n = 0u64;
        while let Some(batch) = stream.next_batch().await.map_err(|e| failure(&e, None))? {
            n += batch.len() as u64;
        }
        Ok(json!({"ids": n, "seconds": start.elapsed().as_secs_f64()}))
    }

    async fn bench_unary(&self, req: &Value) -> Answer {
        let client = self.client()?.clone();
        let seconds = Duration::from_secs_f64(req["seconds"].as_f64().unwrap_or(5.0));
        let until = Instant::now() + seconds;
        let callers = (0..u64_of(req, "concurrency", 50)).map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < until {
                    let t = Instant::now();
                    client.next_ids(1).await?;
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                }
                Ok::<_, ClientError>(latencies)
            })
        });
        let mut all = Vec::new();
        for caller in callers.collect::<Vec<_>>() {
            let latencies = caller.await.map_err(|e| invalid("concurrency", e))?;
            all.extend(latencies.map_err(|e| failure(&e, None))?);
        }
        all.sort_by(f64::total_cmp);
        Ok(
            json!({"calls": all.len(), "p50_ms": percentile(&all, 0.5), "p99_ms": percentile(&all, 0.99)}),
        )
    }

    async fn bench_pool(&self, req: &Value) -> Answer {
        let client = self.client()?.clone();
        let config = PoolConfig {
            batch: 100_000,
            low_watermark: 50_000,
            ..PoolConfig::default()
        };
        let pool = IdPool::new(client, config);
        pool.next_id().await.map_err(|e| failure(&e, None))?;
        let count = u64_of(req, "count", 40_000);
        let start = Instant::now();
        for _ in 0..count {
            pool.next_id().await.map_err(|e| failure(&e, None))?;
        }
        let elapsed = start.elapsed();
        pool.close();
        let ns = elapsed.as_secs_f64() * 1e9 / count.max(1) as f64;
        Ok(json!({"ids": count, "ns_per_id": ns}))
    }

    fn close(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.close();
        }
        self.client = None;
    }

    fn embedded(&self) -> Result<&EmbeddedGenerator, Value> {
        self.embedded.as_ref().ok_or_else(no_generator)
    }

    async fn embedded_start(&mut self, req: &Value) -> Answer {
        if let Some(old) = self.embedded.take() {
            old.shutdown().await;
        }
        let endpoint = req["endpoint"].as_str().unwrap_or_default();
        let api_key = api_key_of(req)?;
        let config = EmbeddedConfig {
            machine_ids: u32_of(req, "machine_ids", 1),
            check_interval: ms(req, "check_interval_ms", 30_000),
            max_floor_wait: ms(req, "max_floor_wait_ms", 30_000),
            acquire_attempts: Some(u32_of(req, "acquire_attempts", 1)),
            api_key,
            ..EmbeddedConfig::new(endpoint, req["namespace"].as_str().unwrap_or_default())
        };
        // A pinned identity (a process restarted as the same requester).
        let config = match requester_of(req) {
            Some(requester) => EmbeddedConfig {
                requester,
                ..config
            },
            None => config,
        };
        let offset = req["clock_offset_ms"].as_i64().unwrap_or(0);
        let clock: SharedClock = std::sync::Arc::new(OffsetClock(offset));
        match EmbeddedGenerator::start(config, clock).await {
            Ok(g) => {
                let held: Vec<u16> = g.machine_ids().iter().map(|m| m.0).collect();
                self.embedded = Some(g);
                Ok(json!({"machine_ids": held}))
            }
            Err(e) => {
                let mut answer = failure(&e, None);
                answer["reason"] = json!(start_refusal(&e));
                Err(answer)
            }
        }
    }

    /// The error answer of a take that failed, with the reason the
    /// generator stopped: a take can fail a moment before the stop is
    /// recorded (the deadline ends issuance and the stop at once), so this
    /// waits up to 1 s for it; null when it did not stop.
    async fn take_failure(&self, e: &snowkeep_client::GenerateError, ids: &[u64]) -> Value {
        let until = Instant::now() + Duration::from_secs(1);
        let mut reason = None;
        while let Some(g) = self.embedded.as_ref() {
            reason = g.stopped();
            if reason.is_some() || Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        json!({
            "ok": false,
            "code": if e.is_retryable() { "UNAVAILABLE" } else { "FAILED_PRECONDITION" },
            "message": e.to_string(),
            "reason": reason.map(stop_reason),
            "ids": ids_json(ids),
        })
    }

    async fn embedded_take(&self, req: &Value) -> Answer {
        let g = self.embedded()?;
        match g.next_ids(u64_of(req, "count", 0)).await {
            Ok(ids) => Ok(json!({"ids": ids_json(&ids)})),
            Err(e) => Err(self.take_failure(&e, &[]).await),
        }
    }

    /// One id at a time, `pace_ms` apart, until a take fails or `max_ms`
    /// passed (then an error answer with code DEADLINE_EXCEEDED).
    async fn embedded_take_until_stop(&self, req: &Value) -> Answer {
        let g = self.embedded()?;
        let (pace, until) = (
            ms(req, "pace_ms", 1),
            Instant::now() + ms(req, "max_ms", 10_000),
        );
        let mut ids = Vec::new();
        while Instant::now() < until {
            match g.next_id().await {
                Ok(id) => ids.push(id),
                Err(e) => return Err(self.take_failure(&e, &ids).await),
            }
            tokio::time::sleep(pace).await;
        }
        Err(
            json!({"ok": false, "code": "DEADLINE_EXCEEDED", "message": "the generator did not stop within max_ms", "ids": ids_json(&ids)}),
        )
    }

    /// Waits at most `wait_ms` for the generator to stop; its reason or null.
    async fn embedded_stopped(&self, req: &Value) -> Answer {
        let g = self.embedded()?;
        let until = Instant::now() + ms(req, "wait_ms", 0);
        loop {
            if let Some(reason) = g.stopped() {
                return Ok(json!({"reason": stop_reason(reason)}));
            }
            if Instant::now() >= until {
                return Ok(json!({"reason": null}));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn embedded_shutdown(&mut self) -> Answer {
        let g = self.embedded.take().ok_or_else(no_generator)?;
        Ok(json!({"released": g.shutdown().await}))
    }

    async fn handle(&mut self, req: &Value) -> Answer {
        match req["op"].as_str().unwrap_or("") {
            "open" => self.open(req),
            "next_ids" => self.next_ids(req).await,
            "stream" => self.stream(req).await,
            "pool_open" => self.pool_open(req),
            "pool_take" => self.pool_take(req).await,
            "pool_close" => {
                if let Some(pool) = self.pool.take() {
                    pool.close();
                }
                Ok(json!({}))
            }
            "decode" => self.decode(req).await,
            "bench_stream" => self.bench_stream(req).await,
            "bench_unary" => self.bench_unary(req).await,
            "bench_pool" => self.bench_pool(req).await,
            "embedded_start" => self.embedded_start(req).await,
            "embedded_take" => self.embedded_take(req).await,
            "embedded_take_until_stop" => self.embedded_take_until_stop(req).await,
            "embedded_stopped" => self.embedded_stopped(req).await,
            "embedded_shutdown" => self.embedded_shutdown().await,
            "close" => {
                self.close();
                Ok(json!({}))
            }
            other => Err(invalid("op", format!("unknown op {other:?}"))),
        }
    }
}

#[tokio::main]
async fn main() {
    let mut driver = Driver::default();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(req) => match driver.handle(&req).await {
                Ok(mut fields) => {
                    fields["ok"] = json!(true);
                    fields
                }
                Err(error) => error,
            },
            Err(e) => invalid("request", e),
        };
        emit(&answer);
    }
    driver.close();
    if let Some(g) = driver.embedded.take() {
        g.shutdown().await;
    }
}
