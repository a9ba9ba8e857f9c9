//! snowkeep-bench: a gRPC load tester in the manner of ghz, with an id checker.
//!
//! Two forms of `--call`:
//! - `unary` or `stream`: snowkeep's `NextIds` / `StreamIds` with `--count`
//!   and `--batch-size`;
//! - `package.Service/Method`: any method of any server, described by server
//!   reflection or by `--proto` files, with the request as JSON (`-d`) and
//!   ghz-style templates (`{{.RequestNumber}}`, `{{newUUID}}`, …).
//!
//! Load: `-c` workers over `--connections` HTTP/2 connections, `-n` calls or
//! `-z` duration, `--rps` or a step/line rate schedule, a step/line
//! concurrency schedule, per-call `--timeout`, `-m` metadata, TLS or
//! plaintext. Output as summary, json, csv, html or prometheus. `--check`
//! keeps every id (snowkeep's `ids`, or ferroid's `packed_ids`) and checks
//! uniqueness and per-call order, and that every finite `StreamIds` stream
//! delivered its `total`. A finite stream that ended short is a failed call
//! even when its status was OK (`ShortStream` in the status distribution).
//! Exit code 2 when the check fails, 1 on a usage or connection error or
//! when every call failed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use prost_reflect::{DynamicMessage, MethodDescriptor};
use rand::SeedableRng;
use snowkeep_bench::dynamic::{self, DynamicCodec};
use snowkeep_bench::report::SHORT_STREAM;
use snowkeep_bench::schedule::Schedule;
use snowkeep_bench::template::Template;
use snowkeep_bench::{check, CallRecord, IdLog, Report};
use snowkeep_proto::v1 as pb;
use tokio::time::Instant;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// gRPC load tester and id checker.
#[derive(Debug, Parser)]
#[command(name = "snowkeep-bench", version, about, allow_negative_numbers = true)]
struct Args {
    /// Server address, `host:port` (ghz's positional form); overrides --target.
    host: Option<String>,
    /// Server URL: `http://host:port` (plaintext), `https://host:port` (TLS),
    /// or a bare `host:port` (plaintext unless a TLS option is given).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    target: String,
    /// `unary` (snowkeep NextIds), `stream` (snowkeep StreamIds), or any
    /// method as `package.Service/Method`.
    #[arg(long, default_value = "unary")]
    call: String,
    /// snowkeep shortcuts: ids per call, `NextIds.count` or the
    /// `StreamIds.total` of each stream (0: endless streams, each ended by
    /// --duration or by --timeout, and counted as served with what it sent).
    #[arg(long, default_value_t = 100)]
    count: u32,
    /// snowkeep shortcuts: ids per streamed message (`StreamIds.batch_size`).
    #[arg(long, default_value_t = 1000)]
    batch_size: u32,
    /// `.proto` file describing the called method (repeatable); without it
    /// the server's reflection service is asked.
    #[arg(long)]
    proto: Vec<PathBuf>,
    /// Folder to search for imports of --proto files (repeatable).
    #[arg(short = 'i', long)]
    import_path: Vec<PathBuf>,
    /// Request as JSON (a JSON array of messages for client-streaming
    /// methods), with templates such as {{.RequestNumber}}. Default `{}`.
    #[arg(short = 'd', long)]
    data: Option<String>,
    /// Read the request JSON from this file.
    #[arg(short = 'D', long, conflicts_with = "data")]
    data_file: Option<PathBuf>,
    /// Request metadata as a JSON object of strings, e.g. '{"x-team":"a"}'.
    #[arg(short = 'm', long)]
    metadata: Option<String>,
    /// Number of calls in all (ignored with --duration).
    #[arg(short = 'n', long, default_value_t = 200)]
    total: u64,
    /// Run for this long instead of a number of calls (e.g. 10s).
    #[arg(short = 'z', long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Concurrent workers (the start of a concurrency schedule).
    #[arg(short = 'c', long, default_value_t = 10)]
    concurrency: u32,
    /// HTTP/2 connections; workers are spread evenly over them.
    #[arg(long, default_value_t = 1)]
    connections: u32,
    /// Calls per second in all (0 = as fast as possible); the start of a
    /// rate schedule.
    #[arg(long, default_value_t = 0.0)]
    rps: f64,
    /// Rate schedule: const (--rps), step or line.
    #[arg(long, value_enum, default_value_t = Shape::Const)]
    load_schedule: Shape,
    /// Rate at the start of a step/line schedule (default --rps).
    #[arg(long)]
    load_start: Option<f64>,
    /// Rate added per step (step) or per second (line).
    #[arg(long, default_value_t = 0.0)]
    load_step: f64,
    /// Rate the schedule stops at.
    #[arg(long)]
    load_end: Option<f64>,
    /// Time at each rate of a step schedule.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    load_step_duration: Duration,
    /// Time after which the rate stops changing.
    #[arg(long, value_parser = humantime::parse_duration)]
    load_max_duration: Option<Duration>,
    /// Concurrency schedule: const (-c), step or line.
    #[arg(long, value_enum, default_value_t = Shape::Const)]
    concurrency_schedule: Shape,
    /// Workers at the start of a step/line schedule (default -c).
    #[arg(long)]
    concurrency_start: Option<u32>,
    /// Workers added per step (step) or per second (line).
    #[arg(long, default_value_t = 0)]
    concurrency_step: i64,
    /// Workers the schedule stops at.
    #[arg(long)]
    concurrency_end: Option<u32>,
    /// Time at each concurrency of a step schedule.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    concurrency_step_duration: Duration,
    /// Time after which the concurrency stops changing.
    #[arg(long, value_parser = humantime::parse_duration)]
    concurrency_max_duration: Option<Duration>,
    /// Per-call timeout; a call still running then counts as DeadlineExceeded.
    #[arg(short = 't', long, default_value = "20s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Plaintext even with TLS options (the default for http:// and host:port).
    #[arg(long)]
    insecure: bool,
    /// Use TLS with the system's roots (implied by https:// and the options below).
    #[arg(long)]
    tls: bool,
    /// PEM file of a CA to trust for TLS.
    #[arg(long)]
    cacert: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --key).
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// PEM client key for mutual TLS (with --cert).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Server name to verify the certificate against (default: the host).
    #[arg(long)]
    cname: Option<String>,
    /// Keep every id and check uniqueness, per-call order, and that every
    /// finite StreamIds stream delivered all the ids it asked for (exit code
    /// 2 otherwise).
    #[arg(long)]
    check: bool,
    /// Output format.
    #[arg(short = 'O', long, value_enum, default_value_t = Format::Summary)]
    format: Format,
    /// Write the output here instead of stdout.
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
    /// Never draw the progress bar (drawn on a terminal for runs over 2 s).
    #[arg(long)]
    no_progress: bool,
    /// Before the run, retry one call while the server answers UNAVAILABLE
    /// (or nothing) until this long passes, and report on stderr how long it
    /// took until it answered (time to first batch).
    #[arg(long, value_parser = humantime::parse_duration)]
    wait_ready: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Shape {
    Const,
    Step,
    Line,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// ghz's text summary.
    #[value(alias = "text")]
    Summary,
    Json,
    Csv,
    Html,
    Prometheus,
}

/// A dynamic method, ready to call.
struct DynCall {
    method: MethodDescriptor,
    path: http::uri::PathAndQuery,
    template: Template,
    /// Pre-built requests when the template has no per-call holes.
    fixed: Option<Vec<DynamicMessage>>,
}

enum Call {
    Unary,
    Stream,
    Dynamic(DynCall),
}

/// What the run shares between workers.
struct Shared {
    args: Args,
    call: Call,
    metadata: MetadataMap,
    started: AtomicU64,
    done: AtomicU64,
    t0: Instant,
    deadline: Option<Instant>,
    rate: Option<Schedule>,
    concurrency: Schedule,
    /// Next free call slot of the rate schedule, seconds since `t0`.
    next_slot: Mutex<f64>,
    /// Latency of every call, µs: one histogram for all workers (one each
    /// would cost 160 kB a worker).
    latency_us: Mutex<Histogram<u64>>,
    /// Workers allowed to call now (the concurrency schedule), refreshed by
    /// a ticker while the schedule changes.
    level: tokio::sync::watch::Receiver<u32>,
}

/// Most workers a run may start (each holds a task and a channel).
const MAX_WORKERS: u32 = 10_000;
/// Lowest nonzero rate: one call a day.
const MIN_RATE: f64 = 1.0 / 86_400.0;

/// What one worker measured.
struct WorkerResult {
    log: IdLog,
    codes: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    ids: u64,
    details: Vec<CallRecord>,
}

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3).context("histogram bounds")
}

fn schedule(
    shape: Shape,
    start: f64,
    step: f64,
    end: Option<f64>,
    step_duration: Duration,
    max: Option<Duration>,
) -> Schedule {
    match shape {
        Shape::Const => Schedule::Const { start },
        Shape::Step => Schedule::Step {
            start,
            step,
            end,
            step_duration,
            max_duration: max,
        },
        Shape::Line => Schedule::Line {
            start,
            step,
            end,
            max_duration: max,
        },
    }
}

fn parse_metadata(json: Option<&str>) -> anyhow::Result<MetadataMap> {
    let mut map = MetadataMap::new();
    let Some(json) = json else { return Ok(map) };
    let obj: BTreeMap<String, String> =
        serde_json::from_str(json).context("--metadata must be a JSON object of strings")?;
    for (k, v) in obj {
        if !v.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
            bail!("--metadata: the value of {k:?} must be printable ASCII");
        }
        let key = MetadataKey::from_str(&k.to_ascii_lowercase())
            .with_context(|| format!("--metadata: {k:?} is not a valid header name"))?;
        let value = MetadataValue::from_str(&v)
            .with_context(|| format!("--metadata: the value of {k:?} is not valid ASCII"))?;
        map.insert(key, value);
    }
    Ok(map)
}

fn with_metadata<T>(msg: T, shared: &Shared) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    *req.metadata_mut() = shared.metadata.clone();
    req.set_timeout(shared.args.timeout);
    req
}

impl Shared {
    /// Waits for the rate schedule's next free slot (none without a rate).
    /// False when no slot will come before the run ends: the schedule fell to
    /// 0 for good, or the next slot lies past `-z`.
    async fn pace(&self) -> bool {
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

    fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// What one call delivered, against what it asked for.
#[derive(Debug, Default)]
struct Progress {
    /// Ids received (also when the call failed part-way).
    delivered: u64,
    /// The `total` of a finite snowkeep stream; `None` for every other call.
    asked: Option<u64>,
    /// The run's end (`-z`) stopped the bench reading the stream: a stream
    /// the bench cut is not short.
    cut_by_run_end: bool,
}

impl Progress {
    /// The `total` of a finite stream that ended (by the server, an error
    /// or --timeout) before delivering it.
    fn short_of(&self) -> Option<u64> {
        self.asked
            .filter(|&asked| self.delivered < asked && !self.cut_by_run_end)
    }
}

/// One call under the per-call timeout: what it delivered and its outcome.
/// An endless snowkeep stream (`--count 0`) ended by the timeout is served,
/// as the help promises.
async fn one_call(
    channel: &Channel,
    shared: &Shared,
    n: u64,
    log: &mut IdLog,
) -> (Progress, Result<(), tonic::Status>) {
    let mut progress = Progress::default();
    let call = call_inner(channel, shared, n, log, &mut progress);
    let outcome = match tokio::time::timeout(shared.args.timeout, call).await {
        Ok(r) => r,
        Err(_) if matches!(shared.call, Call::Stream) && shared.args.count == 0 => Ok(()),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within --timeout {} ({} ids received)",
            humantime::format_duration(shared.args.timeout),
            progress.delivered
        ))),
    };
    (progress, outcome)
}

/// Reads a stream to its end (or the run's deadline, which ends it as a
/// success with what it delivered), feeding each message's ids to the log.
async fn drain<T>(
    mut stream: tonic::Streaming<T>,
    deadline: Option<Instant>,
    ids_of: impl Fn(&T) -> Vec<u64>,
    log: &mut IdLog,
    progress: &mut Progress,
) -> Result<(), tonic::Status> {
    let mut last = None;
    loop {
        let next = match deadline {
            Some(d) => tokio::select! {
                m = stream.message() => m?,
                _ = tokio::time::sleep_until(d) => {
                    progress.cut_by_run_end = true;
                    None
                }
            },
            None => stream.message().await?,
        };
        let Some(msg) = next else { break };
        let ids = ids_of(&msg);
        progress.delivered += ids.len() as u64;
        last = log.record(last, &ids);
    }
    Ok(())
}

async fn call_inner(
    channel: &Channel,
    shared: &Shared,
    n: u64,
    log: &mut IdLog,
    progress: &mut Progress,
) -> Result<(), tonic::Status> {
    let args = &shared.args;
    match &shared.call {
        Call::Unary => {
            let mut client = pb::id_service_client::IdServiceClient::new(channel.clone())
                .max_decoding_message_size(64 * 1024 * 1024);
            let req = with_metadata(
                pb::NextIdsRequest {
                    count: args.count,
                    ..Default::default()
                },
                shared,
            );
            let ids = client.next_ids(req).await?.into_inner().ids;
            log.record(None, &ids);
            progress.delivered = ids.len() as u64;
            Ok(())
        }
        Call::Stream => {
            let mut client = pb::id_service_client::IdServiceClient::new(channel.clone())
                .max_decoding_message_size(64 * 1024 * 1024);
            let req = with_metadata(
                pb::StreamIdsRequest {
                    total: u64::from(args.count),
                    batch_size: args.batch_size,
                },
                shared,
            );
            progress.asked = (args.count > 0).then_some(u64::from(args.count));
            let stream = client.stream_ids(req).await?.into_inner();
            drain(
                stream,
                shared.deadline,
                |b: &pb::IdBatch| b.ids.clone(),
                log,
                progress,
            )
            .await
        }
        Call::Dynamic(d) => {
            let messages = match &d.fixed {
                Some(m) => m.clone(),
                None => {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(n);
                    let json = d.template.render(n, &mut rng);
                    dynamic::messages_from_json(
                        &d.method.input(),
                        &json,
                        d.method.is_client_streaming(),
                    )
                    .map_err(|e| tonic::Status::invalid_argument(format!("request {n}: {e:#}")))?
                }
            };
            let mut grpc = tonic::client::Grpc::new(channel.clone())
                .max_decoding_message_size(64 * 1024 * 1024);
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("connection not ready: {e}")))?;
            let codec = DynamicCodec::new(d.method.output());
            let path = d.path.clone();
            match (
                d.method.is_client_streaming(),
                d.method.is_server_streaming(),
            ) {
                (false, false) => {
                    let msg = messages
                        .into_iter()
                        .next()
                        .unwrap_or_else(|| DynamicMessage::new(d.method.input()));
                    let resp = grpc
                        .unary(with_metadata(msg, shared), path, codec)
                        .await?
                        .into_inner();
                    let ids = dynamic::ids_of(&resp);
                    log.record(None, &ids);
                    progress.delivered = ids.len() as u64;
                    Ok(())
                }
                (false, true) => {
                    let msg = messages
                        .into_iter()
                        .next()
                        .unwrap_or_else(|| DynamicMessage::new(d.method.input()));
                    progress.asked = dynamic::stream_total(&d.method, &msg);
                    let stream = grpc
                        .server_streaming(with_metadata(msg, shared), path, codec)
                        .await?
                        .into_inner();
                    drain(stream, shared.deadline, dynamic::ids_of, log, progress).await
                }
                (true, false) => {
                    let req = with_metadata(tokio_stream::iter(messages), shared);
                    let resp = grpc.client_streaming(req, path, codec).await?.into_inner();
                    let ids = dynamic::ids_of(&resp);
                    log.record(None, &ids);
                    progress.delivered = ids.len() as u64;
                    Ok(())
                }
                (true, true) => {
                    let req = with_metadata(tokio_stream::iter(messages), shared);
                    let stream = grpc.streaming(req, path, codec).await?.into_inner();
                    drain(stream, shared.deadline, dynamic::ids_of, log, progress).await
                }
            }
        }
    }
}

async fn worker(index: u32, channel: Channel, shared: Arc<Shared>) -> WorkerResult {
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
            if !shared.concurrency.rises() {
                break;
            }
            let wake = async {
                match shared.deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = level.changed() => if changed.is_err() { break },
                _ = wake => break,
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
        let (progress, outcome) = one_call(&channel, &shared, n, &mut result.log).await;
        let us = u64::try_from(t0.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        shared
            .latency_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .saturating_record(us);
        result.ids += progress.delivered;
        let short_of = progress.short_of();
        if let Some(asked) = short_of {
            result.log.record_stream_end(asked, progress.delivered);
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
                *result.errors.entry(key).or_default() += 1;
                SHORT_STREAM.to_owned()
            }
            (Err(status), _) => {
                let key = format!("{:?}: {}", status.code(), status.message());
                *result.errors.entry(key).or_default() += 1;
                format!("{:?}", status.code())
            }
        };
        *result.codes.entry(code.clone()).or_default() += 1;
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

/// The endpoint for `target` with the TLS options.
fn endpoint(args: &Args) -> anyhow::Result<Endpoint> {
    let raw = args.host.as_deref().unwrap_or(&args.target);
    let tls_options = args.tls || args.cacert.is_some() || args.cert.is_some();
    let https =
        raw.starts_with("https://") || (!raw.contains("://") && tls_options && !args.insecure);
    let url = match raw.split_once("://") {
        Some((_, rest)) if https => format!("https://{rest}"),
        Some(_) => raw.to_owned(),
        None if https => format!("https://{raw}"),
        None => format!("http://{raw}"),
    };
    let mut ep = Endpoint::from_shared(url.clone())
        .with_context(|| format!("invalid target {raw:?}: use host:port or http(s)://host:port"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    if https && !args.insecure {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = &args.cacert {
            let pem =
                std::fs::read(ca).with_context(|| format!("reading --cacert {}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&args.cert, &args.key) {
            let cert = std::fs::read(cert)
                .with_context(|| format!("reading --cert {}", cert.display()))?;
            let key =
                std::fs::read(key).with_context(|| format!("reading --key {}", key.display()))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &args.cname {
            tls = tls.domain_name(name.clone());
        }
        ep = ep.tls_config(tls).context("TLS settings")?;
    }
    Ok(ep)
}

async fn connect(ep: &Endpoint, wait: Option<Duration>) -> anyhow::Result<Channel> {
    let until = wait.map(|w| Instant::now() + w);
    loop {
        match ep.connect().await {
            Ok(c) => return Ok(c),
            Err(e) if until.is_some_and(|u| Instant::now() < u) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot connect to {}", ep.uri())),
        }
    }
}

async fn resolve_call(args: &Args, channel: &Channel) -> anyhow::Result<Call> {
    match args.call.as_str() {
        "unary" => return Ok(Call::Unary),
        "stream" => return Ok(Call::Stream),
        _ => {}
    }
    let pool = if args.proto.is_empty() {
        let (service, _) = dynamic::split_call(&args.call)?;
        tokio::time::timeout(
            args.timeout,
            dynamic::pool_from_reflection(channel.clone(), service),
        )
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "server reflection gave no answer within --timeout {}; pass --proto instead",
                humantime::format_duration(args.timeout)
            )
        })??
    } else {
        dynamic::pool_from_protos(&args.proto, &args.import_path)?
    };
    let method = dynamic::find_method(&pool, &args.call)?;
    let path = http::uri::PathAndQuery::from_str(&format!(
        "/{}/{}",
        method.parent_service().full_name(),
        method.name()
    ))
    .context("method path")?;
    let json = match (&args.data, &args.data_file) {
        (Some(d), _) => d.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading --data-file {}", f.display()))?,
        (None, None) => "{}".to_owned(),
    };
    let template = Template::parse(&json, &dynamic::call_info(&method))?;
    // Check the request once up front, so a typo fails before the run.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let first = dynamic::messages_from_json(
        &method.input(),
        &template.render(0, &mut rng),
        method.is_client_streaming(),
    )?;
    let fixed = template.is_static().then_some(first);
    Ok(Call::Dynamic(DynCall {
        method,
        path,
        template,
        fixed,
    }))
}

fn progress(shared: &Arc<Shared>) -> Option<tokio::task::JoinHandle<()>> {
    let long = shared
        .args
        .duration
        .is_some_and(|d| d > Duration::from_secs(2))
        || shared.args.total > 10_000;
    if shared.args.no_progress || !long {
        return None;
    }
    let (len, by_time) = match shared.args.duration {
        Some(d) => (d.as_millis() as u64, true),
        None => (shared.args.total, false),
    };
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {percent}% {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let shared = shared.clone();
    Some(tokio::spawn(async move {
        loop {
            let done = shared.done.load(Ordering::Relaxed);
            bar.set_position(if by_time {
                shared.t0.elapsed().as_millis() as u64
            } else {
                done
            });
            bar.set_message(format!("{done} calls"));
            if shared.over() || (!by_time && done >= shared.args.total) {
                bar.finish_and_clear();
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }))
}

async fn run(args: Args) -> anyhow::Result<bool> {
    if args.concurrency == 0 || args.connections == 0 {
        bail!("--concurrency and --connections must be at least 1");
    }
    for (flag, rate) in [
        ("--rps", Some(args.rps)),
        ("--load-start", args.load_start),
        ("--load-end", args.load_end),
    ] {
        match rate {
            Some(r) if !r.is_finite() || r < 0.0 => {
                bail!("{flag} must be a number of calls per second, 0 or more")
            }
            Some(r) if r > 0.0 && r < MIN_RATE => {
                bail!("{flag} {r} is below one call a day; use 0 for no limit")
            }
            _ => {}
        }
    }
    if args.concurrency_start == Some(0) {
        bail!("--concurrency-start must be at least 1");
    }
    let ep = endpoint(&args)?;
    let ready_started = Instant::now();
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(connect(&ep, args.wait_ready).await?);
    }
    let call = resolve_call(&args, &channels[0]).await?;
    let metadata = parse_metadata(args.metadata.as_deref())?;
    let rate = (args.load_schedule != Shape::Const || args.rps > 0.0).then(|| {
        schedule(
            args.load_schedule,
            args.load_start.unwrap_or(args.rps),
            args.load_step,
            args.load_end,
            args.load_step_duration,
            args.load_max_duration,
        )
    });
    let concurrency = schedule(
        args.concurrency_schedule,
        f64::from(args.concurrency_start.unwrap_or(args.concurrency)),
        args.concurrency_step as f64,
        args.concurrency_end.map(f64::from),
        args.concurrency_step_duration,
        args.concurrency_max_duration,
    );
    let workers = match concurrency.peak(args.duration) {
        Some(p) if p.round() > f64::from(MAX_WORKERS) => bail!(
            "the concurrency schedule reaches {p:.0} workers; at most {MAX_WORKERS} are allowed"
        ),
        Some(p) => p.round().max(1.0) as u32,
        None => bail!("an unbounded concurrency schedule needs --concurrency-end, --concurrency-max-duration or -z"),
    };
    let (level_tx, level) =
        tokio::sync::watch::channel(concurrency.at(Duration::ZERO).round() as u32);
    let mut shared = Shared {
        args,
        call,
        metadata,
        started: AtomicU64::new(0),
        done: AtomicU64::new(0),
        t0: Instant::now(),
        deadline: None,
        rate,
        concurrency,
        next_slot: Mutex::new(0.0),
        latency_us: Mutex::new(new_histogram()?),
        level,
    };
    if let Some(wait) = shared.args.wait_ready {
        let until = ready_started + wait;
        let mut log = IdLog::new(false);
        loop {
            match one_call(&channels[0], &shared, 0, &mut log).await.1 {
                Ok(()) => break,
                // Any definite answer but "not now" means the server is up.
                Err(e)
                    if !matches!(
                        e.code(),
                        tonic::Code::Unavailable
                            | tonic::Code::DeadlineExceeded
                            | tonic::Code::Unknown
                    ) =>
                {
                    break
                }
                Err(e) if Instant::now() >= until => {
                    bail!(
                        "no successful call within --wait-ready {}: {e}",
                        humantime::format_duration(wait)
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        let _ = writeln!(
            std::io::stderr(),
            "{} answered after {:.1} ms",
            ep.uri(),
            ready_started.elapsed().as_secs_f64() * 1000.0
        );
    }
    shared.t0 = Instant::now();
    shared.deadline = shared.args.duration.map(|d| shared.t0 + d);
    let shared = Arc::new(shared);
    let bar = progress(&shared);
    // The concurrency schedule's value, for workers waiting their turn.
    let ticker = (!matches!(shared.concurrency, Schedule::Const { .. })).then(|| {
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                let now = shared.concurrency.at(shared.t0.elapsed()).round() as u32;
                level_tx.send_if_modified(|l| std::mem::replace(l, now) != now);
                if shared.over() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    });
    let mut tasks = Vec::new();
    for i in 0..workers {
        let channel = channels[(i % shared.args.connections) as usize].clone();
        tasks.push(tokio::spawn(worker(i, channel, shared.clone())));
    }
    let mut logs = Vec::new();
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut details = Vec::new();
    let mut ids = 0;
    for t in tasks {
        let r = t.await.context("worker panicked")?;
        for (code, n) in r.codes {
            *codes.entry(code).or_default() += n;
        }
        for (error, n) in r.errors {
            *errors.entry(error).or_default() += n;
        }
        ids += r.ids;
        details.extend(r.details);
        logs.push(r.log);
    }
    let elapsed = shared.t0.elapsed();
    if let Some(bar) = bar {
        bar.abort();
    }
    if let Some(t) = ticker {
        t.abort();
    }
    let latency = shared
        .latency_us
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let short_streams = logs.iter().map(IdLog::short_streams).sum();
    let missing_ids = logs.iter().map(IdLog::missing_ids).sum();
    let checked = shared.args.check.then(|| check(logs));
    let mut report = Report::new(
        &shared.args.call,
        elapsed,
        ids,
        &latency,
        codes,
        errors,
        checked,
    );
    details.sort_by(|a, b| a.offset_ms.total_cmp(&b.offset_ms));
    report.details = details;
    report.short_streams = short_streams;
    report.missing_ids = missing_ids;
    let text = match shared.args.format {
        Format::Summary => report.to_text(),
        Format::Json => report.to_json(),
        Format::Csv => report.to_csv(),
        Format::Html => report.to_html(),
        Format::Prometheus => report.to_prometheus(),
    };
    match &shared.args.output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    // CSV rows have no place for the verdict, and a failed check should not
    // hide in a file: say it on stderr too.
    if let Some(c) = &report.check {
        if shared.args.format == Format::Csv || !c.passed() {
            let _ = writeln!(std::io::stderr(), "check: {}", c.summary());
        }
    }
    if let Some(c) = checked {
        if c.ids == 0 {
            let _ = writeln!(
                std::io::stderr(),
                "check: no ids were checked (the responses carry no `ids` or `packed_ids` field)"
            );
        }
        // A failed check says more than failed calls: it wins the exit code.
        if !c.passed() {
            return Ok(false);
        }
    }
    if report.all_failed() {
        bail!("every call failed (see the error distribution)");
    }
    Ok(true)
}

fn main() -> ExitCode {
    // Usage errors exit 1, like connection errors; 2 is kept for a failed check.
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "snowkeep-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "snowkeep-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("snowkeep-bench").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn ghz_style_arguments_parse() {
        let a = parse(&[
            "--call",
            "snowkeep.v1.IdService/NextIds",
            "-d",
            r#"{"count":1}"#,
            "-c",
            "50",
            "-z",
            "30s",
            "--rps",
            "1000",
            "-t",
            "2s",
            "-m",
            r#"{"x-team":"ids"}"#,
            "-O",
            "html",
            "-o",
            "out.html",
            "localhost:50051",
        ]);
        assert_eq!(a.host.as_deref(), Some("localhost:50051"));
        assert_eq!(a.concurrency, 50);
        assert_eq!(a.duration, Some(Duration::from_secs(30)));
        assert_eq!(a.timeout, Duration::from_secs(2));
        assert_eq!(a.rps, 1000.0);
        assert_eq!(a.format, Format::Html);
        assert_eq!(parse(&["-O", "text"]).format, Format::Summary);
    }

    #[test]
    fn schedules_parse_into_their_shapes() {
        let a = parse(&[
            "--load-schedule",
            "step",
            "--load-start",
            "100",
            "--load-step",
            "50",
            "--load-end",
            "300",
            "--load-step-duration",
            "5s",
            "--concurrency-schedule",
            "line",
            "--concurrency-start",
            "2",
            "--concurrency-step",
            "1",
            "--concurrency-end",
            "10",
        ]);
        let rate = schedule(
            a.load_schedule,
            a.load_start.unwrap(),
            a.load_step,
            a.load_end,
            a.load_step_duration,
            None,
        );
        assert_eq!(rate.at(Duration::from_secs(11)), 200.0);
        let c = schedule(
            a.concurrency_schedule,
            2.0,
            1.0,
            Some(10.0),
            a.concurrency_step_duration,
            None,
        );
        assert_eq!(c.peak(None), Some(10.0));
        assert_eq!(c.at(Duration::from_secs(3)), 5.0);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let bad = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("snowkeep-bench").chain(args.iter().copied()))
                .is_err()
        };
        assert!(bad(&["-z", "soon"]));
        assert!(bad(&["--cert", "c.pem"])); // needs --key
        assert!(bad(&["-d", "{}", "-D", "req.json"]));
        assert!(bad(&["-O", "xml"]));
    }

    #[test]
    fn targets_pick_plaintext_or_tls() {
        let uri = |args: &[&str]| endpoint(&parse(args)).unwrap().uri().to_string();
        assert_eq!(uri(&["localhost:50051"]), "http://localhost:50051/");
        assert_eq!(
            uri(&["--target", "https://ids.example:443"]),
            "https://ids.example:443/"
        );
        assert_eq!(
            uri(&["--tls", "ids.example:8443"]),
            "https://ids.example:8443/"
        );
        assert_eq!(
            uri(&["--tls", "--insecure", "ids.example:8443"]),
            "http://ids.example:8443/"
        );
    }

    #[test]
    fn only_a_finite_stream_that_ended_before_its_total_is_short() {
        let p = |asked, delivered, cut_by_run_end| {
            Progress {
                delivered,
                asked,
                cut_by_run_end,
            }
            .short_of()
        };
        assert_eq!(p(Some(5000), 2000, false), Some(5000));
        assert_eq!(p(Some(5000), 0, false), Some(5000));
        assert_eq!(p(Some(5000), 5000, false), None);
        // The bench stopped reading at the run's end: not the server's doing.
        assert_eq!(p(Some(5000), 2000, true), None);
        // Unary calls, unbounded streams and other methods have no total.
        assert_eq!(p(None, 0, false), None);
    }

    #[test]
    fn metadata_is_a_json_object_of_ascii_strings() {
        let md = parse_metadata(Some(r#"{"X-Team":"ids","trace":"1"}"#)).unwrap();
        assert_eq!(md.get("x-team").unwrap(), "ids");
        assert_eq!(md.len(), 2);
        assert!(parse_metadata(Some("[1]")).is_err());
        assert!(parse_metadata(Some(r#"{"bad key":"v"}"#)).is_err());
        assert!(parse_metadata(None).unwrap().is_empty());
    }
}
