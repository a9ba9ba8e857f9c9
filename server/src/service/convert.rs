//! Conversions between protobuf messages and domain types: the only file that
//! knows both shapes.

use snowkeep_client::Layout;
use snowkeep_proto::v1 as pb;

/// A layout as its protobuf message.
pub fn layout_to_pb(layout: &Layout) -> pb::Layout {
    pb::Layout {
        timestamp_bits: u32::from(layout.timestamp_bits()),
        machine_bits: u32::from(layout.machine_bits()),
        sequence_bits: u32::from(layout.sequence_bits()),
        epoch_unix_ms: layout.epoch_unix_ms(),
    }
}
