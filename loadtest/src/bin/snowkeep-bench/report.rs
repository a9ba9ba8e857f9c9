//! Reporting: the progress bar while the run goes, and at its end the
//! workers' results merged into one report, written in the chosen format,
//! with the check's verdict.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use snowkeep_bench::{check, CallRecord, CheckResult, IdLog, Report};
use snowkeep_client::Millis;

use crate::args::Format;
use crate::worker::{Shared, WorkerResult};

/// A progress bar on stderr for a run longer than 2 s or 10,000 calls,
/// unless `--no-progress`; the task redraws it every 100 ms.
pub(crate) fn progress_bar(shared: &Arc<Shared>) -> Option<tokio::task::JoinHandle<()>> {
    let long = shared
        .args
        .duration
        .is_some_and(|d| d > Duration::from_secs(2))
        || shared.args.total > 10_000;
    if shared.args.no_progress || !long {
        return None;
    }
    let (len, by_time) = match shared.args.duration {
        Some(d) => (Millis::of(d).get(), true),
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
                Millis::of(shared.t0.elapsed()).get()
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

/// Merges the workers' `results` (in worker order) into the report of a
/// run that took `elapsed`, writes it to `--output` or stdout, and says a
/// failed check on stderr. `Ok(false)` when the check failed; an error when
/// every call failed.
pub(crate) fn write(
    shared: &Shared,
    results: Vec<WorkerResult>,
    elapsed: Duration,
) -> anyhow::Result<bool> {
    let mut merged = Merged::of(results);
    let latency = shared
        .latency_us
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let short_streams = merged.logs.iter().map(IdLog::short_streams).sum();
    let missing_ids = merged.logs.iter().map(IdLog::missing_ids).sum();
    let checked = shared.args.check.then(|| check(merged.logs));
    let mut report = Report::new(
        &shared.args.call,
        elapsed,
        merged.ids,
        &latency,
        merged.codes,
        merged.errors,
        checked,
    );
    merged
        .details
        .sort_by(|a, b| a.offset_ms.total_cmp(&b.offset_ms));
    report.details = merged.details;
    report.short_streams = short_streams;
    report.missing_ids = missing_ids;
    output(shared, &report)?;
    verdict(&report, checked)
}

/// The workers' results added up.
struct Merged {
    logs: Vec<IdLog>,
    codes: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    details: Vec<CallRecord>,
    ids: u64,
}

impl Merged {
    /// Adds up `results`, keeping each worker's id log (in worker order).
    fn of(results: Vec<WorkerResult>) -> Self {
        let mut m = Merged {
            logs: Vec::new(),
            codes: BTreeMap::new(),
            errors: BTreeMap::new(),
            details: Vec::new(),
            ids: 0,
        };
        for r in results {
            for (code, n) in r.codes {
                *m.codes.entry(code).or_default() += n;
            }
            for (error, n) in r.errors {
                *m.errors.entry(error).or_default() += n;
            }
            m.ids += r.ids;
            m.details.extend(r.details);
            m.logs.push(r.log);
        }
        m
    }
}

/// Writes the report in `--format` to `--output` or stdout, and the
/// check's verdict to stderr when it failed or the format has no place
/// for it.
fn output(shared: &Shared, report: &Report) -> anyhow::Result<()> {
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
    Ok(())
}

/// The run's outcome: `Ok(false)` for a failed check, an error when every
/// call failed, else `Ok(true)`.
fn verdict(report: &Report, checked: Option<CheckResult>) -> anyhow::Result<bool> {
    // Every call refused (a bad key, a missing permission): that is the
    // failure to report (exit 1), not a check of ids that never came.
    if report.all_failed() && checked.as_ref().is_none_or(|c| c.ids == 0) {
        bail!("every call failed (see the error distribution)");
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
