//! `InfoService`: version, layout, held machine ids and fences, id decoding.

use std::sync::Arc;

use snowkeep_client::{GeneratorSet, Millis, SharedClock};
use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::convert;
use super::status::ApiError;
use super::StoreAccess;

/// Serves `snowkeep.v1.InfoService`.
#[derive(Clone)]
pub struct InfoHandler {
    generators: Arc<GeneratorSet>,
    clock: SharedClock,
    namespace: String,
    instance_id: String,
    store: &'static str,
    /// The store, for capacity reads (the single-instance store's machine ids are all
    /// this server's).
    access: StoreAccess,
}

impl InfoHandler {
    /// Creates the handler.
    pub fn new(
        generators: Arc<GeneratorSet>,
        clock: SharedClock,
        namespace: String,
        instance_id: String,
        store: &'static str,
        access: StoreAccess,
    ) -> Self {
        Self {
            generators,
            clock,
            namespace,
            instance_id,
            store,
            access,
        }
    }
}

#[tonic::async_trait]
impl pb::info_service_server::InfoService for InfoHandler {
    async fn get_info(
        &self,
        request: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::GetInfoResponse>, Status> {
        if request
            .extensions()
            .get::<crate::auth::layer::Anonymous>()
            .is_some()
        {
            // Without a key (--auth on): the version and the clock, which
            // peers' clock checks read, and nothing about this deployment.
            return Ok(Response::new(pb::GetInfoResponse {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                server_time_unix_ms: self.clock.unix_ms(),
                ..Default::default()
            }));
        }
        let now = self.clock.now();
        let held = self
            .generators
            .generators()
            .iter()
            .filter(|g| g.is_ready())
            .filter_map(|g| g.grant())
            .map(|g| pb::HeldMachineId {
                machine_id: u32::from(g.machine_id.get()),
                fence_ms: g.fence.get(),
                lease_remaining_ms: g
                    .deadline
                    .map(|d| Millis::of(d.saturating_duration_since(now)).get())
                    .unwrap_or(0),
            })
            .collect();
        let layout = self.generators.layout();
        let unix_ms = self.clock.unix_ms();
        Ok(Response::new(pb::GetInfoResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            namespace: self.namespace.clone(),
            layout: Some(convert::layout_to_pb(&layout)),
            instance_id: self.instance_id.clone(),
            held,
            server_time_unix_ms: unix_ms,
            store: self.store.to_owned(),
            layout_end_unix_ms: layout.end_unix_ms(),
            layout_remaining_seconds: layout.end_unix_ms().saturating_sub(unix_ms) / 1000,
        }))
    }

    async fn decode_id(
        &self,
        request: Request<pb::DecodeIdRequest>,
    ) -> Result<Response<pb::DecodeIdResponse>, Status> {
        let layout = self.generators.layout();
        let id = super::text::requested_id(&request.into_inner(), &layout)?;
        let d = layout.decode(id).ok_or_else(|| ApiError::InvalidId {
            id,
            max: layout.max_id(),
            layout: layout.to_string(),
            bits: layout.total_bits(),
        })?;
        Ok(Response::new(pb::DecodeIdResponse {
            timestamp_ms: d.timestamp.get(),
            unix_ms: layout.to_unix_ms(d.timestamp),
            machine_id: u32::from(d.machine_id.get()),
            sequence: u32::try_from(d.sequence).unwrap_or(u32::MAX),
        }))
    }

    async fn get_capacity(
        &self,
        _request: Request<pb::GetCapacityRequest>,
    ) -> Result<Response<pb::Capacity>, Status> {
        let (capacity, range) = match self.access.etcd_handles()? {
            Some((mut reader, _)) => (
                reader.read().await.map_err(ApiError::Store)?,
                reader.range(),
            ),
            None => {
                let range = match &self.access {
                    StoreAccess::SingleInstance { machine_ids } => machine_ids.clone(),
                    StoreAccess::Etcd(_) => 0..0,
                };
                let total = range.end - range.start;
                let held = if self.generators.is_ready() { total } else { 0 };
                (snowkeep_core::claim::Capacity { total, held }, range)
            }
        };
        Ok(Response::new(convert::capacity_to_pb(
            &self.namespace,
            capacity,
            range,
        )))
    }
}
