//! Conversions between protobuf messages and domain types that more than one
//! service uses; the Lease API's own are in `crate::lease_api::convert`.

use std::ops::Range;

use snowkeep_client::Layout;
use snowkeep_proto::v1 as pb;

/// A layout as its protobuf message.
pub fn layout_to_pb(layout: &Layout) -> pb::Layout {
    pb::Layout::from(layout)
}

/// A namespace range's capacity as its protobuf message.
pub fn capacity_to_pb(
    namespace: &str,
    c: snowkeep_core::claim::Capacity,
    range: Range<u32>,
) -> pb::Capacity {
    pb::Capacity {
        namespace: namespace.to_owned(),
        total: c.total,
        held: c.held,
        free: c.free(),
        range_start: range.start,
        range_end: range.end,
    }
}
