//! The snowflake bit layout: `timestamp_bits + machine_bits + sequence_bits`
//! (32 to 63 bits in all), the epoch, and the time unit of the timestamp field
//! (1 ms, 10 ms, 100 ms or 1 s). Pure encode/decode, no IO.
//!
//! The default: 41 timestamp bits in ms since
//! 2026-01-01T00:00:00Z, 12 machine bits (4096 machine ids), 10 sequence bits
//! (1024 ids per ms per machine id). The JavaScript-safe preset [`JS53`]:
//! 53 bits, `39/6/8` in 10 ms ticks (64 machine ids, 256 ids per tick), so
//! every id is at most `2^53 - 1` and a JavaScript number holds it exactly.
//!
//! **Time inside the system stays in layout ms.** Fences, floors, lease
//! records and the generator's clock readings are ms since the epoch whatever
//! the unit; only the id's timestamp *field* counts ticks: [`Layout::encode`]
//! stores `ms / unit` and [`Layout::decode`] gives back the tick's first ms.
//! The generator stamps the tick's first ms ([`Layout::tick_start`]) and needs
//! it above the floor, so a successor whose floor is a predecessor's fence
//! starts in a later tick than any the predecessor could stamp: a fence in
//! ms never covers less time once rounded to ticks.

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

/// The supported time units of the timestamp field, in ms.
pub const TIME_UNITS_MS: [u64; 4] = [1, 10, 100, 1000];

/// The fewest bits an id may have in all.
pub const MIN_TOTAL_BITS: u8 = 32;

/// The most bits an id may have in all: the sign bit stays 0.
pub const MAX_TOTAL_BITS: u8 = 63;

/// The name of the JavaScript-safe preset: `--layout js53` is
/// `39/6/8@1767225600000/10ms`.
pub const JS53: &str = "js53";

/// Why a layout or a value under it is invalid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// The three bit counts do not sum to 32..=63 or one of them is zero.
    #[error("layout bits must each be positive and sum to 32..63 (63 for 64-bit signed ids, 53 for JavaScript-safe ids), got timestamp {timestamp_bits} + machine {machine_bits} + sequence {sequence_bits}")]
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
    /// A time unit other than 1 ms, 10 ms, 100 ms or 1 s.
    #[error("time unit {text:?} is not supported: use 1ms, 10ms, 100ms or 1s")]
    TimeUnit {
        /// The unit given.
        text: String,
    },
    /// A layout string could not be parsed.
    #[error("cannot parse layout {text:?}: {}; expected TIMESTAMP/MACHINE/SEQUENCE bits such as 41/12/10, optionally @EPOCH_UNIX_MS, optionally /UNIT (1ms, 10ms, 100ms, 1s), or the preset js53", parse_problem(field))]
    Parse {
        /// The text given.
        text: String,
        /// The part that did not parse: "timestamp bits", "machine bits",
        /// "sequence bits", "epoch" or "shape" (not three bit counts).
        field: &'static str,
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
    /// 1, 10, 100 or 1000 ms.
    time_unit_ms: u16,
}

impl Default for Layout {
    fn default() -> Self {
        Self {
            timestamp_bits: 41,
            machine_bits: 12,
            sequence_bits: 10,
            epoch_unix_ms: DEFAULT_EPOCH_UNIX_MS,
            time_unit_ms: 1,
        }
    }
}

impl Layout {
    /// Builds a layout in 1 ms units. Errors when a bit count is 0, the sum is
    /// not 32..=63, or `machine_bits > 16`.
    pub fn new(
        timestamp_bits: u8,
        machine_bits: u8,
        sequence_bits: u8,
        epoch_unix_ms: u64,
    ) -> Result<Self, LayoutError> {
        let sum = u16::from(timestamp_bits) + u16::from(machine_bits) + u16::from(sequence_bits);
        let total = u16::from(MIN_TOTAL_BITS)..=u16::from(MAX_TOTAL_BITS);
        if timestamp_bits == 0 || machine_bits == 0 || sequence_bits == 0 || !total.contains(&sum) {
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
            time_unit_ms: 1,
        })
    }

    /// The same layout with the timestamp field in `unit_ms` ticks. Errors
    /// ([`LayoutError::TimeUnit`]) unless `unit_ms` is one of
    /// [`TIME_UNITS_MS`].
    pub fn with_time_unit(self, unit_ms: u64) -> Result<Self, LayoutError> {
        if !TIME_UNITS_MS.contains(&unit_ms) {
            return Err(LayoutError::TimeUnit {
                text: format!("{unit_ms}ms"),
            });
        }
        Ok(Self {
            time_unit_ms: unit_ms as u16,
            ..self
        })
    }

    /// The same layout from another epoch (Unix ms).
    #[must_use]
    pub fn with_epoch(self, epoch_unix_ms: u64) -> Self {
        Self {
            epoch_unix_ms,
            ..self
        }
    }

    /// The JavaScript-safe preset ([`JS53`]): `39/6/8` bits in 10 ms ticks
    /// from the default epoch; ids stay at or below `2^53 - 1` for about 174
    /// years.
    pub fn js53() -> Self {
        Self {
            timestamp_bits: 39,
            machine_bits: 6,
            sequence_bits: 8,
            epoch_unix_ms: DEFAULT_EPOCH_UNIX_MS,
            time_unit_ms: 10,
        }
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
    /// Ids per tick (one time unit) per machine id: `2^sequence_bits`.
    pub fn sequences_per_tick(&self) -> u64 {
        1u64 << self.sequence_bits
    }
    /// Ids per second per machine id at most: `2^sequence_bits * 1000 / unit`
    /// (saturating: a layout of 55 or more sequence bits has more).
    pub fn ids_per_second(&self) -> u64 {
        self.sequences_per_tick().saturating_mul(1000) / self.time_unit_ms()
    }
    /// The last layout ms an id can carry: the last ms of tick
    /// `2^timestamp_bits - 1`, `2^timestamp_bits * unit - 1` (saturating).
    pub fn max_timestamp(&self) -> Millis {
        Millis((1u64 << self.timestamp_bits).saturating_mul(self.time_unit_ms()) - 1)
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
        u64::from(self.time_unit_ms)
    }
    /// The first ms of the tick `ts` (layout ms) falls in: `ts` rounded down
    /// to a multiple of the time unit. Every ms of a tick stamps the same
    /// timestamp field.
    pub fn tick_start(&self, ts: Millis) -> Millis {
        Millis(ts.0 - ts.0 % self.time_unit_ms())
    }
    /// The Unix time (ms) at which the timestamp field runs out: the first
    /// ms no id of this layout can carry, `epoch + max_timestamp + 1`.
    pub fn end_unix_ms(&self) -> u64 {
        self.to_unix_ms(self.max_timestamp()).saturating_add(1)
    }
    /// The floor (layout ms) above which every id this layout stamps is
    /// greater than `id`, whatever layout `id` came from: a holder stamps
    /// only ticks whose first ms is above its floor, so the floor is the last
    /// ms of the tick `id >> (machine_bits + sequence_bits)`, and the first
    /// tick stamped is the next one, whose smallest id is above `id`. `None`
    /// when that tick is past the layout's last: no id of this layout is
    /// greater than `id`. The migration floor of `--floor-after-id`.
    pub fn floor_above_id(&self, id: u64) -> Option<Millis> {
        let tick = id >> (self.machine_bits + self.sequence_bits);
        let next = tick.checked_add(1)?;
        if next >= 1u64 << self.timestamp_bits {
            return None;
        }
        Some(Millis(next.checked_mul(self.time_unit_ms())? - 1))
    }
    /// The first layout ms at which a holder whose floor is `floor` may
    /// stamp: the first ms of the tick after the floor's (`floor + 1` at
    /// 1 ms units), since a stamp is a tick's first ms and must be above the
    /// floor. Waits for a floor end here, not at `floor + 1`. Saturating.
    pub fn first_stamp_after(&self, floor: Millis) -> Millis {
        Millis(self.tick_start(floor).0.saturating_add(self.time_unit_ms()))
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

    /// Packs the three fields into an id: the timestamp field is the tick
    /// `ts / unit`. Callers guarantee that `ts <= max_timestamp()`,
    /// `machine_id` fits and `sequence < sequences_per_tick()` (checked in
    /// debug builds).
    pub fn encode(&self, ts: Millis, machine_id: MachineId, sequence: u64) -> u64 {
        debug_assert!(ts <= self.max_timestamp());
        debug_assert!(self.contains(machine_id));
        debug_assert!(sequence < self.sequences_per_tick());
        ((ts.0 / self.time_unit_ms()) << (self.machine_bits + self.sequence_bits))
            | (u64::from(machine_id.0) << self.sequence_bits)
            | sequence
    }

    /// Splits an id into its fields, the timestamp as its tick's first layout
    /// ms; `None` when the id is above [`Layout::max_id`] (for 63 bits: the
    /// sign bit is set).
    pub fn decode(&self, id: u64) -> Option<DecodedId> {
        if id > self.max_id() {
            return None;
        }
        let seq_mask = self.sequences_per_tick() - 1;
        let machine_mask = u64::from(self.machine_id_count() - 1);
        let tick = id >> (self.machine_bits + self.sequence_bits);
        Some(DecodedId {
            timestamp: Millis(tick * self.time_unit_ms()),
            machine_id: MachineId(((id >> self.sequence_bits) & machine_mask) as u16),
            sequence: id & seq_mask,
        })
    }
}

impl fmt::Display for Layout {
    /// Formats as `41/12/10@1767225600000` (timestamp/machine/sequence bits @
    /// epoch ms), followed by `/10ms`, `/100ms` or `/1s` for a coarser unit:
    /// the form [`FromStr`](std::str::FromStr) reads and namespace records keep.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}@{}",
            self.timestamp_bits, self.machine_bits, self.sequence_bits, self.epoch_unix_ms
        )?;
        match self.time_unit_ms {
            1 => Ok(()),
            1000 => write!(f, "/1s"),
            unit => write!(f, "/{unit}ms"),
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = LayoutError;

    /// Parses `T/M/S`, `T/M/S@EPOCH_UNIX_MS`, either followed by `/UNIT`
    /// (`1ms`, `10ms`, `100ms`, `1s`), or the preset name [`JS53`]. Without
    /// an epoch the default (2026-01-01T00:00:00Z) applies; without a unit,
    /// 1 ms (so every record written before units existed reads as before).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case(JS53) {
            return Ok(Layout::js53());
        }
        let err = |field| LayoutError::Parse {
            text: text.to_owned(),
            field,
        };
        let (head, tail) = match text.split_once('@') {
            Some((head, tail)) => (head, Some(tail)),
            None => (text, None),
        };
        let mut parts: Vec<&str> = head.split('/').collect();
        let (epoch, unit) = match tail {
            Some(tail) => {
                let (epoch, unit) = match tail.split_once('/') {
                    Some((epoch, unit)) => (epoch, Some(unit)),
                    None => (tail, None),
                };
                (epoch.trim().parse().map_err(|_| err("epoch"))?, unit)
            }
            None if parts.len() == 4 => (DEFAULT_EPOCH_UNIX_MS, parts.pop()),
            None => (DEFAULT_EPOCH_UNIX_MS, None),
        };
        let [t, m, s] = parts[..] else {
            return Err(err("shape"));
        };
        let bits = |part: &str, field| part.trim().parse::<u8>().map_err(|_| err(field));
        let layout = Layout::new(
            bits(t, "timestamp bits")?,
            bits(m, "machine bits")?,
            bits(s, "sequence bits")?,
            epoch,
        )?;
        match unit {
            None => Ok(layout),
            Some(unit) => layout.with_time_unit(parse_unit(unit)?),
        }
    }
}

/// What [`LayoutError::Parse`] says of the part that did not parse.
fn parse_problem(field: &str) -> String {
    match field {
        "shape" => "it is not three bit counts".to_owned(),
        field => format!("the {field} is not a number"),
    }
}

/// `1ms`, `10ms`, `100ms` or `1s` (also `1000ms`) in ms; anything else is
/// [`LayoutError::TimeUnit`].
fn parse_unit(text: &str) -> Result<u64, LayoutError> {
    let text = text.trim();
    let refuse = || LayoutError::TimeUnit {
        text: text.to_owned(),
    };
    let (number, scale) = match text.strip_suffix("ms") {
        Some(number) => (number, 1),
        None => (text.strip_suffix('s').ok_or_else(refuse)?, 1000),
    };
    let unit = number
        .parse::<u64>()
        .map_err(|_| refuse())?
        .checked_mul(scale);
    match unit {
        Some(unit) if TIME_UNITS_MS.contains(&unit) => Ok(unit),
        _ => Err(refuse()),
    }
}

impl From<&Layout> for snowkeep_proto::v1::Layout {
    fn from(layout: &Layout) -> Self {
        Self {
            timestamp_bits: u32::from(layout.timestamp_bits),
            machine_bits: u32::from(layout.machine_bits),
            sequence_bits: u32::from(layout.sequence_bits),
            epoch_unix_ms: layout.epoch_unix_ms,
            time_unit_ms: u32::from(layout.time_unit_ms),
        }
    }
}

impl TryFrom<&snowkeep_proto::v1::Layout> for Layout {
    type Error = LayoutError;

    /// Reads a layout a server sent, with the same checks as
    /// [`Layout::new`] and [`Layout::with_time_unit`]; a `time_unit_ms` of 0
    /// (a server from before time units) is 1 ms.
    fn try_from(l: &snowkeep_proto::v1::Layout) -> Result<Self, Self::Error> {
        let bits = |b: u32| u8::try_from(b).unwrap_or(u8::MAX);
        let layout = Layout::new(
            bits(l.timestamp_bits),
            bits(l.machine_bits),
            bits(l.sequence_bits),
            l.epoch_unix_ms,
        )?;
        layout.with_time_unit(u64::from(l.time_unit_ms.max(1)))
    }
}

/// The fields of an id under a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedId {
    /// Timestamp in layout ms: the first ms of the id's tick.
    pub timestamp: Millis,
    /// Machine id.
    pub machine_id: MachineId,
    /// Sequence within the tick.
    pub sequence: u64,
}

#[cfg(test)]
mod tests;
