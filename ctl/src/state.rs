//! Commands on the cluster's state: namespaces, machine ids, requesters,
//! capacity, decode (offline), evict, export, import.
//!
//! JSON output (`--output json`) uses the protobuf field names in snake
//! case; those names are stable.

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{bail, Context};
use serde_json::json;
use snowkeep_client::{Clock, Layout, SystemClock};
use snowkeep_proto::v1 as pb;

use crate::conn::ConnArgs;
use crate::lifetime::{tenths_of_years_left, years_json, years_text};
use crate::output::{print, Output};

/// Cluster-state commands.
#[derive(clap::Subcommand)]
pub enum StateCommand {
    /// List namespaces with their layouts and capacity.
    Namespaces,
    /// List the machine ids of a namespace that have a holder or a fence.
    MachineIds(NamespaceArg),
    /// List the Lease API requesters of a namespace and what they hold.
    Requesters(NamespaceArg),
    /// Show a namespace's capacity.
    Capacity(NamespaceArg),
    /// Decode an id offline (no server): timestamp, machine id, sequence.
    Decode(DecodeArgs),
    /// Take a machine id from its holder (revokes the holder's etcd lease:
    /// it loses every machine id of that lease; the fence stays).
    Evict(EvictArgs),
    /// Export snowkeep's state (layouts, fences, fence counts, API keys) as JSON.
    Export(ExportArgs),
    /// Import an exported document into an etcd without snowkeep state.
    Import(ImportArgs),
}

/// A namespace, by default the answering server's own.
#[derive(clap::Args)]
pub struct NamespaceArg {
    /// The namespace (default: the server's, from InfoService.GetInfo).
    #[arg(long, env = "SNOWKEEP_NAMESPACE")]
    namespace: Option<String>,
}

/// `decode`.
#[derive(clap::Args)]
pub struct DecodeArgs {
    /// The id (decimal).
    id: u64,
    /// The layout, as the server's --layout: `T/M/S` or `T/M/S@EPOCH_MS`.
    #[arg(long, env = "SNOWKEEP_LAYOUT", default_value = "41/12/10")]
    layout: String,
    /// The layout's epoch, ms since the Unix epoch or an RFC 3339 UTC time
    /// (overrides the one in --layout).
    #[arg(long)]
    epoch: Option<String>,
}

/// `evict`.
#[derive(clap::Args)]
pub struct EvictArgs {
    #[command(flatten)]
    namespace: NamespaceArg,
    /// The machine id to take from its holder.
    machine_id: u32,
}

/// `export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    /// Write the document here instead of to stdout.
    #[arg(long)]
    file: Option<PathBuf>,
}

/// `import`.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// The exported document (`-` for stdin).
    #[arg(long)]
    file: PathBuf,
    /// Import even when etcd holds snowkeep state: fences are only raised.
    #[arg(long)]
    replace: bool,
    /// How far ahead any holder may have stamped since the export (default:
    /// the server's fence lead; 48h1m when Lease API clients may have
    /// renewed since).
    #[arg(long, value_parser = humantime::parse_duration)]
    lead: Option<Duration>,
}

fn layout_json(l: Option<&pb::Layout>) -> serde_json::Value {
    match l {
        Some(l) => json!({
            "timestamp_bits": l.timestamp_bits,
            "machine_bits": l.machine_bits,
            "sequence_bits": l.sequence_bits,
            "epoch_unix_ms": l.epoch_unix_ms,
        }),
        None => serde_json::Value::Null,
    }
}

fn layout_text(l: Option<&pb::Layout>) -> String {
    l.map(|l| {
        format!(
            "{}/{}/{}@{}",
            l.timestamp_bits, l.machine_bits, l.sequence_bits, l.epoch_unix_ms
        )
    })
    .unwrap_or_default()
}

fn capacity_json(c: Option<&pb::Capacity>) -> serde_json::Value {
    match c {
        Some(c) => json!({
            "namespace": c.namespace,
            "total": c.total,
            "held": c.held,
            "free": c.free,
            "range_start": c.range_start,
            "range_end": c.range_end,
        }),
        None => serde_json::Value::Null,
    }
}

fn utc(unix_ms: u64) -> String {
    crate::output::utc(unix_ms, true)
}

/// The fields of `id` under `layout`, as JSON.
fn decode(id: u64, layout: &Layout) -> anyhow::Result<serde_json::Value> {
    let Some(d) = layout.decode(id) else {
        bail!("id {id} has its top bit set; snowkeep ids are 63-bit");
    };
    let unix_ms = layout.to_unix_ms(d.timestamp);
    // A string: JSON numbers lose 64-bit precision in JavaScript.
    Ok(json!({
        "id": id.to_string(),
        "layout": layout.to_string(),
        "timestamp_ms": d.timestamp.get(),
        "unix_ms": unix_ms,
        "utc": utc(unix_ms),
        "machine_id": d.machine_id.get(),
        "sequence": d.sequence,
    }))
}

fn parse_layout(spec: &str, epoch: Option<&str>) -> anyhow::Result<Layout> {
    let mut spec = spec.trim().to_owned();
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
        let bits = spec.split('@').next().unwrap_or_default().to_owned();
        spec = format!("{bits}@{ms}");
    }
    spec.parse::<Layout>()
        .map_err(|e| anyhow::anyhow!("--layout {spec:?}: {e}"))
}

impl StateCommand {
    /// Runs the command.
    pub async fn run(self, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
        match self {
            StateCommand::Namespaces => list_namespaces(conn, output).await,
            StateCommand::MachineIds(ns) => list_machine_ids(ns, conn, output).await,
            StateCommand::Requesters(ns) => list_requesters(ns, conn, output).await,
            StateCommand::Capacity(ns) => show_capacity(ns, conn, output).await,
            StateCommand::Decode(a) => print_decoded(&a, output),
            StateCommand::Evict(a) => evict(a, conn, output).await,
            StateCommand::Export(a) => export(a, conn).await,
            StateCommand::Import(a) => import(a, conn, output).await,
        }
    }
}

/// `namespaces`: one row per namespace, with its layout, capacity and the
/// years (of 365 days) its layout has left by this machine's clock.
async fn list_namespaces(conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
    let mut admin = conn.admin().await?;
    let r = admin
        .list_namespaces(pb::ListNamespacesRequest {})
        .await?
        .into_inner();
    let now_unix_ms = SystemClock.unix_ms();
    let left = |n: &pb::NamespaceSummary| tenths_of_years_left(n.layout_end_unix_ms, now_unix_ms);
    let rows = r
        .namespaces
        .iter()
        .map(|n| {
            let c = n.capacity.clone().unwrap_or_default();
            vec![
                n.name.clone(),
                layout_text(n.layout.as_ref()),
                c.held.to_string(),
                c.free.to_string(),
                c.total.to_string(),
                years_text(left(n)),
            ]
        })
        .collect();
    let json = json!(r
        .namespaces
        .iter()
        .map(|n| json!({
            "name": n.name,
            "layout": layout_json(n.layout.as_ref()),
            "capacity": capacity_json(n.capacity.as_ref()),
            "layout_end_unix_ms": n.layout_end_unix_ms,
            "layout_remaining_years": years_json(left(n)),
        }))
        .collect::<Vec<_>>());
    print(
        output,
        &["NAMESPACE", "LAYOUT", "HELD", "FREE", "TOTAL", "YEARS LEFT"],
        rows,
        json,
    )
}

/// `machine-ids`: one row per machine id with a holder or a fence.
async fn list_machine_ids(ns: NamespaceArg, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
    let namespace = ns.resolve(conn).await?;
    let mut admin = conn.admin().await?;
    let r = admin
        .list_machine_ids(pb::ListMachineIdsRequest {
            namespace: namespace.clone(),
        })
        .await?
        .into_inner();
    let rows = r
        .machine_ids
        .iter()
        .map(|m| {
            vec![
                m.machine_id.to_string(),
                if m.holder.is_empty() {
                    "-".into()
                } else {
                    m.holder.clone()
                },
                m.fence_ms.to_string(),
                m.fence_ahead_ms.to_string(),
                m.lease_remaining_s.to_string(),
                m.lease_renewed_ago_s.to_string(),
            ]
        })
        .collect();
    let json = json!({
        "namespace": namespace,
        "machine_ids": r.machine_ids.iter().map(|m| json!({
            "machine_id": m.machine_id,
            "holder": m.holder,
            "fence_ms": m.fence_ms,
            "fence_ahead_ms": m.fence_ahead_ms,
            "lease_remaining_s": m.lease_remaining_s,
            "lease_renewed_ago_s": m.lease_renewed_ago_s,
        })).collect::<Vec<_>>(),
    });
    print(
        output,
        &[
            "MACHINE ID",
            "HOLDER",
            "FENCE (LAYOUT MS)",
            "FENCE AHEAD (MS)",
            "LEASE LEFT (S)",
            "RENEWED (S AGO)",
        ],
        rows,
        json,
    )
}

/// `requesters`: one row per Lease API requester and what it holds.
async fn list_requesters(ns: NamespaceArg, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
    let namespace = ns.resolve(conn).await?;
    let mut admin = conn.admin().await?;
    let r = admin
        .list_requesters(pb::ListRequestersRequest {
            namespace: namespace.clone(),
        })
        .await?
        .into_inner();
    let rows = r.requesters.iter().map(requester_row).collect();
    let json = json!({
        "namespace": namespace,
        "requesters": r.requesters.iter().map(|q| json!({
            "requester_hash": q.requester_hash,
            "host_id": q.host_id,
            "pid": q.pid,
            "start_unix_ms": q.start_unix_ms,
            "skew_ms": q.skew_ms,
            "machine_ids": q.machine_ids,
            "lease_remaining_s": q.lease_remaining_s,
            "key_id": q.key_id,
        })).collect::<Vec<_>>(),
    });
    print(
        output,
        &[
            "REQUESTER",
            "HOST",
            "PID",
            "STARTED",
            "SKEW (MS)",
            "MACHINE IDS",
            "LEASE LEFT (S)",
            "KEY",
        ],
        rows,
        json,
    )
}

/// A requester's table row, in the order of `requesters`' header.
fn requester_row(q: &pb::RequesterState) -> Vec<String> {
    vec![
        q.requester_hash.clone(),
        q.host_id.clone(),
        q.pid.to_string(),
        if q.start_unix_ms == 0 {
            "-".into()
        } else {
            utc(q.start_unix_ms)
        },
        q.skew_ms.to_string(),
        q.machine_ids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        q.lease_remaining_s.to_string(),
        q.key_id.clone(),
    ]
}

/// `capacity`: the namespace's held, free and total machine ids and its range.
async fn show_capacity(ns: NamespaceArg, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
    let namespace = ns.resolve(conn).await?;
    let mut admin = conn.admin().await?;
    let c = admin
        .get_namespace_capacity(pb::GetNamespaceCapacityRequest { namespace })
        .await?
        .into_inner()
        .capacity
        .unwrap_or_default();
    let rows = vec![vec![
        c.namespace.clone(),
        c.held.to_string(),
        c.free.to_string(),
        c.total.to_string(),
        format!("{}..{}", c.range_start, c.range_end),
    ]];
    print(
        output,
        &["NAMESPACE", "HELD", "FREE", "TOTAL", "RANGE"],
        rows,
        capacity_json(Some(&c)),
    )
}

/// `decode`: the id's fields under the given layout, offline.
fn print_decoded(a: &DecodeArgs, output: Output) -> anyhow::Result<()> {
    let layout = parse_layout(&a.layout, a.epoch.as_deref())?;
    let d = decode(a.id, &layout)?;
    let rows = vec![vec![
        a.id.to_string(),
        d["timestamp_ms"].to_string(),
        d["utc"].as_str().unwrap_or_default().to_owned(),
        d["machine_id"].to_string(),
        d["sequence"].to_string(),
    ]];
    print(
        output,
        &[
            "ID",
            "TIMESTAMP (LAYOUT MS)",
            "UTC",
            "MACHINE ID",
            "SEQUENCE",
        ],
        rows,
        d,
    )
}

/// `evict`: takes the machine id from its holder and says what that means
/// for the holder and its successor.
async fn evict(a: EvictArgs, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
    let namespace = a.namespace.resolve(conn).await?;
    let mut admin = conn.admin().await?;
    let r = admin
        .evict(pb::EvictRequest {
            namespace: namespace.clone(),
            machine_id: a.machine_id,
        })
        .await?
        .into_inner();
    let ids = r
        .machine_ids
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    match output {
        Output::Json => print(
            output,
            &[],
            Vec::new(),
            json!({
                "namespace": namespace,
                "holder": r.holder,
                "machine_ids": r.machine_ids,
                "successor_wait_ms": r.successor_wait_ms,
            }),
        ),
        Output::Table => {
            print(
                output,
                &["HOLDER", "MACHINE IDS", "SUCCESSOR WAITS (MS)"],
                vec![vec![
                    r.holder.clone(),
                    ids.clone(),
                    r.successor_wait_ms.to_string(),
                ]],
                serde_json::Value::Null,
            )?;
            crate::output::line(eviction_explained(&r, &ids))
        }
    }
}

/// Why an eviction keeps the fences, and how long the successor waits.
fn eviction_explained(r: &pb::EvictResponse, ids: &str) -> String {
    format!(
        "evicted {} from machine ids {ids}: its etcd lease is revoked, but its fences stay, because it may go on stamping up to them until it sees the loss; a successor on these machine ids waits {} until its clock passes the highest fence, so no timestamp is stamped twice",
        crate::output::shown(&r.holder),
        humantime::format_duration(Duration::from_millis(r.successor_wait_ms))
    )
}

/// `export`: the state document, to the file or stdout.
async fn export(a: ExportArgs, conn: &ConnArgs) -> anyhow::Result<()> {
    let mut admin = conn.admin_for_transfer().await?;
    let doc = crate::transfer::export(&mut admin).await?;
    match a.file {
        Some(path) => std::fs::write(&path, doc.as_bytes())
            .with_context(|| format!("writing {}", path.display())),
        None => crate::output::line(doc),
    }
}

/// `import`: reads the document and imports it, printing what it wrote.
async fn import(a: ImportArgs, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
    let document = read_document(&a.file)?;
    let mut admin = conn.admin_for_transfer().await?;
    let lead_ms = a.lead.map_or(0, |d| snowkeep_client::Millis::of(d).get());
    let r = crate::transfer::import(&mut admin, document, a.replace, lead_ms).await?;
    print(
        output,
        &["NAMESPACES", "FENCES", "KEYS", "LEAD (MS)"],
        vec![vec![
            r.namespaces.to_string(),
            r.fences.to_string(),
            r.keys.to_string(),
            r.lead_ms.to_string(),
        ]],
        json!({
            "namespaces": r.namespaces,
            "fences": r.fences,
            "keys": r.keys,
            "lead_ms": r.lead_ms,
        }),
    )
}

/// The exported document at `file`, or stdin's for `-`.
fn read_document(file: &std::path::Path) -> anyhow::Result<String> {
    if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
    }
}

impl NamespaceArg {
    /// The namespace given, or the answering server's.
    async fn resolve(self, conn: &ConnArgs) -> anyhow::Result<String> {
        if let Some(ns) = self.namespace {
            return Ok(ns);
        }
        let info = conn
            .info()
            .await?
            .get_info(pb::GetInfoRequest {})
            .await
            .context("asking the server for its namespace (or pass --namespace)")?
            .into_inner();
        Ok(info.namespace)
    }
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
    }
}
