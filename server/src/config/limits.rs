//! The limit flags: bounds on connections, calls, memory, messages and
//! HTTP/2, each range-checked into the server's [`Limits`] (defaults and the
//! size parser live with `Limits` in `crate::limits::settings`).

use std::time::Duration;

use super::{
    parse_size, ConfigError, Limits, DEFAULT_HTTP2_KEEPALIVE_INTERVAL,
    DEFAULT_HTTP2_KEEPALIVE_TIMEOUT, DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
    DEFAULT_HTTP2_MAX_HEADER_LIST_SIZE, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CALLS_PER_KEY,
    DEFAULT_MAX_CALL_MEMORY, DEFAULT_MAX_CONCURRENT_CALLS, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER, DEFAULT_MAX_KEYLESS_CALLS,
    DEFAULT_MAX_KEYLESS_CALLS_PER_PEER, DEFAULT_MAX_KEYLESS_STREAMS, DEFAULT_MAX_OPEN_STREAMS,
    DEFAULT_MAX_RECV_MESSAGE_SIZE, DEFAULT_MAX_SEND_MESSAGE_SIZE, DEFAULT_MAX_STREAMS_PER_KEY,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_STREAM_SEND_TIMEOUT, DEFAULT_TCP_KEEPALIVE,
};

/// A count or size flag with its value and allowed range: `(flag, value,
/// min, max)`.
type Bound = (&'static str, u64, u64, u64);

/// Bounds on connections, calls, memory, messages and HTTP/2.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Most open client connections to the gRPC port; a connection beyond it
    /// is closed at once.
    #[arg(long, env = "SNOWKEEP_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: u32,
    /// Most open connections to the gRPC port from one source IP address; a
    /// connection beyond it is closed at once. 0 turns the per-peer cap off
    /// (for clients that all come through one NAT or proxy address).
    #[arg(long, env = "SNOWKEEP_MAX_CONNECTIONS_PER_PEER", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    pub max_connections_per_peer: u32,
    /// A connection on which a call's response message (for a stream, the
    /// message being sent) has waited this long without being fully taken
    /// by the client is closed, freeing its calls' slots and memory; 0s
    /// never closes one. Range 1s to 1h.
    #[arg(long, env = "SNOWKEEP_STREAM_SEND_TIMEOUT", default_value = DEFAULT_STREAM_SEND_TIMEOUT, value_parser = humantime::parse_duration)]
    pub stream_send_timeout: Duration,
    /// Most concurrent HTTP/2 streams (calls) one connection may open
    /// (SETTINGS_MAX_CONCURRENT_STREAMS); clients queue the rest.
    #[arg(long, env = "SNOWKEEP_HTTP2_MAX_CONCURRENT_STREAMS", default_value_t = DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS)]
    pub http2_max_concurrent_streams: u32,
    /// Most unary calls in progress on the whole server; more get
    /// RESOURCE_EXHAUSTED. A call lasts until its response has left the process.
    #[arg(long, env = "SNOWKEEP_MAX_CONCURRENT_CALLS", default_value_t = DEFAULT_MAX_CONCURRENT_CALLS)]
    pub max_concurrent_calls: u32,
    /// Most streaming calls (StreamIds, health Watch, reflection) open on the
    /// whole server; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "SNOWKEEP_MAX_OPEN_STREAMS", default_value_t = DEFAULT_MAX_OPEN_STREAMS)]
    pub max_open_streams: u32,
    /// Most calls made without an API key under `--auth on` (health Check,
    /// GetInfo without a key) in progress at once, in a pool of their own:
    /// they never take a slot or memory from calls with a key.
    #[arg(long, env = "SNOWKEEP_MAX_KEYLESS_CALLS", default_value_t = DEFAULT_MAX_KEYLESS_CALLS)]
    pub max_keyless_calls: u32,
    /// Most streams opened without an API key under `--auth on` (health
    /// Watch, reflection), in a pool of their own.
    #[arg(long, env = "SNOWKEEP_MAX_KEYLESS_STREAMS", default_value_t = DEFAULT_MAX_KEYLESS_STREAMS)]
    pub max_keyless_streams: u32,
    /// Most keyless unary calls, and most keyless streams, one remote IP
    /// address may have in progress under `--auth on`: one peer cannot take
    /// the keyless pools that probes and peers' clock checks need.
    #[arg(long, env = "SNOWKEEP_MAX_KEYLESS_CALLS_PER_PEER", default_value_t = DEFAULT_MAX_KEYLESS_CALLS_PER_PEER)]
    pub max_keyless_calls_per_peer: u32,
    /// Most unary calls one API key may have in progress on this server;
    /// more get RESOURCE_EXHAUSTED, so one key cannot take every slot.
    #[arg(long, env = "SNOWKEEP_MAX_CALLS_PER_KEY", default_value_t = DEFAULT_MAX_CALLS_PER_KEY)]
    pub max_calls_per_key: u32,
    /// Most streams one API key may have open on this server.
    #[arg(long, env = "SNOWKEEP_MAX_STREAMS_PER_KEY", default_value_t = DEFAULT_MAX_STREAMS_PER_KEY)]
    pub max_streams_per_key: u32,
    /// A call whose request message has not fully arrived this long after
    /// its headers is ended with DEADLINE_EXCEEDED, freeing its slot.
    /// Range 100ms to 10m.
    #[arg(long, env = "SNOWKEEP_REQUEST_TIMEOUT", default_value = DEFAULT_REQUEST_TIMEOUT, value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Memory that calls in progress may reserve for their requests and the
    /// responses not yet sent (bytes, or with KiB/MiB/GiB); a quarter is kept
    /// for unary calls, the rest for streams. A call that finds no room gets
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "SNOWKEEP_MAX_CALL_MEMORY", default_value = DEFAULT_MAX_CALL_MEMORY, value_parser = parse_size)]
    pub max_call_memory: u64,
    /// Largest request message accepted (bytes, or with KiB/MiB); larger ones
    /// get RESOURCE_EXHAUSTED.
    #[arg(long, env = "SNOWKEEP_MAX_RECV_MESSAGE_SIZE", default_value = DEFAULT_MAX_RECV_MESSAGE_SIZE, value_parser = parse_size)]
    pub max_recv_message_size: u64,
    /// Largest response message sent (bytes, or with KiB/MiB); a call whose
    /// response would be larger gets RESOURCE_EXHAUSTED. 100,000 ids take
    /// 800,004 bytes.
    #[arg(long, env = "SNOWKEEP_MAX_SEND_MESSAGE_SIZE", default_value = DEFAULT_MAX_SEND_MESSAGE_SIZE, value_parser = parse_size)]
    pub max_send_message_size: u64,
    /// Largest HTTP/2 header list of a request (bytes, or with KiB).
    #[arg(long, env = "SNOWKEEP_HTTP2_MAX_HEADER_LIST_SIZE", default_value = DEFAULT_HTTP2_MAX_HEADER_LIST_SIZE, value_parser = parse_size)]
    pub http2_max_header_list_size: u64,
    /// How often the server pings each client over HTTP/2; 0s turns pings off.
    #[arg(long, env = "SNOWKEEP_HTTP2_KEEPALIVE_INTERVAL", default_value = DEFAULT_HTTP2_KEEPALIVE_INTERVAL, value_parser = humantime::parse_duration)]
    pub http2_keepalive_interval: Duration,
    /// A connection whose client does not answer a ping within this is closed.
    #[arg(long, env = "SNOWKEEP_HTTP2_KEEPALIVE_TIMEOUT", default_value = DEFAULT_HTTP2_KEEPALIVE_TIMEOUT, value_parser = humantime::parse_duration)]
    pub http2_keepalive_timeout: Duration,
    /// A connection with no call in progress whose client has sent nothing
    /// (not even a ping answer) for this long is closed; clients that answer
    /// the keepalive pings stay connected.
    #[arg(long, env = "SNOWKEEP_IDLE_TIMEOUT", default_value = DEFAULT_IDLE_TIMEOUT, value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// TCP keepalive idle time on accepted connections; 0s turns it off.
    #[arg(long, env = "SNOWKEEP_TCP_KEEPALIVE", default_value = DEFAULT_TCP_KEEPALIVE, value_parser = humantime::parse_duration)]
    pub tcp_keepalive: Duration,
}

impl TryFrom<&LimitArgs> for Limits {
    type Error = ConfigError;

    /// Checks every limit flag against its range, then builds [`Limits`].
    fn try_from(args: &LimitArgs) -> Result<Self, ConfigError> {
        args.check_counts_and_sizes()?;
        args.check_durations()?;
        Ok(args.limits())
    }
}

impl LimitArgs {
    /// The connection and call counts with their ranges.
    fn counts(&self) -> [Bound; 10] {
        let unlimited = |flag, value: u32, min| (flag, u64::from(value), min, 1_000_000);
        [
            unlimited(
                "--max-connections (SNOWKEEP_MAX_CONNECTIONS)",
                self.max_connections,
                1,
            ),
            unlimited(
                "--max-connections-per-peer (SNOWKEEP_MAX_CONNECTIONS_PER_PEER)",
                self.max_connections_per_peer,
                0,
            ),
            (
                "--http2-max-concurrent-streams (SNOWKEEP_HTTP2_MAX_CONCURRENT_STREAMS)",
                u64::from(self.http2_max_concurrent_streams),
                1,
                100_000,
            ),
            unlimited(
                "--max-concurrent-calls (SNOWKEEP_MAX_CONCURRENT_CALLS)",
                self.max_concurrent_calls,
                1,
            ),
            unlimited(
                "--max-open-streams (SNOWKEEP_MAX_OPEN_STREAMS)",
                self.max_open_streams,
                1,
            ),
            unlimited(
                "--max-keyless-calls (SNOWKEEP_MAX_KEYLESS_CALLS)",
                self.max_keyless_calls,
                1,
            ),
            unlimited(
                "--max-keyless-calls-per-peer (SNOWKEEP_MAX_KEYLESS_CALLS_PER_PEER)",
                self.max_keyless_calls_per_peer,
                1,
            ),
            unlimited(
                "--max-keyless-streams (SNOWKEEP_MAX_KEYLESS_STREAMS)",
                self.max_keyless_streams,
                1,
            ),
            unlimited(
                "--max-calls-per-key (SNOWKEEP_MAX_CALLS_PER_KEY)",
                self.max_calls_per_key,
                1,
            ),
            unlimited(
                "--max-streams-per-key (SNOWKEEP_MAX_STREAMS_PER_KEY)",
                self.max_streams_per_key,
                1,
            ),
        ]
    }

    /// The memory and message sizes with their ranges.
    fn sizes(&self) -> [Bound; 4] {
        const KIB: u64 = 1 << 10;
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        [
            (
                "--max-call-memory (SNOWKEEP_MAX_CALL_MEMORY)",
                self.max_call_memory,
                4 * MIB,
                64 * GIB,
            ),
            (
                "--max-recv-message-size (SNOWKEEP_MAX_RECV_MESSAGE_SIZE)",
                self.max_recv_message_size,
                KIB,
                64 * MIB,
            ),
            (
                "--max-send-message-size (SNOWKEEP_MAX_SEND_MESSAGE_SIZE)",
                self.max_send_message_size,
                KIB,
                64 * MIB,
            ),
            (
                "--http2-max-header-list-size (SNOWKEEP_HTTP2_MAX_HEADER_LIST_SIZE)",
                self.http2_max_header_list_size,
                KIB,
                MIB,
            ),
        ]
    }

    /// Refuses the first count or size outside its range, in flag order.
    fn check_counts_and_sizes(&self) -> Result<(), ConfigError> {
        for (flag, value, min, max) in self.counts().into_iter().chain(self.sizes()) {
            if !(min..=max).contains(&value) {
                return Err(ConfigError::LimitOutOfRange {
                    flag,
                    value,
                    min,
                    max,
                });
            }
        }
        Ok(())
    }

    /// Refuses the first timeout outside its range: up to 1 h, the request
    /// timeout up to 10 min, and the keepalives and send timeout either 0
    /// (off) or from 1 s.
    fn check_durations(&self) -> Result<(), ConfigError> {
        let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
        let out_of = |flag, value, min, max| ConfigError::OutOfRange {
            flag,
            value,
            min,
            max,
        };
        for (flag, value, min) in [
            (
                "--http2-keepalive-timeout (SNOWKEEP_HTTP2_KEEPALIVE_TIMEOUT)",
                self.http2_keepalive_timeout,
                second,
            ),
            (
                "--idle-timeout (SNOWKEEP_IDLE_TIMEOUT)",
                self.idle_timeout,
                Duration::from_millis(100),
            ),
        ] {
            if !(min..=hour).contains(&value) {
                return Err(out_of(flag, value, min, hour));
            }
        }
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(600));
        if !(min..=max).contains(&self.request_timeout) {
            let flag = "--request-timeout (SNOWKEEP_REQUEST_TIMEOUT)";
            return Err(out_of(flag, self.request_timeout, min, max));
        }
        for (flag, value) in [
            (
                "--http2-keepalive-interval (SNOWKEEP_HTTP2_KEEPALIVE_INTERVAL)",
                self.http2_keepalive_interval,
            ),
            (
                "--tcp-keepalive (SNOWKEEP_TCP_KEEPALIVE)",
                self.tcp_keepalive,
            ),
            (
                "--stream-send-timeout (SNOWKEEP_STREAM_SEND_TIMEOUT)",
                self.stream_send_timeout,
            ),
        ] {
            if !value.is_zero() && !(second..=hour).contains(&value) {
                return Err(out_of(flag, value, second, hour));
            }
        }
        Ok(())
    }

    /// The checked flags as [`Limits`]: 0 turns the per-peer cap and the
    /// keepalives and send timeout off.
    fn limits(&self) -> Limits {
        let off_if_zero = |d: Duration| (!d.is_zero()).then_some(d);
        // The ranges checked keep every value within usize and u32.
        let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Limits {
            max_connections: usize_of(self.max_connections.into()),
            max_connections_per_peer: (self.max_connections_per_peer > 0)
                .then(|| usize_of(self.max_connections_per_peer.into())),
            stream_send_timeout: off_if_zero(self.stream_send_timeout),
            http2_max_concurrent_streams: self.http2_max_concurrent_streams,
            max_concurrent_calls: usize_of(self.max_concurrent_calls.into()),
            max_open_streams: usize_of(self.max_open_streams.into()),
            max_keyless_calls: usize_of(self.max_keyless_calls.into()),
            max_keyless_streams: usize_of(self.max_keyless_streams.into()),
            max_keyless_calls_per_peer: usize_of(self.max_keyless_calls_per_peer.into()),
            max_calls_per_key: usize_of(self.max_calls_per_key.into()),
            max_streams_per_key: usize_of(self.max_streams_per_key.into()),
            request_timeout: self.request_timeout,
            max_call_memory: usize_of(self.max_call_memory),
            max_recv_message_size: usize_of(self.max_recv_message_size),
            max_send_message_size: usize_of(self.max_send_message_size),
            http2_max_header_list_size: u32::try_from(self.http2_max_header_list_size)
                .unwrap_or(u32::MAX),
            http2_keepalive_interval: off_if_zero(self.http2_keepalive_interval),
            http2_keepalive_timeout: self.http2_keepalive_timeout,
            idle_timeout: self.idle_timeout,
            tcp_keepalive: off_if_zero(self.tcp_keepalive),
        }
    }
}
