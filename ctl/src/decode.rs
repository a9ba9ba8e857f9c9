//! `snowkeepctl state decode`: an id's fields under a layout, offline, from
//! its number or its Crockford base32 text.

use std::time::UNIX_EPOCH;

use anyhow::{bail, Context};
use serde_json::json;
use snowkeep_client::{text_id, Layout};

use crate::output::{print, Output};

/// `decode`.
#[derive(clap::Args)]
pub struct DecodeArgs {
    /// The id: decimal digits, or its fixed-width Crockford base32 text (as
    /// IdService returns with ID_FORMAT_CROCKFORD_BASE32; 13 characters for
    /// 63-bit layouts, any case, I and L read as 1, O as 0). An argument of
    /// digits only is the number unless --text is given.
    id: String,
    /// Read the id as text even when it is digits only (a text can be, e.g.
    /// 0000000000001).
    #[arg(long)]
    text: bool,
    /// The layout, as the server's --layout: `T/M/S`, `T/M/S@EPOCH_MS`,
    /// either with `/UNIT` (10ms, 100ms, 1s), or `js53`.
    #[arg(long, env = "SNOWKEEP_LAYOUT", default_value = "41/12/10")]
    layout: String,
    /// The layout's epoch, ms since the Unix epoch or an RFC 3339 UTC time
    /// (overrides the one in --layout).
    #[arg(long)]
    epoch: Option<String>,
}

pub(crate) fn utc(unix_ms: u64) -> String {
    crate::output::utc(unix_ms, true)
}

/// The id `arg` names under `layout`: decimal digits are the number (unless
/// `as_text`), anything else its Crockford base32 text
/// (`snowkeep_client::text_id`).
fn parse_id(arg: &str, as_text: bool, layout: &Layout) -> anyhow::Result<u64> {
    let arg = arg.trim();
    if !as_text && !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_digit()) {
        return arg
            .parse()
            .with_context(|| format!("id {arg} does not fit 64 bits"));
    }
    text_id::decode(arg, layout.total_bits()).map_err(|e| match e {
        // Another layout's width: say which layout was used, and how to
        // give the namespace's.
        text_id::TextIdError::WrongLength { .. } => anyhow::anyhow!(
            "{e}; it was read under --layout {layout} (the default unless --layout or SNOWKEEP_LAYOUT is given): give the namespace's layout, e.g. --layout js53 for the 11-character texts of js53 ids"
        ),
        e => e.into(),
    })
}

/// The fields of `id` under `layout`, as JSON.
fn decode(id: u64, layout: &Layout) -> anyhow::Result<serde_json::Value> {
    let Some(d) = layout.decode(id) else {
        bail!(
            "id {id} is above {}, the largest id of layout {layout} ({} bits)",
            layout.max_id(),
            layout.total_bits()
        );
    };
    let unix_ms = layout.to_unix_ms(d.timestamp);
    // A string: JSON numbers lose 64-bit precision in JavaScript.
    Ok(json!({
        "id": id.to_string(),
        "text": text_id::encode(id, layout.total_bits()),
        "layout": layout.to_string(),
        "timestamp_ms": d.timestamp.get(),
        "unix_ms": unix_ms,
        "utc": utc(unix_ms),
        "machine_id": d.machine_id.get(),
        "sequence": d.sequence,
    }))
}

fn parse_layout(spec: &str, epoch: Option<&str>) -> anyhow::Result<Layout> {
    let spec = spec.trim();
    if let Some(epoch) = epoch {
        let ms = match epoch.parse::<u64>() {
            Ok(ms) => ms,
            Err(_) => {
                let t = humantime::parse_rfc3339(epoch).with_context(|| {
                    format!(
                        "--epoch {epoch:?}: use ms since the Unix epoch or an RFC 3339 UTC time"
                    )
                })?;
                u64::try_from(t.duration_since(UNIX_EPOCH)?.as_millis())?
            }
        };
        let layout = parse_layout(spec, None)?;
        return Ok(layout.with_epoch(ms));
    }
    spec.parse::<Layout>()
        .map_err(|e| anyhow::anyhow!("--layout {spec:?}: {e}"))
}

/// `decode`: the id's fields under the given layout, offline.
pub(crate) fn print_decoded(a: &DecodeArgs, output: Output) -> anyhow::Result<()> {
    let layout = parse_layout(&a.layout, a.epoch.as_deref())?;
    let id = parse_id(&a.id, a.text, &layout)?;
    let d = decode(id, &layout)?;
    let rows = vec![vec![
        id.to_string(),
        d["text"].as_str().unwrap_or_default().to_owned(),
        d["timestamp_ms"].to_string(),
        d["utc"].as_str().unwrap_or_default().to_owned(),
        d["machine_id"].to_string(),
        d["sequence"].to_string(),
    ]];
    print(
        output,
        &[
            "ID",
            "TEXT",
            "TIMESTAMP (LAYOUT MS)",
            "UTC",
            "MACHINE ID",
            "SEQUENCE",
        ],
        rows,
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_decodes_into_its_fields() {
        let layout = parse_layout("41/12/10", None).unwrap();
        let d = decode(4_194_309_125, &layout).unwrap();
        assert_eq!(d["id"], "4194309125");
        assert_eq!(d["timestamp_ms"], 1000);
        assert_eq!(d["unix_ms"], 1_767_225_601_000u64);
        assert_eq!(d["utc"], "2026-01-01T00:00:01.000Z");
        assert_eq!(d["machine_id"], 5);
        assert_eq!(d["sequence"], 5);
        let moved = parse_layout("41/12/10@0", Some("1767225600000")).unwrap();
        assert_eq!(moved, layout);
        let rfc = parse_layout("41/12/10", Some("2026-01-01T00:00:00Z")).unwrap();
        assert_eq!(rfc, layout);
        assert!(decode(1 << 63, &layout).is_err());
        assert!(parse_layout("41/12", None).is_err());
        assert_eq!(d["text"], "0000003X00505");
    }

    #[test]
    fn an_id_is_read_as_a_number_or_as_its_text() {
        let layout = Layout::default();
        assert_eq!(
            parse_id("4194309125", false, &layout).unwrap(),
            4_194_309_125
        );
        assert_eq!(
            parse_id("0000003X00505", false, &layout).unwrap(),
            4_194_309_125
        );
        assert_eq!(
            parse_id("0000003x00505", false, &layout).unwrap(),
            4_194_309_125
        );
        // Digits only: the number, unless --text.
        assert_eq!(parse_id("0000000000010", false, &layout).unwrap(), 10);
        assert_eq!(parse_id("0000000000010", true, &layout).unwrap(), 32);
        assert_eq!(
            parse_id("0000003U00505", false, &layout)
                .unwrap_err()
                .to_string(),
            "id text \"0000003U00505\" has 'U' at position 8, which is not a Crockford base32 \
             digit (0-9 and A-Z except U; I and L read as 1, O as 0)"
        );
        assert_eq!(
            parse_id("99999999999999999999", false, &layout)
                .unwrap_err()
                .to_string(),
            "id 99999999999999999999 does not fit 64 bits"
        );
        let js_text = text_id::encode(1_639_687, 53);
        let wrong = parse_id(&js_text, false, &layout).unwrap_err().to_string();
        assert!(
            wrong.ends_with("; it was read under --layout 41/12/10@1767225600000 (the default unless --layout or SNOWKEEP_LAYOUT is given): give the namespace's layout, e.g. --layout js53 for the 11-character texts of js53 ids"),
            "{wrong}"
        );
        assert_eq!(
            parse_id(&js_text, false, &Layout::js53()).unwrap(),
            1_639_687
        );
    }

    #[test]
    fn a_js53_id_decodes_in_10ms_ticks() {
        let layout = parse_layout("js53", None).unwrap();
        // tick 100 (1,000 ms), machine id 5, sequence 7: (100 << 14) | (5 << 8) | 7.
        let d = decode(1_639_687, &layout).unwrap();
        assert_eq!(d["layout"], "39/6/8@1767225600000/10ms");
        assert_eq!(d["timestamp_ms"], 1000);
        assert_eq!(d["utc"], "2026-01-01T00:00:01.000Z");
        assert_eq!(d["machine_id"], 5);
        assert_eq!(d["sequence"], 7);
        let moved = parse_layout("js53", Some("0")).unwrap();
        assert_eq!(moved.to_string(), "39/6/8@0/10ms");
        let err = decode(1 << 53, &layout).unwrap_err().to_string();
        assert_eq!(
            err,
            "id 9007199254740992 is above 9007199254740991, the largest id of layout 39/6/8@1767225600000/10ms (53 bits)"
        );
    }
}
