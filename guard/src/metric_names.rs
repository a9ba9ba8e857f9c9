//! The names of the metrics this crate records. They are entries of the
//! workspace's catalog (`snowkeep_core::metrics`, which dashboards, alert
//! rules and docs/operations.md follow), spelled here again because that
//! crate sits above the protos and this one may not; the server's tests
//! check that both spell each name alike.

/// Connections closed as soon as they were accepted, because of a limit;
/// labels `listener` = `gRPC` | `metrics`, `reason` = `max_connections` |
/// `max_connections_per_peer`.
pub const CONNECTIONS_REFUSED_TOTAL: &str = "snowkeep_connections_refused_total";
/// Connections closed because a response message on them (of a stream or
/// a unary call) waited `--stream-send-timeout` without being taken.
pub const STREAM_SEND_STALLS_TOTAL: &str = "snowkeep_stream_send_stalls_total";
/// Reloads of the gRPC port's TLS files after they changed; label `result` =
/// `ok` | `error`. TLS only.
pub const TLS_RELOADS_TOTAL: &str = "snowkeep_tls_reloads_total";
/// notAfter of the certificate the gRPC port serves new connections with,
/// seconds since the Unix epoch. TLS only.
pub const TLS_CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS: &str =
    "snowkeep_tls_certificate_expiry_timestamp_seconds";
