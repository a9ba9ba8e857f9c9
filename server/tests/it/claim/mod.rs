//! Claiming machine ids through etcd and issuing under them: the claim lifecycle
//! and its faults, fences, pool reads, release, streams, ids as text and the scale claimer.

mod claim_lifecycle;
mod claims;
mod fence_counts;
mod issuance;
mod pool_reads;
mod release;
mod scale;
pub(crate) mod settings;
mod streams;
mod text_ids;
