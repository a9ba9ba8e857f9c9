//! gRPC adapters only: each handler turns a request into a domain call and the
//! result into a response; errors become statuses in [`status`].

pub mod convert;
pub mod health;
pub mod id;
pub mod info;
pub mod status;

use std::sync::{Arc, OnceLock};

use snowkeep_proto::v1 as pb;
use tonic::service::Routes;
use tonic_health::server::HealthReporter;

use crate::config::Limits;
use crate::etcd::admin::StateStore;
use crate::etcd::requesters::RequesterLeases;
use crate::etcd::{CapacityReader, EtcdStore};
use status::ApiError;

/// What the API handlers need from the lease store, once it is connected.
#[derive(Clone)]
pub enum StoreAccess {
    /// The single-instance store: no etcd, so no Lease API.
    SingleInstance {
        /// The machine ids this server holds, `[start, end)`.
        machine_ids: std::ops::Range<u32>,
    },
    /// etcd: filled in as the server connects.
    Etcd(Arc<EtcdCells>),
}

/// The etcd handles of [`StoreAccess::Etcd`], each set once.
#[derive(Default)]
pub struct EtcdCells {
    /// Capacity and the Lease API: once the namespace opened.
    handles: OnceLock<(CapacityReader, RequesterLeases)>,
    /// The administration service: as soon as the clients exist.
    state: OnceLock<StateStore>,
}

impl StoreAccess {
    /// Access to an etcd store that is not connected yet.
    pub fn etcd() -> Self {
        StoreAccess::Etcd(Arc::default())
    }

    /// Records that the etcd clients of `s` exist (its namespace may not be
    /// open yet): the administration service can use them.
    pub fn clients_ready(&self, s: &EtcdStore) {
        if let StoreAccess::Etcd(cells) = self {
            let _ = cells.state.set(s.state_store());
        }
    }

    /// Records that the etcd store `s` is connected.
    pub fn connected(&self, s: &EtcdStore) {
        if let StoreAccess::Etcd(cells) = self {
            let _ = cells.state.set(s.state_store());
            let _ = cells
                .handles
                .set((s.capacity_reader(), RequesterLeases::new(s)));
        }
    }

    /// The etcd handles; `Ok(None)` on the single-instance store,
    /// [`ApiError::StoreNotConnected`] before etcd answered.
    pub fn etcd_handles(&self) -> Result<Option<(CapacityReader, RequesterLeases)>, ApiError> {
        match self {
            StoreAccess::SingleInstance { .. } => Ok(None),
            StoreAccess::Etcd(cells) => cells
                .handles
                .get()
                .cloned()
                .map(Some)
                .ok_or(ApiError::StoreNotConnected),
        }
    }

    /// The administration service's etcd handle; `Ok(None)` on the
    /// single-instance store, [`ApiError::StoreNotConnected`] before the
    /// etcd clients exist.
    pub(crate) fn state_store(&self) -> Result<Option<StateStore>, ApiError> {
        match self {
            StoreAccess::SingleInstance { .. } => Ok(None),
            StoreAccess::Etcd(cells) => cells
                .state
                .get()
                .cloned()
                .map(Some)
                .ok_or(ApiError::StoreNotConnected),
        }
    }
}

/// Builds the routes: IdService, InfoService, LeaseService, AdminService, grpc.health.v1 and server
/// reflection (v1 and v1alpha, so grpcurl 1.8 works too). Every service
/// decodes requests of at most `limits.max_recv_message_size` bytes and
/// encodes responses of at most `limits.max_send_message_size` bytes.
pub fn router(
    id: id::IdHandler,
    info: info::InfoHandler,
    lease: crate::lease_api::LeaseHandler,
    admin: crate::admin::AdminHandler,
    limits: &Limits,
) -> Result<(Routes, HealthReporter), tonic_reflection::server::Error> {
    let (recv, send) = (limits.max_recv_message_size, limits.max_send_message_size);
    let (reporter, health) = tonic_health::server::health_reporter();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(snowkeep_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(snowkeep_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let routes = Routes::new(
        pb::id_service_server::IdServiceServer::new(id)
            .max_decoding_message_size(recv)
            .max_encoding_message_size(send),
    )
    .add_service(
        pb::info_service_server::InfoServiceServer::new(info)
            .max_decoding_message_size(recv)
            .max_encoding_message_size(send),
    )
    .add_service(
        pb::lease_service_server::LeaseServiceServer::new(lease)
            .max_decoding_message_size(recv)
            .max_encoding_message_size(send),
    )
    .add_service(
        pb::admin_service_server::AdminServiceServer::new(admin)
            .max_decoding_message_size(recv)
            .max_encoding_message_size(send),
    )
    .add_service(
        health
            .max_decoding_message_size(recv)
            .max_encoding_message_size(send),
    )
    .add_service(
        reflection_v1
            .max_decoding_message_size(recv)
            .max_encoding_message_size(send),
    )
    .add_service(
        reflection_v1alpha
            .max_decoding_message_size(recv)
            .max_encoding_message_size(send),
    );
    Ok((routes, reporter))
}
