//! [`Limits`]: the bounds on connections, calls, memory and messages that
//! the `--max-*`, `--*-timeout`, `--http2-*` and `--tcp-keepalive` flags set
//! (the server's `config` parses them), and the flags' defaults, which make
//! `Limits::default()`.

use std::time::Duration;

/// Default most open gRPC connections.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;
/// Default most open gRPC connections from one source IP address: a quarter
/// of [`DEFAULT_MAX_CONNECTIONS`], so one peer cannot take every slot while
/// a few clients behind one NAT or proxy still fit.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: u32 = 64;
/// Default longest a response message may wait to be taken by its client.
pub const DEFAULT_STREAM_SEND_TIMEOUT: &str = "30s";
/// Default most concurrent streams per HTTP/2 connection.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 64;
/// Default most unary calls in progress on the server.
pub const DEFAULT_MAX_CONCURRENT_CALLS: u32 = 256;
/// Default most streaming calls open on the server.
pub const DEFAULT_MAX_OPEN_STREAMS: u32 = 128;
/// Default most keyless calls in progress (`--auth on`).
pub const DEFAULT_MAX_KEYLESS_CALLS: u32 = 32;
/// Default most keyless streams open (`--auth on`).
pub const DEFAULT_MAX_KEYLESS_STREAMS: u32 = 16;
/// Default most keyless calls (and streams) per remote IP address: a
/// quarter of [`DEFAULT_MAX_KEYLESS_CALLS`].
pub const DEFAULT_MAX_KEYLESS_CALLS_PER_PEER: u32 = 8;
/// Default most unary calls in progress per API key: a quarter of
/// [`DEFAULT_MAX_CONCURRENT_CALLS`].
pub const DEFAULT_MAX_CALLS_PER_KEY: u32 = 64;
/// Default most streams open per API key: a quarter of
/// [`DEFAULT_MAX_OPEN_STREAMS`].
pub const DEFAULT_MAX_STREAMS_PER_KEY: u32 = 32;
/// Default longest wait for a call's request message.
pub const DEFAULT_REQUEST_TIMEOUT: &str = "5s";
/// Default memory calls in progress may reserve.
pub const DEFAULT_MAX_CALL_MEMORY: &str = "64MiB";
/// Default largest request message.
pub const DEFAULT_MAX_RECV_MESSAGE_SIZE: &str = "16KiB";
/// Default largest response message: room for 100,000 ids (800,004 bytes).
pub const DEFAULT_MAX_SEND_MESSAGE_SIZE: &str = "1MiB";
/// Default largest request header list (hyper's own default).
pub const DEFAULT_HTTP2_MAX_HEADER_LIST_SIZE: &str = "16KiB";
/// Default HTTP/2 ping interval.
pub const DEFAULT_HTTP2_KEEPALIVE_INTERVAL: &str = "20s";
/// Default HTTP/2 ping answer timeout.
pub const DEFAULT_HTTP2_KEEPALIVE_TIMEOUT: &str = "10s";
/// Default idle (silent) connection timeout.
pub const DEFAULT_IDLE_TIMEOUT: &str = "60s";
/// Default TCP keepalive idle time.
pub const DEFAULT_TCP_KEEPALIVE: &str = "60s";

/// Bounds on what clients can make the server hold: connections, calls,
/// memory and message sizes, and when silent connections are closed. The
/// defaults fit a 128 MiB memory limit (docs/operations.md has the sums).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most open gRPC connections; one more is closed at once.
    pub max_connections: usize,
    /// Most open gRPC connections from one source IP address; `None` for no
    /// per-peer cap.
    pub max_connections_per_peer: Option<usize>,
    /// A connection with a response message unsent for this long is closed;
    /// `None` never closes one.
    pub stream_send_timeout: Option<Duration>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS advertised on every connection.
    pub http2_max_concurrent_streams: u32,
    /// Most unary calls in progress server-wide.
    pub max_concurrent_calls: usize,
    /// Most streaming calls open server-wide.
    pub max_open_streams: usize,
    /// Most keyless unary calls in progress (`--auth on`), a pool apart.
    pub max_keyless_calls: usize,
    /// Most keyless streams open (`--auth on`), a pool apart.
    pub max_keyless_streams: usize,
    /// Most keyless unary calls, and streams, per remote IP address.
    pub max_keyless_calls_per_peer: usize,
    /// Most unary calls in progress per API key.
    pub max_calls_per_key: usize,
    /// Most streams open per API key.
    pub max_streams_per_key: usize,
    /// Longest a call's request message may take to arrive.
    pub request_timeout: Duration,
    /// Bytes calls in progress may reserve: a quarter for unary calls, the
    /// rest for streams.
    pub max_call_memory: usize,
    /// Largest request message, bytes.
    pub max_recv_message_size: usize,
    /// Largest response message, bytes.
    pub max_send_message_size: usize,
    /// Largest request header list, bytes.
    pub http2_max_header_list_size: u32,
    /// HTTP/2 ping interval; `None` sends no pings.
    pub http2_keepalive_interval: Option<Duration>,
    /// HTTP/2 ping answer timeout.
    pub http2_keepalive_timeout: Duration,
    /// A connection with no call in progress and nothing received for this
    /// long is closed.
    pub idle_timeout: Duration,
    /// TCP keepalive idle time; `None` leaves TCP keepalive off.
    pub tcp_keepalive: Option<Duration>,
}

impl Default for Limits {
    /// The flags' defaults.
    fn default() -> Self {
        let size = |s: &str| parse_size(s).expect("valid default size") as usize;
        let duration = |s: &str| humantime::parse_duration(s).expect("valid default duration");
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
            max_connections_per_peer: Some(DEFAULT_MAX_CONNECTIONS_PER_PEER as usize),
            stream_send_timeout: Some(duration(DEFAULT_STREAM_SEND_TIMEOUT)),
            http2_max_concurrent_streams: DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
            max_concurrent_calls: DEFAULT_MAX_CONCURRENT_CALLS as usize,
            max_open_streams: DEFAULT_MAX_OPEN_STREAMS as usize,
            max_keyless_calls: DEFAULT_MAX_KEYLESS_CALLS as usize,
            max_keyless_streams: DEFAULT_MAX_KEYLESS_STREAMS as usize,
            max_keyless_calls_per_peer: DEFAULT_MAX_KEYLESS_CALLS_PER_PEER as usize,
            max_calls_per_key: DEFAULT_MAX_CALLS_PER_KEY as usize,
            max_streams_per_key: DEFAULT_MAX_STREAMS_PER_KEY as usize,
            request_timeout: duration(DEFAULT_REQUEST_TIMEOUT),
            max_call_memory: size(DEFAULT_MAX_CALL_MEMORY),
            max_recv_message_size: size(DEFAULT_MAX_RECV_MESSAGE_SIZE),
            max_send_message_size: size(DEFAULT_MAX_SEND_MESSAGE_SIZE),
            http2_max_header_list_size: size(DEFAULT_HTTP2_MAX_HEADER_LIST_SIZE) as u32,
            http2_keepalive_interval: Some(duration(DEFAULT_HTTP2_KEEPALIVE_INTERVAL)),
            http2_keepalive_timeout: duration(DEFAULT_HTTP2_KEEPALIVE_TIMEOUT),
            idle_timeout: duration(DEFAULT_IDLE_TIMEOUT),
            tcp_keepalive: Some(duration(DEFAULT_TCP_KEEPALIVE)),
        }
    }
}

/// Parses a size in bytes: digits with an optional `KiB`, `MiB` or `GiB`
/// suffix (`16384`, `16KiB`, `64MiB`).
///
/// # Errors
/// A message naming the accepted forms.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => 0,
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| multiplier != 0)
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| {
            format!("invalid size {text:?}: use a number of bytes, optionally with KiB, MiB or GiB (e.g. 64MiB)")
        })
}
