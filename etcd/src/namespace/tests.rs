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
fn a_record_keeps_a_coarser_unit_and_a_shorter_layout() {
    let record = NamespaceRecord {
        floor: Millis(1_005),
        ..NamespaceRecord::new(Layout::js53(), 0)
    };
    let text = record.encode();
    assert!(
        text.starts_with("layout 39/6/8@1767225600000/10ms\nincarnation "),
        "{text}"
    );
    let read = NamespaceRecord::parse(KEY, text.as_bytes()).unwrap();
    assert_eq!(read.layout.time_unit_ms(), 10);
    assert_eq!(read.layout.total_bits(), 53);
    assert_eq!(read, record);
    // An unknown unit (a newer version's, say) is refused, not read as 1 ms.
    let newer = text.replace("/10ms", "/5ms");
    let err = NamespaceRecord::parse(KEY, newer.as_bytes()).unwrap_err();
    assert!(
        err.to_string()
            .contains("time unit \"5ms\" is not supported"),
        "{err}"
    );
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
