//! The checker: records every id from every source with the time it arrived,
//! every call's outcome per server slot, and every fence a holder persisted
//! in etcd (from a watch); then finds duplicates, order violations inside
//! batches and streams, ids stamped above their holder's fences, and how long
//! each server refused during each fault.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

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
}

#[derive(Default)]
struct Inner {
    sources: Vec<Source>,
    by_label: HashMap<String, u32>,
    batches: Vec<Batch>,
    /// (server slot, ms since start, served)
    outcomes: Vec<(usize, u64, bool)>,
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

    /// The index of the source `label` minting under `holder`.
    pub fn source(&self, label: &str, holder: &str) -> u32 {
        let mut inner = self.inner.lock().unwrap();
        if let Some(&i) = inner.by_label.get(label) {
            return i;
        }
        let i = inner.sources.len() as u32;
        inner.sources.push(Source {
            label: label.to_owned(),
            holder: holder.to_owned(),
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

    /// Records whether a call to server `slot` was served.
    pub fn outcome(&self, slot: usize, served: bool) {
        let at = self.now_ms();
        self.inner.lock().unwrap().outcomes.push((slot, at, served));
    }

    /// True when `slot` served a call at or after `since_ms`.
    pub fn served_since(&self, slot: usize, since_ms: u64) -> bool {
        let inner = self.inner.lock().unwrap();
        inner
            .outcomes
            .iter()
            .rev()
            .take_while(|o| o.1 >= since_ms)
            .any(|o| o.0 == slot && o.2)
    }

    /// True when `slot` refused a call at or after `since_ms`.
    pub fn refused_since(&self, slot: usize, since_ms: u64) -> bool {
        let inner = self.inner.lock().unwrap();
        inner
            .outcomes
            .iter()
            .rev()
            .take_while(|o| o.1 >= since_ms)
            .any(|o| o.0 == slot && !o.2)
    }

    /// True when `slot`'s latest call at or after `since_ms` was served.
    pub fn serving_since(&self, slot: usize, since_ms: u64) -> bool {
        let inner = self.inner.lock().unwrap();
        inner
            .outcomes
            .iter()
            .rev()
            .take_while(|o| o.1 >= since_ms)
            .find(|o| o.0 == slot)
            .is_some_and(|o| o.2)
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
                .filter(|o| o.0 == slot && o.1 >= window.start_ms && o.1 < window.end_ms)
                .map(|o| (o.1, o.2))
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

    Verdict {
        rows,
        sources: inner.sources.len(),
        samples,
    }
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
        let a = rec.source("a unary", "a");
        let e = rec.source("embedded", REQUESTER);
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
        let a = rec.source("a unary", "a");
        let b = rec.source("b unary", "b");
        push(&rec, a, 0, 10, vec![id(900, 1, 0)]);
        push(&rec, b, 1, 150, vec![id(900, 1, 0), id(900, 1, 1)]);
        let v = check(&rec, &[window("f", 100, 120, 200)], &layout(), 1);
        assert_eq!(v.rows[0].duplicates, 0);
        assert_eq!(v.rows[1].duplicates, 1);
    }

    #[test]
    fn a_stream_going_back_across_batches_is_an_order_violation() {
        let rec = recorder();
        let a = rec.source("a stream", "a");
        push(&rec, a, 7, 10, vec![id(900, 1, 0), id(900, 1, 2)]);
        push(&rec, a, 7, 20, vec![id(900, 1, 1)]);
        push(&rec, a, 8, 30, vec![id(900, 1, 3), id(900, 1, 3)]);
        let v = check(&rec, &[], &layout(), 1);
        assert_eq!(v.rows[0].order_violations, 2);
    }

    #[test]
    fn an_id_above_its_own_holders_fence_is_flagged_even_below_a_later_holders() {
        let rec = recorder();
        let a = rec.source("a unary", "a");
        let b = rec.source("b unary", "b");
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
        let a = rec.source("a unary", "a");
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
        let a = rec.source("a unary", "a");
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
                inner.outcomes.push((0, at, ok));
            }
        }
        let v = check(&rec, &[window("f", 95, 160, 300)], &layout(), 1);
        assert_eq!(v.rows[1].max_unavailable, Duration::from_millis(110));
        assert_eq!(v.rows[1].max_recovery, Some(Duration::from_millis(50)));
        // A slot that never serves again has no recovery.
        let v = check(&rec, &[window("f", 95, 160, 200)], &layout(), 1);
        assert_eq!(v.rows[1].max_recovery, None);
    }
}
