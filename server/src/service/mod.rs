//! gRPC adapters only: each handler turns a request into a domain call and the
//! result into a response; errors become statuses in [`status`].

pub mod convert;
pub mod health;
pub mod id;
pub mod info;
pub mod lease;
pub mod status;

use snowkeep_proto::v1 as pb;
use tonic::service::Routes;
use tonic_health::server::HealthReporter;

/// Builds the routes: IdService, InfoService, grpc.health.v1 and server
/// reflection (v1 and v1alpha, so grpcurl 1.8 works too).
pub fn router(
    id: id::IdHandler,
    info: info::InfoHandler,
    lease: lease::LeaseHandler,
) -> Result<(Routes, HealthReporter), tonic_reflection::server::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(snowkeep_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(snowkeep_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let routes = Routes::new(pb::id_service_server::IdServiceServer::new(id))
        .add_service(pb::info_service_server::InfoServiceServer::new(info))
        .add_service(pb::lease_service_server::LeaseServiceServer::new(lease))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    Ok((routes, reporter))
}
