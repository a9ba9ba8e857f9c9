//! The peer clock check: every server registers its advertised address under
//! its namespace in etcd, bound to its lease ([`snowkeep_etcd::EtcdStore`]
//! does that at each claim), and this task measures its clock offset to every
//! other registered server, NTP-style: it reads its clock, calls
//! `InfoService.GetInfo` (which carries the peer's wall clock), reads its
//! clock again, and takes the peer's time minus the midpoint of the round
//! trip. Offsets go to `snowkeep_clock_skew_seconds{source="peer"}` and the
//! round's largest to `snowkeep_peer_clock_offset_max_seconds`; past the
//! warning threshold a warning is logged.
//!
//! Why it matters: fences are wall-clock times, so a server whose clock is
//! behind its peers waits out their fences after a failover (docs/design.md, the safety invariant), and
//! one ahead makes others wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use snowkeep_client::SharedClock;
use snowkeep_proto::v1 as pb;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, warn};

use crate::audit::Escaped;
use crate::config::{PeerSkewConfig, PeerTls};
use crate::metrics as m;
use snowkeep_etcd::PeerDirectory;

/// Timeout of one GetInfo to a peer; a slower answer says little about clocks.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The last check's result for one peer, as the status page shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerClock {
    /// The peer's instance id.
    pub instance_id: String,
    /// The address it advertises.
    pub address: String,
    /// Its clock minus ours, ms; `None` when it did not answer the last
    /// check.
    pub offset_ms: Option<i64>,
}

/// The peers of the last clock check round, shared with the status page.
/// Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct PeerClocks(Arc<Mutex<Vec<PeerClock>>>);

impl PeerClocks {
    /// The peers of the last round, by instance id.
    pub fn snapshot(&self) -> Vec<PeerClock> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, mut peers: Vec<PeerClock>) {
        peers.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = peers;
    }
}

/// One measurement: the peer's clock minus ours at the midpoint of the call,
/// ms, from our wall time before (`t0`) and after (`t1`) the call and the
/// peer's wall time (`peer`), all Unix ms.
pub fn offset_ms(t0: u64, peer: u64, t1: u64) -> i64 {
    let mid = (i128::from(t0) + i128::from(t1)) / 2;
    i64::try_from(i128::from(peer) - mid).unwrap_or(i64::MAX)
}

/// The endpoint of the peer at `address` (`host:port`): plaintext, or TLS
/// with `tls`'s CA, server name and this server's own certificate (files
/// read now, so a rotated pair serves the next connection).
fn peer_endpoint(address: &str, tls: Option<&PeerTls>) -> Result<Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
        .map_err(|e| format!("unusable peer address: {e}"))?;
    let Some(tls) = tls else {
        return Ok(endpoint);
    };
    let (cert, key) = &tls.identity;
    let mut client = snowkeep_client::ClientTls::from_ca_file(&tls.ca_file)
        .and_then(|c| c.identity_files(cert, key))
        .map_err(|e| e.to_string())?;
    if let Some(name) = &tls.server_name {
        client = client.server_name(name.clone());
    }
    client.apply(endpoint).map_err(|e| e.to_string())
}

/// Measures the offset to `channel`'s server; `None` when it does not answer
/// in time.
async fn measure(channel: Channel, clock: &SharedClock) -> Option<i64> {
    let mut client = pb::info_service_client::InfoServiceClient::new(channel);
    let t0 = clock.unix_ms();
    let resp = tokio::time::timeout(CALL_TIMEOUT, client.get_info(pb::GetInfoRequest {}))
        .await
        .ok()?
        .ok()?;
    let t1 = clock.unix_ms();
    Some(offset_ms(t0, resp.into_inner().server_time_unix_ms, t1))
}

/// One lazily connected channel per peer address, kept across rounds.
struct Channels {
    /// By address.
    by_address: HashMap<String, Channel>,
    /// TLS towards peers (`--peer-tls-ca-file`), if any.
    tls: Option<PeerTls>,
    /// A peer that cannot be reached for a reason of ours (a TLS file) is
    /// warned about once; it is retried every round.
    warned: bool,
}

impl Channels {
    fn new(tls: Option<PeerTls>) -> Self {
        Channels {
            by_address: HashMap::new(),
            tls,
            warned: false,
        }
    }

    /// Drops the channels of addresses no peer has any more.
    fn keep_only(&mut self, peers: &[(String, String)]) {
        self.by_address
            .retain(|address, _| peers.iter().any(|(_, a)| a == address));
    }

    /// The channel to `address` (peer `instance`), made on first use;
    /// `None` when no endpoint can be built for it.
    fn get(&mut self, instance: &str, address: &str) -> Option<Channel> {
        if let Some(c) = self.by_address.get(address) {
            return Some(c.clone());
        }
        match peer_endpoint(address, self.tls.as_ref()) {
            Ok(e) => {
                let c = e.connect_timeout(CALL_TIMEOUT).connect_lazy();
                self.by_address.insert(address.to_owned(), c.clone());
                Some(c)
            }
            Err(problem) => {
                if !self.warned {
                    warn!(peer = %Escaped(instance), address = %Escaped(address), %problem, "cannot reach a peer for the clock check");
                    self.warned = true;
                }
                None
            }
        }
    }
}

/// Runs the check every `config.interval` until `shutdown`, once `directory`
/// is set (the store connected), keeping each round's results in `clocks`.
/// Does nothing when the interval is zero.
pub async fn run(
    config: PeerSkewConfig,
    namespace: String,
    directory: Arc<OnceLock<PeerDirectory>>,
    clock: SharedClock,
    clocks: PeerClocks,
    shutdown: CancellationToken,
) {
    if config.interval.is_zero() {
        return;
    }
    let max_gauge =
        metrics::gauge!(m::PEER_CLOCK_OFFSET_MAX_SECONDS, "namespace" => namespace.clone());
    let mut channels = Channels::new(config.tls.clone());
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(mut dir) = directory.get().cloned() else {
            continue;
        };
        let peers = match dir.others().await {
            Ok(p) => p,
            Err(e) => {
                debug!(error = %snowkeep_core::DisplayChain(&e), "could not list peers for the clock check");
                continue;
            }
        };
        channels.keep_only(&peers);
        let mut largest: i64 = 0;
        let mut answered = 0;
        let mut round = Vec::with_capacity(peers.len());
        for (instance, address) in &peers {
            let Some(channel) = channels.get(instance, address) else {
                continue;
            };
            let measured = measure(channel, &clock).await;
            round.push(PeerClock {
                instance_id: instance.clone(),
                address: address.clone(),
                offset_ms: measured,
            });
            let Some(offset) = measured else {
                debug!(peer = %Escaped(instance), address = %Escaped(address), "peer did not answer the clock check");
                continue;
            };
            answered += 1;
            m::record_skew(&namespace, m::SkewSource::Peer, offset);
            if offset.unsigned_abs() > largest.unsigned_abs() {
                largest = offset;
            }
            if u128::from(offset.unsigned_abs()) > config.warn.as_millis() {
                warn!(peer = %Escaped(instance), address = %Escaped(address), offset_ms = offset, threshold = ?config.warn, "clock offset to a peer server is over the threshold; check NTP on both hosts");
            }
        }
        clocks.set(round);
        // No peers: no offset. Peers that all failed to answer leave the last
        // figure standing rather than clearing a real skew.
        if peers.is_empty() || answered > 0 {
            max_gauge.set(largest.unsigned_abs() as f64 / 1000.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_at_the_midpoint_of_the_round_trip() {
        // Peer 2 s ahead, 10 ms round trip: it answered at our 1005.
        assert_eq!(offset_ms(1_000, 3_005, 1_010), 2_000);
        // Peer 1.5 s behind.
        assert_eq!(offset_ms(10_000, 8_502, 10_004), -1_500);
        assert_eq!(offset_ms(0, 0, 0), 0);
    }
}
