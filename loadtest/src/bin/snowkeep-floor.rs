//! snowkeep-floor: the gRPC floor of a machine. It serves snowkeep's
//! `IdService` with responses of the same size as snowkeep's and no work
//! behind them (the ids are a precomputed run 1..=count), plus server
//! reflection, so `snowkeep-bench` can measure what tonic alone costs here.
//!
//! Its ids repeat from call to call, so `--check` against it reports
//! duplicates; with `--descending` each batch is also in descending order;
//! with `--cut-streams-after N` every stream ends after N ids, with OK (as
//! snowkeep servers did at shutdown before they reported early ends) or with
//! `--cut-streams-with unavailable`. All on purpose: it is the checker's
//! test target as well. It also
//! serves `snowkeep.floor.v1.FloorService`, a client-streaming and a bidi
//! method, for the bench's tests of those call kinds.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use snowkeep_proto::v1 as pb;
use tokio_stream::Stream;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// The floor's own test service (client-streaming and bidi methods).
#[allow(missing_docs, clippy::all)]
mod floor_pb {
    tonic::include_proto!("snowkeep.floor.v1");
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("floor_descriptor");
}

/// Largest batch served, as snowkeep's own limit.
const MAX_BATCH: u32 = 100_000;

/// A no-work IdService for measuring the gRPC floor.
#[derive(Debug, Parser)]
#[command(name = "snowkeep-floor", version, about)]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:50061")]
    listen: SocketAddr,
    /// Serve each batch in descending order (for the checker's tests).
    #[arg(long)]
    descending: bool,
    /// End every stream after this many ids, however many it asked for (for
    /// the checker's tests of short streams).
    #[arg(long)]
    cut_streams_after: Option<u64>,
    /// The status a stream cut by --cut-streams-after ends with.
    #[arg(long, value_enum, default_value_t = CutStatus::Ok, requires = "cut_streams_after")]
    cut_streams_with: CutStatus,
    /// PEM certificate to serve TLS with (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// How a stream cut by `--cut-streams-after` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CutStatus {
    /// OK, as if the stream were whole.
    Ok,
    /// UNAVAILABLE, counting the ids sent, as snowkeep-server does.
    Unavailable,
}

struct Floor {
    ids: Arc<Vec<u64>>,
    /// `--cut-streams-after` and `--cut-streams-with`.
    cut: Option<(u64, CutStatus)>,
}

impl Floor {
    fn batch(&self, count: u32) -> Result<Vec<u64>, Status> {
        if count == 0 || count > MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "count must be 1..={MAX_BATCH}, got {count}"
            )));
        }
        Ok(self.ids[..count as usize].to_vec())
    }
}

type IdStream = Pin<Box<dyn Stream<Item = Result<pb::IdBatch, Status>> + Send>>;

#[tonic::async_trait]
impl pb::id_service_server::IdService for Floor {
    async fn next_ids(
        &self,
        request: Request<pb::NextIdsRequest>,
    ) -> Result<Response<pb::NextIdsResponse>, Status> {
        let ids = self.batch(request.into_inner().count)?;
        Ok(Response::new(pb::NextIdsResponse {
            ids,
            ..Default::default()
        }))
    }

    type StreamIdsStream = IdStream;

    async fn stream_ids(
        &self,
        request: Request<pb::StreamIdsRequest>,
    ) -> Result<Response<IdStream>, Status> {
        let req = request.into_inner();
        let batch = if req.batch_size == 0 {
            1000
        } else {
            req.batch_size
        };
        self.batch(batch)?;
        let ids = self.ids.clone();
        let asked = if req.total == 0 { u64::MAX } else { req.total };
        let (mut left, end) = match self.cut {
            Some((after, status)) if after < asked => {
                let end = (status == CutStatus::Unavailable).then(|| {
                    let sent = match req.total {
                        0 => format!("stream ended: {after} ids sent"),
                        total => format!("stream ended early: {after} of {total} ids sent"),
                    };
                    Status::unavailable(format!(
                        "{sent}; the floor cuts every stream after {after} ids"
                    ))
                });
                (after, end)
            }
            _ => (asked, None),
        };
        let stream = async_stream_batches(ids, batch, move || {
            let n = left.min(u64::from(batch));
            left -= n;
            n
        });
        let stream =
            futures_util::StreamExt::chain(stream, futures_util::stream::iter(end.map(Err)));
        Ok(Response::new(Box::pin(stream)))
    }
}

#[tonic::async_trait]
impl floor_pb::floor_service_server::FloorService for Floor {
    async fn collect_ids(
        &self,
        request: Request<tonic::Streaming<pb::NextIdsRequest>>,
    ) -> Result<Response<pb::NextIdsResponse>, Status> {
        let mut requests = request.into_inner();
        let mut total: u32 = 0;
        while let Some(r) = requests.message().await? {
            total = total.saturating_add(r.count);
        }
        let ids = self.batch(total)?;
        Ok(Response::new(pb::NextIdsResponse {
            ids,
            ..Default::default()
        }))
    }

    type EchoIdsStream = IdStream;

    async fn echo_ids(
        &self,
        request: Request<tonic::Streaming<pb::NextIdsRequest>>,
    ) -> Result<Response<IdStream>, Status> {
        let requests = request.into_inner();
        let ids = self.ids.clone();
        let stream = futures_util::StreamExt::map(requests, move |r| {
            let count = r?.count;
            if count == 0 || count > MAX_BATCH {
                return Err(Status::invalid_argument(format!(
                    "count must be 1..={MAX_BATCH}, got {count}"
                )));
            }
            Ok(pb::IdBatch {
                ids: ids[..count as usize].to_vec(),
                ..Default::default()
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Yields batches of the sizes `next` gives until it gives 0.
fn async_stream_batches(
    ids: Arc<Vec<u64>>,
    _batch: u32,
    mut next: impl FnMut() -> u64 + Send + 'static,
) -> impl Stream<Item = Result<pb::IdBatch, Status>> + Send {
    futures_util::stream::poll_fn(move |_| {
        let n = next();
        std::task::Poll::Ready((n > 0).then(|| {
            Ok(pb::IdBatch {
                ids: ids[..n as usize].to_vec(),
                ..Default::default()
            })
        }))
    })
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let mut ids: Vec<u64> = (1..=u64::from(MAX_BATCH)).collect();
    if args.descending {
        ids.reverse();
    }
    let ids = Arc::new(ids);
    let cut = args.cut_streams_after.map(|n| (n, args.cut_streams_with));
    let floor = Floor {
        ids: ids.clone(),
        cut,
    };
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(snowkeep_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(floor_pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("reflection service")?;
    let mut builder = Server::builder();
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let cert = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
        let key = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
            .context("TLS settings")?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    builder
        .add_service(pb::id_service_server::IdServiceServer::new(floor))
        .add_service(floor_pb::floor_service_server::FloorServiceServer::new(
            Floor { ids, cut },
        ))
        .add_service(reflection)
        .serve_with_incoming_shutdown(
            // The same socket options as snowkeep-server: no Nagle delay.
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await
        .context("serving")
}

/// Parses the flags and serves until Ctrl-C (also the entry point of
/// `snowkeep-floor-mimalloc`, the same floor on snowkeep-server's allocator).
pub fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "snowkeep-floor: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "snowkeep-floor: {e:#}");
            ExitCode::FAILURE
        }
    }
}
