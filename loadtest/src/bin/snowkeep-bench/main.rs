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

mod args;
mod call;
mod report;
mod worker;

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use snowkeep_bench::schedule::Schedule;
use snowkeep_bench::IdLog;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use args::{add_api_key, parse_metadata, schedule, Args, Shape, MAX_WORKERS, MIN_RATE};
use call::{connect, endpoint, one_call, resolve_call};
use report::progress_bar;
use worker::{new_histogram, worker, Shared, WorkerResult};

/// One run: checks the arguments, connects, waits for the server under
/// `--wait-ready`, runs the workers and writes the report. `Ok(false)` when
/// the id check failed (exit 2), an error on a usage or connection error or
/// when every call failed (exit 1).
async fn run(args: Args) -> anyhow::Result<bool> {
    check_args(&args)?;
    let ep = endpoint(&args)?;
    let ready_started = Instant::now();
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(connect(&ep, args.wait_ready).await?);
    }
    let call = resolve_call(&args, &channels[0]).await?;
    let mut metadata = parse_metadata(args.metadata.as_deref())?;
    add_api_key(
        &mut metadata,
        args.api_key.as_deref(),
        args.api_key_file.as_deref(),
    )?;
    let (rate, concurrency) = schedules(&args);
    let workers = worker_count(&concurrency, args.duration)?;
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
        wait_ready(&channels[0], &shared, ready_started + wait, wait).await?;
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
    let bar = progress_bar(&shared);
    let ticker = spawn_level_ticker(&shared, level_tx);
    let results = run_workers(workers, &channels, &shared).await?;
    let elapsed = shared.t0.elapsed();
    if let Some(bar) = bar {
        bar.abort();
    }
    if let Some(t) = ticker {
        t.abort();
    }
    report::write(&shared, results, elapsed)
}

/// Refuses flag values no run can follow: no workers or connections, a
/// rate that is negative, not a number or below one call a day.
fn check_args(args: &Args) -> anyhow::Result<()> {
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
    Ok(())
}

/// The rate schedule (none without `--rps` or a load schedule) and the
/// concurrency schedule the flags describe.
fn schedules(args: &Args) -> (Option<Schedule>, Schedule) {
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
    (rate, concurrency)
}

/// The workers to start: the concurrency schedule's peak over the run, at
/// most [`MAX_WORKERS`]; an error when the schedule has no bound.
fn worker_count(concurrency: &Schedule, duration: Option<Duration>) -> anyhow::Result<u32> {
    match concurrency.peak(duration) {
        Some(p) if p.round() > f64::from(MAX_WORKERS) => bail!(
            "the concurrency schedule reaches {p:.0} workers; at most {MAX_WORKERS} are allowed"
        ),
        Some(p) => Ok(p.round().max(1.0) as u32),
        None => bail!("an unbounded concurrency schedule needs --concurrency-end, --concurrency-max-duration or -z"),
    }
}

/// `--wait-ready`: calls until the server gives a definite answer, or
/// fails at `until` (`wait` after the first connection attempt).
async fn wait_ready(
    channel: &Channel,
    shared: &Shared,
    until: Instant,
    wait: Duration,
) -> anyhow::Result<()> {
    let mut log = IdLog::new(false);
    loop {
        match one_call(channel, shared.call_context(), 0, &mut log)
            .await
            .1
        {
            Ok(()) => return Ok(()),
            // Any definite answer but "not now" means the server is up.
            Err(e)
                if !matches!(
                    e.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
                ) =>
            {
                return Ok(())
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
}

/// Keeps the concurrency schedule's value current for workers waiting
/// their turn; none for a constant schedule.
fn spawn_level_ticker(
    shared: &Arc<Shared>,
    level_tx: tokio::sync::watch::Sender<u32>,
) -> Option<JoinHandle<()>> {
    (!matches!(shared.concurrency, Schedule::Const { .. })).then(|| {
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
    })
}

/// Starts `workers` workers, spread over the connections in turn, and
/// collects what each measured.
async fn run_workers(
    workers: u32,
    channels: &[Channel],
    shared: &Arc<Shared>,
) -> anyhow::Result<Vec<WorkerResult>> {
    let mut tasks = Vec::new();
    for i in 0..workers {
        let channel = channels[(i % shared.args.connections) as usize].clone();
        tasks.push(tokio::spawn(worker(i, channel, shared.clone())));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.context("worker panicked")?);
    }
    Ok(results)
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
