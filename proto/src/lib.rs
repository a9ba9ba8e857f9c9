//! Generated protobuf and gRPC code for the `snowkeep.v1` package.
//!
//! Nothing here is hand-written beyond the module wiring: the `.proto` files
//! under `proto/snowkeep/v1/` are the source of truth.

/// `snowkeep.v1`: messages, clients (`*_client`) and servers (`*_server`).
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("snowkeep.v1");
}

/// The encoded `FileDescriptorSet` of `snowkeep.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("snowkeep_v1_descriptor");
