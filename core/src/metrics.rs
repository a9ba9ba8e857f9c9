//! The metric catalog: every metric name snowkeep-server exports is a
//! `const` here, with its type, unit and help in the one table [`METRICS`],
//! which [`CATALOG`] lists and [`describe_all`] describes. Dashboards and alert rules in
//! `deploy/` use these names, so renaming one breaks them. Labels take
//! bounded values only: `namespace` (configured), enums with `as_str`, never
//! ids or text. The server installs the Prometheus recorder and serves the
//! scrape; this crate only names and describes.

use metrics::Unit;

/// Build information, gauge = 1; labels `version`.
pub const BUILD_INFO: &str = "snowkeep_build_info";
/// gRPC calls by final status; labels `service`, `method`, `protocol`
/// (`grpc`, `http`, `grpc-web`), `code` (canonical names).
pub const GRPC_REQUESTS_TOTAL: &str = "snowkeep_grpc_requests_total";
/// gRPC call duration, until the last message of a stream; labels `service`,
/// `method`, `protocol`.
pub const GRPC_REQUEST_DURATION_SECONDS: &str = "snowkeep_grpc_request_duration_seconds";
/// gRPC calls in progress (open streams included); labels `service`,
/// `method`, `protocol`.
pub const GRPC_REQUESTS_IN_FLIGHT: &str = "snowkeep_grpc_requests_in_flight";
/// Ids issued; labels `namespace`, `method`.
pub const IDS_ISSUED_TOTAL: &str = "snowkeep_ids_issued_total";
/// Lease renewals (etcd keepalives); label `result` = `ok`|`error`.
pub const LEASE_RENEWALS_TOTAL: &str = "snowkeep_lease_renewals_total";
/// Latency of a lease renewal round trip.
pub const LEASE_RENEWAL_DURATION_SECONDS: &str = "snowkeep_lease_renewal_duration_seconds";
/// Time left to the local monotonic lease deadline (0 when none is held).
pub const LEASE_REMAINING_SECONDS: &str = "snowkeep_lease_remaining_seconds";
/// Claims lost; label `reason` = `expired`|`holder_changed`|`deadline`|`rolled_back`.
pub const LEASE_LOSSES_TOTAL: &str = "snowkeep_lease_losses_total";
/// Machine ids held by this instance with a valid grant; label `namespace`.
pub const MACHINE_IDS_HELD: &str = "snowkeep_machine_ids_held";
/// Machine ids of the namespace (this instance's range), label `state` =
/// `held`|`free` (sum = capacity); label `namespace`.
pub const NAMESPACE_MACHINE_IDS: &str = "snowkeep_namespace_machine_ids";
/// Fence − now over held machine ids; label `namespace`.
pub const FENCE_HEADROOM_SECONDS: &str = "snowkeep_fence_headroom_seconds";
/// The configured outage budget; label `namespace`.
pub const OUTAGE_BUDGET_SECONDS: &str = "snowkeep_outage_budget_seconds";
/// How much longer issuance lasts if the store stops answering now: the time
/// from the clock to the lowest persisted fence (at least the budget while
/// the store answers, counting down during an outage), 0 when not issuing;
/// label `namespace`.
pub const OUTAGE_BUDGET_REMAINING_SECONDS: &str = "snowkeep_outage_budget_remaining_seconds";
/// Seconds from the wall clock to the end of the namespace's layout (its
/// `Layout::end_unix_ms`, the first Unix ms no id can carry), 0 once past;
/// computed at each scrape; label `namespace`.
pub const LAYOUT_REMAINING_SECONDS: &str = "snowkeep_layout_remaining_seconds";
/// Fence advances; label `result` = `ok`|`error`.
pub const FENCE_ADVANCES_TOTAL: &str = "snowkeep_fence_advances_total";
/// Waits for the clock to pass a previous holder's fence.
pub const FENCE_WAITS_TOTAL: &str = "snowkeep_fence_waits_total";
/// Length of those waits.
pub const FENCE_WAIT_DURATION_SECONDS: &str = "snowkeep_fence_wait_duration_seconds";
/// Milliseconds whose sequence ran out; label `namespace`.
pub const SEQUENCE_EXHAUSTED_TOTAL: &str = "snowkeep_sequence_exhausted_total";
/// `NextIds` and `StreamIds` calls the generator refused; labels
/// `namespace`, `reason` = `no_lease` | `clock_behind_floor` |
/// `fence_reached` | `clock_stepped_back` | `clock_before_epoch` |
/// `layout_exhausted`.
pub const ISSUANCE_REFUSALS_TOTAL: &str = "snowkeep_issuance_refusals_total";
/// Backwards clock steps; label `outcome` = `waited`|`halted`.
pub const CLOCK_BACKWARD_STEPS_TOTAL: &str = "snowkeep_clock_backward_steps_total";
/// Absolute clock skew observed; labels `namespace`, `source` = `client`
/// (Lease API requesters) | `caller` (NextIds callers that send their time) |
/// `peer` (other servers).
pub const CLOCK_SKEW_SECONDS: &str = "snowkeep_clock_skew_seconds";
/// Lease API Acquires refused for client clock skew.
pub const CLOCK_SKEW_REJECTIONS_TOTAL: &str = "snowkeep_clock_skew_rejections_total";
/// 1 while ids can be issued, else 0; label `namespace` (mirrors gRPC health).
pub const ISSUANCE_READY: &str = "snowkeep_issuance_ready";
/// Other namespaces of the same etcd, with the same bit layout, that have
/// used machine ids of this server's range (their ids can equal this
/// namespace's); checked at start; label `namespace`.
pub const NAMESPACE_OVERLAPS: &str = "snowkeep_namespace_overlaps";
/// Largest absolute clock offset to a peer server in the last measuring
/// round, seconds (0 with no peers); label `namespace`.
pub const PEER_CLOCK_OFFSET_MAX_SECONDS: &str = "snowkeep_peer_clock_offset_max_seconds";
/// Clock skews recorded at [`MAX_RECORDED_SKEW_MS`] because they were
/// further off; labels `namespace`, `source` (as [`CLOCK_SKEW_SECONDS`]).
pub const CLOCK_SKEW_CLAMPED_TOTAL: &str = "snowkeep_clock_skew_clamped_total";
/// Lease API requesters this server knows (they hold machine ids and
/// presented their lease token) whose last reported clock is off by more
/// than a share of `--client-skew-threshold`, either way; labels `namespace`,
/// `over` = `half_threshold` | `threshold`.
pub const CLIENT_CLOCK_SKEW_REQUESTERS: &str = "snowkeep_client_clock_skew_requesters";
/// Unreadable keys met while reading etcd, one per key per read; labels
/// `namespace`, `kind` = `fence` | `requester` | `token` | `layout` |
/// `fence_count`. The log
/// names each key in full.
pub const CORRUPT_KEYS_TOTAL: &str = "snowkeep_corrupt_keys_total";
/// Connections closed as soon as they were accepted, because of a limit;
/// labels `listener` = `gRPC` | `metrics`, `reason` = `max_connections` |
/// `max_connections_per_peer`.
pub const CONNECTIONS_REFUSED_TOTAL: &str = "snowkeep_connections_refused_total";
/// Connections closed because a response message on them (of a stream or
/// a unary call) waited `--stream-send-timeout` without being taken.
pub const STREAM_SEND_STALLS_TOTAL: &str = "snowkeep_stream_send_stalls_total";
/// Reloads of the gRPC port's TLS files after they changed; label `result` =
/// `ok` (the new certificate serves new connections) | `error` (the files
/// did not parse; the previous certificate keeps serving). TLS only.
pub const TLS_RELOADS_TOTAL: &str = "snowkeep_tls_reloads_total";
/// notAfter of the certificate the gRPC port serves new connections with,
/// seconds since the Unix epoch. TLS only.
pub const TLS_CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS: &str =
    "snowkeep_tls_certificate_expiry_timestamp_seconds";

/// The metrics of the catalog a server exports only when it serves TLS
/// (`--tls-cert-file`): a plaintext server's scrape holds the catalog
/// without them.
pub const TLS_ONLY: &[&str] = &[TLS_RELOADS_TOTAL, TLS_CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS];
/// API key checks with `--auth on`, by `key_id` (`-` for a missing,
/// malformed or unknown key) and `result` (`ok`, `missing`, `malformed`,
/// `unknown`, `wrong_secret`, `expired`, `revoked`, `permission_denied`,
/// `unavailable`, `anonymous`: a GetInfo without a key).
pub const AUTH_REQUESTS_TOTAL: &str = "snowkeep_auth_requests_total";
/// Audit events (Lease API acquire and release, eviction, key changes,
/// import), by `action`, `key_id` (empty with `--auth off`) and `result`
/// (`ok` or a gRPC code name).
pub const AUDIT_EVENTS_TOTAL: &str = "snowkeep_audit_events_total";

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up; `_total` names.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets (`_seconds` names, buckets set by the server).
    Histogram,
}

impl Kind {
    /// The type as a scrape's `# TYPE` line names it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric of the catalog: what `describe_all` tells the recorder and
/// [`CATALOG`] lists.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// The full name, one of the `const`s above.
    pub name: &'static str,
    /// Its Prometheus type.
    pub kind: Kind,
    /// Its unit, `None` for a plain value (build info, readiness).
    pub unit: Option<Unit>,
    /// The `# HELP` text of the scrape.
    pub help: &'static str,
}

/// Every metric of the catalog, in the catalog's order: the one table both
/// [`CATALOG`] and [`describe_all`] read.
pub const METRICS: &[Metric] = &[
    Metric {
        name: BUILD_INFO,
        kind: Kind::Gauge,
        unit: None,
        help: "Build information of the running snowkeep-server; always 1.",
    },
    Metric {
        name: GRPC_REQUESTS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "gRPC calls by service, method, protocol (grpc, http for HTTP/JSON, grpc-web) and final status code.",
    },
    Metric {
        name: GRPC_REQUEST_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "gRPC call duration, until the last message of a stream, by service, method and protocol.",
    },
    Metric {
        name: GRPC_REQUESTS_IN_FLIGHT,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "gRPC calls in progress, open streams included, by service, method and protocol.",
    },
    Metric {
        name: IDS_ISSUED_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Ids issued, by namespace and gRPC method.",
    },
    Metric {
        name: LEASE_RENEWALS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Lease renewals (etcd keepalives) by result.",
    },
    Metric {
        name: LEASE_RENEWAL_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Round-trip time of successful lease renewals.",
    },
    Metric {
        name: LEASE_REMAINING_SECONDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Seconds),
        help: "Time left until the lease's local monotonic deadline; 0 when no lease is held.",
    },
    Metric {
        name: LEASE_LOSSES_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Machine-id leases lost, by reason.",
    },
    Metric {
        name: MACHINE_IDS_HELD,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Machine ids this instance holds with a valid grant.",
    },
    Metric {
        name: NAMESPACE_MACHINE_IDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Machine ids of the namespace range by state (held or free); their sum is the capacity.",
    },
    Metric {
        name: FENCE_HEADROOM_SECONDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Seconds),
        help: "Persisted fence minus the clock, minimum over held machine ids.",
    },
    Metric {
        name: OUTAGE_BUDGET_SECONDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Seconds),
        help: "The configured outage budget: how long issuance goes on with the store unreachable.",
    },
    Metric {
        name: OUTAGE_BUDGET_REMAINING_SECONDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Seconds),
        help: "Outage budget left: the time from the clock to the lowest persisted fence (at least the budget while the store answers, counting down during an outage), 0 when not issuing.",
    },
    Metric {
        name: LAYOUT_REMAINING_SECONDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Seconds),
        help: "Time from the wall clock until the layout's timestamp field runs out (no id can be issued from then on); 0 once past.",
    },
    Metric {
        name: FENCE_ADVANCES_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Fence advances in the store, by result.",
    },
    Metric {
        name: FENCE_WAITS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Waits for the clock to pass a previous holder's fence before issuing.",
    },
    Metric {
        name: FENCE_WAIT_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Length of waits for the clock to pass a previous holder's fence.",
    },
    Metric {
        name: SEQUENCE_EXHAUSTED_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Milliseconds whose sequence ran out, moving issuance to the next millisecond.",
    },
    Metric {
        name: ISSUANCE_REFUSALS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "NextIds and StreamIds calls the generator refused, by reason; fence_reached means the clock reached a fence the claim loop did not raise in time.",
    },
    Metric {
        name: CLOCK_BACKWARD_STEPS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Backwards wall-clock steps seen while issuing, by outcome (waited out or halted).",
    },
    Metric {
        name: CLOCK_SKEW_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Absolute clock skew observed, by source: Lease API clients, NextIds callers that send their time, or peer servers.",
    },
    Metric {
        name: CLOCK_SKEW_REJECTIONS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Lease API Acquires refused because the client clock was behind or ahead of the server by more than the threshold.",
    },
    Metric {
        name: ISSUANCE_READY,
        kind: Kind::Gauge,
        unit: None,
        help: "1 while this instance can issue ids, else 0.",
    },
    Metric {
        name: PEER_CLOCK_OFFSET_MAX_SECONDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Seconds),
        help: "Largest absolute clock offset to a peer server in the last measuring round (NTP-style, half the round trip).",
    },
    Metric {
        name: NAMESPACE_OVERLAPS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Other namespaces of this etcd with the same bit layout that have used machine ids of this server's range, so their ids can equal this namespace's (checked at start).",
    },
    Metric {
        name: CLOCK_SKEW_CLAMPED_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Clock skews more than a day off, recorded in the skew histogram as one day.",
    },
    Metric {
        name: CLIENT_CLOCK_SKEW_REQUESTERS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Lease API requesters holding machine ids whose last reported clock was more than half the skew threshold, or the threshold, off this server's; 0 when the threshold is 0.",
    },
    Metric {
        name: CORRUPT_KEYS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Unreadable etcd keys met, one per key per read, by kind; the log names each key. A machine id with an unreadable fence is never claimed.",
    },
    Metric {
        name: CONNECTIONS_REFUSED_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Connections closed as soon as they were accepted because a limit was reached, by listener and reason (max_connections, max_connections_per_peer, allow_list: the budget of peers outside --allow-cidrs).",
    },
    Metric {
        name: STREAM_SEND_STALLS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Connections closed because a response message on them waited --stream-send-timeout without its client taking it.",
    },
    Metric {
        name: TLS_RELOADS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Reloads of the gRPC port's TLS certificate files after they changed, by result: ok (new connections use the new certificate) or error (they did not parse; the previous certificate keeps serving).",
    },
    Metric {
        name: TLS_CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Seconds),
        help: "notAfter of the certificate the gRPC port serves new connections with, as a Unix timestamp.",
    },
    Metric {
        name: AUTH_REQUESTS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "API key checks with --auth on, by key id (- for a missing, malformed or unknown key) and result.",
    },
    Metric {
        name: AUDIT_EVENTS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Audit events (Lease API acquire and release, eviction, key changes, import), by action, key id and result.",
    },
];

/// Every metric of the catalog with its Prometheus type, as scraped: the
/// dashboards, the alert rules and the catalog test hold to this list.
pub const CATALOG: &[(&str, &str)] = &name_and_kind::<{ METRICS.len() }>();

/// `(name, type)` of each of the first `N` entries of [`METRICS`].
const fn name_and_kind<const N: usize>() -> [(&'static str, &'static str); N] {
    let mut pairs = [("", ""); N];
    let mut i = 0;
    while i < N {
        pairs[i] = (METRICS[i].name, METRICS[i].kind.as_str());
        i += 1;
    }
    pairs
}

/// The value of [`LAYOUT_REMAINING_SECONDS`]: seconds (ms precision) from
/// `now_unix_ms` to `end_unix_ms` (a layout's `end_unix_ms`), both ms
/// since the Unix epoch; 0 once `now_unix_ms` reached it.
pub fn layout_remaining_seconds(end_unix_ms: u64, now_unix_ms: u64) -> f64 {
    end_unix_ms.saturating_sub(now_unix_ms) as f64 / 1000.0
}

/// Where a clock skew was observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkewSource {
    /// An embedded requester, through the Lease API (its Acquire is refused
    /// past the threshold: the client-skew alerts watch this one).
    Client,
    /// A `NextIds` caller that sent `client_time_unix_ms` (recorded only).
    Caller,
    /// Measured to a peer server.
    Peer,
}

impl SkewSource {
    /// The `source` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SkewSource::Client => "client",
            SkewSource::Caller => "caller",
            SkewSource::Peer => "peer",
        }
    }
}

/// The largest clock skew recorded, either way: one day, in ms. Anything
/// further off is recorded as this and counted in
/// [`CLOCK_SKEW_CLAMPED_TOTAL`], so a client time of 0 or 2^64−1 cannot blow
/// up the histogram's sum.
pub const MAX_RECORDED_SKEW_MS: i64 = 86_400_000;

/// Records an observed clock skew of `skew_ms` (either sign) from `source`
/// in `namespace`, clamped to ±[`MAX_RECORDED_SKEW_MS`]; returns the value
/// recorded.
pub fn record_skew(namespace: &str, source: SkewSource, skew_ms: i64) -> i64 {
    let clamped = skew_ms.clamp(-MAX_RECORDED_SKEW_MS, MAX_RECORDED_SKEW_MS);
    metrics::counter!(CLOCK_SKEW_CLAMPED_TOTAL, "namespace" => namespace.to_owned(), "source" => source.as_str())
        .increment(u64::from(clamped != skew_ms));
    metrics::histogram!(CLOCK_SKEW_SECONDS, "namespace" => namespace.to_owned(), "source" => source.as_str())
        .record(clamped.unsigned_abs() as f64 / 1000.0);
    clamped
}

/// What an unreadable etcd key held (the `kind` label of [`CORRUPT_KEYS_TOTAL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// A machine id's fence.
    Fence,
    /// An embedded requester's record of machine ids and floors.
    Requester,
    /// An embedded requester's lease token hash.
    Token,
    /// The namespace's layout.
    Layout,
    /// A fence-count key of the namespace (its root or a block's).
    FenceCount,
}

impl KeyKind {
    /// Every kind, for the series created at start.
    pub const ALL: [KeyKind; 5] = [
        KeyKind::Fence,
        KeyKind::Requester,
        KeyKind::Token,
        KeyKind::Layout,
        KeyKind::FenceCount,
    ];

    /// The `kind` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Fence => "fence",
            KeyKind::Requester => "requester",
            KeyKind::Token => "token",
            KeyKind::Layout => "layout",
            KeyKind::FenceCount => "fence_count",
        }
    }
}

/// Counts `n` unreadable keys of `kind` met in `namespace`.
pub fn count_corrupt(namespace: &str, kind: KeyKind, n: u64) {
    metrics::counter!(CORRUPT_KEYS_TOTAL, "namespace" => namespace.to_owned(), "kind" => kind.as_str())
        .increment(n);
}

/// Sets [`CLIENT_CLOCK_SKEW_REQUESTERS`] of `namespace`: `over_half` and
/// `over` requesters off by more than half the threshold and the threshold.
pub fn set_skewed_requesters(namespace: &str, over_half: usize, over: usize) {
    for (band, n) in [("half_threshold", over_half), ("threshold", over)] {
        metrics::gauge!(CLIENT_CLOCK_SKEW_REQUESTERS, "namespace" => namespace.to_owned(), "over" => band)
            .set(n as f64);
    }
}

/// Creates the Lease API's and the etcd store's labelled series of
/// `namespace` at 0, so rates and alerts see them before the first event.
/// Never lowers a value already there.
pub fn init_namespace(namespace: &str) {
    for kind in KeyKind::ALL {
        count_corrupt(namespace, kind, 0);
    }
    for band in ["half_threshold", "threshold"] {
        metrics::gauge!(CLIENT_CLOCK_SKEW_REQUESTERS, "namespace" => namespace.to_owned(), "over" => band)
            .increment(0.0);
    }
}

/// Describes every metric of [`METRICS`] (unit and help) for the installed
/// recorder, and creates the unlabelled and enum-labelled series at 0.
pub fn describe_all() {
    metrics::with_recorder(|recorder| {
        for m in METRICS {
            let (name, help) = (m.name.into(), m.help.into());
            match m.kind {
                Kind::Counter => recorder.describe_counter(name, m.unit, help),
                Kind::Gauge => recorder.describe_gauge(name, m.unit, help),
                Kind::Histogram => recorder.describe_histogram(name, m.unit, help),
            }
        }
    });
    // Counters exist from the start (at 0) so rates and alerts see them.
    metrics::counter!(AUTH_REQUESTS_TOTAL, "key_id" => "-", "result" => "missing").increment(0);
    metrics::counter!(CLOCK_SKEW_REJECTIONS_TOTAL).increment(0);
    for result in ["ok", "error"] {
        metrics::counter!(LEASE_RENEWALS_TOTAL, "result" => result).increment(0);
        metrics::counter!(FENCE_ADVANCES_TOTAL, "result" => result).increment(0);
    }
    for reason in ["expired", "holder_changed", "deadline", "rolled_back"] {
        metrics::counter!(LEASE_LOSSES_TOTAL, "reason" => reason).increment(0);
    }
    metrics::counter!(FENCE_WAITS_TOTAL).increment(0);
    metrics::counter!(STREAM_SEND_STALLS_TOTAL).increment(0);
    // So is the fence-wait histogram (empty): most servers never wait for
    // a fence now that never-used machine ids start at the namespace floor.
    let _ = metrics::histogram!(FENCE_WAIT_DURATION_SECONDS);
}
