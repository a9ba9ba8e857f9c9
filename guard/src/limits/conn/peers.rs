//! Per-peer accounting: the open connections of each source IP address,
//! against `max_connections_per_peer`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Open connections per source IP address; an address with none has no
/// entry, so the map holds at most `max_connections` entries.
pub(super) type PerPeer = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// Counts a connection from `peer` in `per_peer` when the cap `max` allows
/// it: `Some` (holding it until dropped) or `None` when `peer` is at the
/// cap. With no cap, or no known address, always `Some`.
pub(super) fn take(
    per_peer: &PerPeer,
    max: Option<usize>,
    peer: Option<IpAddr>,
) -> Option<Option<PeerSlot>> {
    let (Some(max), Some(peer)) = (max, peer) else {
        return Some(None);
    };
    let mut map = per_peer.lock().unwrap_or_else(|p| p.into_inner());
    let open = map.entry(peer).or_insert(0);
    if *open >= max {
        if *open == 0 {
            map.remove(&peer);
        }
        return None;
    }
    *open += 1;
    Some(Some(PeerSlot {
        map: per_peer.clone(),
        peer,
    }))
}

/// One open connection counted against its source address; uncounts it on
/// drop.
#[derive(Debug)]
pub(super) struct PeerSlot {
    map: PerPeer,
    peer: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = map.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                map.remove(&self.peer);
            }
        }
    }
}
