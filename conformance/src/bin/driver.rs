//! The Rust client's conformance driver: reads one JSON request per line on
//! stdin and answers each on stdout, through `snowkeep-client`'s public API
//! only (`conformance/README.md`, "The driver protocol").

use std::io::Write;
use std::time::Duration;

use tokio::time::Instant;

use serde_json::{json, Value};
use snowkeep_client::{
    ApiKey, ClientError, ClientTls, IdPool, PoolConfig, RemoteClient, RemoteConfig,
};
use tokio::io::AsyncBufReadExt;

use snowkeep_conformance::{code_name, ids_json, percentile};

/// What a request handler returns: the answer's fields, or an error answer.
type Answer = Result<Value, Value>;

#[derive(Default)]
struct Driver {
    client: Option<RemoteClient>,
    pool: Option<IdPool>,
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
        let api_key = match req["api_key"].as_str() {
            Some(k) => Some(ApiKey::new(k).map_err(|e| invalid("api_key", e))?),
            None => None,
        };
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
}
