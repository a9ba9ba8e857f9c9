//! What the status page shows, gathered per request from the same
//! `AdminService` handler snowkeepctl calls (in process, so the two never
//! disagree), this server's `InfoService.GetInfo`, the peer clock check and
//! the audit ring, and rendered by the `templates/status.html` template.

use std::time::Duration;

use askama::Template;
use snowkeep_proto::v1 as pb;
use snowkeep_proto::v1::admin_service_server::AdminService;
use snowkeep_proto::v1::info_service_server::InfoService;
use tonic::Request;

use snowkeep_ctl::lifetime::{tenths_of_years_left, years_text};

use super::fence::fence_text;
use super::StatusSources;
use snowkeep_core::text::rfc3339;

/// Bound on each administration call the page makes: a page that cannot
/// reach etcd says so rather than hanging the browser.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Most namespaces whose machine ids and requesters the page lists.
const MAX_NAMESPACES: usize = 32;

/// The rendered page's data.
#[derive(Template)]
#[template(path = "status.html")]
pub(crate) struct StatusView {
    pub(crate) refresh_s: u32,
    pub(crate) generated: String,
    pub(crate) server: ServerView,
    pub(crate) peer_check: bool,
    pub(crate) peers: Vec<PeerView>,
    pub(crate) namespaces_error: Option<String>,
    pub(crate) namespaces: Vec<NamespaceView>,
    pub(crate) audit_capacity: usize,
    pub(crate) audit: Vec<AuditView>,
}

/// This server.
pub(crate) struct ServerView {
    pub(crate) instance_id: String,
    pub(crate) namespace: String,
    pub(crate) version: String,
    pub(crate) store: String,
    pub(crate) auth: &'static str,
    pub(crate) ready: bool,
    pub(crate) held: Vec<HeldView>,
}

/// A machine id this server holds.
pub(crate) struct HeldView {
    pub(crate) machine_id: u32,
    /// The fence against the clock, in words ([`fence_text`]).
    pub(crate) fence: String,
    pub(crate) lease_remaining: String,
}

/// A peer of the clock check.
pub(crate) struct PeerView {
    pub(crate) instance_id: String,
    pub(crate) address: String,
    pub(crate) offset_ms: Option<i64>,
    pub(crate) skewed: bool,
}

/// One namespace.
pub(crate) struct NamespaceView {
    pub(crate) name: String,
    pub(crate) layout: String,
    /// How long the layout has left, in words ([`lifetime_text`]).
    pub(crate) lifetime: String,
    /// Under a year left (or none): what `SnowkeepLayoutEndingSoon` fires on.
    pub(crate) lifetime_short: bool,
    pub(crate) range: String,
    pub(crate) total: u32,
    pub(crate) held: u32,
    pub(crate) free: u32,
    pub(crate) held_pct: u32,
    pub(crate) machine_ids_error: Option<String>,
    pub(crate) machine_ids: Vec<MachineIdView>,
    pub(crate) requesters_error: Option<String>,
    pub(crate) requesters: Vec<RequesterView>,
}

/// One machine id of a namespace.
pub(crate) struct MachineIdView {
    pub(crate) machine_id: u32,
    pub(crate) holder: String,
    pub(crate) ours: bool,
    /// The fence against the clock, in words ([`fence_text`]).
    pub(crate) fence: String,
    pub(crate) lease_remaining_s: i64,
    pub(crate) lease_renewed_ago_s: i64,
}

/// One Lease API requester (never its nonce or lease token).
pub(crate) struct RequesterView {
    pub(crate) requester_hash: String,
    pub(crate) host_id: String,
    pub(crate) pid: u32,
    pub(crate) started: String,
    pub(crate) skew_ms: i64,
    pub(crate) machine_ids: String,
    pub(crate) lease_remaining_s: i64,
    pub(crate) key_id: String,
}

/// One audit event.
pub(crate) struct AuditView {
    pub(crate) time: String,
    pub(crate) action: &'static str,
    pub(crate) result: String,
    pub(crate) namespace: String,
    pub(crate) subject: String,
    pub(crate) key_id: String,
    pub(crate) requester: String,
    pub(crate) peer: String,
}

/// `status`'s message, or a timeout's.
async fn call<T>(
    future: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, future).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}

/// Percent of `total` that `held` is, rounded up so one held id shows.
pub(crate) fn percent(held: u32, total: u32) -> u32 {
    if total == 0 {
        return 0;
    }
    let pct = (u64::from(held) * 100).div_ceil(u64::from(total));
    u32::try_from(pct.min(100)).unwrap_or(100)
}

fn layout_text(layout: Option<&pb::Layout>) -> String {
    match layout {
        None => "unknown".to_owned(),
        Some(l) => format!(
            "{} timestamp + {} machine + {} sequence bits, {} ms ticks, epoch {}",
            l.timestamp_bits,
            l.machine_bits,
            l.sequence_bits,
            l.time_unit_ms.max(1),
            rfc3339(l.epoch_unix_ms)
        ),
    }
}

/// How long a layout ending at `end_unix_ms` (the first Unix ms no id can
/// carry; 0 when unknown) has left at `now_unix_ms`, in years of 365 days
/// rounded down to a tenth (as `snowkeepctl namespaces` shows them), and
/// whether that is under a year.
pub(crate) fn lifetime_text(end_unix_ms: u64, now_unix_ms: u64) -> (String, bool) {
    let Some(tenths) = tenths_of_years_left(end_unix_ms, now_unix_ms) else {
        return ("unknown".to_owned(), false);
    };
    let end = rfc3339(end_unix_ms);
    if end_unix_ms <= now_unix_ms {
        return (format!("none: the timestamp field ran out at {end}"), true);
    }
    let years = years_text(Some(tenths));
    let text = format!("{years} years left: the timestamp field runs out at {end}");
    (text, tenths < 10)
}

/// Comma-separated machine ids, with runs shortened (`0-3, 7`).
pub(crate) fn id_list(ids: &[u32]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(", ")
}

async fn namespace_view(
    sources: &StatusSources,
    summary: pb::NamespaceSummary,
    ours: &str,
) -> NamespaceView {
    let capacity = summary.capacity.unwrap_or_default();
    let (machine_ids_error, machine_ids) = match call(sources.admin.list_machine_ids(Request::new(
        pb::ListMachineIdsRequest {
            namespace: summary.name.clone(),
        },
    )))
    .await
    {
        Ok(r) => (
            None,
            r.machine_ids
                .into_iter()
                .map(|m| MachineIdView {
                    ours: m.holder == ours,
                    machine_id: m.machine_id,
                    fence: fence_text(m.fence_ms, m.fence_ahead_ms, !m.holder.is_empty()),
                    holder: m.holder,
                    lease_remaining_s: m.lease_remaining_s,
                    lease_renewed_ago_s: m.lease_renewed_ago_s,
                })
                .collect(),
        ),
        Err(e) => (
            Some(format!("Cannot list the machine ids: {e}")),
            Vec::new(),
        ),
    };
    let (requesters_error, requesters) = match call(sources.admin.list_requesters(Request::new(
        pb::ListRequestersRequest {
            namespace: summary.name.clone(),
        },
    )))
    .await
    {
        Ok(r) => (
            None,
            r.requesters
                .into_iter()
                .map(|r| RequesterView {
                    started: rfc3339(r.start_unix_ms),
                    machine_ids: id_list(&r.machine_ids),
                    requester_hash: r.requester_hash,
                    host_id: r.host_id,
                    pid: r.pid,
                    skew_ms: r.skew_ms,
                    lease_remaining_s: r.lease_remaining_s,
                    key_id: r.key_id,
                })
                .collect(),
        ),
        Err(e) => (Some(format!("Cannot list the requesters: {e}")), Vec::new()),
    };
    let (lifetime, lifetime_short) =
        lifetime_text(summary.layout_end_unix_ms, sources.clock.unix_ms());
    NamespaceView {
        layout: layout_text(summary.layout.as_ref()),
        lifetime,
        lifetime_short,
        range: format!(
            "{} to {} ({} machine ids)",
            capacity.range_start,
            capacity.range_end.saturating_sub(1),
            capacity.total
        ),
        total: capacity.total,
        held: capacity.held,
        free: capacity.free,
        held_pct: percent(capacity.held, capacity.total),
        name: summary.name,
        machine_ids_error,
        machine_ids,
        requesters_error,
        requesters,
    }
}

/// Gathers the page's data now.
pub(crate) async fn gather(sources: &StatusSources) -> StatusView {
    let now_unix_ms = sources.clock.unix_ms();
    let server = server_view(sources, now_unix_ms).await;
    let peers = peer_views(sources);
    let (namespaces_error, namespaces) = namespace_views(sources).await;
    StatusView {
        refresh_s: super::REFRESH_SECONDS,
        generated: rfc3339(now_unix_ms),
        server,
        peer_check: sources.peer_check,
        peers,
        namespaces_error,
        namespaces,
        audit_capacity: super::RECENT_EVENTS,
        audit: audit_views(sources),
    }
}

/// This server: its identity, security mode, readiness and the machine ids
/// it holds with their fences (from its own `GetInfo`).
async fn server_view(sources: &StatusSources, now_unix_ms: u64) -> ServerView {
    let info = call(sources.info.get_info(Request::new(pb::GetInfoRequest {})))
        .await
        .unwrap_or_default();
    let layout = sources.generators.layout();
    let now_layout_ms = layout.to_layout_ms(now_unix_ms).map_or(0, |m| m.get());
    ServerView {
        instance_id: sources.instance_id.clone(),
        namespace: sources.namespace.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        store: info.store,
        auth: match sources.auth.enforcement() {
            crate::auth::Enforcement::On => "on: API keys required",
            crate::auth::Enforcement::Off => "off",
            crate::auth::Enforcement::Unknown => "not read from etcd yet",
        },
        ready: sources.generators.is_ready(),
        held: info
            .held
            .into_iter()
            .map(|h| HeldView {
                machine_id: h.machine_id,
                fence: fence_text(
                    h.fence_ms,
                    i64::try_from(i128::from(h.fence_ms) - i128::from(now_layout_ms))
                        .unwrap_or(i64::MAX),
                    true,
                ),
                // On etcd the grant has no local deadline: the fence alone
                // bounds issuance (the etcd lease is in the namespace table).
                lease_remaining: match h.lease_remaining_ms {
                    0 => "– (issuance bounded by the fence)".to_owned(),
                    ms => format!("{:.1} s", ms as f64 / 1000.0),
                },
            })
            .collect(),
    }
}

/// The peer clock check's last round, each peer marked when over the
/// warning threshold.
fn peer_views(sources: &StatusSources) -> Vec<PeerView> {
    let warn_ms = i64::try_from(sources.peer_warn.as_millis()).unwrap_or(i64::MAX);
    sources
        .peers
        .snapshot()
        .into_iter()
        .map(|p| PeerView {
            skewed: p.offset_ms.is_some_and(|o| o.abs() > warn_ms),
            instance_id: p.instance_id,
            address: p.address,
            offset_ms: p.offset_ms,
        })
        .collect()
}

/// The cluster's namespaces (at most `MAX_NAMESPACES`), or why they could
/// not be listed.
async fn namespace_views(sources: &StatusSources) -> (Option<String>, Vec<NamespaceView>) {
    let mut namespaces = Vec::new();
    let error = match call(
        sources
            .admin
            .list_namespaces(Request::new(pb::ListNamespacesRequest {})),
    )
    .await
    {
        Ok(r) => {
            for summary in r.namespaces.into_iter().take(MAX_NAMESPACES) {
                namespaces.push(namespace_view(sources, summary, &sources.instance_id).await);
            }
            None
        }
        Err(e) => Some(e),
    };
    (error, namespaces)
}

/// The recent audit events, in the order the ring keeps them.
fn audit_views(sources: &StatusSources) -> Vec<AuditView> {
    sources
        .audit
        .recent()
        .into_iter()
        .map(|e| AuditView {
            time: rfc3339(e.unix_ms),
            action: e.action,
            result: e.result,
            namespace: e.namespace,
            subject: e.subject,
            key_id: e.who.key_id,
            requester: e.requester,
            peer: e.who.peer,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_up_and_stop_at_100() {
        assert_eq!(percent(0, 1024), 0);
        assert_eq!(percent(1, 1024), 1);
        assert_eq!(percent(512, 1024), 50);
        assert_eq!(percent(1024, 1024), 100);
        assert_eq!(percent(5, 0), 0);
    }

    #[test]
    fn the_lifetime_reads_in_years_and_is_short_under_one() {
        let day = 86_400_000;
        // The default layout from 2026-12-03T00:00:00Z.
        let end = 1_767_225_600_000 + (1u64 << 41);
        assert_eq!(
            lifetime_text(end, 1_796_256_000_000),
            (
                "68.8 years left: the timestamp field runs out at 2095-09-07T15:47:35Z".to_owned(),
                false
            )
        );
        assert_eq!(
            lifetime_text(end, end - 365 * day),
            (
                "1.0 years left: the timestamp field runs out at 2095-09-07T15:47:35Z".to_owned(),
                false
            )
        );
        let (text, short) = lifetime_text(end, end - 200 * day);
        assert!(short);
        assert!(text.starts_with("0.5 years left"), "{text}");
        assert_eq!(
            lifetime_text(end, end),
            (
                "none: the timestamp field ran out at 2095-09-07T15:47:35Z".to_owned(),
                true
            )
        );
        assert_eq!(lifetime_text(0, end), ("unknown".to_owned(), false));
    }

    #[test]
    fn machine_id_runs_are_shortened() {
        assert_eq!(id_list(&[7, 0, 1, 2, 3, 9, 10]), "0-3, 7, 9-10");
        assert_eq!(id_list(&[4]), "4");
        assert_eq!(id_list(&[]), "");
    }
}
