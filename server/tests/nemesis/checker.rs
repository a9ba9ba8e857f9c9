//! The checker: records every id from every source with the time it arrived,
//! every call's outcome per server slot (with the code and message of each
//! refusal), and every fence a holder persisted in etcd (from a watch); then
//! finds duplicates, order violations inside batches and streams, ids stamped
//! above their holder's fences, how long each server refused during each
//! fault, and whether each server issued through an etcd outage or stopped at
//! its fence as the outage budget says.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;

use snowkeep_client::Layout;

/// The holder value of every embedded requester, as the checker files it.
pub const REQUESTER: &str = "requester";

/// One response: a unary batch, or one message of a stream.
pub struct Batch {
    /// Index into the recorder's sources.
    pub source: u32,
    /// Which call (unary) or stream the batch belongs to; unique per run.
    pub unit: u64,
    /// Milliseconds since the run began.
    pub at_ms: u64,
    pub ids: Vec<u64>,
}

struct Source {
    label: String,
    /// The holder value in etcd this source's ids are minted under: a
    /// server's instance id, or [`REQUESTER`].
    holder: String,
    /// The server slot whose clients this source is (`None`: the embedded
    /// generator, or a server outside the slots).
    slot: Option<usize>,
}

/// Why a call to a server slot was not served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub message: String,
}

impl Refusal {
    /// The message of a server whose clock reached its persisted fence.
    pub const FENCE_REACHED: &'static str = "clock reached the persisted fence";

    /// The refusal recorded while a slot has no process to call.
    pub fn no_process() -> Self {
        Self {
            code: Code::Unavailable,
            message: "no server process in the slot".to_owned(),
        }
    }

    /// True for the server's refusal at its fence: `UNAVAILABLE`, "clock
    /// reached the persisted fence".
    pub fn is_fence_reached(&self) -> bool {
        self.code == Code::Unavailable && self.message.contains(Self::FENCE_REACHED)
    }
}

/// One call to a server slot.
struct Outcome {
    slot: usize,
    /// Milliseconds since the run began, when the answer arrived.
    at_ms: u64,
    /// `None` when served.
    refusal: Option<Refusal>,
}

#[derive(Default)]
struct Inner {
    sources: Vec<Source>,
    by_label: HashMap<String, u32>,
    batches: Vec<Batch>,
    outcomes: Vec<Outcome>,
}

/// Fences persisted per (machine id, holder), from the etcd watch.
#[derive(Default)]
pub struct FenceLog {
    holder_now: HashMap<u16, String>,
    /// Highest fence each holder persisted for each machine id, layout ms.
    fences: HashMap<(u16, String), u64>,
    /// Highest etcd revision applied.
    pub revision: i64,
    pub events: u64,
}

impl FenceLog {
    /// Applies a put of `key` (relative to the namespace prefix) at `revision`.
    pub fn put(&mut self, key: &str, value: &str, revision: i64) {
        self.revision = self.revision.max(revision);
        self.events += 1;
        let Some((kind, id)) = key.split_once('/') else {
            return;
        };
        let Ok(machine_id) = id.parse::<u16>() else {
            return;
        };
        match kind {
            "holder" => {
                let holder = if value.starts_with("requester/") {
                    REQUESTER.to_owned()
                } else {
                    value.to_owned()
                };
                self.holder_now.insert(machine_id, holder);
            }
            "fence" => {
                let (Some(holder), Ok(fence)) =
                    (self.holder_now.get(&machine_id), value.parse::<u64>())
                else {
                    return;
                };
                let e = self.fences.entry((machine_id, holder.clone())).or_default();
                *e = (*e).max(fence);
            }
            _ => {}
        }
    }

    fn fence_of(&self, machine_id: u16, holder: &str) -> Option<u64> {
        self.fences.get(&(machine_id, holder.to_owned())).copied()
    }
}

/// Everything the run saw.
pub struct Recorder {
    start: Instant,
    units: AtomicU64,
    inner: Mutex<Inner>,
    pub fences: Mutex<FenceLog>,
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            units: AtomicU64::new(0),
            inner: Mutex::default(),
            fences: Mutex::default(),
        }
    }

    /// Milliseconds since the run began.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The index of the source `label` minting under `holder`, a client of
    /// server slot `slot` (if any).
    pub fn source(&self, label: &str, holder: &str, slot: Option<usize>) -> u32 {
        let mut inner = self.inner.lock().unwrap();
        if let Some(&i) = inner.by_label.get(label) {
            return i;
        }
        let i = inner.sources.len() as u32;
        inner.sources.push(Source {
            label: label.to_owned(),
            holder: holder.to_owned(),
            slot,
        });
        inner.by_label.insert(label.to_owned(), i);
        i
    }

    /// A fresh call or stream number.
    pub fn unit(&self) -> u64 {
        self.units.fetch_add(1, Ordering::Relaxed)
    }

    pub fn batch(&self, source: u32, unit: u64, ids: Vec<u64>) {
        let at_ms = self.now_ms();
        self.inner.lock().unwrap().batches.push(Batch {
            source,
            unit,
            at_ms,
            ids,
        });
    }

    /// Records a call to server `slot` that was served.
    pub fn served(&self, slot: usize) {
        self.push_outcome(slot, None);
    }

    /// Records a call to server `slot` that was refused (or failed).
    pub fn refused(&self, slot: usize, refusal: Refusal) {
        self.push_outcome(slot, Some(refusal));
    }

    fn push_outcome(&self, slot: usize, refusal: Option<Refusal>) {
        let at_ms = self.now_ms();
        self.inner.lock().unwrap().outcomes.push(Outcome {
            slot,
            at_ms,
            refusal,
        });
    }

    /// Whether each of `slot`'s calls at or after `since_ms` was served,
    /// latest first.
    fn served_flags(&self, slot: usize, since_ms: u64) -> Vec<bool> {
        let inner = self.inner.lock().unwrap();
        inner
            .outcomes
            .iter()
            .rev()
            .take_while(|o| o.at_ms >= since_ms)
            .filter(|o| o.slot == slot)
            .map(|o| o.refusal.is_none())
            .collect()
    }

    /// True when `slot` served a call at or after `since_ms`.
    pub fn served_since(&self, slot: usize, since_ms: u64) -> bool {
        self.served_flags(slot, since_ms).contains(&true)
    }

    /// True when `slot` refused a call at or after `since_ms`.
    pub fn refused_since(&self, slot: usize, since_ms: u64) -> bool {
        self.served_flags(slot, since_ms).contains(&false)
    }

    /// True when `slot`'s latest call at or after `since_ms` was served.
    pub fn serving_since(&self, slot: usize, since_ms: u64) -> bool {
        self.served_flags(slot, since_ms).first() == Some(&true)
    }

    /// Ids recorded so far.
    pub fn id_count(&self) -> u64 {
        let inner = self.inner.lock().unwrap();
        inner.batches.iter().map(|b| b.ids.len() as u64).sum()
    }
}

/// One fault as it ran.
pub struct FaultWindow {
    pub name: String,
    pub start_ms: u64,
    /// Per server slot: when the heal step that concerns it ended.
    pub heal_ms: Vec<u64>,
    pub end_ms: u64,
    /// A paused server that must mint nothing under its old machine id after
    /// it resumes.
    pub zombie: Option<Zombie>,
    /// An etcd outage every slot rode out without a restart.
    pub outage: Option<Outage>,
}

/// An etcd outage, and what every server slot must have done through it.
#[derive(Clone, Debug)]
pub struct Outage {
    /// Run ms once the outage was in place.
    pub start_ms: u64,
    /// Run ms just before the heal began.
    pub heal_ms: u64,
    pub expect: Expect,
}

/// What the outage budget promises for an outage.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// An outage inside the budget: every slot serves every call from the
    /// start to the heal, with ids from its clients in every whole
    /// [`BUCKET`].
    IssueThrough,
    /// An outage past the farthest fence: every slot issues (ids in every
    /// whole [`BUCKET`]) until at least `not_before` after the start, then
    /// refuses every call with `UNAVAILABLE` "clock reached the persisted
    /// fence" from no later than `by` after the start until the heal, and no
    /// id from its clients arrives from `by` on.
    StopAtFence { not_before: Duration, by: Duration },
}

/// The span ids are counted in during an outage: every one must have some.
pub const BUCKET: Duration = Duration::from_secs(5);

/// What one server slot did during an outage, from its start to the heal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotOutage {
    /// Calls served.
    pub served: u64,
    /// Calls refused, and of those the refusals at the fence.
    pub refused: u64,
    pub fence_refusals: u64,
    /// From the start to the first refused call, and to the last served one.
    pub first_refused: Option<Duration>,
    pub last_served: Option<Duration>,
    /// Calls served after the first refused one (a clean stop has none).
    pub served_after_refusal: u64,
    /// Ids from the slot's clients in each whole [`BUCKET`] from the start
    /// (to the heal, or to `not_before` for [`Expect::StopAtFence`]).
    pub ids_per_bucket: Vec<u64>,
    /// Ids from the slot's clients that arrived from `by` after the start to
    /// the heal ([`Expect::StopAtFence`]; 0 otherwise).
    pub ids_after_stop: u64,
    /// The first refusal that was not the fence's.
    pub other_refusal: Option<Refusal>,
}

impl SlotOutage {
    /// What `slot` did that `expect` rules out, one line each.
    fn problems(&self, slot: usize, expect: Expect) -> Vec<String> {
        let mut out = Vec::new();
        let ms = |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{d:?}"));
        let empty: Vec<usize> = (0..self.ids_per_bucket.len())
            .filter(|&i| self.ids_per_bucket[i] == 0)
            .collect();
        if let Some(&first) = empty.first() {
            out.push(format!(
                "slot {slot}: no id in {} of {} whole {BUCKET:?} spans, the first from {:?} into the outage",
                empty.len(),
                self.ids_per_bucket.len(),
                BUCKET * first as u32
            ));
        }
        match expect {
            Expect::IssueThrough => {
                if self.refused > 0 {
                    out.push(format!(
                        "slot {slot}: {} calls refused inside the budget (first {} into the outage; {} at the fence; other: {:?})",
                        self.refused,
                        ms(self.first_refused),
                        self.fence_refusals,
                        self.other_refusal
                    ));
                }
            }
            Expect::StopAtFence { not_before, by } => {
                match self.first_refused {
                    None => out.push(format!("slot {slot}: never stopped")),
                    Some(at) if at < not_before || at > by => out.push(format!(
                        "slot {slot}: stopped {at:?} into the outage, outside {not_before:?}..={by:?}"
                    )),
                    Some(_) => {}
                }
                if self.refused != self.fence_refusals {
                    out.push(format!(
                        "slot {slot}: {} of {} refusals not at the fence, e.g. {:?}",
                        self.refused - self.fence_refusals,
                        self.refused,
                        self.other_refusal
                    ));
                }
                if self.served_after_refusal > 0 {
                    out.push(format!(
                        "slot {slot}: {} calls served after it stopped (last {} into the outage)",
                        self.served_after_refusal,
                        ms(self.last_served)
                    ));
                }
                if self.ids_after_stop > 0 {
                    out.push(format!(
                        "slot {slot}: {} ids arrived more than {by:?} into the outage",
                        self.ids_after_stop
                    ));
                }
            }
        }
        out
    }
}

pub struct Zombie {
    pub holder: String,
    pub machine_id: u16,
    /// Layout ms when it was stopped: it cannot mint a later timestamp before
    /// it resumes.
    pub stopped_at: u64,
    /// Run ms when the replacement began to release the machine id; ids
    /// arriving later are not a zombie's.
    pub until_ms: u64,
}

/// One row of the results table.
pub struct Row {
    pub fault: String,
    pub ids: u64,
    pub duplicates: u64,
    pub order_violations: u64,
    pub fence_violations: u64,
    pub zombie_ids: u64,
    /// Longest time from a slot's first refused call to its next served call
    /// after the last refused one.
    pub max_unavailable: Duration,
    /// Longest time from a heal to the slot's next served call; `None` when a
    /// slot never served again inside the window.
    pub max_recovery: Option<Duration>,
    /// Per server slot, what it did through the fault's etcd outage (empty
    /// for other faults).
    pub outage: Vec<SlotOutage>,
    /// What the slots did that the outage budget rules out (must be empty).
    pub outage_problems: Vec<String>,
}

/// The whole verdict.
pub struct Verdict {
    pub rows: Vec<Row>,
    pub sources: usize,
    pub samples: Vec<String>,
}

impl Verdict {
    pub fn total(&self, f: impl Fn(&Row) -> u64) -> u64 {
        self.rows.iter().map(f).sum()
    }

    /// The results as Markdown: one row per fault kind (runs summed, worst
    /// figures kept), then one row per run.
    pub fn table(&self) -> String {
        let mut kinds: Vec<(String, Vec<&Row>)> = Vec::new();
        for r in &self.rows {
            match kinds.iter_mut().find(|(k, _)| *k == r.fault) {
                Some((_, rows)) => rows.push(r),
                None => kinds.push((r.fault.clone(), vec![r])),
            }
        }
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        let mut out = String::from(
            "| fault | runs | ids checked | duplicates | order violations | above fence | zombie ids | max unavailability | max recovery after heal |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for (kind, rows) in &kinds {
            let sum = |f: fn(&Row) -> u64| rows.iter().map(|r| f(r)).sum::<u64>();
            let unavailable = rows
                .iter()
                .map(|r| r.max_unavailable)
                .max()
                .unwrap_or_default();
            let recovery = rows
                .iter()
                .map(|r| r.max_recovery)
                .try_fold(Duration::ZERO, |m, r| r.map(|r| m.max(r)));
            out.push_str(&format!(
                "| {kind} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                rows.len(),
                sum(|r| r.ids),
                sum(|r| r.duplicates),
                sum(|r| r.order_violations),
                sum(|r| r.fence_violations),
                sum(|r| r.zombie_ids),
                ms(unavailable),
                recovery.map_or("never".into(), ms),
            ));
        }
        out.push_str("\nEach run:\n\n");
        out.push_str(&self.runs_table());
        if self.rows.iter().any(|r| !r.outage.is_empty()) {
            out.push_str(
                "\nEach server slot through each etcd outage (times from the outage start):\n\n",
            );
            out.push_str(&self.outage_table());
        }
        out
    }

    /// One row per outage run and slot.
    fn outage_table(&self) -> String {
        let mut out = String::from(
            "| fault | slot | calls served | refused | at the fence | first refusal | last served | fewest ids per 5 s | ids after the stop |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let ms =
            |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{} ms", d.as_millis()));
        for r in &self.rows {
            for (slot, o) in r.outage.iter().enumerate() {
                out.push_str(&format!(
                    "| {} | {slot} | {} | {} | {} | {} | {} | {} | {} |\n",
                    r.fault,
                    o.served,
                    o.refused,
                    o.fence_refusals,
                    ms(o.first_refused),
                    ms(o.last_served),
                    o.ids_per_bucket
                        .iter()
                        .min()
                        .map_or("-".to_owned(), u64::to_string),
                    o.ids_after_stop,
                ));
            }
        }
        out
    }

    /// One row per run.
    fn runs_table(&self) -> String {
        let mut out = String::from(
            "| fault | ids checked | duplicates | order violations | above fence | zombie ids | max unavailability | max recovery after heal |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.fault,
                r.ids,
                r.duplicates,
                r.order_violations,
                r.fence_violations,
                r.zombie_ids,
                ms(r.max_unavailable),
                r.max_recovery.map_or("never".into(), ms),
            ));
        }
        out.push_str(&format!(
            "| **all** | {} | {} | {} | {} | {} | | |\n",
            self.total(|r| r.ids),
            self.total(|r| r.duplicates),
            self.total(|r| r.order_violations),
            self.total(|r| r.fence_violations),
            self.total(|r| r.zombie_ids),
        ));
        out
    }
}

/// Checks everything recorded against `windows` (in time order); ids before
/// the first fault form the row `steady`.
pub fn check(rec: &Recorder, windows: &[FaultWindow], layout: &Layout, slots: usize) -> Verdict {
    let inner = rec.inner.lock().unwrap();
    let fences = rec.fences.lock().unwrap();
    let mut rows: Vec<Row> = std::iter::once("steady (before the first fault)".to_owned())
        .chain(windows.iter().map(|w| w.name.clone()))
        .map(|fault| Row {
            fault,
            ids: 0,
            duplicates: 0,
            order_violations: 0,
            fence_violations: 0,
            zombie_ids: 0,
            max_unavailable: Duration::ZERO,
            max_recovery: Some(Duration::ZERO),
            outage: Vec::new(),
            outage_problems: Vec::new(),
        })
        .collect();
    let row_of = |at_ms: u64| windows.iter().take_while(|w| w.start_ms <= at_ms).count();
    let mut samples = Vec::new();
    let mut sample = |s: String| {
        if samples.len() < 20 {
            samples.push(s)
        }
    };

    // Order inside each batch and across the batches of one stream, and each
    // id against its holder's fences.
    let mut last_of_unit: HashMap<u64, u64> = HashMap::new();
    for b in &inner.batches {
        let row = row_of(b.at_ms);
        let src = &inner.sources[b.source as usize];
        rows[row].ids += b.ids.len() as u64;
        let mut prev = last_of_unit.get(&b.unit).copied();
        for &id in &b.ids {
            if prev.is_some_and(|p| id <= p) {
                rows[row].order_violations += 1;
                sample(format!(
                    "order: {id} after {} from {} at {} ms",
                    prev.unwrap_or(0),
                    src.label,
                    b.at_ms
                ));
            }
            prev = Some(id);
            let Some(d) = layout.decode(id) else {
                rows[row].fence_violations += 1;
                continue;
            };
            let (m, ts) = (d.machine_id.get(), d.timestamp.get());
            if fences.fence_of(m, &src.holder).is_none_or(|f| ts > f) {
                rows[row].fence_violations += 1;
                sample(format!(
                    "above fence: {id} (machine id {m}, ts {ts}) from {} whose fence is {:?}",
                    src.label,
                    fences.fence_of(m, &src.holder)
                ));
            }
        }
        if let Some(&last) = b.ids.last() {
            last_of_unit.insert(b.unit, last);
        }
    }

    // Duplicates: sort every id once, then find who minted the repeats.
    let mut all: Vec<u64> = inner
        .batches
        .iter()
        .flat_map(|b| b.ids.iter().copied())
        .collect();
    all.sort_unstable();
    let repeated: HashSet<u64> = all
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    drop(all);
    if !repeated.is_empty() {
        let mut seen: HashSet<u64> = HashSet::new();
        for b in &inner.batches {
            for id in b.ids.iter().filter(|id| repeated.contains(id)) {
                if !seen.insert(*id) {
                    let row = row_of(b.at_ms);
                    rows[row].duplicates += 1;
                    sample(format!(
                        "duplicate: {id} again from {} at {} ms",
                        inner.sources[b.source as usize].label, b.at_ms
                    ));
                }
            }
        }
    }

    // Zombies: nothing stamped after the pause under the old machine id.
    for (w, window) in windows.iter().enumerate() {
        let Some(z) = &window.zombie else { continue };
        for b in inner.batches.iter().filter(|b| {
            inner.sources[b.source as usize].holder == z.holder
                && (window.start_ms..z.until_ms).contains(&b.at_ms)
        }) {
            for &id in &b.ids {
                let Some(d) = layout.decode(id) else { continue };
                if d.machine_id.get() == z.machine_id && d.timestamp.get() > z.stopped_at {
                    rows[w + 1].zombie_ids += 1;
                    sample(format!(
                        "zombie: {id} (ts {}, stopped at {}) from {} at {} ms",
                        d.timestamp.get(),
                        z.stopped_at,
                        inner.sources[b.source as usize].label,
                        b.at_ms
                    ));
                }
            }
        }
    }

    // Refusals and recovery per slot and window.
    for (w, window) in windows.iter().enumerate() {
        for slot in 0..slots {
            let outcomes: Vec<(u64, bool)> = inner
                .outcomes
                .iter()
                .filter(|o| o.slot == slot && o.at_ms >= window.start_ms && o.at_ms < window.end_ms)
                .map(|o| (o.at_ms, o.refusal.is_none()))
                .collect();
            let refused: Vec<u64> = outcomes.iter().filter(|o| !o.1).map(|o| o.0).collect();
            let (Some(&first), Some(&last)) = (refused.first(), refused.last()) else {
                continue;
            };
            let row = &mut rows[w + 1];
            let back = outcomes
                .iter()
                .find(|o| o.1 && o.0 > last)
                .map_or(last, |o| o.0);
            row.max_unavailable = row.max_unavailable.max(Duration::from_millis(back - first));
            let heal = window.heal_ms[slot];
            let served = outcomes.iter().find(|o| o.1 && o.0 >= heal.max(last));
            row.max_recovery = match (row.max_recovery, served) {
                (Some(r), Some(s)) => Some(r.max(Duration::from_millis(s.0.saturating_sub(heal)))),
                _ => None,
            };
        }
    }

    // What each slot did through an etcd outage.
    for (w, window) in windows.iter().enumerate() {
        let Some(outage) = &window.outage else {
            continue;
        };
        for slot in 0..slots {
            let facts = outage_of(&inner, outage, slot);
            rows[w + 1]
                .outage_problems
                .extend(facts.problems(slot, outage.expect));
            rows[w + 1].outage.push(facts);
        }
    }

    Verdict {
        rows,
        sources: inner.sources.len(),
        samples,
    }
}

/// What `slot` did from `outage`'s start to its heal.
fn outage_of(inner: &Inner, outage: &Outage, slot: usize) -> SlotOutage {
    let (start, heal) = (outage.start_ms, outage.heal_ms);
    let since = |at: u64| Duration::from_millis(at - start);
    let mut facts = SlotOutage::default();
    for o in inner
        .outcomes
        .iter()
        .filter(|o| o.slot == slot && (start..heal).contains(&o.at_ms))
    {
        match &o.refusal {
            None => {
                facts.served += 1;
                facts.last_served = Some(since(o.at_ms));
                if facts.first_refused.is_some() {
                    facts.served_after_refusal += 1;
                }
            }
            Some(r) => {
                facts.refused += 1;
                facts.first_refused.get_or_insert(since(o.at_ms));
                if r.is_fence_reached() {
                    facts.fence_refusals += 1;
                } else if facts.other_refusal.is_none() {
                    facts.other_refusal = Some(r.clone());
                }
            }
        }
    }
    let (issuing, stop) = match outage.expect {
        Expect::IssueThrough => (heal - start, None),
        Expect::StopAtFence { not_before, by } => (
            (heal - start).min(not_before.as_millis() as u64),
            Some(start + by.as_millis() as u64),
        ),
    };
    let bucket = BUCKET.as_millis() as u64;
    facts.ids_per_bucket = vec![0; (issuing / bucket) as usize];
    for b in inner
        .batches
        .iter()
        .filter(|b| inner.sources[b.source as usize].slot == Some(slot))
        .filter(|b| (start..heal).contains(&b.at_ms))
    {
        let n = b.ids.len() as u64;
        if let Some(c) = facts
            .ids_per_bucket
            .get_mut(((b.at_ms - start) / bucket) as usize)
        {
            *c += n;
        }
        if stop.is_some_and(|stop| b.at_ms >= stop) {
            facts.ids_after_stop += n;
        }
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;
    use snowkeep_client::{MachineId, Millis};

    fn layout() -> Layout {
        "41/12/10@1767225600000".parse().unwrap()
    }

    fn id(ts: u64, m: u16, seq: u64) -> u64 {
        layout().encode(Millis(ts), MachineId(m), seq)
    }

    /// A recorder with fences 1000 for machine id 1 under `a` and 5000 for
    /// machine id 1 under `b` (b took machine id 1 over from a).
    fn recorder() -> Recorder {
        let rec = Recorder::new();
        let mut f = rec.fences.lock().unwrap();
        f.put("holder/00001", "a", 2);
        f.put("fence/00001", "1000", 3);
        f.put("holder/00001", "b", 4);
        f.put("fence/00001", "5000", 5);
        f.put("holder/00002", "requester/host:1:x", 6);
        f.put("fence/00002", "9000", 7);
        drop(f);
        rec
    }

    fn window(name: &str, start_ms: u64, heal_ms: u64, end_ms: u64) -> FaultWindow {
        FaultWindow {
            name: name.into(),
            start_ms,
            heal_ms: vec![heal_ms],
            end_ms,
            zombie: None,
            outage: None,
        }
    }

    fn push(rec: &Recorder, source: u32, unit: u64, at_ms: u64, ids: Vec<u64>) {
        rec.inner.lock().unwrap().batches.push(Batch {
            source,
            unit,
            at_ms,
            ids,
        });
    }

    #[test]
    fn clean_ids_pass_and_are_counted_per_window() {
        let rec = recorder();
        let a = rec.source("a unary", "a", None);
        let e = rec.source("embedded", REQUESTER, None);
        push(&rec, a, 0, 10, vec![id(900, 1, 0), id(900, 1, 1)]);
        push(&rec, e, 1, 150, vec![id(8000, 2, 0)]);
        let v = check(&rec, &[window("f", 100, 120, 200)], &layout(), 1);
        assert_eq!(v.rows.iter().map(|r| r.ids).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(
            v.total(|r| r.duplicates + r.order_violations + r.fence_violations),
            0
        );
    }

    #[test]
    fn a_repeated_id_from_another_source_is_one_duplicate_in_its_window() {
        let rec = recorder();
        let a = rec.source("a unary", "a", None);
        let b = rec.source("b unary", "b", None);
        push(&rec, a, 0, 10, vec![id(900, 1, 0)]);
        push(&rec, b, 1, 150, vec![id(900, 1, 0), id(900, 1, 1)]);
        let v = check(&rec, &[window("f", 100, 120, 200)], &layout(), 1);
        assert_eq!(v.rows[0].duplicates, 0);
        assert_eq!(v.rows[1].duplicates, 1);
    }

    #[test]
    fn a_stream_going_back_across_batches_is_an_order_violation() {
        let rec = recorder();
        let a = rec.source("a stream", "a", None);
        push(&rec, a, 7, 10, vec![id(900, 1, 0), id(900, 1, 2)]);
        push(&rec, a, 7, 20, vec![id(900, 1, 1)]);
        push(&rec, a, 8, 30, vec![id(900, 1, 3), id(900, 1, 3)]);
        let v = check(&rec, &[], &layout(), 1);
        assert_eq!(v.rows[0].order_violations, 2);
    }

    #[test]
    fn an_id_above_its_own_holders_fence_is_flagged_even_below_a_later_holders() {
        let rec = recorder();
        let a = rec.source("a unary", "a", None);
        let b = rec.source("b unary", "b", None);
        // a's fence is 1000: 1001 is above it although b's fence is 5000.
        push(&rec, a, 0, 10, vec![id(1000, 1, 0), id(1001, 1, 0)]);
        push(&rec, b, 1, 10, vec![id(5000, 1, 0), id(5001, 1, 0)]);
        // No fence at all under a for machine id 2.
        push(&rec, a, 2, 10, vec![id(10, 2, 0)]);
        let v = check(&rec, &[], &layout(), 1);
        assert_eq!(v.rows[0].fence_violations, 3);
    }

    #[test]
    fn a_zombie_id_is_one_stamped_after_the_pause_under_the_old_machine_id() {
        let rec = recorder();
        let a = rec.source("a unary", "a", None);
        push(
            &rec,
            a,
            0,
            150,
            vec![id(700, 1, 0), id(800, 1, 0), id(801, 1, 0)],
        );
        // After the replacement let go (190 ms), the slot may hold it again.
        push(&rec, a, 1, 195, vec![id(900, 1, 0)]);
        let mut w = window("pause", 100, 120, 200);
        w.zombie = Some(Zombie {
            holder: "a".into(),
            machine_id: 1,
            stopped_at: 800,
            until_ms: 190,
        });
        let v = check(&rec, &[w], &layout(), 1);
        assert_eq!(v.rows[1].zombie_ids, 1);
    }

    #[test]
    fn the_table_sums_the_runs_of_each_fault_kind() {
        let rec = recorder();
        let a = rec.source("a unary", "a", None);
        push(&rec, a, 0, 150, vec![id(900, 1, 0)]);
        push(&rec, a, 1, 250, vec![id(900, 1, 1), id(900, 1, 2)]);
        let windows = [window("f", 100, 120, 200), window("f", 200, 220, 300)];
        let table = check(&rec, &windows, &layout(), 1).table();
        assert!(
            table.contains("| f | 2 | 3 | 0 | 0 | 0 | 0 | 0 ms | 0 ms |"),
            "{table}"
        );
        assert!(table.contains("Each run:"), "{table}");
    }

    #[test]
    fn unavailability_runs_to_the_next_served_call_and_recovery_from_the_heal() {
        let rec = recorder();
        {
            let mut inner = rec.inner.lock().unwrap();
            for (at, ok) in [
                (90, true),
                (100, false),
                (150, false),
                (180, false),
                (210, true),
            ] {
                inner.outcomes.push(Outcome {
                    slot: 0,
                    at_ms: at,
                    refusal: (!ok).then(Refusal::no_process),
                });
            }
        }
        let v = check(&rec, &[window("f", 95, 160, 300)], &layout(), 1);
        assert_eq!(v.rows[1].max_unavailable, Duration::from_millis(110));
        assert_eq!(v.rows[1].max_recovery, Some(Duration::from_millis(50)));
        // A slot that never serves again has no recovery.
        let v = check(&rec, &[window("f", 95, 160, 200)], &layout(), 1);
        assert_eq!(v.rows[1].max_recovery, None);
    }

    fn call(rec: &Recorder, slot: usize, at_ms: u64, refusal: Option<Refusal>) {
        rec.inner.lock().unwrap().outcomes.push(Outcome {
            slot,
            at_ms,
            refusal,
        });
    }

    fn fence_reached() -> Option<Refusal> {
        Some(Refusal {
            code: Code::Unavailable,
            message: "clock reached the persisted fence 90061 that has not been raised; retry shortly or on another snowkeep server".into(),
        })
    }

    /// A window whose etcd outage runs from 1,000 to `heal_ms` run ms.
    fn outage_window(heal_ms: u64, expect: Expect) -> FaultWindow {
        let mut w = window("outage", 900, heal_ms + 10, heal_ms + 1_000);
        w.heal_ms = vec![heal_ms + 10; 3];
        w.outage = Some(Outage {
            start_ms: 1_000,
            heal_ms,
            expect,
        });
        w
    }

    #[test]
    fn inside_the_budget_any_refusal_or_a_5_s_span_without_ids_is_a_problem() {
        let rec = recorder();
        let s0 = rec.source("s0 unary", "s0", Some(0));
        let s1 = rec.source("s1 stream", "s1", Some(1));
        // Slot 0 serves a call with 50 ids every second of the 10 s outage.
        for at in (1_000..11_000).step_by(1_000) {
            call(&rec, 0, at, None);
            push(&rec, s0, at, at, vec![id(900, 1, 0); 50]);
        }
        // Slot 1 serves until 6 s in, is refused once at its fence, and its
        // stream delivers nothing in the second 5 s.
        call(&rec, 1, 2_000, None);
        push(&rec, s1, 0, 2_000, vec![id(900, 2, 0); 500]);
        call(&rec, 1, 7_000, fence_reached());
        let v = check(
            &rec,
            &[outage_window(11_000, Expect::IssueThrough)],
            &layout(),
            2,
        );
        let o = &v.rows[1].outage;
        assert_eq!(o[0].ids_per_bucket, [250, 250]);
        assert_eq!((o[0].served, o[0].refused), (10, 0));
        assert_eq!(
            o[1],
            SlotOutage {
                served: 1,
                refused: 1,
                fence_refusals: 1,
                first_refused: Some(Duration::from_secs(6)),
                last_served: Some(Duration::from_secs(1)),
                served_after_refusal: 0,
                ids_per_bucket: vec![500, 0],
                ids_after_stop: 0,
                other_refusal: None,
            }
        );
        assert_eq!(
            v.rows[1].outage_problems.len(),
            2,
            "{:?}",
            v.rows[1].outage_problems
        );
        assert!(v.rows[1]
            .outage_problems
            .iter()
            .all(|p| p.starts_with("slot 1: ")));
        assert!(v
            .table()
            .contains("| outage | 1 | 1 | 1 | 1 | 6000 ms | 1000 ms | 0 | 0 |"));
    }

    #[test]
    fn past_the_budget_a_slot_must_stop_at_its_fence_in_time_and_stay_stopped() {
        let rec = recorder();
        let expect = Expect::StopAtFence {
            not_before: Duration::from_secs(6),
            by: Duration::from_secs(9),
        };
        let src: Vec<u32> = (0..3)
            .map(|s| rec.source(&format!("s{s} unary"), &format!("s{s}"), Some(s)))
            .collect();
        // Slot 0 issues until 7.5 s in, then is refused at its fence to the heal.
        // Slot 1 stops 4 s in (too early), times out once, serves once more
        // at 8 s and its ids arrive 10 s in. Slot 2 never stops.
        for at in (1_000..13_000).step_by(500) {
            let t = at - 1_000;
            call(&rec, 0, at, if t <= 7_500 { None } else { fence_reached() });
            if t <= 7_500 {
                push(&rec, src[0], at, at, vec![id(900, 1, 0); 50]);
            }
            call(&rec, 2, at, None);
            push(&rec, src[2], at, at, vec![id(900, 3, 0); 50]);
        }
        for (at, served) in [(2_000, true), (5_000, false), (8_000, false), (9_000, true)] {
            if served {
                call(&rec, 1, at, None);
                push(&rec, src[1], at, at, vec![id(900, 2, 0); 50]);
            } else {
                call(&rec, 1, at, fence_reached());
            }
        }
        call(
            &rec,
            1,
            10_000,
            Some(Refusal {
                code: Code::DeadlineExceeded,
                message: "Timeout expired".into(),
            }),
        );
        push(&rec, src[1], 99, 11_000, vec![id(900, 2, 1); 500]);
        let v = check(&rec, &[outage_window(13_000, expect)], &layout(), 3);
        let (o, problems) = (&v.rows[1].outage, &v.rows[1].outage_problems);
        assert_eq!(o[0].first_refused, Some(Duration::from_millis(8_000)));
        assert_eq!(o[0].last_served, Some(Duration::from_millis(7_500)));
        assert_eq!((o[0].refused, o[0].fence_refusals), (8, 8));
        assert_eq!(o[0].ids_per_bucket, [500]);
        assert_eq!(o[0].ids_after_stop, 0);
        assert_eq!(
            o[1],
            SlotOutage {
                served: 2,
                refused: 3,
                fence_refusals: 2,
                first_refused: Some(Duration::from_secs(4)),
                last_served: Some(Duration::from_secs(8)),
                served_after_refusal: 1,
                ids_per_bucket: vec![50],
                ids_after_stop: 500,
                other_refusal: Some(Refusal {
                    code: Code::DeadlineExceeded,
                    message: "Timeout expired".into(),
                }),
            }
        );
        assert_eq!((o[2].refused, o[2].ids_after_stop), (0, 300));
        // Slot 1: early, not at the fence, served after, ids after; slot 2:
        // never stopped, ids after.
        let of = |slot: &str| problems.iter().filter(|p| p.starts_with(slot)).count();
        assert_eq!(
            (of("slot 0:"), of("slot 1:"), of("slot 2:")),
            (0, 4, 2),
            "{problems:?}"
        );
    }
}
