//! Layout unit tests: exact encodings, the grammar, the refusals.

use super::*;
use proptest::prelude::*;

#[test]
fn default_layout_encodes_reference_values() {
    let layout = Layout::default();
    assert_eq!(layout.encode(Millis(1000), MachineId(5), 0), 4_194_309_120);
    assert_eq!(layout.encode(Millis(1000), MachineId(5), 5), 4_194_309_125);
    assert_eq!(layout.encode(Millis(1001), MachineId(0), 0), 4_198_498_304);
    assert_eq!(layout.machine_id_count(), 4096);
    assert_eq!(layout.sequences_per_tick(), 1024);
    assert_eq!(layout.to_string(), "41/12/10@1767225600000");
}

#[test]
fn rejects_bits_not_summing_to_63_or_zero() {
    assert_eq!(
        Layout::new(41, 12, 11, 0),
        Err(LayoutError::BadBits {
            timestamp_bits: 41,
            machine_bits: 12,
            sequence_bits: 11
        })
    );
    assert!(matches!(
        Layout::new(63, 0, 0, 0),
        Err(LayoutError::BadBits { .. })
    ));
    assert_eq!(
        Layout::new(30, 17, 16, 0),
        Err(LayoutError::TooManyMachineBits { machine_bits: 17 })
    );
}

#[test]
fn parses_layout_strings() {
    assert_eq!("41/12/10".parse::<Layout>(), Ok(Layout::default()));
    assert_eq!("39/8/16@0".parse::<Layout>(), Layout::new(39, 8, 16, 0));
    assert!(matches!(
        "41/12".parse::<Layout>(),
        Err(LayoutError::Parse { .. })
    ));
    assert!(matches!(
        "41/12/11".parse::<Layout>(),
        Err(LayoutError::BadBits { .. })
    ));
}

#[test]
fn bits_may_sum_to_32_through_63() {
    assert_eq!(Layout::new(20, 6, 6, 0).unwrap().total_bits(), 32);
    assert_eq!(Layout::new(41, 12, 9, 0).unwrap().max_id(), (1 << 62) - 1);
    assert_eq!(
        Layout::new(20, 6, 5, 0),
        Err(LayoutError::BadBits {
            timestamp_bits: 20,
            machine_bits: 6,
            sequence_bits: 5
        })
    );
    assert_eq!(Layout::default().max_id(), i64::MAX as u64);
}

#[test]
fn the_js53_preset_is_53_bits_in_10ms_ticks() {
    let js = "js53".parse::<Layout>().unwrap();
    assert_eq!(js, Layout::js53());
    assert_eq!(js.to_string(), "39/6/8@1767225600000/10ms");
    assert_eq!(js.to_string().parse::<Layout>(), Ok(js));
    assert_eq!("39/6/8/10ms".parse::<Layout>(), Ok(js));
    assert_eq!((js.total_bits(), js.max_id()), (53, (1 << 53) - 1));
    assert_eq!((js.machine_id_count(), js.sequences_per_tick()), (64, 256));
    assert_eq!(js.ids_per_second(), 25_600);
    assert_eq!(js.time_unit_ms(), 10);
    assert_eq!(js.max_timestamp(), Millis((1 << 39) * 10 - 1));
    assert_eq!(js.end_unix_ms(), DEFAULT_EPOCH_UNIX_MS + (1 << 39) * 10);
    // 5,497,558,138,880 ms: 174 years of 365 days.
    let years = (js.end_unix_ms() - DEFAULT_EPOCH_UNIX_MS) / 1000 / 86_400 / 365;
    assert_eq!(years, 174);
}

#[test]
fn time_units_parse_print_and_encode_ticks() {
    let s = "41/12/10@0/1s".parse::<Layout>().unwrap();
    assert_eq!(
        (s.time_unit_ms(), s.to_string()),
        (1000, "41/12/10@0/1s".into())
    );
    assert_eq!("41/12/10@0/1000ms".parse::<Layout>(), Ok(s));
    let hundred = "41/12/10/100ms".parse::<Layout>().unwrap();
    assert_eq!(hundred.to_string(), "41/12/10@1767225600000/100ms");
    assert_eq!(
        "41/12/10@0/1ms".parse::<Layout>(),
        Layout::new(41, 12, 10, 0)
    );
    // An old record (no unit) reads as 1 ms.
    assert_eq!(
        "41/12/10@1767225600000"
            .parse::<Layout>()
            .unwrap()
            .time_unit_ms(),
        1
    );
    let js = Layout::js53();
    assert_eq!(js.encode(Millis(1_009), MachineId(5), 7), 1_639_687);
    assert_eq!(js.encode(Millis(1_000), MachineId(5), 7), 1_639_687);
    assert_eq!(js.tick_start(Millis(1_009)), Millis(1_000));
    assert_eq!(
        js.decode(1_639_687),
        Some(DecodedId {
            timestamp: Millis(1_000),
            machine_id: MachineId(5),
            sequence: 7
        })
    );
    assert_eq!(js.decode(1 << 53), None);
    assert!(js.decode((1 << 53) - 1).is_some());
}

#[test]
fn a_bad_layout_names_what_is_wrong() {
    let parse = |text: &str| text.parse::<Layout>().unwrap_err().to_string();
    for (text, unit) in [("41/12/10/5ms", "5ms"), ("41/12/10@0/10us", "10us")] {
        assert_eq!(
            parse(text),
            format!("time unit {unit:?} is not supported: use 1ms, 10ms, 100ms or 1s")
        );
    }
    assert!(parse("41/x/10").contains("the machine bits is not a number"));
    assert!(parse("x/12/10").contains("the timestamp bits is not a number"));
    assert!(parse("41/12/x").contains("the sequence bits is not a number"));
    assert!(parse("41/12/10@soon").contains("the epoch is not a number"));
    assert!(parse("41/12").contains("it is not three bit counts"));
    assert!(parse("js54").contains("it is not three bit counts"));
}

#[test]
fn a_floor_above_an_id_makes_every_later_id_greater() {
    let layout = Layout::default();
    // 4,194,309,125 is ms 1,000, machine id 5, sequence 5: the floor is ms
    // 1,000, so the first stamp is ms 1,001, whose smallest id is above it.
    assert_eq!(layout.floor_above_id(4_194_309_125), Some(Millis(1_000)));
    assert!(layout.encode(Millis(1_001), MachineId(0), 0) > 4_194_309_125);
    // In 10 ms ticks the floor is the tick's last ms.
    let js = Layout::js53();
    assert_eq!(js.floor_above_id(1_639_687), Some(Millis(1_009)));
    assert_eq!(js.tick_start(Millis(1_010)), Millis(1_010));
    assert!(js.encode(Millis(1_010), MachineId(0), 0) > 1_639_687);
    // An id in or past the last tick: nothing greater can be stamped.
    assert_eq!(js.floor_above_id(js.max_id()), None);
    assert_eq!(js.floor_above_id(u64::MAX), None);
    assert_eq!(layout.floor_above_id(i64::MAX as u64), None);
}

#[test]
fn decode_rejects_sign_bit() {
    assert_eq!(Layout::default().decode(1 << 63), None);
}

proptest! {
    #[test]
    fn encode_decode_round_trips(total in 32u8..=63, t_raw in 1u8..=61, m_raw in 1u8..=16, unit in 0usize..4, ts in any::<u64>(), mid in any::<u16>(), seq in any::<u64>()) {
        prop_assume!(u16::from(t_raw) + u16::from(m_raw) < u16::from(total));
        let s = total - t_raw - m_raw;
        let layout = Layout::new(t_raw, m_raw, s, 0).unwrap().with_time_unit(TIME_UNITS_MS[unit]).unwrap();
        let ts = layout.tick_start(Millis(ts % (layout.max_timestamp().0 + 1)));
        let mid = MachineId((u32::from(mid) % layout.machine_id_count()) as u16);
        let seq = seq % layout.sequences_per_tick();
        let id = layout.encode(ts, mid, seq);
        prop_assert!(id <= layout.max_id());
        prop_assert_eq!(layout.decode(id), Some(DecodedId { timestamp: ts, machine_id: mid, sequence: seq }));
    }
}

#[test]
fn millis_of_a_span_rounds_down_and_saturates() {
    use std::time::Duration;
    assert_eq!(Millis::of(Duration::from_micros(1_999)), Millis(1));
    assert_eq!(Millis::of(Duration::from_secs(3)), Millis(3_000));
    assert_eq!(Millis::of(Duration::MAX), Millis(u64::MAX));
    assert_eq!(
        Millis(10).saturating_add(Duration::from_millis(5)),
        Millis(15)
    );
    assert_eq!(
        Millis(u64::MAX - 1).saturating_add(Duration::from_millis(5)),
        Millis(u64::MAX)
    );
}

#[test]
fn a_clocks_layout_ms_count_from_the_epoch_and_are_0_before_it() {
    use crate::clock::{Clock, ManualClock};
    let layout = Layout::default();
    let clock = ManualClock::new(DEFAULT_EPOCH_UNIX_MS + 1_234);
    assert_eq!(clock.layout_ms(&layout), Millis(1_234));
    let before = ManualClock::new(DEFAULT_EPOCH_UNIX_MS - 1);
    assert_eq!(before.layout_ms(&layout), Millis(0));
}
