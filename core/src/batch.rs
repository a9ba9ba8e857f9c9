//! The size of a batch of ids: the bounds `NextIds` and `StreamIds` check
//! (`service::id`, `service::status`) and the ones a call's memory weight is
//! read under (`limits::weight`). This module imports nothing of the crate,
//! so both sides take the same numbers without importing each other.

/// Largest `count` of one `NextIds` call and largest stream `batch_size`.
pub const MAX_BATCH: u32 = 100_000;

/// Default ids per streamed message (`StreamIds.batch_size` 0).
pub const DEFAULT_STREAM_BATCH: u32 = 1000;
