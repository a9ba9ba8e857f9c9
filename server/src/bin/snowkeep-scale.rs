//! snowkeep-scale: N claimers against one etcd, each one server's claim run
//! on the production lease code (`snowkeep_server::scale::Claimer`: the
//! etcd claim store and the claim loop), as tokio tasks of this one process.
//! It measures what a fleet of N servers costs etcd, from etcd's own
//! `/metrics`, and prints one markdown table:
//!
//! 1. creates the namespace (as `--create-namespace-only` does);
//! 2. *fresh*: starts N claimers at once, each with instance id
//!    `PREFIX-i`, and times each one from its start to its first grant
//!    published (hdrhistogram, ms): a claim of never-used machine ids waits
//!    out its floor, one fence horizon, by design;
//! 3. waits `--settle`, then counts etcd's raft proposals committed over
//!    `--window` (the steady state of N holders), etcd's CPU time and its
//!    database size (total and in use) at the end of the window;
//! 4. releases every claim cleanly, as SIGTERM does, and times that;
//! 5. *restart*: starts N claimers with the same instance ids again: each
//!    takes back the machine id it released (fence passed), so this time
//!    measures the claim itself, not a fence wait; then releases them.
//!
//! Every server flag is accepted and passed to each claimer (`--lease-ttl`,
//! `--machine-ids`, `--namespace`, `--layout`, the fence settings, ...);
//! `--instance-id`, `--listen` and the namespace-setup flags are ignored.
//! Exit codes: 0 when every claimer got its grant in both rounds, 1 when
//! any did not (the table still prints, with the failures), 64 for bad
//! arguments.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use snowkeep_client::{Clock, SystemClock};
use snowkeep_core::DisplayChain;
use snowkeep_server::config::{Args, ServerConfig, StoreConfig};
use snowkeep_server::scale::Claimer;
use tokio_util::sync::CancellationToken;

const EX_USAGE: u8 = 64;

/// Monotonic time, from the clock the server's own code reads.
fn now() -> Instant {
    SystemClock.now()
}

/// snowkeep-scale: runs N claimers (the production claim loop on the etcd
/// store) against one etcd and reports claim times and etcd's cost.
#[derive(Debug, Parser)]
#[command(name = "snowkeep-scale", version)]
struct ScaleArgs {
    /// Claimers to run, each one server's claim of --machine-ids machine ids.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    claimers: u32,
    /// etcd's Prometheus endpoint: its --listen-metrics-urls (or a client
    /// URL) with the path, e.g. http://127.0.0.1:2381/metrics.
    #[arg(long)]
    etcd_metrics: http::Uri,
    /// How long steady-state proposals are counted, once every claimer has
    /// its grant and --settle has passed.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Wait between the last first grant and the start of the window.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    settle: Duration,
    /// Longest wait for every claimer's first grant in each round; claimers
    /// still waiting then count as failed.
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    claim_timeout: Duration,
    /// While holding, each claimer takes one id from each of its generators
    /// this often (a busy fleet); 0s takes none (an idle fleet).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    issue_every: Duration,
    /// Claimer i has the instance id PREFIX-i.
    #[arg(long, default_value = "scale")]
    instance_prefix: String,
    /// The server's flags, given to every claimer.
    #[command(flatten)]
    server: Args,
}

fn main() -> ExitCode {
    let args = match ScaleArgs::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match ServerConfig::try_from(args.server.clone()) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "snowkeep-scale: invalid server flags: {}",
                DisplayChain(&e)
            );
            return ExitCode::from(EX_USAGE);
        }
    };
    if !matches!(config.store, StoreConfig::Etcd { .. }) {
        let _ = writeln!(
            std::io::stderr(),
            "snowkeep-scale: {}",
            snowkeep_server::scale::NeedsEtcd
        );
        return ExitCode::from(EX_USAGE);
    }
    if args.etcd_metrics.host().is_none() {
        let _ = writeln!(
            std::io::stderr(),
            "snowkeep-scale: --etcd-metrics {} has no host: give http://host:port/metrics",
            args.etcd_metrics
        );
        return ExitCode::from(EX_USAGE);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "snowkeep-scale: cannot start the tokio runtime: {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(&args, config)) {
        Ok(report) => {
            for e in &report.errors {
                let _ = writeln!(std::io::stderr(), "snowkeep-scale: first claim error: {e}");
            }
            let _ = write!(std::io::stdout(), "{}", report.table());
            if report.failures() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "snowkeep-scale: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// etcd's figures at one moment, from its `/metrics`.
#[derive(Debug, Clone, Copy)]
struct Scrape {
    at: Instant,
    proposals: f64,
    cpu_seconds: f64,
    db_bytes: f64,
    db_in_use_bytes: f64,
    keys: f64,
}

impl Scrape {
    async fn take(url: &http::Uri) -> anyhow::Result<Self> {
        let text = get(url)
            .await
            .with_context(|| format!("scraping etcd's metrics at {url}"))?;
        let value =
            |name: &str| metric(&text, name).with_context(|| format!("{url} has no metric {name}"));
        Ok(Self {
            at: now(),
            proposals: value("etcd_server_proposals_committed_total")?,
            cpu_seconds: value("process_cpu_seconds_total")?,
            db_bytes: value("etcd_mvcc_db_total_size_in_bytes")?,
            db_in_use_bytes: value("etcd_mvcc_db_total_size_in_use_in_bytes")?,
            keys: value("etcd_debugging_mvcc_keys_total")?,
        })
    }
}

/// GET `url` over HTTP/1.1 (hyper's client connection); the body as text.
async fn get(url: &http::Uri) -> anyhow::Result<String> {
    let host = url.host().context("no host")?;
    let port = url.port_u16().unwrap_or(80);
    let stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    .context("connect timed out")??;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = http::Request::get(url.path_and_query().map_or("/", |p| p.as_str()))
        .header(http::header::HOST, format!("{host}:{port}"))
        .body(Empty::<Bytes>::new())?;
    let response = tokio::time::timeout(Duration::from_secs(10), async {
        let response = sender.send_request(request).await?;
        anyhow::ensure!(response.status().is_success(), "HTTP {}", response.status());
        Ok(response.into_body().collect().await?.to_bytes())
    })
    .await
    .context("no answer within 10 s")??;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// The sum of every series of metric `name` in Prometheus text `text`;
/// `None` when it has none.
fn metric(text: &str, name: &str) -> Option<f64> {
    let mut sum = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let value = rest.rsplit(' ').next()?.parse::<f64>().ok()?;
        *sum.get_or_insert(0.0) += value;
    }
    sum
}

/// One round of N claimers: their claim times and the claimers themselves,
/// holding until `release` is cancelled.
struct Round {
    /// Start to first grant, µs.
    claim_us: Histogram<u64>,
    failed: u32,
    first_error: Option<String>,
    holders: Vec<tokio::task::JoinHandle<Claimer>>,
    release: CancellationToken,
    /// When the last claimer got its grant (or the round gave up).
    done: Instant,
}

impl Round {
    /// Starts `n` claimers at once and waits (up to `timeout`) for each
    /// one's first grant. A claimer with its grant then takes one id per
    /// generator every `issue_every` (never when zero) until release.
    async fn run(
        n: u32,
        config: &ServerConfig,
        prefix: &str,
        issue_every: Duration,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let release = CancellationToken::new();
        let (granted_tx, mut granted_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut holders = Vec::new();
        for i in 0..n {
            let mut config = config.clone();
            config.instance_id = format!("{prefix}-{i}");
            config.stable_instance = true;
            config.namespace_setup = Default::default();
            let release = release.clone();
            let granted_tx = granted_tx.clone();
            let started = now();
            let mut claimer = Claimer::spawn(&config, release.clone())?;
            holders.push(tokio::spawn(async move {
                let result = claimer.first_grant().await.map(|()| started.elapsed());
                let ok = result.is_ok();
                let _ = granted_tx.send(result);
                if ok && !issue_every.is_zero() {
                    let mut tick = tokio::time::interval(issue_every);
                    loop {
                        tokio::select! {
                            _ = release.cancelled() => break,
                            _ = tick.tick() => {
                                for generator in claimer.generators() {
                                    let _ = generator.next_id().await;
                                }
                            }
                        }
                    }
                }
                claimer
            }));
        }
        drop(granted_tx);
        let mut claim_us = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
        let (mut answered, mut failed, mut first_error) = (0, 0, None);
        let deadline = tokio::time::Instant::from_std(now() + timeout);
        while answered < n {
            match tokio::time::timeout_at(deadline, granted_rx.recv()).await {
                Ok(Some(Ok(took))) => {
                    claim_us.saturating_record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
                }
                Ok(Some(Err(e))) => {
                    failed += 1;
                    first_error.get_or_insert_with(|| DisplayChain(&e).to_string());
                }
                // Every claimer task gone (a panic) or the time is up: the
                // ones that never answered failed.
                Ok(None) => {
                    failed += n - answered;
                    first_error.get_or_insert_with(|| {
                        format!("{} claimers ended without an answer", n - answered)
                    });
                    break;
                }
                Err(_) => {
                    failed += n - answered;
                    first_error.get_or_insert_with(|| {
                        format!("{} claimers had no grant after {timeout:?}", n - answered)
                    });
                    break;
                }
            }
            answered += 1;
        }
        Ok(Self {
            claim_us,
            failed,
            first_error,
            holders,
            release,
            done: now(),
        })
    }

    /// Releases every claim (as SIGTERM does) and waits for all of them;
    /// how long that took.
    async fn release(self) -> Duration {
        let started = now();
        self.release.cancel();
        for holder in self.holders {
            // A claim that failed was counted then; a failed release is
            // logged by the claim loop itself.
            if let Ok(claimer) = holder.await {
                let _ = claimer.join().await;
            }
        }
        started.elapsed()
    }
}

/// What the run measured.
struct Report {
    n: u32,
    machine_ids: u32,
    fresh: Percentiles,
    restart: Percentiles,
    /// Proposals committed from the start of the fresh round until every
    /// claimer had its grant.
    claim_proposals: f64,
    /// Proposals per second over the window, and etcd's CPU (fraction of
    /// one core).
    steady_proposals_per_s: f64,
    steady_cpu: f64,
    window_start: Scrape,
    end_of_window: Scrape,
    released_in: Duration,
    errors: Vec<String>,
}

/// Claim-time percentiles of one round, ms, and its failures.
struct Percentiles {
    p50: f64,
    p99: f64,
    max: f64,
    failed: u32,
}

impl Percentiles {
    fn of(round: &Round) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            p50: ms(round.claim_us.value_at_quantile(0.50)),
            p99: ms(round.claim_us.value_at_quantile(0.99)),
            max: ms(round.claim_us.max()),
            failed: round.failed,
        }
    }
}

impl Report {
    fn failures(&self) -> u32 {
        self.fresh.failed + self.restart.failed
    }

    fn table(&self) -> String {
        let mb = |b: f64| b / 1_048_576.0;
        let mut t = String::new();
        t.push_str("| claimers | machine ids each | fresh claim p50 / p99 / max ms | proposals per fresh claim | steady proposals/s | etcd CPU, % of a core | etcd DB total / in use MiB (start → end of window) | keys | release all ms | restart claim p50 / p99 / max ms | failed claims |\n");
        t.push_str("|---:|---:|---|---:|---:|---:|---|---:|---:|---|---:|\n");
        t.push_str(&format!(
            "| {} | {} | {:.0} / {:.0} / {:.0} | {:.2} | {:.2} | {:.1} | {:.2} / {:.2} → {:.2} / {:.2} | {:.0} | {} | {:.0} / {:.0} / {:.0} | {} |\n",
            self.n,
            self.machine_ids,
            self.fresh.p50,
            self.fresh.p99,
            self.fresh.max,
            self.claim_proposals / f64::from(self.n),
            self.steady_proposals_per_s,
            self.steady_cpu * 100.0,
            mb(self.window_start.db_bytes),
            mb(self.window_start.db_in_use_bytes),
            mb(self.end_of_window.db_bytes),
            mb(self.end_of_window.db_in_use_bytes),
            self.end_of_window.keys,
            self.released_in.as_millis(),
            self.restart.p50,
            self.restart.p99,
            self.restart.max,
            self.failures(),
        ));
        t
    }
}

async fn bench(args: &ScaleArgs, config: ServerConfig) -> anyhow::Result<Report> {
    let url = &args.etcd_metrics;
    let n = args.claimers;
    let mut log = std::io::stderr();
    // The namespace first, once, as an operator's init step does.
    let mut setup = config.clone();
    setup.namespace_setup.create = true;
    let done = snowkeep_server::run::setup_namespace(setup, CancellationToken::new())
        .await
        .map_err(|e| anyhow::anyhow!("creating the namespace: {}", DisplayChain(&e)))?;
    anyhow::ensure!(done, "creating the namespace was interrupted");
    let before = Scrape::take(url).await?;

    writeln!(log, "== fresh: {n} claimers at once")?;
    let fresh = Round::run(
        n,
        &config,
        &args.instance_prefix,
        args.issue_every,
        args.claim_timeout,
    )
    .await?;
    let granted = Scrape::take(url).await?;
    writeln!(
        log,
        "   all answered in {:.1} s; settling {:?}, then counting proposals over {:?}",
        fresh.done.duration_since(before.at).as_secs_f64(),
        args.settle,
        args.window
    )?;
    tokio::time::sleep(args.settle).await;
    let start = Scrape::take(url).await?;
    tokio::time::sleep(args.window).await;
    let end_of_window = Scrape::take(url).await?;
    let secs = end_of_window.at.duration_since(start.at).as_secs_f64();
    let fresh_p = Percentiles::of(&fresh);
    let mut errors: Vec<String> = fresh.first_error.iter().cloned().collect();
    writeln!(log, "== releasing {n} claims")?;
    let released_in = fresh.release().await;

    writeln!(log, "== restart: {n} claimers with the same instance ids")?;
    let restart = Round::run(
        n,
        &config,
        &args.instance_prefix,
        Duration::ZERO,
        args.claim_timeout,
    )
    .await?;
    let restart_p = Percentiles::of(&restart);
    errors.extend(restart.first_error.iter().cloned());
    let _ = restart.release().await;

    Ok(Report {
        n,
        machine_ids: config.machine_ids,
        fresh: fresh_p,
        restart: restart_p,
        claim_proposals: granted.proposals - before.proposals,
        steady_proposals_per_s: (end_of_window.proposals - start.proposals) / secs,
        steady_cpu: (end_of_window.cpu_seconds - start.cpu_seconds) / secs,
        window_start: start,
        end_of_window,
        released_in,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn a_metric_sums_its_series_and_ignores_longer_names() {
        let text = "# HELP x_total help\n# TYPE x_total counter\nx_total 4\nx_total_other 100\nx_total{a=\"1\"} 2.5\nx_totals 9\n";
        assert_eq!(metric(text, "x_total"), Some(6.5));
        assert_eq!(metric(text, "y_total"), None);
    }
}
