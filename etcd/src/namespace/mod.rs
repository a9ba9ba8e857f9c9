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
//! record rolled-back itself, and `guard` first asks the revision witness
//! ([`super::witness`]), which sees a restore a running server lived through.

mod rollback;
mod setup;

use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

use snowkeep_client::{Layout, Millis};

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
            FloorSpec::After(d) => Millis(now_unix_ms).saturating_add(d).get(),
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
    } else if floor - now_unix_ms > Millis::of(MAX_FLOOR_LEAD).get() {
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
    /// A new namespace's floor (layout ms) above the largest id an earlier
    /// generator may have issued (`--floor-after-id`,
    /// [`Layout::floor_above_id`](snowkeep_client::Layout::floor_above_id)):
    /// written into the record at creation; an existing record with a lower
    /// floor is refused ([`StoreError::MigrationFloorNotSet`]).
    pub migration_floor: Option<Millis>,
}

pub(crate) use rollback::{guard, progress, read, ClaimGuard};
pub use setup::Confirmed;

#[cfg(test)]
mod tests;
