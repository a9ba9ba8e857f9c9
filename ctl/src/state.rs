//! Commands on the cluster's state: namespaces, machine ids, requesters,
//! capacity, decode (offline), evict, export, import.
//!
//! JSON output (`--output json`) uses the protobuf field names in snake
//! case; those names are stable.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use snowkeep_client::{Clock, Layout, SystemClock};
use snowkeep_proto::v1 as pb;

use crate::conn::ConnArgs;
use crate::decode::{print_decoded, utc, DecodeArgs};
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
    /// Decode an id offline (no server), given as a number or as its
    /// Crockford base32 text: timestamp, machine id, sequence, both forms.
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
            "time_unit_ms": l.time_unit_ms.max(1),
        }),
        None => serde_json::Value::Null,
    }
}

/// The layout in the `--layout` grammar (`41/12/10@1767225600000`, with
/// `/10ms` for a coarser unit); a layout no server should send, raw.
fn layout_text(l: Option<&pb::Layout>) -> String {
    l.map(|l| match Layout::try_from(l) {
        Ok(layout) => layout.to_string(),
        Err(e) => format!(
            "{}/{}/{}@{} ({e})",
            l.timestamp_bits, l.machine_bits, l.sequence_bits, l.epoch_unix_ms
        ),
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
