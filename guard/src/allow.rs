//! The network allow-list (`--allow-cidrs`): a call from a peer address
//! outside every configured range is answered PERMISSION_DENIED before any
//! handler (or the call limits) runs, whatever its method: health and
//! reflection too (the status page answers such a peer 403; the metrics
//! port serves every peer, see the server's `metrics_http`), so probes must come from an allowed address (an `exec`
//! probe in the pod calls from 127.0.0.1). An IPv4 client reaching an IPv6
//! socket (an IPv4-mapped address, `::ffff:10.1.2.3`) is matched against the
//! IPv4 ranges. An empty list allows every peer.
//!
//! The listener ([`crate::limits::conn::Listener::with_allow_list`]) sorts
//! connections by the same list at accept: one from outside it counts
//! against no connection limit of the allowed peers, only against a small
//! budget of its own, and is closed soon after its first call is denied
//! here (see [`crate::limits::conn`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{ready, Either, Ready};
use ipnet::IpNet;
use tonic::Status;
use tower::{Layer, Service};

use crate::conn_info::ConnInfo;

/// The allowed ranges; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    nets: Arc<[IpNet]>,
}

impl AllowList {
    /// Allows peers inside any of `nets`; every peer when empty.
    pub fn new(nets: Vec<IpNet>) -> Self {
        Self { nets: nets.into() }
    }

    /// Whether a call from `peer` may proceed.
    pub fn allows(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.nets.is_empty() || self.nets.iter().any(|n| n.contains(&peer))
    }

    /// Whether a connection from `peer` (`None`: an unknown address) may
    /// call: always with an empty list, never from an unknown address
    /// otherwise.
    pub fn admits(&self, peer: Option<IpAddr>) -> bool {
        self.nets.is_empty() || peer.is_some_and(|p| self.allows(p))
    }

    /// Whether the list admits every peer.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// `None` when the peer of a request (its [`ConnInfo`] extension) may
    /// call; else the PERMISSION_DENIED status to answer, the connection
    /// marked to close soon. The one check of the allow-list layer and of
    /// whatever answers a request before that layer sees it (the server's
    /// HTTP/JSON API).
    pub fn refuse(&self, extensions: &http::Extensions) -> Option<Status> {
        if self.nets.is_empty() {
            return None;
        }
        let conn = extensions.get::<ConnInfo>();
        let peer = conn.and_then(|c| c.tcp.remote_addr()).map(|a| a.ip());
        if self.admits(peer) {
            return None;
        }
        if let Some(conn) = conn {
            // The connection closes shortly, once this answer is out.
            conn.state.denied();
        }
        Some(self.denied(peer))
    }

    /// The status for a peer the list refuses (`None`: an unknown address).
    fn denied(&self, peer: Option<IpAddr>) -> Status {
        Status::permission_denied(self.refusal(peer))
    }

    /// Why the list refuses `peer` (`None`: an unknown address), for the
    /// gRPC status and the HTTP listeners' 403.
    pub fn refusal(&self, peer: Option<IpAddr>) -> String {
        let ranges = self
            .nets
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let who = peer.map_or_else(
            || "a peer with no known address".to_owned(),
            |p| format!("peer {}", p.to_canonical()),
        );
        format!(
            "{who} is outside this server's --allow-cidrs ({ranges}): call from an allowed network, or have the operator add the client's range to --allow-cidrs"
        )
    }
}

impl<S> Layer<S> for AllowList {
    type Service = Allow<S>;

    fn layer(&self, inner: S) -> Allow<S> {
        Allow {
            inner,
            list: self.clone(),
        }
    }
}

/// The service of [`AllowList`].
#[derive(Debug, Clone)]
pub struct Allow<S> {
    inner: S,
    list: AllowList,
}

impl<S, R> Service<http::Request<R>> for Allow<S>
where
    S: Service<http::Request<R>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    /// The refusal at once, or the inner call (no box per call).
    type Future = Either<Ready<Result<Self::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<R>) -> Self::Future {
        match self.list.refuse(request.extensions()) {
            Some(denied) => Either::Left(ready(Ok(denied.into_http()))),
            None => Either::Right(self.inner.call(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(ranges: &[&str]) -> AllowList {
        AllowList::new(ranges.iter().map(|r| r.parse().unwrap()).collect())
    }

    #[test]
    fn peers_match_their_ranges_and_mapped_ipv4_matches_ipv4_ranges() {
        let l = list(&["10.0.0.0/8", "127.0.0.1/32", "fd00::/8"]);
        for ok in [
            "10.1.2.3",
            "127.0.0.1",
            "::ffff:10.9.9.9",
            "::ffff:127.0.0.1",
            "fd12::1",
        ] {
            assert!(l.allows(ok.parse().unwrap()), "{ok}");
        }
        for no in [
            "11.0.0.1",
            "127.0.0.2",
            "::1",
            "::ffff:192.168.0.1",
            "fe80::1",
        ] {
            assert!(!l.allows(no.parse().unwrap()), "{no}");
        }
        assert!(AllowList::default().allows("203.0.113.9".parse().unwrap()));
    }

    #[test]
    fn the_denial_names_the_peer_and_the_flag() {
        let s = list(&["10.0.0.0/8"]).denied(Some("::ffff:127.0.0.1".parse().unwrap()));
        assert_eq!(s.code(), tonic::Code::PermissionDenied);
        assert_eq!(s.message(), "peer 127.0.0.1 is outside this server's --allow-cidrs (10.0.0.0/8): call from an allowed network, or have the operator add the client's range to --allow-cidrs");
    }
}
