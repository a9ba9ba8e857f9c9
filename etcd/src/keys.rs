//! The etcd key schema. Every key snowkeep writes is built here.
//!
//! | key | value | bound to a lease |
//! | --- | --- | --- |
//! | `/snowkeep/v1/ns/{namespace}/layout` | the namespace record: layout, incarnation, state, floor ([`super::namespace`]); an older version's plain layout `41/12/10@1767225600000` still reads | no |
//! | `/snowkeep/v1/ns/{namespace}/holder/{machine_id:05}` | holder's instance id | yes, the holder's |
//! | `/snowkeep/v1/ns/{namespace}/fence/{machine_id:05}` | fence, decimal layout ms | no: it outlives holders |
//! | `/snowkeep/v1/ns/{namespace}/last/{machine_id:05}` | instance id of the last clean release | no |
//! | `/snowkeep/v1/ns/{namespace}/instance/{instance_id}/{machine_id:05}` | empty: a stable instance id claimed this machine id (its claims find by key what it holds or released last; entries of neither are pruned) | no |
//! | `/snowkeep/v1/ns/{namespace}/fence-count` | `base 0` and `absent_floor_ms 0`: fence keys are counted since the namespace was created (`super::fence_count`) | no |
//! | `/snowkeep/v1/ns/{namespace}/fence-count/{block:04}` | the block's own `base` and `absent_floor_ms`, once re-based | no |
//! | `/snowkeep/v1/ns/{namespace}/fence-count/{block:04}/{nonce}` | empty: one per fence key created in the block (machine ids `64 × block` to `64 × block + 63`) | no |
//! | `/snowkeep/v1/ns/{namespace}/requester/{requester}` | `id:floor,…` of an embedded requester's machine ids | yes, the requester's |
//! | `/snowkeep/v1/ns/{namespace}/token/{requester}` | SHA-256 of the requester's lease token, 64 hex digits | yes, the requester's |
//! | `/snowkeep/v1/ns/{namespace}/about/{requester}` | JSON: what the administration service shows of the requester (host id, pid, start time, skew, API key id; never its nonce or token); informational only, no claim reads it | yes, the requester's |
//! | `/snowkeep/v1/ns/{namespace}/peer/{instance_id}` | the server's advertised `host:port` (peer clock check) | yes, the server's |
//! | `/snowkeep/v1/ns/{namespace}/write-check` | never written: the start's write-permission check puts it in a transaction whose guard can never hold (`super::start_check`) | no |
//! | `/snowkeep/v1/auth-mode` | the cluster's security mode, `on` or `off` (absent: off, and not yet set) ([`super::auth_mode`]) | no |
//! | `/snowkeep/v1/apikeys/{key_id}` | an API key record, JSON with the SHA-256 of its secret (`snowkeep_core::api_key::KeyRecord`) | no |
//! | `/snowkeep/v1/keyholds/{key_id}/{namespace}/{requester}` | decimal count of the machine ids a requester acquired with that API key holds (its quota) | yes, the requester's |
//!
//! `{requester}` is the SHA-256 of the requester's identity
//! (`host_id:pid:start_unix_ms:nonce`) in 64 hex digits, so keys never carry
//! the identity itself. An embedded requester's holder keys hold
//! `requester/{requester}`, which can never equal a server's instance id (no
//! `/` in `host:pid:suffix`).
//!
//! Servers before lease tokens also wrote `/snowkeep/v1/ns/{namespace}/skew/…`
//! keys, each on a lease of its own; none is written any more, and those left
//! expire with their leases.
//!
//! A requester that acquired with an API key has `;key={key_id}` after its
//! record's machine ids, so its renewals keep its `keyholds` key with it.
//!
//! Machine ids are zero-padded to five digits so keys sort numerically.
//!
//! The values snowkeep parses back are decoded here too: fences
//! (`decode_fence`) and requester records (`encode_record`,
//! `decode_record`).

use snowkeep_client::{MachineId, Millis};

use snowkeep_core::claim::{HeldId, StoreError};

/// Longest stored value quoted in a log line or an error about an unreadable key.
const QUOTED_VALUE_CHARS: usize = 100;

const ROOT: &str = "/snowkeep/v1/ns/";

/// The prefix of every namespace's keys.
pub fn namespaces_root() -> &'static str {
    ROOT
}

/// The prefix of everything under a namespace.
pub fn namespace_prefix(namespace: &str) -> String {
    format!("{ROOT}{namespace}/")
}

/// The key of the start's write-permission check: named in a guarded put
/// whose guard never holds, so it is never written.
pub fn write_check(namespace: &str) -> String {
    format!("{ROOT}{namespace}/write-check")
}

/// The namespace's record key (named for the layout it first held).
pub fn layout(namespace: &str) -> String {
    format!("{ROOT}{namespace}/layout")
}

/// The prefix of the namespace's holder keys.
pub fn holder_prefix(namespace: &str) -> String {
    format!("{ROOT}{namespace}/holder/")
}

/// The holder key of one machine id.
pub fn holder(namespace: &str, machine_id: MachineId) -> String {
    format!("{ROOT}{namespace}/holder/{:05}", machine_id.get())
}

/// The exclusive end of the holder keys of machine ids below `end`: with
/// [`holder`] of the range's start, the key range of a machine-id range
/// `[start, end)` (five-digit padding keeps numeric order, and `end` may be
/// 65536, one past the last machine id).
pub fn holder_range_end(namespace: &str, end: u32) -> String {
    format!("{ROOT}{namespace}/holder/{end:05}")
}

/// The prefix of the namespace's fence keys.
pub fn fence_prefix(namespace: &str) -> String {
    format!("{ROOT}{namespace}/fence/")
}

/// The fence key of one machine id.
pub fn fence(namespace: &str, machine_id: MachineId) -> String {
    format!("{ROOT}{namespace}/fence/{:05}", machine_id.get())
}

/// Machine ids per fence-count block: machine id `m` is counted in block
/// `m / FENCE_COUNT_BLOCK`.
pub const FENCE_COUNT_BLOCK: u16 = 64;

/// The namespace's fence-count root: present when fence keys have been
/// counted since the namespace was created. Every fence-count key starts with
/// it, and it starts with the fence keys' `…/fence`: an `etcdctl del
/// --prefix …/fence` deletes the counts with the fences, and a missing count
/// vouches for nothing.
pub fn fence_count_root(namespace: &str) -> String {
    format!("{ROOT}{namespace}/fence-count")
}

/// The fence-count key of a block (present once the block was re-based).
pub fn fence_count_block(namespace: &str, block: u16) -> String {
    format!("{ROOT}{namespace}/fence-count/{block:04}")
}

/// The prefix of a block's creation markers, one per fence key created.
pub fn fence_count_markers(namespace: &str, block: u16) -> String {
    format!("{ROOT}{namespace}/fence-count/{block:04}/")
}

/// A new creation marker of `block`, named by 64 random bits: nothing in its
/// name ties it to a machine id, so deleting "every key of a machine id"
/// leaves it, and the count shows the deletion.
pub fn fence_count_marker(namespace: &str, block: u16) -> String {
    format!(
        "{}{:016x}",
        fence_count_markers(namespace, block),
        rand::random::<u64>()
    )
}

/// The fence-count block of a machine id.
pub fn fence_count_block_of(machine_id: MachineId) -> u16 {
    machine_id.get() / FENCE_COUNT_BLOCK
}

/// The fence keys of a block: `[start, end)` for a range read or compare.
pub fn block_fences(namespace: &str, block: u16) -> (String, String) {
    let start = u32::from(block) * u32::from(FENCE_COUNT_BLOCK);
    let end = start + u32::from(FENCE_COUNT_BLOCK);
    (
        format!("{ROOT}{namespace}/fence/{start:05}"),
        format!("{ROOT}{namespace}/fence/{end:05}"),
    )
}

/// The fence-count block whose fence-key range ([`block_fences`]) holds
/// `key`, by key order, whatever follows the prefix (a hand-written key
/// that is no machine id too, as a range count finds it); `None` outside
/// every block's range.
pub fn fence_block_of_key(key: &[u8], namespace: &str) -> Option<u16> {
    let rest = key.strip_prefix(fence_prefix(namespace).as_bytes())?;
    let blocks = (u32::from(u16::MAX) + 1) / u32::from(FENCE_COUNT_BLOCK);
    let start = |b: u32| format!("{:05}", b * u32::from(FENCE_COUNT_BLOCK));
    if rest < start(0).as_bytes() || rest >= start(blocks).as_bytes() {
        return None;
    }
    if let Some(n) = rest
        .get(..5)
        .filter(|d| d.iter().all(u8::is_ascii_digit))
        .and_then(|d| std::str::from_utf8(d).ok()?.parse::<u32>().ok())
    {
        // Five digits first: ordered as their number.
        return u16::try_from(n / u32::from(FENCE_COUNT_BLOCK)).ok();
    }
    // The last block whose range starts at or before it.
    let (mut lo, mut hi) = (0, blocks);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if start(mid).as_bytes() <= rest {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    u16::try_from(lo).ok()
}

/// What a key under [`fence_count_root`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceCountKey {
    /// The root itself.
    Root,
    /// A block's own key.
    Block(u16),
    /// A creation marker of a block.
    Marker(u16),
}

/// Parses a key read under [`fence_count_root`]; `None` for a foreign one.
pub fn fence_count_key(key: &[u8], namespace: &str) -> Option<FenceCountKey> {
    let root = fence_count_root(namespace);
    let rest = key.strip_prefix(root.as_bytes())?;
    if rest.is_empty() {
        return Some(FenceCountKey::Root);
    }
    let rest = std::str::from_utf8(rest.strip_prefix(b"/")?).ok()?;
    let (block, marker) = match rest.split_once('/') {
        Some((block, marker)) => (block, Some(marker)),
        None => (rest, None),
    };
    if block.len() != 4 || !block.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let block: u16 = block.parse().ok()?;
    if u32::from(block) * u32::from(FENCE_COUNT_BLOCK) > u32::from(u16::MAX) {
        return None;
    }
    match marker {
        None => Some(FenceCountKey::Block(block)),
        Some(m) if !m.is_empty() && !m.contains('/') => Some(FenceCountKey::Marker(block)),
        Some(_) => None,
    }
}

/// The prefix of the namespace's last-holder keys.
pub fn last_holder_prefix(namespace: &str) -> String {
    format!("{ROOT}{namespace}/last/")
}

/// The last-holder key of one machine id: who released it last, so a stable
/// instance gets its own machine id back after a clean restart.
pub fn last_holder(namespace: &str, machine_id: MachineId) -> String {
    format!("{ROOT}{namespace}/last/{:05}", machine_id.get())
}

/// The prefix of the machine ids a stable instance id claimed
/// ([`instance_claim`]).
pub fn instance_claims_prefix(namespace: &str, instance_id: &str) -> String {
    format!("{ROOT}{namespace}/instance/{instance_id}/")
}

/// The key that records that the stable instance `instance_id` claimed
/// `machine_id`: its next claims read its holder and last-holder keys by
/// key, instead of scanning every holder key of the pool.
pub fn instance_claim(namespace: &str, instance_id: &str, machine_id: MachineId) -> String {
    format!(
        "{}{:05}",
        instance_claims_prefix(namespace, instance_id),
        machine_id.get()
    )
}

/// The prefix of every stored API key (`{prefix}{id}`, JSON kept by the
/// authentication module; export and import copy the values verbatim).
pub const API_KEYS_ROOT: &str = "/snowkeep/v1/apikeys/";

/// The prefix of the namespace's requester records.
pub fn requester_prefix(namespace: &str) -> String {
    format!("{ROOT}{namespace}/requester/")
}

/// The record of an embedded requester's machine ids and floors;
/// `requester` is the hex SHA-256 of its identity.
pub fn requester(namespace: &str, requester: &str) -> String {
    format!("{ROOT}{namespace}/requester/{requester}")
}

/// The SHA-256 of an embedded requester's lease token; `requester` is the
/// hex SHA-256 of its identity.
pub fn token(namespace: &str, requester: &str) -> String {
    format!("{ROOT}{namespace}/token/{requester}")
}

/// The prefix of the namespace's requester descriptions.
pub fn about_prefix(namespace: &str) -> String {
    format!("{ROOT}{namespace}/about/")
}

/// What the administration service shows of an embedded requester
/// (`snowkeep_core::lease::records::RequesterAbout`); `requester` is the hex SHA-256
/// of its identity.
pub fn about(namespace: &str, requester: &str) -> String {
    format!("{ROOT}{namespace}/about/{requester}")
}

/// The holder value of an embedded requester.
pub fn requester_holder(requester: &str) -> String {
    format!("requester/{requester}")
}

/// The prefix of the namespace's peer keys.
pub fn peer_prefix(namespace: &str) -> String {
    format!("{ROOT}{namespace}/peer/")
}

/// The peer key of one server instance.
pub fn peer(namespace: &str, instance_id: &str) -> String {
    format!("{ROOT}{namespace}/peer/{instance_id}")
}

const APIKEYS: &str = "/snowkeep/v1/apikeys/";

/// The cluster's security mode: one key for every server on the etcd, of
/// every namespace (API keys are cluster-wide too).
pub const AUTH_MODE: &str = "/snowkeep/v1/auth-mode";

/// The restore record: the snapshot (sha256, revision) etcd was restored
/// from by `scripts/etcd-snapshot restore`; see `super::restore_record`.
pub const RESTORED: &str = "/snowkeep/v1/restored";
const KEYHOLDS: &str = "/snowkeep/v1/keyholds/";

/// The prefix of every API key record.
pub fn apikeys_prefix() -> &'static str {
    APIKEYS
}

/// The record of one API key.
pub fn apikey(id: &str) -> String {
    format!("{APIKEYS}{id}")
}

/// The prefix of one API key's Lease API holdings (the trailing `/` keeps
/// key `k1` apart from key `k10`).
pub fn key_holds_prefix(key_id: &str) -> String {
    format!("{KEYHOLDS}{key_id}/")
}

/// The holding of one requester acquired with `key_id`: the number of
/// machine ids it holds, on its etcd lease.
pub fn key_hold(key_id: &str, namespace: &str, requester: &str) -> String {
    format!("{KEYHOLDS}{key_id}/{namespace}/{requester}")
}

/// The first key after every key that starts with `prefix`: the exclusive end
/// of the prefix's range (what etcd's `--prefix` reads up to).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only for a prefix of 0xff bytes (never one of ours): to the end of keys.
    vec![0]
}

/// Parses the machine id from a key under `prefix`; `None` for a foreign key.
pub fn machine_id_of(key: &[u8], prefix: &str) -> Option<MachineId> {
    let rest = key.strip_prefix(prefix.as_bytes())?;
    std::str::from_utf8(rest).ok()?.parse().ok().map(MachineId)
}

/// A fence value: decimal layout ms. [`StoreError::Corrupt`] naming `key`
/// for anything else.
pub fn decode_fence(key: &str, value: &[u8]) -> Result<Millis, StoreError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Millis)
        .ok_or_else(|| StoreError::Corrupt {
            key: key.to_owned(),
            value: String::from_utf8_lossy(value).into_owned(),
        })
}

/// A requester record's value: `machine_id:floor_ms` per held machine id,
/// comma-separated, in slot order; then `;key={key_id}` when it acquired
/// with an API key.
pub fn encode_record(held: &[HeldId], key_id: Option<&str>) -> String {
    let ids = held
        .iter()
        .map(|h| format!("{}:{}", h.machine_id.get(), h.floor.get()))
        .collect::<Vec<_>>()
        .join(",");
    match key_id {
        Some(key) => format!("{ids}{RECORD_KEY}{key}"),
        None => ids,
    }
}

/// What separates a requester record's machine ids from its API key id.
const RECORD_KEY: &str = ";key=";

/// The API key id a requester record's value names (`;key=…`), if any.
pub fn record_key_id(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    let (_, key) = text.split_once(RECORD_KEY)?;
    Some(key.to_owned())
}

/// The machine ids and floors (layout ms) of a requester record's value;
/// [`StoreError::Corrupt`] naming `key` (the value quoted) for anything that
/// is not `encode_record`'s form.
pub fn decode_record(key: &str, value: &[u8]) -> Result<Vec<(MachineId, Millis)>, StoreError> {
    let corrupt = || StoreError::Corrupt {
        key: key.to_owned(),
        value: quoted(value),
    };
    let text = std::str::from_utf8(value).map_err(|_| corrupt())?;
    let text = text.split_once(RECORD_KEY).map_or(text, |(ids, _)| ids);
    text.split(',')
        .map(|pair| {
            let (id, floor) = pair.split_once(':').ok_or_else(corrupt)?;
            Ok((
                MachineId(id.parse().map_err(|_| corrupt())?),
                Millis(floor.parse().map_err(|_| corrupt())?),
            ))
        })
        .collect()
}

/// A stored `value` as text for logs and errors, cut to
/// `QUOTED_VALUE_CHARS` characters.
pub fn quoted(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    match text.char_indices().nth(QUOTED_VALUE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_zero_padded_and_parse_back() {
        assert_eq!(
            holder("orders", MachineId(42)),
            "/snowkeep/v1/ns/orders/holder/00042"
        );
        assert_eq!(
            fence("orders", MachineId(4095)),
            "/snowkeep/v1/ns/orders/fence/04095"
        );
        assert_eq!(
            machine_id_of(
                b"/snowkeep/v1/ns/orders/fence/04095",
                &fence_prefix("orders")
            ),
            Some(MachineId(4095))
        );
        assert_eq!(
            machine_id_of(b"/snowkeep/v1/ns/other/fence/1", &fence_prefix("orders")),
            None
        );
    }

    #[test]
    fn fence_counts_are_blocks_of_machine_ids_outside_the_fence_keys() {
        assert_eq!(
            fence_count_root("orders"),
            "/snowkeep/v1/ns/orders/fence-count"
        );
        assert_eq!(
            fence_count_block("orders", 7),
            "/snowkeep/v1/ns/orders/fence-count/0007"
        );
        assert_eq!(fence_count_block_of(MachineId(63)), 0);
        assert_eq!(fence_count_block_of(MachineId(64)), 1);
        assert_eq!(fence_count_block_of(MachineId(4095)), 63);
        assert_eq!(fence_count_block_of(MachineId(65535)), 1023);
        assert_eq!(
            block_fences("orders", 1),
            (
                "/snowkeep/v1/ns/orders/fence/00064".to_owned(),
                "/snowkeep/v1/ns/orders/fence/00128".to_owned()
            )
        );
        assert_eq!(
            block_fences("orders", 1023).1,
            "/snowkeep/v1/ns/orders/fence/65536"
        );
        let marker = fence_count_marker("orders", 3);
        assert!(marker.starts_with("/snowkeep/v1/ns/orders/fence-count/0003/"));
        assert_eq!(marker.len(), fence_count_markers("orders", 3).len() + 16);
        assert_ne!(marker, fence_count_marker("orders", 3));
        let parse = |k: &str| fence_count_key(k.as_bytes(), "orders");
        assert_eq!(
            parse(&fence_count_root("orders")),
            Some(FenceCountKey::Root)
        );
        assert_eq!(
            parse(&fence_count_block("orders", 1023)),
            Some(FenceCountKey::Block(1023))
        );
        assert_eq!(parse(&marker), Some(FenceCountKey::Marker(3)));
        for foreign in [
            "/snowkeep/v1/ns/orders/fence-countx",
            "/snowkeep/v1/ns/orders/fence-count/7",
            "/snowkeep/v1/ns/orders/fence-count/1024",
            "/snowkeep/v1/ns/orders/fence-count/0003/",
            "/snowkeep/v1/ns/orders/fence-count/0003/a/b",
            "/snowkeep/v1/ns/other/fence-count",
        ] {
            assert_eq!(parse(foreign), None, "{foreign}");
        }
        // Blocks by key order, as a range count sees them.
        let fences = fence_prefix("orders");
        let block = |rest: &str| fence_block_of_key(format!("{fences}{rest}").as_bytes(), "orders");
        assert_eq!(block("00000"), Some(0));
        assert_eq!(block("00063"), Some(0));
        assert_eq!(block("00064"), Some(1));
        assert_eq!(block("65535"), Some(1023));
        assert_eq!(block("00064-junk"), Some(1));
        assert_eq!(block("0006"), Some(0));
        assert_eq!(block("0007"), Some(1));
        assert_eq!(block("7"), None);
        assert_eq!(block("0"), None);
        assert_eq!(block("65536"), None);
        assert_eq!(block("x"), None);
        for b in [0u16, 1, 500, 1023] {
            let (start, end) = block_fences("orders", b);
            assert_eq!(fence_block_of_key(start.as_bytes(), "orders"), Some(b));
            let last = format!("{fences}{:05}", (u32::from(b) + 1) * 64 - 1);
            assert!(last < end);
            assert_eq!(fence_block_of_key(last.as_bytes(), "orders"), Some(b));
        }
        // Outside the fence keys' range (pool reads, overlap counts) ...
        let fences = fence_prefix("orders");
        assert!(marker.clone().into_bytes() < fences.clone().into_bytes());
        assert_eq!(machine_id_of(marker.as_bytes(), &fences), None);
        // ... but under the bare `…/fence` prefix an operator might delete.
        assert!(marker.starts_with("/snowkeep/v1/ns/orders/fence"));
    }

    #[test]
    fn a_prefix_range_ends_just_after_its_last_possible_key() {
        assert_eq!(
            prefix_end(&fence_prefix("orders")),
            b"/snowkeep/v1/ns/orders/fence0".to_vec()
        );
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert!(
            prefix_end(&holder_prefix("orders")) > holder("orders", MachineId(65535)).into_bytes()
        );
        assert!(prefix_end(&holder_prefix("orders")) <= last_holder_prefix("orders").into_bytes());
    }
}
