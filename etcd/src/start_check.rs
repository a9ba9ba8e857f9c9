//! The access check before a server's first claim: does etcd accept this
//! server's TLS settings and credentials, and may its user read and write
//! the namespace's keys? Each "no" is a [`StoreError::AccessRefused`], which
//! ends the start with exit code 64 and the remedy, instead of a server that
//! retries forever against a refusal it cannot outlast.
//!
//! Two steps, each deterministic:
//!
//! 1. With `https://` endpoints, the TLS probe ([`super::tls_probe`]) of
//!    every endpoint. The first endpoint that accepts ends the step. When none
//!    accepts and one refused, the refusal is the answer (confirmed by a
//!    second probe of that endpoint). When none answered at all, the step
//!    passes and the namespace read that follows reports etcd as not
//!    reachable yet (retried).
//! 2. A count-only read of the namespace's prefix, and a transaction that
//!    would put [`keys::write_check`] under a guard that never holds (the key's
//!    version below 0). etcd checks the permissions of every operation of a
//!    transaction whatever its guard answers, so a user whose role cannot
//!    write the namespace's keys is refused here, and nothing is ever written.
//!    That transaction is a raft proposal (etcd serves only transactions of
//!    reads without one), so it is sent only when this server authenticates
//!    to etcd (a user and password, or a client certificate, whose common
//!    name etcd takes as the user): without either, etcd's auth is off and
//!    every key may be written, or it is on and the read already failed
//!    (etcd refuses a request with no user). Should something in between
//!    authenticate for it (a proxy or sidecar with a certificate of its own)
//!    as a read-only user, the first claim transaction meets the refusal,
//!    which ends the start the same way (the claim loop does not retry an
//!    access refusal before its first claim). A fleet restarting together
//!    saves one proposal per server (docs/benchmarks.md, *A fleet of
//!    claimers*).

use futures_util::stream::{FuturesUnordered, StreamExt};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tracing::{debug, warn};

use super::access::EtcdTls;
use super::keys;
use super::tls_probe::{probe, Probe};
use super::EtcdStore;
use snowkeep_core::claim::StoreError;

/// The longest one TLS probe of one endpoint may take (TCP connect,
/// handshake, and the member's first answer).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the TLS probe saw, as the source of an `AccessRefused`.
#[derive(Debug, thiserror::Error)]
#[error("TLS probe: {0}")]
struct ProbeSaw(String);

impl EtcdStore {
    /// Checks that etcd accepts this server (see the module docs): `Ok` when
    /// it does, or when no endpoint answered (the caller's next request
    /// reports that); [`StoreError::AccessRefused`] for a refusal.
    pub async fn check_access(&self) -> Result<(), StoreError> {
        if let Some(tls) = &self.settings.access.tls {
            self.probe_endpoints(tls).await?;
        }
        self.check_permissions().await
    }

    /// Step 1 of the module docs.
    async fn probe_endpoints(&self, tls: &EtcdTls) -> Result<(), StoreError> {
        let now_unix_s = i64::try_from(self.clock.unix_ms() / 1000).unwrap_or(i64::MAX);
        let mut probes: FuturesUnordered<_> = self
            .endpoints
            .urls()
            .iter()
            .map(|url| async move { (url, probe(url, tls, PROBE_TIMEOUT, now_unix_s).await) })
            .collect();
        let mut refused = None;
        while let Some((url, verdict)) = probes.next().await {
            match verdict {
                Probe::Accepted => return Ok(()),
                Probe::Refused { problem, seen } => {
                    warn!(endpoint = %url, seen = %seen, "etcd refused this server's TLS connection");
                    refused.get_or_insert((url, problem, seen));
                }
                Probe::Unanswered(seen) => {
                    debug!(endpoint = %url, seen = %seen, "TLS probe got no answer")
                }
            }
        }
        drop(probes);
        let Some((url, ..)) = refused else {
            return Ok(());
        };
        // The refusal again, from a fresh connection: one close at the wrong
        // moment is not a refusal.
        match probe(url, tls, PROBE_TIMEOUT, now_unix_s).await {
            Probe::Refused { problem, seen } => Err(StoreError::AccessRefused {
                endpoint: url.clone(),
                problem,
                source: Box::new(ProbeSaw(seen)),
            }),
            Probe::Accepted | Probe::Unanswered(_) => Ok(()),
        }
    }

    /// Step 2 of the module docs.
    async fn check_permissions(&self) -> Result<(), StoreError> {
        let timeout = self.settings.request_timeout;
        let prefix = keys::namespace_prefix(self.ns());
        self.endpoints
            .call("check read permission", timeout, |mut c| {
                let prefix = prefix.clone();
                async move {
                    c.get(
                        prefix,
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
                }
            })
            .await?;
        if !self.settings.access.authenticates() {
            return Ok(());
        }
        let key = keys::write_check(self.ns());
        let never = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Less, 0)])
            .and_then([TxnOp::put(key, "", None)]);
        let answer = self
            .endpoints
            .txn("check write permission", timeout, never)
            .await?;
        debug_assert!(!answer.succeeded(), "a version is never below 0");
        Ok(())
    }
}
