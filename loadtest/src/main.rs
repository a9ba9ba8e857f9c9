//! snowkeep-bench: drives `IdService` with unary or streaming calls over N
//! connections and M concurrent workers, reports throughput, latency and status
//! codes, and with `--check` verifies every id is unique and every call's ids
//! ascend. Exit code 2 when the check fails, 1 on a usage or connection error.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use snowkeep_bench::{check, IdLog, Report};
use snowkeep_proto::v1 as pb;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

/// Load generator and id checker for snowkeep.
#[derive(Debug, Parser)]
#[command(name = "snowkeep-bench", version, about)]
struct Args {
    /// Server URL (`http://host:port`; a bare `host:port` means http).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    target: String,
    /// Call `NextIds` (unary) or `StreamIds` (stream).
    #[arg(long, value_enum, default_value_t = CallKind::Unary)]
    call: CallKind,
    /// Ids per call: `NextIds.count`, or the `StreamIds.total` of each stream
    /// (0 streams until the run's --duration or the call's --timeout ends it).
    #[arg(long, default_value_t = 100)]
    count: u32,
    /// Ids per streamed message (`StreamIds.batch_size`).
    #[arg(long, default_value_t = 1000)]
    batch_size: u32,
    /// Number of calls in all (ignored with --duration).
    #[arg(short = 'n', long, default_value_t = 200)]
    total: u64,
    /// Run for this long instead of a number of calls (e.g. 10s).
    #[arg(short = 'z', long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Concurrent workers.
    #[arg(short = 'c', long, default_value_t = 10)]
    concurrency: u32,
    /// HTTP/2 connections; workers are spread evenly over them.
    #[arg(long, default_value_t = 1)]
    connections: u32,
    /// Keep every id and check uniqueness and per-call order.
    #[arg(long)]
    check: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Per-call timeout; a call still running is counted as DeadlineExceeded.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CallKind {
    Unary,
    Stream,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// What one worker measured.
struct WorkerResult {
    log: IdLog,
    latency_us: Histogram<u64>,
    codes: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    ids: u64,
}

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3).context("histogram bounds")
}

/// One call under the per-call timeout. A stream still open at the run's
/// `deadline` is ended there (cancelled) and counts as a success with the ids
/// it delivered.
async fn one_call(
    client: &mut pb::id_service_client::IdServiceClient<Channel>,
    args: &Args,
    log: &mut IdLog,
    deadline: Option<Instant>,
) -> Result<u64, tonic::Status> {
    let mut delivered = 0;
    let call = call_inner(client, args, log, deadline, &mut delivered);
    match tokio::time::timeout(args.timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within --timeout {} ({delivered} ids received)",
            humantime::format_duration(args.timeout)
        ))),
    }
}

async fn call_inner(
    client: &mut pb::id_service_client::IdServiceClient<Channel>,
    args: &Args,
    log: &mut IdLog,
    deadline: Option<Instant>,
    delivered: &mut u64,
) -> Result<u64, tonic::Status> {
    match args.call {
        CallKind::Unary => {
            let mut req = tonic::Request::new(pb::NextIdsRequest { count: args.count });
            req.set_timeout(args.timeout);
            let ids = client.next_ids(req).await?.into_inner().ids;
            log.record(None, &ids);
            Ok(ids.len() as u64)
        }
        CallKind::Stream => {
            let mut req = tonic::Request::new(pb::StreamIdsRequest {
                total: u64::from(args.count),
                batch_size: args.batch_size,
            });
            req.set_timeout(args.timeout);
            let mut stream = client.stream_ids(req).await?.into_inner();
            let mut last = None;
            loop {
                let next = match deadline {
                    Some(d) => tokio::select! {
                        m = stream.message() => m?,
                        _ = tokio::time::sleep_until(d) => None,
                    },
                    None => stream.message().await?,
                };
                let Some(batch) = next else { break };
                *delivered += batch.ids.len() as u64;
                last = log.record(last, &batch.ids);
            }
            Ok(*delivered)
        }
    }
}

async fn worker(
    channel: Channel,
    args: Arc<Args>,
    started: Arc<AtomicU64>,
    deadline: Option<Instant>,
) -> anyhow::Result<WorkerResult> {
    let mut client = pb::id_service_client::IdServiceClient::new(channel)
        .max_decoding_message_size(64 * 1024 * 1024);
    let mut result = WorkerResult {
        log: IdLog::new(args.check),
        latency_us: new_histogram()?,
        codes: BTreeMap::new(),
        errors: BTreeMap::new(),
        ids: 0,
    };
    loop {
        match deadline {
            Some(d) if Instant::now() >= d => break,
            None if started.fetch_add(1, Ordering::Relaxed) >= args.total => break,
            _ => {}
        }
        let t0 = Instant::now();
        let outcome = one_call(&mut client, &args, &mut result.log, deadline).await;
        let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        result.latency_us.saturating_record(us.max(1));
        let code = match outcome {
            Ok(n) => {
                result.ids += n;
                tonic::Code::Ok
            }
            Err(status) => {
                let key = format!("{:?}: {}", status.code(), status.message());
                *result.errors.entry(key).or_default() += 1;
                status.code()
            }
        };
        *result.codes.entry(format!("{code:?}")).or_default() += 1;
    }
    Ok(result)
}

async fn run(args: Args) -> anyhow::Result<bool> {
    if args.concurrency == 0 || args.connections == 0 {
        bail!("--concurrency and --connections must be at least 1");
    }
    let target = if args.target.contains("://") {
        args.target.clone()
    } else {
        format!("http://{}", args.target)
    };
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        let channel = Endpoint::from_shared(target.clone())
            .with_context(|| format!("invalid --target {target}: use http://host:port"))?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("cannot connect to {target}"))?;
        channels.push(channel);
    }
    let args = Arc::new(args);
    let started = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let deadline = args.duration.map(|d| t0 + d);
    let mut tasks = Vec::new();
    for i in 0..args.concurrency {
        let channel = channels[(i % args.connections) as usize].clone();
        tasks.push(tokio::spawn(worker(
            channel,
            args.clone(),
            started.clone(),
            deadline,
        )));
    }
    let mut logs = Vec::new();
    let mut latency = new_histogram()?;
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut ids = 0;
    for t in tasks {
        let r = t.await.context("worker panicked")??;
        latency.add(&r.latency_us).context("merge histograms")?;
        for (code, n) in r.codes {
            *codes.entry(code).or_default() += n;
        }
        for (error, n) in r.errors {
            *errors.entry(error).or_default() += n;
        }
        ids += r.ids;
        logs.push(r.log);
    }
    let elapsed = t0.elapsed();
    let checked = args.check.then(|| check(logs));
    let call = match args.call {
        CallKind::Unary => "unary",
        CallKind::Stream => "stream",
    };
    let report = Report::new(call, elapsed, ids, &latency, codes, errors, checked);
    let text = match args.format {
        Format::Text => report.to_text(),
        Format::Json => serde_json::to_string_pretty(&report)? + "\n",
    };
    std::io::stdout().write_all(text.as_bytes())?;
    if report.all_failed() {
        bail!("every call failed (see the error distribution)");
    }
    Ok(checked.is_none_or(|c| c.passed()))
}

fn main() -> ExitCode {
    let args = Args::parse();
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
