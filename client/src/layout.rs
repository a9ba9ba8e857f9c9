//! The snowflake bit layout: `timestamp_bits + machine_bits + sequence_bits = 63`,
//! the epoch, and the time unit (milliseconds). Pure encode/decode, no IO.
//!
//! The default: 41 timestamp bits in ms since
//! 2026-01-01T00:00:00Z, 12 machine bits (4096 machine ids), 10 sequence bits
//! (1024 ids per ms per machine id).

use std::fmt;
use std::time::Duration;

use thiserror::Error;

/// 2026-01-01T00:00:00Z in milliseconds since the Unix epoch: the default epoch.
pub const DEFAULT_EPOCH_UNIX_MS: u64 = 1_767_225_600_000;

/// A count of milliseconds: a timestamp in layout ms (ms since the layout's
/// epoch), or a span read from a [`Duration`] with [`Millis::of`]. The
/// arithmetic saturates: a `Duration` holds more ms than a `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Millis {
    /// Returns the raw millisecond count.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The whole milliseconds of `span`, rounded down, saturating at
    /// `u64::MAX` (about 584 million years).
    pub fn of(span: Duration) -> Millis {
        Millis(u64::try_from(span.as_millis()).unwrap_or(u64::MAX))
    }

    /// `self` moved `span` later, saturating at `u64::MAX`.
    #[must_use]
    pub fn saturating_add(self, span: Duration) -> Millis {
        Millis(self.0.saturating_add(Millis::of(span).0))
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A machine id: the `machine_bits` field of an id (docs/design.md, words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MachineId(pub u16);

impl MachineId {
    /// Returns the raw machine id.
    pub fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for MachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a layout or a value under it is invalid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// The three bit counts do not sum to 63 or one of them is zero.
    #[error("layout bits must each be positive and sum to 63, got timestamp {timestamp_bits} + machine {machine_bits} + sequence {sequence_bits}")]
    BadBits {
        /// Timestamp bits given.
        timestamp_bits: u8,
        /// Machine bits given.
        machine_bits: u8,
        /// Sequence bits given.
        sequence_bits: u8,
    },
    /// More than 16 machine bits: machine ids are `u16`.
    #[error("machine_bits is {machine_bits}, at most 16 are supported")]
    TooManyMachineBits {
        /// Machine bits given.
        machine_bits: u8,
    },
    /// A layout string could not be parsed.
    #[error("cannot parse layout {text:?}: expected TIMESTAMP/MACHINE/SEQUENCE bits such as 41/12/10, optionally followed by @EPOCH_UNIX_MS")]
    Parse {
        /// The text given.
        text: String,
    },
}

/// The bit layout of one namespace's ids. Construct with [`Layout::new`], which
/// validates; fields are private so an invalid layout cannot exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    timestamp_bits: u8,
    machine_bits: u8,
    sequence_bits: u8,
    epoch_unix_ms: u64,
}

impl Default for Layout {
    fn default() -> Self {
        Self {
            timestamp_bits: 41,
            machine_bits: 12,
            sequence_bits: 10,
            epoch_unix_ms: DEFAULT_EPOCH_UNIX_MS,
        }
    }
}

impl Layout {
    /// Builds a layout. Errors when a bit count is 0, the sum is not 63, or
    /// `machine_bits > 16`.
    pub fn new(
        timestamp_bits: u8,
        machine_bits: u8,
        sequence_bits: u8,
        epoch_unix_ms: u64,
    ) -> Result<Self, LayoutError> {
        let sum = u16::from(timestamp_bits) + u16::from(machine_bits) + u16::from(sequence_bits);
        if timestamp_bits == 0 || machine_bits == 0 || sequence_bits == 0 || sum != 63 {
            return Err(LayoutError::BadBits {
                timestamp_bits,
                machine_bits,
                sequence_bits,
            });
        }
        if machine_bits > 16 {
            return Err(LayoutError::TooManyMachineBits { machine_bits });
        }
        Ok(Self {
            timestamp_bits,
            machine_bits,
            sequence_bits,
            epoch_unix_ms,
        })
    }

    /// Bits of the timestamp field.
    pub fn timestamp_bits(&self) -> u8 {
        self.timestamp_bits
    }
    /// Bits of the machine id field.
    pub fn machine_bits(&self) -> u8 {
        self.machine_bits
    }
    /// Bits of the sequence field.
    pub fn sequence_bits(&self) -> u8 {
        self.sequence_bits
    }
    /// The epoch in ms since the Unix epoch.
    pub fn epoch_unix_ms(&self) -> u64 {
        self.epoch_unix_ms
    }
    /// Number of machine ids in a namespace of this layout: `2^machine_bits`.
    pub fn machine_id_count(&self) -> u32 {
        1u32 << self.machine_bits
    }
    /// Ids per millisecond per machine id: `2^sequence_bits`.
    pub fn sequences_per_ms(&self) -> u64 {
        1u64 << self.sequence_bits
    }
    /// The largest timestamp (layout ms) an id can carry: `2^timestamp_bits - 1`.
    pub fn max_timestamp(&self) -> Millis {
        Millis((1u64 << self.timestamp_bits) - 1)
    }
    /// Bits of the whole id: `timestamp_bits + machine_bits + sequence_bits`,
    /// 32 to 63. Ids are below `2^total_bits`.
    pub fn total_bits(&self) -> u8 {
        self.timestamp_bits + self.machine_bits + self.sequence_bits
    }
    /// The largest id the layout can express: `2^total_bits - 1`
    /// (`2^53 - 1` for a JavaScript-safe layout).
    pub fn max_id(&self) -> u64 {
        (1u64 << self.total_bits()) - 1
    }
    /// The time unit of the timestamp field, in ms: 1, 10, 100 or 1000.
    pub fn time_unit_ms(&self) -> u64 {
        1
    }
    /// The Unix time (ms) at which the timestamp field runs out: the first
    /// ms no id of this layout can carry, `epoch + max_timestamp + 1`.
    pub fn end_unix_ms(&self) -> u64 {
        self.to_unix_ms(self.max_timestamp()).saturating_add(1)
    }
    /// True when `machine_id` fits in `machine_bits`.
    pub fn contains(&self, machine_id: MachineId) -> bool {
        u32::from(machine_id.0) < self.machine_id_count()
    }

    /// Converts a Unix-epoch wall time (ms) into layout ms; `None` before the epoch.
    pub fn to_layout_ms(&self, unix_ms: u64) -> Option<Millis> {
        unix_ms.checked_sub(self.epoch_unix_ms).map(Millis)
    }

    /// Converts layout ms back to ms since the Unix epoch.
    pub fn to_unix_ms(&self, ts: Millis) -> u64 {
        self.epoch_unix_ms.saturating_add(ts.0)
    }

    /// Packs the three fields into an id. Callers guarantee that `ts <=
    /// max_timestamp()`, `machine_id` fits and `sequence < sequences_per_ms()`
    /// (checked in debug builds).
    pub fn encode(&self, ts: Millis, machine_id: MachineId, sequence: u64) -> u64 {
        debug_assert!(ts <= self.max_timestamp());
        debug_assert!(self.contains(machine_id));
        debug_assert!(sequence < self.sequences_per_ms());
        (ts.0 << (self.machine_bits + self.sequence_bits))
            | (u64::from(machine_id.0) << self.sequence_bits)
            | sequence
    }

    /// Splits an id into its fields; `None` when the top (sign) bit is set.
    pub fn decode(&self, id: u64) -> Option<DecodedId> {
        if id >> 63 != 0 {
            return None;
        }
        let seq_mask = self.sequences_per_ms() - 1;
        let machine_mask = u64::from(self.machine_id_count() - 1);
        Some(DecodedId {
            timestamp: Millis(id >> (self.machine_bits + self.sequence_bits)),
            machine_id: MachineId(((id >> self.sequence_bits) & machine_mask) as u16),
            sequence: id & seq_mask,
        })
    }
}

impl fmt::Display for Layout {
    /// Formats as `41/12/10@1767225600000` (timestamp/machine/sequence bits @ epoch ms).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}@{}",
            self.timestamp_bits, self.machine_bits, self.sequence_bits, self.epoch_unix_ms
        )
    }
}

impl std::str::FromStr for Layout {
    type Err = LayoutError;

    /// Parses `T/M/S` or `T/M/S@EPOCH_UNIX_MS`; without an epoch the default
    /// (2026-01-01T00:00:00Z) applies.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parse_err = || LayoutError::Parse {
            text: text.to_owned(),
        };
        let (bits, epoch) = match text.split_once('@') {
            Some((bits, epoch)) => (bits, epoch.trim().parse().map_err(|_| parse_err())?),
            None => (text, DEFAULT_EPOCH_UNIX_MS),
        };
        let parts: Vec<u8> = bits
            .split('/')
            .map(|p| p.trim().parse::<u8>())
            .collect::<Result<_, _>>()
            .map_err(|_| parse_err())?;
        match parts[..] {
            [t, m, s] => Layout::new(t, m, s, epoch),
            _ => Err(parse_err()),
        }
    }
}

/// The fields of an id under a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedId {
    /// Timestamp in layout ms.
    pub timestamp: Millis,
    /// Machine id.
    pub machine_id: MachineId,
    /// Sequence within the millisecond.
    pub sequence: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn default_layout_encodes_reference_values() {
        let layout = Layout::default();
        assert_eq!(layout.encode(Millis(1000), MachineId(5), 0), 4_194_309_120);
        assert_eq!(layout.encode(Millis(1000), MachineId(5), 5), 4_194_309_125);
        assert_eq!(layout.encode(Millis(1001), MachineId(0), 0), 4_198_498_304);
        assert_eq!(layout.machine_id_count(), 4096);
        assert_eq!(layout.sequences_per_ms(), 1024);
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
            "41/12/9".parse::<Layout>(),
            Err(LayoutError::BadBits { .. })
        ));
    }

    #[test]
    fn decode_rejects_sign_bit() {
        assert_eq!(Layout::default().decode(1 << 63), None);
    }

    proptest! {
        #[test]
        fn encode_decode_round_trips(t in 1u8..=61, m_raw in 1u8..=16, ts in any::<u64>(), mid in any::<u16>(), seq in any::<u64>()) {
            prop_assume!(u16::from(t) + u16::from(m_raw) < 63);
            let s = 63 - t - m_raw;
            let layout = Layout::new(t, m_raw, s, 0).unwrap();
            let ts = Millis(ts & layout.max_timestamp().0);
            let mid = MachineId((u32::from(mid) % layout.machine_id_count()) as u16);
            let seq = seq % layout.sequences_per_ms();
            let id = layout.encode(ts, mid, seq);
            prop_assert_eq!(id >> 63, 0);
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
}
