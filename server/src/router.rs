//! The gRPC routes: every service of the gRPC port (IdService, InfoService,
//! LeaseService, AdminService, health, reflection) under one message-size
//! bound. It sits above `crate::service`, `crate::lease_api` and
//! `crate::admin`, so those need not import each other for it.

use snowkeep_proto::v1 as pb;
use tonic::service::Routes;
use tonic_health::server::HealthReporter;

use crate::admin::AdminHandler;
use crate::lease_api::LeaseHandler;
use crate::limits::Limits;
use crate::service::id::IdHandler;
use crate::service::info::InfoHandler;

/// Builds the routes: IdService, InfoService, LeaseService, AdminService, grpc.health.v1 and server
/// reflection (v1 and v1alpha, so grpcurl 1.8 works too). Every service
/// decodes requests of at most `limits.max_recv_message_size` bytes and
/// encodes responses of at most `limits.max_send_message_size` bytes.
pub fn router(
    id: IdHandler,
    info: InfoHandler,
    lease: LeaseHandler,
    admin: AdminHandler,
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
