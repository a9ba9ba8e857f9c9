//! The namespace record and the detection of an etcd that lost writes.
//!
//! **The record** is the value of `/snowkeep/v1/ns/{namespace}/layout`, one
//! `key value` pair per line so `etcdctl get` shows it plainly:
//!
//! ```text
//! layout 41/12/10@1767225600000
//! incarnation 6a1f0c9e2b7d4c13
//! state ok
//! acknowledged_gap -3
//! floor_ms 0
//! ```
//!
//! * `incarnation`: 64 random bits (16 hex digits) drawn when the namespace
//!   is created. Grants carry it, so a holder can tell a namespace that was
//!   deleted and created again (same name, state lost) from its own.
//! * `state`: `ok`, or `rolled-back` with `rolled_back_at` (RFC 3339) and
//!   `rolled_back_reason`. While rolled back nothing claims a machine id in
//!   the namespace.
//! * `acknowledged_gap`: the gap (below) an operator accepted when the
//!   namespace was created or a floor was confirmed.
//! * `floor_ms`: a timestamp floor in layout ms an operator confirmed: every
//!   claim's floor is at least this, exactly as if every machine id's fence
//!   had been raised to it. `confirmed_at` says when (RFC 3339).
//!
//! A value holding only a layout (`41/12/10@1767225600000`) was written by an
//! older version: it reads as state `ok`, incarnation 0 (unknown), gap 0.
//!
//! **Rollback detection** here is the index rule, the last of three layers
//! (docs/design.md, "Detecting a restore"): etcd's raft index counts the
//! entries of this cluster's raft log, and every entry raises the mvcc
//! revision by at most one. So in a cluster that was never restored,
//! `revision <= applied index + 1` on every member, whatever happens
//! (restarts, member changes, compaction, defragmentation). `etcdctl
//! snapshot restore` starts a new raft log (index ~1 per member) but keeps
//! the snapshot's revision, and keeps the cluster id, so only the gap
//! `revision - applied index` shows it. A member answering with a gap above
//! the acknowledged one plus `ROLLBACK_SLACK` belongs to a restored cluster.
//! The gap measures the snapshot's revision, not the writes it lost: a
//! snapshot taken within about `ROLLBACK_SLACK` revisions of the acknowledged
//! gap is never seen, nor one whose gap non-writing entries closed before a
//! check. The runbook's restore (`scripts/etcd-snapshot restore`) marks every
//! record rolled-back itself, and [`guard`] first asks the revision witness
//! ([`super::witness`]), which sees a restore a running server lived through.

use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use snowkeep_client::{Layout, Millis};
use tracing::{error, info, warn};

use super::fence_count::CountBase;
use super::{keys, restore_record, Endpoints, EtcdStore};
use snowkeep_core::claim::StoreError;
use snowkeep_core::text::rfc3339;

/// How far (in revisions) etcd's revision may run ahead of its raft applied
/// index, beyond the acknowledged gap, before the store counts as restored
/// from an older snapshot. A never-restored member is at most 1 ahead; the
/// slack leaves room for what this reasoning may have missed. It is also the
/// rule's blind spot: a snapshot whose revision is within the slack of the
/// new raft log (an early one) is not seen, however many writes it lost.
pub const ROLLBACK_SLACK: i64 = 16;

/// The section of the runbook for a restored etcd.
pub const RUNBOOK_RESTORE: &str = "docs/operations.md#restoring-etcd-from-a-snapshot";

/// Whether a namespace may be claimed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceState {
    /// Claims go ahead.
    Ok,
    /// etcd lost writes; nothing is claimed until an operator confirms a floor.
    RolledBack {
        /// When it was detected, RFC 3339.
        at: String,
        /// What was detected.
        reason: String,
    },
}

/// The decoded namespace record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceRecord {
    /// The namespace's layout.
    pub layout: Layout,
    /// Random per creation; 0 for a record an older version wrote.
    pub incarnation: u64,
    /// Ok or rolled back.
    pub state: NamespaceState,
    /// `revision - applied index` accepted by an operator (revisions).
    pub acknowledged_gap: i64,
    /// Confirmed floor, layout ms (0: none): every claim's floor is at least this.
    pub floor: Millis,
    /// When the floor was confirmed, RFC 3339.
    pub confirmed_at: Option<String>,
}

/// A random non-zero incarnation.
fn new_incarnation() -> u64 {
    loop {
        let n = rand::random::<u64>();
        if n != 0 {
            return n;
        }
    }
}

impl NamespaceRecord {
    /// A new record in state `ok` with a fresh incarnation.
    pub fn new(layout: Layout, acknowledged_gap: i64) -> Self {
        Self {
            layout,
            incarnation: new_incarnation(),
            state: NamespaceState::Ok,
            acknowledged_gap,
            floor: Millis(0),
            confirmed_at: None,
        }
    }

    /// Gives a record an older version wrote (incarnation 0) an incarnation,
    /// as every record written from now on has one.
    pub fn with_incarnation(mut self) -> Self {
        if self.incarnation == 0 {
            self.incarnation = new_incarnation();
        }
        self
    }

    /// The value stored in etcd. Write only records with an incarnation
    /// ([`NamespaceRecord::with_incarnation`]): 0 does not parse back.
    pub fn encode(&self) -> String {
        let mut text = format!(
            "layout {}\nincarnation {:016x}\nstate {}\nacknowledged_gap {}\nfloor_ms {}\n",
            self.layout,
            self.incarnation,
            match self.state {
                NamespaceState::Ok => "ok",
                NamespaceState::RolledBack { .. } => "rolled-back",
            },
            self.acknowledged_gap,
            self.floor.get(),
        );
        if let Some(at) = &self.confirmed_at {
            text.push_str(&format!("confirmed_at {at}\n"));
        }
        if let NamespaceState::RolledBack { at, reason } = &self.state {
            // One line each: the reason is ours, but keep the format robust.
            let reason = reason.replace('\n', " ");
            text.push_str(&format!(
                "rolled_back_at {at}\nrolled_back_reason {reason}\n"
            ));
        }
        text
    }

    /// Parses a stored value (the new format, or an older version's plain
    /// layout). [`StoreError::CorruptNamespace`] names `key`, the value and
    /// what is wrong.
    pub fn parse(key: &str, value: &[u8]) -> Result<Self, StoreError> {
        let corrupt = |problem: String| StoreError::CorruptNamespace {
            key: key.to_owned(),
            value: String::from_utf8_lossy(value).into_owned(),
            problem,
        };
        let text = std::str::from_utf8(value).map_err(|_| corrupt("not UTF-8".into()))?;
        if !text.contains('\n') && !text.contains(' ') {
            // An older version's record: the layout alone.
            let layout = text
                .trim()
                .parse()
                .map_err(|e: snowkeep_client::LayoutError| corrupt(e.to_string()))?;
            return Ok(Self {
                layout,
                incarnation: 0,
                state: NamespaceState::Ok,
                acknowledged_gap: 0,
                floor: Millis(0),
                confirmed_at: None,
            });
        }
        let mut fields = std::collections::HashMap::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            fields.insert(k, v.trim());
        }
        let field = |name: &str| {
            fields
                .get(name)
                .copied()
                .ok_or_else(|| corrupt(format!("no {name} line")))
        };
        let layout = field("layout")?
            .parse()
            .map_err(|e: snowkeep_client::LayoutError| corrupt(format!("layout: {e}")))?;
        let incarnation = u64::from_str_radix(field("incarnation")?, 16)
            .ok()
            .filter(|&n| n != 0)
            .ok_or_else(|| corrupt("incarnation must be 16 hex digits, not zero".into()))?;
        let state = match field("state")? {
            "ok" => NamespaceState::Ok,
            "rolled-back" => NamespaceState::RolledBack {
                at: fields.get("rolled_back_at").copied().unwrap_or("?").into(),
                reason: fields
                    .get("rolled_back_reason")
                    .copied()
                    .unwrap_or("?")
                    .into(),
            },
            other => {
                return Err(corrupt(format!(
                    "state {other:?} is neither ok nor rolled-back"
                )))
            }
        };
        let acknowledged_gap = field("acknowledged_gap")?
            .parse()
            .map_err(|_| corrupt("acknowledged_gap must be an integer".into()))?;
        let floor = match fields.get("floor_ms") {
            None => Millis(0),
            Some(v) => Millis(
                v.parse()
                    .map_err(|_| corrupt("floor_ms must be a whole number".into()))?,
            ),
        };
        Ok(Self {
            layout,
            incarnation,
            state,
            acknowledged_gap,
            floor,
            confirmed_at: fields.get("confirmed_at").map(|s| (*s).to_owned()),
        })
    }

    /// The error for a rolled-back record; `None` when it is ok.
    pub fn refusal(&self, namespace: &str) -> Option<StoreError> {
        match &self.state {
            NamespaceState::Ok => None,
            NamespaceState::RolledBack { at, reason } => Some(StoreError::NamespaceRolledBack {
                namespace: namespace.to_owned(),
                since: at.clone(),
                reason: reason.clone(),
            }),
        }
    }
}

/// How far etcd's revision runs ahead of its raft log on the member that answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreProgress {
    /// The mvcc revision (header of the Status answer).
    pub revision: i64,
    /// The raft applied index (the raft index on etcd versions that do not
    /// report the applied one).
    pub applied_index: u64,
}

impl StoreProgress {
    /// `revision - applied index`: at most 1 in a cluster never restored.
    pub fn gap(&self) -> i64 {
        self.revision
            .saturating_sub(i64::try_from(self.applied_index).unwrap_or(i64::MAX))
    }
}

/// The rollback rule: `Some(reason)` when `progress` shows a store restored
/// from an older snapshot since `acknowledged_gap` was accepted, i.e. its gap
/// exceeds `acknowledged_gap + ROLLBACK_SLACK`.
pub fn restored(progress: StoreProgress, acknowledged_gap: i64) -> Option<String> {
    let gap = progress.gap();
    (gap > acknowledged_gap.saturating_add(ROLLBACK_SLACK)).then(|| {
        format!(
            "etcd revision {} is {gap} ahead of its raft applied index {}, more than the acknowledged gap {acknowledged_gap} + slack {ROLLBACK_SLACK}: etcd was restored from an older snapshot",
            progress.revision, progress.applied_index
        )
    })
}

/// When the confirmed floor lies: a time, or a lead over the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorSpec {
    /// This time, ms since the Unix epoch.
    At(u64),
    /// This long after the confirming process's clock.
    After(Duration),
}

impl FromStr for FloorSpec {
    type Err = String;

    /// `+DURATION` (humantime, e.g. `+48h1m`) or an RFC 3339 UTC time
    /// (`2026-12-03T10:00:00Z`).
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = || {
            format!("{s:?}: use +DURATION (like +48h1m) or an RFC 3339 UTC time (like 2026-12-03T10:00:00Z)")
        };
        if let Some(lead) = s.strip_prefix('+') {
            return humantime::parse_duration(lead)
                .map(FloorSpec::After)
                .map_err(|_| bad());
        }
        let at = humantime::parse_rfc3339(s).map_err(|_| bad())?;
        let ms = at
            .duration_since(UNIX_EPOCH)
            .map_err(|_| bad())?
            .as_millis();
        Ok(FloorSpec::At(u64::try_from(ms).map_err(|_| bad())?))
    }
}

impl FloorSpec {
    /// The floor in ms since the Unix epoch, for a clock reading `now_unix_ms`.
    pub fn resolve(self, now_unix_ms: u64) -> u64 {
        match self {
            FloorSpec::At(t) => t,
            FloorSpec::After(d) => {
                now_unix_ms.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }
        }
    }
}

/// The longest lead a confirmed floor may have: no holder's fence runs
/// further ahead than the longest renewed lease (30 days) plus its margin.
pub const MAX_FLOOR_LEAD: Duration = Duration::from_secs(31 * 86_400);

/// Refuses a floor before `now_unix_ms` (it would protect nothing: a floor
/// must lie after every timestamp any holder may have stamped) or more than
/// [`MAX_FLOOR_LEAD`] after it ([`StoreError::BadFloor`]).
pub fn check_floor(spec: FloorSpec, now_unix_ms: u64) -> Result<(), StoreError> {
    let floor = spec.resolve(now_unix_ms);
    let problem = if floor < now_unix_ms {
        format!("it is before the clock ({})", rfc3339(now_unix_ms))
    } else if floor - now_unix_ms > u64::try_from(MAX_FLOOR_LEAD.as_millis()).unwrap_or(u64::MAX) {
        "it is more than 31 days ahead, further than any holder's fence can run (the longest renewed lease, 30 days, plus 60 s)".to_owned()
    } else {
        return Ok(());
    };
    Err(StoreError::BadFloor {
        floor: rfc3339(floor),
        problem,
    })
}

/// What the server does to its namespace when it connects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceSetup {
    /// Create the namespace when it has no record (`--create-namespace`).
    pub create: bool,
    /// Confirm this floor and lift a rollback (`--confirm-namespace-floor`).
    pub confirm_floor: Option<FloorSpec>,
}

/// Reads the record: `None` when the key is absent; with its mod revision.
pub(super) async fn read(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
) -> Result<Option<(NamespaceRecord, i64)>, StoreError> {
    Ok(read_at(endpoints, timeout, namespace).await?.0)
}

/// [`read`], with the header revision of the (linearizable) answer.
async fn read_at(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
) -> Result<(Option<(NamespaceRecord, i64)>, i64), StoreError> {
    let key = keys::layout(namespace);
    let resp = endpoints
        .call("read namespace record", timeout, |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })
        .await?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let found = match resp.kvs().first() {
        None => None,
        Some(kv) => Some((NamespaceRecord::parse(&key, kv.value())?, kv.mod_revision())),
    };
    Ok((found, revision))
}

/// Reads revision and applied index from the member the next request goes to.
pub(super) async fn progress(
    endpoints: &Endpoints,
    timeout: Duration,
) -> Result<StoreProgress, StoreError> {
    let status = endpoints
        .call("status", timeout, |mut c| async move { c.status().await })
        .await?;
    let applied = status.raft_applied_index();
    Ok(StoreProgress {
        revision: status.header().map(|h| h.revision()).unwrap_or(0),
        applied_index: if applied > 0 {
            applied
        } else {
            status.raft_index()
        },
    })
}

/// Writes state `rolled-back` (when the record is still the one read at
/// `mod_revision`) and returns the refusal to report.
async fn mark_rolled_back(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    mut record: NamespaceRecord,
    mod_revision: i64,
    reason: String,
    unix_ms: u64,
) -> StoreError {
    let key = keys::layout(namespace);
    let at = rfc3339(unix_ms);
    error!(namespace, reason = %reason, runbook = RUNBOOK_RESTORE, "etcd lost writes: marking the namespace rolled back; no machine id is claimed in it until an operator confirms a floor");
    record = record.with_incarnation();
    record.state = NamespaceState::RolledBack {
        at: at.clone(),
        reason: reason.clone(),
    };
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            mod_revision,
        )])
        .and_then([TxnOp::put(key, record.encode(), None)]);
    match endpoints.txn("mark rolled back", timeout, txn).await {
        Ok(r) if r.succeeded() => {}
        // Someone changed the record first (marked it too, or confirmed a
        // floor): refuse this time anyway; the next check reads theirs.
        Ok(_) => warn!(
            namespace,
            "the namespace record changed while marking it rolled back"
        ),
        Err(e) => {
            warn!(namespace, error = %snowkeep_core::DisplayChain(&e), "could not mark the namespace rolled back; every check refuses by itself until an operator confirms a floor")
        }
    }
    StoreError::NamespaceRolledBack {
        namespace: namespace.to_owned(),
        since: at,
        reason,
    }
}

/// The check before a claim (and the periodic one of holders): the record
/// must exist and be `ok`, and the store must not show a restore (the
/// revision witness, then the index rule); a restore it finds is marked in
/// the record. Returns the record and its mod revision.
///
/// Errors: [`StoreError::UnknownNamespace`], [`StoreError::CorruptNamespace`],
/// [`StoreError::NamespaceRolledBack`], or the etcd failure.
pub(super) async fn guard(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    unix_ms: u64,
) -> Result<(NamespaceRecord, i64), StoreError> {
    let before = endpoints.witness().highest(namespace);
    let (found, revision) = read_at(endpoints, timeout, namespace).await?;
    let Some((record, mod_revision)) = found else {
        return Err(StoreError::UnknownNamespace {
            namespace: namespace.to_owned(),
        });
    };
    let confirmed_at = record.confirmed_at.as_deref();
    if let Some(refusal) = record.refusal(namespace) {
        endpoints
            .witness()
            .start_over(namespace, revision, confirmed_at);
        return Err(refusal);
    }
    let went_back = endpoints
        .witness()
        .check(namespace, before, revision, confirmed_at);
    let reason = match went_back {
        Some(reason) => Some(reason),
        None => restored(progress(endpoints, timeout).await?, record.acknowledged_gap),
    };
    if let Some(reason) = reason {
        return Err(mark_rolled_back(
            endpoints,
            timeout,
            namespace,
            record,
            mod_revision,
            reason,
            unix_ms,
        )
        .await);
    }
    Ok((record, mod_revision))
}

/// What a confirmation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The namespace floor now, layout ms.
    pub floor: Millis,
    /// The gap acknowledged.
    pub acknowledged_gap: i64,
    /// Holder keys and requester records removed.
    pub cleared_keys: i64,
    /// Leases revoked.
    pub revoked_leases: usize,
}

/// Confirms `floor` (layout ms) on an existing namespace: in one transaction
/// guarded by the record read at `mod_revision`, raises the namespace floor,
/// records the current gap as acknowledged, sets state `ok`, and removes every
/// holder key and requester record (every holder starts over above the floor);
/// then revokes the leases they were bound to.
async fn confirm_existing(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    record: NamespaceRecord,
    mod_revision: i64,
    floor: Millis,
    unix_ms: u64,
) -> Result<Option<Confirmed>, StoreError> {
    let key = keys::layout(namespace);
    let holder_prefix = keys::holder_prefix(namespace);
    let requester_prefix = keys::requester(namespace, "");
    let mut leases = std::collections::BTreeSet::new();
    for prefix in [&holder_prefix, &requester_prefix] {
        let resp = endpoints
            .call("read holders", timeout, |mut c| {
                let p = prefix.clone();
                async move {
                    c.get(p, Some(GetOptions::new().with_prefix().with_keys_only()))
                        .await
                }
            })
            .await?;
        leases.extend(resp.kvs().iter().map(|kv| kv.lease()).filter(|&l| l != 0));
    }
    let progress = progress(endpoints, timeout).await?;
    let was = record.state.clone();
    let record = record.with_incarnation();
    let new = NamespaceRecord {
        state: NamespaceState::Ok,
        floor: record.floor.max(floor),
        acknowledged_gap: progress.gap(),
        confirmed_at: Some(rfc3339(unix_ms)),
        ..record
    };
    // The failure branch reads the record: a transaction retried on another
    // endpoint after its first attempt committed (and the answer was lost)
    // finds exactly this new record, and must not confirm again (a second
    // confirmation would clear holders that claimed above the floor since).
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            mod_revision,
        )])
        .and_then([
            TxnOp::delete(holder_prefix, Some(DeleteOptions::new().with_prefix())),
            TxnOp::delete(requester_prefix, Some(DeleteOptions::new().with_prefix())),
            TxnOp::put(key.clone(), new.encode(), None),
        ])
        .or_else([TxnOp::get(key, None)]);
    let resp = endpoints.txn("confirm floor", timeout, txn).await?;
    if !resp.succeeded() && !holds_value(&resp, &new.encode()) {
        return Ok(None);
    }
    let cleared_keys = resp
        .op_responses()
        .into_iter()
        .map(|r| match r {
            etcd_client::TxnOpResponse::Delete(d) => d.deleted(),
            _ => 0,
        })
        .sum();
    let mut revoked_leases = 0;
    for lease in leases {
        if endpoints.revoke(timeout, lease).await.is_ok() {
            revoked_leases += 1;
        }
    }
    if was == NamespaceState::Ok {
        warn!(
            namespace,
            "the namespace was not marked rolled back; confirmed the floor anyway"
        );
    }
    Ok(Some(Confirmed {
        floor: new.floor,
        acknowledged_gap: new.acknowledged_gap,
        cleared_keys,
        revoked_leases,
    }))
}

/// True when `resp` (a failed transaction whose `or_else` read one key)
/// found the key holding `value`.
fn holds_value(resp: &etcd_client::TxnResponse, value: &str) -> bool {
    resp.op_responses().into_iter().any(|r| match r {
        etcd_client::TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == value.as_bytes()),
        _ => false,
    })
}

/// Creates the record when the key is absent; `Ok(None)` when it already
/// existed. When nothing at all is stored under the namespace's prefix (so no
/// fence key can have been deleted from it), the same transaction, guarded
/// by the whole prefix being empty, writes the fence-count root (`base 0`):
/// `Ok(Some(true))`. When keys are there without a record (it was deleted by
/// hand, say) the record alone is created, guarded by `create_revision ==
/// 0`: `Ok(Some(false))`, and each fence-count block is counted from its
/// first claim of a machine id without a fence key, which starts one fence
/// lead ahead. A transaction retried on another endpoint after its
/// first attempt committed finds this very record (its incarnation is
/// random) and counts as created.
async fn create(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    record: &NamespaceRecord,
) -> Result<Option<bool>, StoreError> {
    let key = keys::layout(namespace);
    let value = record.encode();
    let ops = [
        TxnOp::put(key.clone(), value.clone(), None),
        TxnOp::put(
            keys::fence_count_root(namespace),
            CountBase::NEW.encode(),
            None,
        ),
    ];
    let empty = Compare::create_revision(keys::namespace_prefix(namespace), CompareOp::Equal, 0)
        .with_prefix();
    // Without a floor, only on an etcd never restored by the script: a
    // restore between the caller's check and here fails both transactions,
    // and the caller's next look refuses.
    let guards = |first: Compare| {
        let mut guards = vec![first];
        guards.extend(record.confirmed_at.is_none().then(restore_record::absent));
        guards
    };
    let txn = Txn::new()
        .when(guards(empty))
        .and_then(ops)
        .or_else([TxnOp::get(key.clone(), None)]);
    let resp = endpoints.txn("create namespace", timeout, txn).await?;
    if resp.succeeded() || holds_value(&resp, &value) {
        return Ok(Some(true));
    }
    let found_record = resp.op_responses().into_iter().any(|r| match r {
        etcd_client::TxnOpResponse::Get(get) => !get.kvs().is_empty(),
        _ => false,
    });
    if found_record {
        return Ok(None);
    }
    let txn = Txn::new()
        .when(guards(Compare::create_revision(
            key.clone(),
            CompareOp::Equal,
            0,
        )))
        .and_then([TxnOp::put(key.clone(), value.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    let resp = endpoints.txn("create namespace", timeout, txn).await?;
    Ok((resp.succeeded() || holds_value(&resp, &value)).then_some(false))
}

impl EtcdStore {
    fn endpoint_list(&self) -> String {
        self.settings.endpoints.join(",")
    }

    fn layout_ms(&self, unix_ms: u64) -> Millis {
        self.layout.to_layout_ms(unix_ms).unwrap_or_default()
    }

    /// Opens the namespace at connect, as [`NamespaceSetup`] says:
    ///
    /// * no record: create it with `create`, else
    ///   [`StoreError::NamespaceNotCreated`] (with `confirm_floor` too, the new
    ///   record carries the floor);
    /// * a record: check its layout ([`StoreError::LayoutMismatch`]); with
    ///   `confirm_floor`, confirm it; else refuse a rolled-back namespace or
    ///   a store that shows a restore ([`StoreError::NamespaceRolledBack`],
    ///   marking it), then, with `create`, upgrade an older version's record.
    ///
    /// The first request after [`EtcdStore::new`]. Each request fails over
    /// to the next endpoint like any other; with a retryable error when no
    /// endpoint answers, call it again (it starts on the endpoint after the
    /// last one that failed).
    pub async fn open_namespace(&mut self) -> Result<(), StoreError> {
        let timeout = self.settings.request_timeout;
        let setup = self.settings.namespace_setup.clone();
        let ns = self.settings.namespace.clone();
        let key = keys::layout(&ns);
        if let Some(spec) = setup.confirm_floor {
            check_floor(spec, self.clock.unix_ms())?;
        }
        for _ in 0..8 {
            let unix_ms = self.clock.unix_ms();
            let floor = setup
                .confirm_floor
                .map(|f| self.layout_ms(f.resolve(unix_ms)));
            let Some((record, mod_revision)) = read(&self.endpoints, timeout, &ns).await? else {
                if !setup.create {
                    return Err(StoreError::NamespaceNotCreated {
                        namespace: ns,
                        endpoints: self.endpoint_list(),
                    });
                }
                if floor.is_none() {
                    let list = self.endpoint_list();
                    restore_record::refuse_creation_without_floor(
                        &self.endpoints,
                        timeout,
                        &ns,
                        list,
                    )
                    .await?;
                }
                let gap = progress(&self.endpoints, timeout).await?.gap();
                let mut record = NamespaceRecord::new(self.layout, gap);
                if let Some(floor) = floor {
                    record.floor = floor;
                    record.confirmed_at = Some(rfc3339(unix_ms));
                }
                if let Some(counted) = create(&self.endpoints, timeout, &ns, &record).await? {
                    info!(namespace = %ns, key = %key, layout = %self.layout, incarnation = %format!("{:016x}", record.incarnation), floor_ms = record.floor.get(), acknowledged_gap = gap, fence_counts = counted, "created the namespace");
                    if !counted {
                        warn!(namespace = %ns, prefix = %keys::namespace_prefix(&ns), "created the namespace over keys already stored under it: a fence key may have been deleted there, so in each fence-count block the first claim of a machine id without a fence key starts one fence lead ahead, and counts from then on");
                    }
                    return Ok(());
                }
                continue; // created concurrently: check theirs
            };
            if record.layout != self.layout {
                return Err(StoreError::LayoutMismatch {
                    namespace: ns,
                    stored: record.layout,
                    configured: self.layout,
                });
            }
            if let Some(floor) = floor {
                let confirmed = confirm_existing(
                    &self.endpoints,
                    timeout,
                    &ns,
                    record,
                    mod_revision,
                    floor,
                    unix_ms,
                )
                .await?;
                match confirmed {
                    Some(c) => {
                        info!(namespace = %ns, floor_ms = c.floor.get(), floor = %rfc3339(self.layout.to_unix_ms(c.floor)), acknowledged_gap = c.acknowledged_gap, cleared_keys = c.cleared_keys, revoked_leases = c.revoked_leases, "confirmed the namespace floor: claims resume, each above the floor");
                        return Ok(());
                    }
                    None => continue, // the record changed meanwhile
                }
            }
            let (record, mod_revision) = match record.refusal(&ns) {
                Some(refusal) => return Err(refusal),
                None => guard(&self.endpoints, timeout, &ns, unix_ms).await?,
            };
            if setup.create && record.incarnation == 0 {
                let gap = progress(&self.endpoints, timeout).await?.gap();
                let upgraded = NamespaceRecord::new(record.layout, gap);
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        mod_revision,
                    )])
                    .and_then([TxnOp::put(key.clone(), upgraded.encode(), None)]);
                if !self
                    .endpoints
                    .txn("upgrade namespace record", timeout, txn)
                    .await?
                    .succeeded()
                {
                    continue;
                }
                info!(namespace = %ns, incarnation = %format!("{:016x}", upgraded.incarnation), "gave the namespace record of an older version an incarnation and a state");
            }
            return Ok(());
        }
        Err(StoreError::Timeout {
            op: "open namespace (the record kept changing)",
            after: timeout,
        })
    }

    /// The check before every claim and, while holding, on every renewal: the
    /// namespace exists and is `ok`, etcd shows no restore (one found is
    /// marked), the layout is still ours and the confirmed floor is within
    /// `--max-fence-wait`. Returns the namespace floor (layout ms).
    ///
    /// Errors: [`StoreError::NamespaceNotCreated`], [`StoreError::CorruptNamespace`],
    /// [`StoreError::NamespaceRolledBack`], [`StoreError::LayoutMismatch`],
    /// [`StoreError::NamespaceFloorAhead`], or the etcd failure.
    pub async fn guard_namespace(&mut self) -> Result<Millis, StoreError> {
        let timeout = self.settings.request_timeout;
        let unix_ms = self.clock.unix_ms();
        let ns = self.settings.namespace.clone();
        let (record, _) = match guard(&self.endpoints, timeout, &ns, unix_ms).await {
            Err(StoreError::UnknownNamespace { namespace }) => {
                return Err(StoreError::NamespaceNotCreated {
                    namespace,
                    endpoints: self.endpoint_list(),
                })
            }
            other => other?,
        };
        if record.layout != self.layout {
            return Err(StoreError::LayoutMismatch {
                namespace: ns,
                stored: record.layout,
                configured: self.layout,
            });
        }
        let now = self.layout_ms(unix_ms);
        let max_wait = self.settings.max_fence_wait;
        let ahead = Duration::from_millis(record.floor.get().saturating_sub(now.get()));
        if ahead > max_wait {
            return Err(StoreError::NamespaceFloorAhead {
                namespace: ns,
                until: rfc3339(self.layout.to_unix_ms(record.floor)),
                ahead,
                max: max_wait,
            });
        }
        Ok(record.floor)
    }
}

/// The namespace as a claim sees it: the floor, and the compare that keeps
/// the claim from committing once the record changed (a rollback marked, a
/// floor confirmed). Read once per round of candidates.
pub(super) struct ClaimGuard {
    /// The confirmed floor, layout ms.
    pub floor: Millis,
    /// The record's key.
    pub key: String,
    /// The record's mod revision when read.
    pub mod_revision: i64,
}

impl ClaimGuard {
    /// Reads the record for a claim: [`StoreError::UnknownNamespace`] when
    /// absent, [`StoreError::NamespaceRolledBack`] when rolled back.
    pub(super) async fn read(
        endpoints: &Endpoints,
        timeout: Duration,
        namespace: &str,
    ) -> Result<Self, StoreError> {
        let Some((record, mod_revision)) = read(endpoints, timeout, namespace).await? else {
            return Err(StoreError::UnknownNamespace {
                namespace: namespace.to_owned(),
            });
        };
        if let Some(refusal) = record.refusal(namespace) {
            return Err(refusal);
        }
        Ok(Self {
            floor: record.floor,
            key: keys::layout(namespace),
            mod_revision,
        })
    }

    /// Holds while the record is the one read.
    pub(super) fn compare(&self) -> Compare {
        Compare::mod_revision(self.key.clone(), CompareOp::Equal, self.mod_revision)
    }

    /// True when `resp` (a failed claim transaction whose `or_else` read the
    /// record as its operation number `at`) shows the record changed since it
    /// was read.
    pub(super) fn changed(&self, resp: &etcd_client::TxnResponse, at: usize) -> bool {
        match resp.op_responses().get(at) {
            Some(etcd_client::TxnOpResponse::Get(get)) => {
                get.kvs().first().map(|kv| kv.mod_revision()) != Some(self.mod_revision)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    const KEY: &str = "/snowkeep/v1/ns/orders/layout";

    fn progress(revision: i64, applied_index: u64) -> StoreProgress {
        StoreProgress {
            revision,
            applied_index,
        }
    }

    #[test]
    fn a_never_restored_store_is_not_rolled_back() {
        // Measured on etcd 3.4.23: a fresh member, after 30 puts, after 50.
        for (rev, index) in [(1, 4), (31, 36), (51, 56)] {
            assert_eq!(restored(progress(rev, index), 0), None);
        }
        // Right at the slack: still not.
        assert_eq!(restored(progress(20 + ROLLBACK_SLACK, 20), 0), None);
    }

    #[test]
    fn a_restored_store_is_rolled_back_by_more_than_the_slack() {
        // etcd 3.4.23 after `etcdctl snapshot restore` of a snapshot at revision 51.
        let reason = restored(progress(51, 4), 0).unwrap();
        assert_eq!(
            reason,
            "etcd revision 51 is 47 ahead of its raft applied index 4, more than the acknowledged gap 0 + slack 16: etcd was restored from an older snapshot"
        );
        assert!(restored(progress(21 + ROLLBACK_SLACK, 20), 0).is_some());
    }

    #[test]
    fn an_acknowledged_gap_is_not_detected_again_until_it_grows() {
        // Confirmed at gap 47; the gap only shrinks while the cluster runs.
        for (rev, index) in [(51, 4), (151, 104), (151, 150)] {
            assert_eq!(restored(progress(rev, index), 47), None);
        }
        // Restored again, further back than the slack beyond the accepted gap.
        assert!(restored(progress(47 + ROLLBACK_SLACK + 5, 4), 47).is_some());
        assert_eq!(restored(progress(47 + ROLLBACK_SLACK + 4, 4), 47), None);
        // A negative acknowledged gap (a healthy cluster's) is stricter.
        assert!(restored(progress(20, 4), -3).is_some());
    }

    #[test]
    fn a_record_round_trips_and_stays_readable() {
        let layout: Layout = "41/12/10@1767225600000".parse().unwrap();
        let mut record = NamespaceRecord {
            layout,
            incarnation: 0x6a1f_0c9e_2b7d_4c13,
            state: NamespaceState::Ok,
            acknowledged_gap: -3,
            floor: Millis(0),
            confirmed_at: None,
        };
        assert_eq!(
            record.encode(),
            "layout 41/12/10@1767225600000\nincarnation 6a1f0c9e2b7d4c13\nstate ok\nacknowledged_gap -3\nfloor_ms 0\n"
        );
        assert_eq!(
            NamespaceRecord::parse(KEY, record.encode().as_bytes()).unwrap(),
            record
        );
        record.state = NamespaceState::RolledBack {
            at: "2026-12-01T10:00:00Z".into(),
            reason: "etcd revision 51 is 47 ahead".into(),
        };
        record.floor = Millis(123);
        record.confirmed_at = Some("2026-11-30T00:00:00Z".into());
        assert_eq!(
            NamespaceRecord::parse(KEY, record.encode().as_bytes()).unwrap(),
            record
        );
        assert!(record.encode().contains("\nstate rolled-back\n"));
    }

    #[test]
    fn an_older_versions_plain_layout_reads_as_ok_without_incarnation() {
        let record = NamespaceRecord::parse(KEY, b"41/12/10@1767225600000").unwrap();
        assert_eq!(record.layout, Layout::default());
        assert_eq!(record.incarnation, 0);
        assert_eq!(record.state, NamespaceState::Ok);
        assert_eq!(record.acknowledged_gap, 0);
    }

    #[test]
    fn an_older_record_gets_an_incarnation_before_it_is_written() {
        let old = NamespaceRecord::parse(KEY, b"41/12/10@1767225600000").unwrap();
        let mut marked = old.clone().with_incarnation();
        assert_ne!(marked.incarnation, 0);
        marked.state = NamespaceState::RolledBack {
            at: "2026-12-01T10:00:00Z".into(),
            reason: "r".into(),
        };
        assert_eq!(
            NamespaceRecord::parse(KEY, marked.encode().as_bytes()).unwrap(),
            marked
        );
        // One that has an incarnation keeps it.
        assert_eq!(marked.clone().with_incarnation(), marked);
    }

    #[test]
    fn garbage_names_the_key_the_value_and_the_problem() {
        for (value, problem) in [
            (&b"not-a-layout"[..], "cannot parse layout \"not-a-layout\""),
            (b"layout 41/12/10\nstate ok\n", "no incarnation line"),
            (
                b"layout 41/12/10\nincarnation 00000000000000ff\nstate maybe\nacknowledged_gap 0\n",
                "state \"maybe\" is neither ok nor rolled-back",
            ),
            (b"\xff\xfe", "not UTF-8"),
        ] {
            let err = NamespaceRecord::parse(KEY, value).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, StoreError::CorruptNamespace { .. }), "{text}");
            assert!(text.contains(KEY), "{text}");
            assert!(text.contains(problem), "{text}");
        }
    }

    #[test]
    fn a_floor_is_a_lead_or_a_utc_time() {
        assert_eq!(
            "+48h1m".parse::<FloorSpec>().unwrap(),
            FloorSpec::After(Duration::from_secs(48 * 3600 + 60))
        );
        assert_eq!(
            "2026-12-03T10:00:00Z".parse::<FloorSpec>().unwrap(),
            FloorSpec::At(1_796_292_000_000)
        );
        assert_eq!(FloorSpec::After(Duration::from_secs(2)).resolve(1000), 3000);
        assert_eq!(FloorSpec::At(7).resolve(1000), 7);
        for bad in ["48h", "+soon", "2026-12-03", "yesterday"] {
            let err = bad.parse::<FloorSpec>().unwrap_err();
            assert!(err.contains("use +DURATION"), "{err}");
        }
    }

    #[test]
    fn a_floor_before_the_clock_or_beyond_any_fence_is_refused() {
        let now = 1_796_292_000_000;
        assert!(check_floor(FloorSpec::After(Duration::ZERO), now).is_ok());
        assert!(check_floor(FloorSpec::After(MAX_FLOOR_LEAD), now).is_ok());
        let past = check_floor(FloorSpec::At(now - 1000), now).unwrap_err();
        assert_eq!(
            past.to_string(),
            "--confirm-namespace-floor 2026-12-03T09:59:59Z cannot be used: it is before the clock (2026-12-03T10:00:00Z); the floor must lie after every timestamp any holder may have stamped: see docs/operations.md#choosing-the-floor"
        );
        let far = check_floor(
            FloorSpec::After(MAX_FLOOR_LEAD + Duration::from_secs(1)),
            now,
        )
        .unwrap_err()
        .to_string();
        assert!(far.contains("more than 31 days ahead"), "{far}");
    }
}
