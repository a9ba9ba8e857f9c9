//! Tables for people, JSON for scripts.

use std::io::Write;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

/// The output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// An aligned table.
    Table,
    /// One JSON document.
    Json,
}

/// Prints `rows` under `header` as a table, or `json` as JSON.
///
/// # Errors
/// Stdout cannot be written ([`StdoutClosed`] when its reader has gone).
pub fn print(
    output: Output,
    header: &[&str],
    rows: Vec<Vec<String>>,
    json: serde_json::Value,
) -> anyhow::Result<()> {
    match output {
        Output::Json => line(format_args!("{json:#}")),
        Output::Table => {
            let mut table = Table::new();
            table
                .load_preset(UTF8_FULL_CONDENSED)
                .set_header(header.to_vec());
            for row in rows {
                table.add_row(row.iter().map(|cell| shown(cell)).collect::<Vec<_>>());
            }
            line(&table)
        }
    }
}

/// `text` as a terminal may show it: a value from the cluster (a
/// namespace, a holder, a key's description, an audit event) can carry any
/// bytes, so control characters (newline, CR, ESC, BEL and the rest), the
/// Unicode marks that reorder or hide text, and the backslash itself are
/// written as escapes (`\n`, `\u{1b}`, `\\`). JSON output needs none:
/// JSON escapes them itself.
pub fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control()
            || c == '\\'
            || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes `text` and a newline to stdout (locked) and flushes it.
///
/// # Errors
/// [`StdoutClosed`] when stdout's reader has gone (`snowkeepctl … | head`),
/// which `main` treats as a normal end; any other write error as it is.
pub fn line(text: impl std::fmt::Display) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => anyhow::Error::new(StdoutClosed),
            _ => anyhow::Error::new(e).context("writing to stdout"),
        })
}

/// Stdout's reader has gone: nothing more can be shown, which is no
/// failure (exit 0, nothing on stderr).
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// The last millisecond RFC 3339 can write: 9999-12-31T23:59:59.999Z.
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

/// `unix_ms` (ms since the Unix epoch) as RFC 3339 in UTC, with
/// milliseconds when `millis`. Times after the year 9999, which RFC 3339
/// cannot write (a Lease API client may send any start time), print as the
/// number itself, never a panic.
pub fn utc(unix_ms: u64, millis: bool) -> String {
    if unix_ms > LAST_RFC3339_MS {
        return format!("{unix_ms} ms (after 9999)");
    }
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    match millis {
        true => humantime::format_rfc3339_millis(t).to_string(),
        false => humantime::format_rfc3339_seconds(t).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_past_rfc3339_print_as_numbers() {
        assert_eq!(utc(0, true), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(LAST_RFC3339_MS, false), "9999-12-31T23:59:59Z");
        assert_eq!(
            utc(LAST_RFC3339_MS + 1, true),
            "253402300800000 ms (after 9999)"
        );
        assert_eq!(utc(u64::MAX, false), "18446744073709551615 ms (after 9999)");
    }
}
