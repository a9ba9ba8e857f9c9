//! The command line: every flag, the rate and concurrency schedule shapes,
//! the output formats, and `-m` metadata.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use snowkeep_bench::schedule::Schedule;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};

/// gRPC load tester and id checker.
#[derive(Debug, Parser)]
#[command(name = "snowkeep-bench", version, about, allow_negative_numbers = true)]
pub(crate) struct Args {
    /// Server address, `host:port` (ghz's positional form); overrides --target.
    pub(crate) host: Option<String>,
    /// Server URL: `http://host:port` (plaintext), `https://host:port` (TLS),
    /// or a bare `host:port` (plaintext unless a TLS option is given).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub(crate) target: String,
    /// `unary` (snowkeep NextIds), `stream` (snowkeep StreamIds), or any
    /// method as `package.Service/Method`.
    #[arg(long, default_value = "unary")]
    pub(crate) call: String,
    /// snowkeep shortcuts: ids per call, `NextIds.count` or the
    /// `StreamIds.total` of each stream (0: endless streams, each ended by
    /// --duration or by --timeout, and counted as served with what it sent).
    #[arg(long, default_value_t = 100)]
    pub(crate) count: u32,
    /// snowkeep shortcuts: ids per streamed message (`StreamIds.batch_size`).
    #[arg(long, default_value_t = 1000)]
    pub(crate) batch_size: u32,
    /// `.proto` file describing the called method (repeatable); without it
    /// the server's reflection service is asked.
    #[arg(long)]
    pub(crate) proto: Vec<PathBuf>,
    /// Folder to search for imports of --proto files (repeatable).
    #[arg(short = 'i', long)]
    pub(crate) import_path: Vec<PathBuf>,
    /// Request as JSON (a JSON array of messages for client-streaming
    /// methods), with templates such as {{.RequestNumber}}. Default `{}`.
    #[arg(short = 'd', long)]
    pub(crate) data: Option<String>,
    /// Read the request JSON from this file.
    #[arg(short = 'D', long, conflicts_with = "data")]
    pub(crate) data_file: Option<PathBuf>,
    /// Request metadata as a JSON object of strings, e.g. '{"x-team":"a"}'.
    #[arg(short = 'm', long)]
    pub(crate) metadata: Option<String>,
    /// An API key `<id>.<secret>`, sent as `authorization: Bearer <key>`
    /// (needed while the cluster requires API keys); overrides an
    /// authorization in --metadata.
    #[arg(long, env = "SNOWKEEP_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// A file whose first line is the API key, instead of --api-key.
    #[arg(long, env = "SNOWKEEP_API_KEY_FILE", conflicts_with = "api_key")]
    pub(crate) api_key_file: Option<PathBuf>,
    /// Number of calls in all (ignored with --duration).
    #[arg(short = 'n', long, default_value_t = 200)]
    pub(crate) total: u64,
    /// Run for this long instead of a number of calls (e.g. 10s).
    #[arg(short = 'z', long, value_parser = humantime::parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Concurrent workers (the start of a concurrency schedule).
    #[arg(short = 'c', long, default_value_t = 10)]
    pub(crate) concurrency: u32,
    /// HTTP/2 connections; workers are spread evenly over them.
    #[arg(long, default_value_t = 1)]
    pub(crate) connections: u32,
    /// Calls per second in all (0 = as fast as possible); the start of a
    /// rate schedule.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) rps: f64,
    /// Rate schedule: const (--rps), step or line.
    #[arg(long, value_enum, default_value_t = Shape::Const)]
    pub(crate) load_schedule: Shape,
    /// Rate at the start of a step/line schedule (default --rps).
    #[arg(long)]
    pub(crate) load_start: Option<f64>,
    /// Rate added per step (step) or per second (line).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) load_step: f64,
    /// Rate the schedule stops at.
    #[arg(long)]
    pub(crate) load_end: Option<f64>,
    /// Time at each rate of a step schedule.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub(crate) load_step_duration: Duration,
    /// Time after which the rate stops changing.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) load_max_duration: Option<Duration>,
    /// Concurrency schedule: const (-c), step or line.
    #[arg(long, value_enum, default_value_t = Shape::Const)]
    pub(crate) concurrency_schedule: Shape,
    /// Workers at the start of a step/line schedule (default -c).
    #[arg(long)]
    pub(crate) concurrency_start: Option<u32>,
    /// Workers added per step (step) or per second (line).
    #[arg(long, default_value_t = 0)]
    pub(crate) concurrency_step: i64,
    /// Workers the schedule stops at.
    #[arg(long)]
    pub(crate) concurrency_end: Option<u32>,
    /// Time at each concurrency of a step schedule.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub(crate) concurrency_step_duration: Duration,
    /// Time after which the concurrency stops changing.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) concurrency_max_duration: Option<Duration>,
    /// Per-call timeout; a call still running then counts as DeadlineExceeded.
    #[arg(short = 't', long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
    /// Plaintext even with TLS options (the default for http:// and host:port).
    #[arg(long)]
    pub(crate) insecure: bool,
    /// Use TLS with the system's roots (implied by https:// and the options below).
    #[arg(long)]
    pub(crate) tls: bool,
    /// PEM file of a CA to trust for TLS (alias --tls-ca-file, as
    /// snowkeepctl names it).
    #[arg(long, visible_alias = "tls-ca-file")]
    pub(crate) cacert: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --key; alias
    /// --tls-cert-file).
    #[arg(long, requires = "key", visible_alias = "tls-cert-file")]
    pub(crate) cert: Option<PathBuf>,
    /// PEM client key for mutual TLS (with --cert; alias --tls-key-file).
    #[arg(long, requires = "cert", visible_alias = "tls-key-file")]
    pub(crate) key: Option<PathBuf>,
    /// Server name to verify the certificate against (default: the host;
    /// alias --tls-server-name).
    #[arg(long, visible_alias = "tls-server-name")]
    pub(crate) cname: Option<String>,
    /// Keep every id and check uniqueness, per-call order, and that every
    /// finite StreamIds stream delivered all the ids it asked for (exit code
    /// 2 otherwise).
    #[arg(long)]
    pub(crate) check: bool,
    /// Output format.
    #[arg(short = 'O', long, value_enum, default_value_t = Format::Summary)]
    pub(crate) format: Format,
    /// Write the output here instead of stdout.
    #[arg(short = 'o', long)]
    pub(crate) output: Option<PathBuf>,
    /// Never draw the progress bar (drawn on a terminal for runs over 2 s).
    #[arg(long)]
    pub(crate) no_progress: bool,
    /// Before the run, retry one call while the server answers UNAVAILABLE
    /// (or nothing) until this long passes, and report on stderr how long it
    /// took until it answered (time to first batch).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) wait_ready: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Shape {
    Const,
    Step,
    Line,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// ghz's text summary.
    #[value(alias = "text")]
    Summary,
    Json,
    Csv,
    Html,
    Prometheus,
}

/// Most workers a run may start (each holds a task and a channel).
pub(crate) const MAX_WORKERS: u32 = 10_000;
/// Lowest nonzero rate: one call a day.
pub(crate) const MIN_RATE: f64 = 1.0 / 86_400.0;

pub(crate) fn schedule(
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

pub(crate) fn parse_metadata(json: Option<&str>) -> anyhow::Result<MetadataMap> {
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

/// Adds `authorization: Bearer <key>` to `map` for --api-key or
/// --api-key-file; leaves it as it is with neither.
pub(crate) fn add_api_key(
    map: &mut MetadataMap,
    key: Option<&str>,
    file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let key = match (key, file) {
        (Some(k), _) => snowkeep_client::ApiKey::new(k)?,
        (None, Some(path)) => snowkeep_client::ApiKey::from_file(path)
            .with_context(|| format!("--api-key-file {}", path.display()))?,
        (None, None) => return Ok(()),
    };
    map.insert("authorization", key.authorization());
    Ok(())
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
    fn metadata_is_a_json_object_of_ascii_strings() {
        let md = parse_metadata(Some(r#"{"X-Team":"ids","trace":"1"}"#)).unwrap();
        assert_eq!(md.get("x-team").unwrap(), "ids");
        assert_eq!(md.len(), 2);
        assert!(parse_metadata(Some("[1]")).is_err());
        assert!(parse_metadata(Some(r#"{"bad key":"v"}"#)).is_err());
        assert!(parse_metadata(None).unwrap().is_empty());
        let mut md = parse_metadata(Some(r#"{"authorization":"old"}"#)).unwrap();
        add_api_key(&mut md, Some("k1.secretsecretsecret"), None).unwrap();
        assert_eq!(
            md.get("authorization").unwrap(),
            "Bearer k1.secretsecretsecret"
        );
        assert!(add_api_key(&mut md, Some("nodot"), None).is_err());
        let mut empty = MetadataMap::new();
        add_api_key(&mut empty, None, None).unwrap();
        assert!(empty.is_empty());
    }
}
