//! Calling: the endpoint and its TLS settings, connecting, resolving
//! `--call` to snowkeep's methods or a dynamic one, and one call under the
//! per-call timeout with what it delivered. A call reads what it needs of
//! the run through a [`CallContext`], so this module imports nothing of the
//! workers that make the calls.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use prost_reflect::{DynamicMessage, MethodDescriptor};
use rand::SeedableRng;
use snowkeep_bench::dynamic::{self, DynamicCodec};
use snowkeep_bench::template::Template;
use snowkeep_bench::IdLog;
use snowkeep_proto::v1 as pb;
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::args::Args;

/// A dynamic method, ready to call.
pub(crate) struct DynCall {
    method: MethodDescriptor,
    path: http::uri::PathAndQuery,
    template: Template,
    /// Pre-built requests when the template has no per-call holes.
    fixed: Option<Vec<DynamicMessage>>,
}

pub(crate) enum Call {
    Unary,
    Stream,
    Dynamic(DynCall),
}

/// What a call reads of the run: its flags, the resolved method, the
/// metadata every request carries and the run's end (`-z`), once it is set.
#[derive(Clone, Copy)]
pub(crate) struct CallContext<'a> {
    pub(crate) args: &'a Args,
    pub(crate) call: &'a Call,
    pub(crate) metadata: &'a MetadataMap,
    pub(crate) deadline: Option<Instant>,
}

pub(crate) fn with_metadata<T>(msg: T, cx: CallContext<'_>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    *req.metadata_mut() = cx.metadata.clone();
    req.set_timeout(cx.args.timeout);
    req
}

/// What one call delivered, against what it asked for.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Ids received (also when the call failed part-way).
    pub(crate) delivered: u64,
    /// The `total` of a finite snowkeep stream; `None` for every other call.
    pub(crate) asked: Option<u64>,
    /// The run's end (`-z`) stopped the bench reading the stream: a stream
    /// the bench cut is not short.
    pub(crate) cut_by_run_end: bool,
}

impl Progress {
    /// The `total` of a finite stream that ended (by the server, an error
    /// or --timeout) before delivering it.
    pub(crate) fn short_of(&self) -> Option<u64> {
        self.asked
            .filter(|&asked| self.delivered < asked && !self.cut_by_run_end)
    }
}

/// One call under the per-call timeout: what it delivered and its outcome.
/// An endless snowkeep stream (`--count 0`) ended by the timeout is served,
/// as the help promises.
pub(crate) async fn one_call(
    channel: &Channel,
    cx: CallContext<'_>,
    n: u64,
    log: &mut IdLog,
) -> (Progress, Result<(), tonic::Status>) {
    let mut progress = Progress::default();
    let call = call_inner(channel, cx, n, log, &mut progress);
    let outcome = match tokio::time::timeout(cx.args.timeout, call).await {
        Ok(r) => r,
        Err(_) if matches!(cx.call, Call::Stream) && cx.args.count == 0 => Ok(()),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within --timeout {} ({} ids received)",
            humantime::format_duration(cx.args.timeout),
            progress.delivered
        ))),
    };
    (progress, outcome)
}

/// Reads a stream to its end (or the run's deadline, which ends it as a
/// success with what it delivered), feeding each message's ids to the log.
pub(crate) async fn drain<T>(
    mut stream: tonic::Streaming<T>,
    deadline: Option<Instant>,
    ids_of: impl Fn(&T) -> Vec<u64>,
    log: &mut IdLog,
    progress: &mut Progress,
) -> Result<(), tonic::Status> {
    let mut last = None;
    loop {
        let next = match deadline {
            Some(d) => tokio::select! {
                m = stream.message() => m?,
                _ = tokio::time::sleep_until(d) => {
                    progress.cut_by_run_end = true;
                    None
                }
            },
            None => stream.message().await?,
        };
        let Some(msg) = next else { break };
        let ids = ids_of(&msg);
        progress.delivered += ids.len() as u64;
        last = log.record(last, &ids);
    }
    Ok(())
}

/// The call itself, without the timeout: snowkeep's `NextIds`, its
/// `StreamIds`, or the dynamic method, recording what it delivered.
pub(crate) async fn call_inner(
    channel: &Channel,
    cx: CallContext<'_>,
    n: u64,
    log: &mut IdLog,
    progress: &mut Progress,
) -> Result<(), tonic::Status> {
    match cx.call {
        Call::Unary => next_ids(channel, cx, log, progress).await,
        Call::Stream => stream_ids(channel, cx, log, progress).await,
        Call::Dynamic(d) => dynamic_call(d, channel, cx, n, log, progress).await,
    }
}

/// An id-service client on `channel` that takes large batches.
fn id_client(channel: &Channel) -> pb::id_service_client::IdServiceClient<Channel> {
    pb::id_service_client::IdServiceClient::new(channel.clone())
        .max_decoding_message_size(64 * 1024 * 1024)
}

/// `NextIds` for `--count` ids.
async fn next_ids(
    channel: &Channel,
    cx: CallContext<'_>,
    log: &mut IdLog,
    progress: &mut Progress,
) -> Result<(), tonic::Status> {
    let req = with_metadata(
        pb::NextIdsRequest {
            count: cx.args.count,
            ..Default::default()
        },
        cx,
    );
    let ids = id_client(channel).next_ids(req).await?.into_inner().ids;
    log.record(None, &ids);
    progress.delivered = ids.len() as u64;
    Ok(())
}

/// `StreamIds` of `--count` ids (endless for 0) in `--batch-size` batches.
async fn stream_ids(
    channel: &Channel,
    cx: CallContext<'_>,
    log: &mut IdLog,
    progress: &mut Progress,
) -> Result<(), tonic::Status> {
    let args = cx.args;
    let req = with_metadata(
        pb::StreamIdsRequest {
            total: u64::from(args.count),
            batch_size: args.batch_size,
            ..Default::default()
        },
        cx,
    );
    progress.asked = (args.count > 0).then_some(u64::from(args.count));
    let stream = id_client(channel).stream_ids(req).await?.into_inner();
    drain(
        stream,
        cx.deadline,
        |b: &pb::IdBatch| b.ids.clone(),
        log,
        progress,
    )
    .await
}

/// Call `n` of a dynamic method, in whichever of the four shapes it has.
async fn dynamic_call(
    d: &DynCall,
    channel: &Channel,
    cx: CallContext<'_>,
    n: u64,
    log: &mut IdLog,
    progress: &mut Progress,
) -> Result<(), tonic::Status> {
    let messages = d.requests(n)?;
    let mut grpc =
        tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(64 * 1024 * 1024);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connection not ready: {e}")))?;
    let codec = DynamicCodec::new(d.method.output());
    let path = d.path.clone();
    let answer = match (
        d.method.is_client_streaming(),
        d.method.is_server_streaming(),
    ) {
        (false, false) => {
            grpc.unary(with_metadata(d.first(messages), cx), path, codec)
                .await?
        }
        (false, true) => {
            let msg = d.first(messages);
            progress.asked = dynamic::stream_total(&d.method, &msg);
            let req = with_metadata(msg, cx);
            let stream = grpc.server_streaming(req, path, codec).await?.into_inner();
            return drain(stream, cx.deadline, dynamic::ids_of, log, progress).await;
        }
        (true, false) => {
            let req = with_metadata(tokio_stream::iter(messages), cx);
            grpc.client_streaming(req, path, codec).await?
        }
        (true, true) => {
            let req = with_metadata(tokio_stream::iter(messages), cx);
            let stream = grpc.streaming(req, path, codec).await?.into_inner();
            return drain(stream, cx.deadline, dynamic::ids_of, log, progress).await;
        }
    };
    let ids = dynamic::ids_of(&answer.into_inner());
    log.record(None, &ids);
    progress.delivered = ids.len() as u64;
    Ok(())
}

impl DynCall {
    /// The one request of a method without a client stream (an empty
    /// message when the document held none).
    fn first(&self, messages: Vec<DynamicMessage>) -> DynamicMessage {
        messages
            .into_iter()
            .next()
            .unwrap_or_else(|| DynamicMessage::new(self.method.input()))
    }

    /// The request messages of call `n`: the fixed ones, or the template
    /// rendered for `n`.
    fn requests(&self, n: u64) -> Result<Vec<DynamicMessage>, tonic::Status> {
        if let Some(m) = &self.fixed {
            return Ok(m.clone());
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(n);
        let json = self.template.render(n, &mut rng);
        dynamic::messages_from_json(
            &self.method.input(),
            &json,
            self.method.is_client_streaming(),
        )
        .map_err(|e| tonic::Status::invalid_argument(format!("request {n}: {e:#}")))
    }
}

/// The endpoint for `target` with the TLS options.
pub(crate) fn endpoint(args: &Args) -> anyhow::Result<Endpoint> {
    let raw = args.host.as_deref().unwrap_or(&args.target);
    let tls_options = args.tls || args.cacert.is_some() || args.cert.is_some();
    let https =
        raw.starts_with("https://") || (!raw.contains("://") && tls_options && !args.insecure);
    let url = match raw.split_once("://") {
        Some((_, rest)) if https => format!("https://{rest}"),
        Some(_) => raw.to_owned(),
        None if https => format!("https://{raw}"),
        None => format!("http://{raw}"),
    };
    let mut ep = Endpoint::from_shared(url.clone())
        .with_context(|| format!("invalid target {raw:?}: use host:port or http(s)://host:port"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    if https && !args.insecure {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = &args.cacert {
            let pem =
                std::fs::read(ca).with_context(|| format!("reading --cacert {}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&args.cert, &args.key) {
            let cert = std::fs::read(cert)
                .with_context(|| format!("reading --cert {}", cert.display()))?;
            let key =
                std::fs::read(key).with_context(|| format!("reading --key {}", key.display()))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &args.cname {
            tls = tls.domain_name(name.clone());
        }
        ep = ep.tls_config(tls).context("TLS settings")?;
    }
    Ok(ep)
}

pub(crate) async fn connect(ep: &Endpoint, wait: Option<Duration>) -> anyhow::Result<Channel> {
    let until = wait.map(|w| Instant::now() + w);
    loop {
        match ep.connect().await {
            Ok(c) => return Ok(c),
            Err(e) if until.is_some_and(|u| Instant::now() < u) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot connect to {}", ep.uri())),
        }
    }
}

pub(crate) async fn resolve_call(args: &Args, channel: &Channel) -> anyhow::Result<Call> {
    match args.call.as_str() {
        "unary" => return Ok(Call::Unary),
        "stream" => return Ok(Call::Stream),
        _ => {}
    }
    let pool = if args.proto.is_empty() {
        let (service, _) = dynamic::split_call(&args.call)?;
        tokio::time::timeout(
            args.timeout,
            dynamic::pool_from_reflection(channel.clone(), service),
        )
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "server reflection gave no answer within --timeout {}; pass --proto instead",
                humantime::format_duration(args.timeout)
            )
        })??
    } else {
        dynamic::pool_from_protos(&args.proto, &args.import_path)?
    };
    let method = dynamic::find_method(&pool, &args.call)?;
    let path = http::uri::PathAndQuery::from_str(&format!(
        "/{}/{}",
        method.parent_service().full_name(),
        method.name()
    ))
    .context("method path")?;
    let json = match (&args.data, &args.data_file) {
        (Some(d), _) => d.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading --data-file {}", f.display()))?,
        (None, None) => "{}".to_owned(),
    };
    let template = Template::parse(&json, &dynamic::call_info(&method))?;
    // Check the request once up front, so a typo fails before the run.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let first = dynamic::messages_from_json(
        &method.input(),
        &template.render(0, &mut rng),
        method.is_client_streaming(),
    )?;
    let fixed = template.is_static().then_some(first);
    Ok(Call::Dynamic(DynCall {
        method,
        path,
        template,
        fixed,
    }))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("snowkeep-bench").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn targets_pick_plaintext_or_tls() {
        let uri = |args: &[&str]| endpoint(&parse(args)).unwrap().uri().to_string();
        assert_eq!(uri(&["localhost:50051"]), "http://localhost:50051/");
        assert_eq!(
            uri(&["--target", "https://ids.example:443"]),
            "https://ids.example:443/"
        );
        assert_eq!(
            uri(&["--tls", "ids.example:8443"]),
            "https://ids.example:8443/"
        );
        assert_eq!(
            uri(&["--tls", "--insecure", "ids.example:8443"]),
            "http://ids.example:8443/"
        );
    }

    #[test]
    fn only_a_finite_stream_that_ended_before_its_total_is_short() {
        let p = |asked, delivered, cut_by_run_end| {
            Progress {
                delivered,
                asked,
                cut_by_run_end,
            }
            .short_of()
        };
        assert_eq!(p(Some(5000), 2000, false), Some(5000));
        assert_eq!(p(Some(5000), 0, false), Some(5000));
        assert_eq!(p(Some(5000), 5000, false), None);
        // The bench stopped reading at the run's end: not the server's doing.
        assert_eq!(p(Some(5000), 2000, true), None);
        // Unary calls, unbounded streams and other methods have no total.
        assert_eq!(p(None, 0, false), None);
    }
}
