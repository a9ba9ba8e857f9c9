//! The revision witness: the highest etcd revision this process has seen,
//! which lets it notice that etcd went back in time whatever the age of the
//! snapshot it was restored from.
//!
//! etcd's revision never decreases in a cluster that keeps its data:
//! compaction, defragmentation, member changes and restarts all keep it.
//! Only a restore from a snapshot (or a wipe) brings it back. So a
//! linearizable answer (a transaction, a read of the namespace record) whose
//! header revision is below the highest one seen before shows a restore,
//! even one of a snapshot taken a moment earlier, which the index rule
//! ([`super::namespace::restored`]) cannot see.
//!
//! Answers that need not be linearizable (Status, watch events, keepalives
//! served by a lagging member) are neither recorded nor compared.
//!
//! After an operator confirms a floor, etcd goes on from the restored
//! revision, below what this process saw before. So the witness starts over
//! when it sees the namespace `rolled-back` (an operator must confirm before
//! anything claims), and when the record carries a confirmation newer than
//! the one it remembers: the operator vouched for the state since.

use std::collections::HashMap;
use std::sync::Mutex;

/// What the witness remembers of one namespace.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// The highest header revision of a linearizable answer (0: none yet).
    highest: i64,
    /// The namespace record's `confirmed_at` when this started.
    confirmed_at: Option<String>,
    /// A restore seen on a key ([`RevisionWitness::key_went_back`]), for the
    /// next check to mark.
    pending: Option<String>,
}

/// The highest etcd revision this process saw (see the module docs). Shared
/// by every clone of one store's endpoints. Revisions are the cluster's, so
/// every answer raises every namespace's mark; a namespace starts over alone.
#[derive(Debug, Default)]
pub struct RevisionWitness {
    /// The highest revision of any answer.
    highest: Mutex<(i64, HashMap<String, Seen>)>,
}

/// What this process saw of `namespace`, starting at the highest revision
/// it saw of any namespace (`highest`) the first time.
fn seen_of<'a>(
    namespaces: &'a mut HashMap<String, Seen>,
    namespace: &str,
    highest: i64,
) -> &'a mut Seen {
    namespaces
        .entry(namespace.to_owned())
        .or_insert_with(|| Seen {
            highest,
            ..Seen::default()
        })
}

impl RevisionWitness {
    fn lock(&self) -> std::sync::MutexGuard<'_, (i64, HashMap<String, Seen>)> {
        // A poisoned lock only means a panic elsewhere; the values stay valid.
        self.highest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the header revision of a linearizable answer.
    pub fn saw(&self, revision: i64) {
        let mut guard = self.lock();
        let (highest, namespaces) = &mut *guard;
        *highest = (*highest).max(revision);
        for seen in namespaces.values_mut() {
            seen.highest = seen.highest.max(revision);
        }
    }

    /// The highest revision recorded for `namespace` (0: none yet). Take it
    /// before sending the read that [`RevisionWitness::check`] compares: an
    /// answer recorded while the read was on its way may be newer than it.
    pub fn highest(&self, namespace: &str) -> i64 {
        let guard = self.lock();
        guard.1.get(namespace).map_or(guard.0, |s| s.highest)
    }

    /// Starts `namespace` over at `revision`: it is rolled back, so nothing
    /// claims in it until an operator confirms a floor on the state as it is.
    pub fn start_over(&self, namespace: &str, revision: i64, confirmed_at: Option<&str>) {
        let seen = Seen {
            highest: revision,
            confirmed_at: confirmed_at.map(str::to_owned),
            pending: None,
        };
        self.lock().1.insert(namespace.to_owned(), seen);
    }

    /// Compares the header revision of a read of `namespace`'s record (whose
    /// `confirmed_at` is given) with `before`, the highest seen before the
    /// read was sent ([`RevisionWitness::highest`]): `Some(reason)` when etcd
    /// went back in time. Records `revision` otherwise.
    pub fn check(
        &self,
        namespace: &str,
        before: i64,
        revision: i64,
        confirmed_at: Option<&str>,
    ) -> Option<String> {
        let mut guard = self.lock();
        let (highest, namespaces) = &mut *guard;
        let seen = seen_of(namespaces, namespace, *highest);
        // RFC 3339 times in UTC with whole seconds sort as text.
        let confirmed_since = match (confirmed_at, seen.confirmed_at.as_deref()) {
            (Some(now), Some(before)) => now > before,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if confirmed_since {
            seen.highest = revision;
            seen.confirmed_at = confirmed_at.map(str::to_owned);
            seen.pending = None;
            return None;
        }
        if let Some(reason) = &seen.pending {
            return Some(reason.clone());
        }
        if revision < before {
            return Some(went_back(revision, before, "this server"));
        }
        seen.highest = seen.highest.max(revision);
        *highest = (*highest).max(revision);
        None
    }
}

impl RevisionWitness {
    /// Notes that a key of `namespace` this process wrote at revision
    /// `written` now shows an older mod revision `found`: etcd went back in
    /// time, even if its revision has climbed back above every revision this
    /// process saw (other writers since the restore). A key's mod revision
    /// never decreases in a cluster that keeps its data (a deleted key comes
    /// back at a new, higher revision). The next [`RevisionWitness::check`]
    /// of the namespace reports it, until the namespace starts over (found
    /// rolled back, or confirmed since).
    pub fn key_went_back(&self, namespace: &str, key: &str, found: i64, written: i64) {
        let mut guard = self.lock();
        let (highest, namespaces) = &mut *guard;
        let seen = seen_of(namespaces, namespace, *highest);
        seen.pending.get_or_insert_with(|| {
            format!(
                "the key {key} is at mod revision {found}, below revision {written} this server wrote it at: etcd was restored from an older snapshot"
            )
        });
    }
}

/// The reason written into the record when a revision `seen` by `witness`
/// is above etcd's current `revision`.
pub fn went_back(revision: i64, seen: i64, witness: &str) -> String {
    format!(
        "etcd revision {revision} is below revision {seen} {witness} saw before: etcd was restored from an older snapshot"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "orders";

    /// A check whose read was sent after every answer recorded so far.
    fn chk(w: &RevisionWitness, ns: &str, revision: i64, at: Option<&str>) -> Option<String> {
        w.check(ns, w.highest(ns), revision, at)
    }

    #[test]
    fn an_answer_recorded_while_the_read_was_on_its_way_is_no_restore() {
        let w = RevisionWitness::default();
        w.saw(10);
        let before = w.highest(NS);
        // A fence write commits (revision 11) while the read (revision 10)
        // is on its way back.
        w.saw(11);
        assert_eq!(w.check(NS, before, 10, None), None);
        assert_eq!(w.highest(NS), 11);
        assert!(w.check(NS, w.highest(NS), 10, None).is_some());
    }

    #[test]
    fn a_revision_below_one_seen_is_a_restore_and_is_not_recorded() {
        let w = RevisionWitness::default();
        assert_eq!(chk(&w, NS, 5, None), None);
        w.saw(41);
        assert_eq!(chk(&w, NS, 41, None), None);
        assert_eq!(
            chk(&w, NS, 7, None).as_deref(),
            Some("etcd revision 7 is below revision 41 this server saw before: etcd was restored from an older snapshot")
        );
        // Not recorded: the next look finds it again.
        assert_eq!(w.highest(NS), 41);
        assert!(chk(&w, NS, 8, None).is_some());
        // Lower answers never lower the mark; a namespace first looked at
        // now starts from the highest revision of any answer.
        w.saw(3);
        assert_eq!(w.highest(NS), 41);
        assert!(chk(&w, "billing", 8, None).is_some());
    }

    #[test]
    fn a_namespace_starts_over_alone_when_rolled_back_or_confirmed_since() {
        let w = RevisionWitness::default();
        w.saw(41);
        assert_eq!(chk(&w, "billing", 41, None), None);
        w.start_over(NS, 7, None);
        assert_eq!(chk(&w, NS, 8, None), None);
        // The other namespace still remembers 41.
        assert!(chk(&w, "billing", 8, None).is_some());
        w.saw(100);
        // An operator confirmed a floor since: adopt the state as it is.
        assert_eq!(chk(&w, NS, 9, Some("2026-12-01T10:00:00Z")), None);
        assert_eq!(w.highest(NS), 9);
        assert_eq!(w.highest("billing"), 100);
        w.saw(50);
        // The same confirmation, or an older one (a restore from before a
        // later confirmation), or none, is compared.
        assert!(chk(&w, NS, 20, Some("2026-12-01T10:00:00Z")).is_some());
        assert!(chk(&w, NS, 20, Some("2026-11-30T10:00:00Z")).is_some());
        assert!(chk(&w, NS, 20, None).is_some());
        assert_eq!(chk(&w, NS, 50, Some("2026-12-01T10:00:00Z")), None);
    }

    #[test]
    fn a_key_gone_back_is_a_restore_even_above_the_highest_revision() {
        let w = RevisionWitness::default();
        w.saw(41);
        assert_eq!(chk(&w, NS, 41, None), None);
        w.key_went_back(NS, "/k", 30, 40);
        let reason = chk(&w, NS, 90, None).expect("a restore");
        assert!(
            reason.contains("mod revision 30, below revision 40"),
            "{reason}"
        );
        assert!(chk(&w, NS, 91, None).is_some(), "until it starts over");
        assert_eq!(chk(&w, "billing", 91, None), None);
        w.start_over(NS, 92, None);
        assert_eq!(chk(&w, NS, 93, None), None);
        w.key_went_back(NS, "/k", 30, 40);
        assert_eq!(chk(&w, NS, 94, Some("2026-12-01T10:00:00Z")), None);
        assert_eq!(chk(&w, NS, 95, Some("2026-12-01T10:00:00Z")), None);
    }
}
