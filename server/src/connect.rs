//! Connecting a server to etcd: the cluster's security mode first (for a
//! serving server), then the administration service's handle and the API
//! key cache, then the namespace, each retried while etcd does not answer.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::service::StoreAccess;
use snowkeep_core::claim::StoreError;
use snowkeep_etcd::{EtcdSettings, EtcdStore};

/// Connects to etcd, retrying with backoff until it answers; `None` when
/// shutdown comes first. etcd may come up after us (compose, Kubernetes), so
/// only what an operator must fix (a namespace not created, a layout
/// mismatch, a rolled-back namespace, etcd refusing the `--etcd-*` TLS or
/// credentials, or a user without permission on the namespace's keys:
/// [`StoreError::AccessRefused`], found by `EtcdStore::check_access` before
/// any other request) is an error. Opens the namespace as
/// `settings.namespace_setup` says ([`EtcdStore::open_namespace`]). Each
/// attempt tries every endpoint in turn and the clients live across attempts,
/// so a retry starts on the endpoint after the last one that failed, not on
/// the first one again.
pub(crate) async fn connect_etcd(
    settings: EtcdSettings,
    layout: snowkeep_client::Layout,
    clock: snowkeep_client::SharedClock,
    shutdown: &CancellationToken,
) -> Result<Option<EtcdStore>, StoreError> {
    connect_etcd_serving(settings, layout, clock, shutdown, None, false).await
}

/// What a serving server connects besides the namespace
/// ([`connect_etcd_serving`]).
pub(crate) struct Serving<'a> {
    /// Gets the administration service's etcd handle.
    pub(crate) access: &'a StoreAccess,
    /// The API key cache, with the bootstrap admin key.
    pub(crate) keys: (&'a crate::auth::KeyCache, Option<crate::auth::BootstrapKey>),
    /// The server's view of the cluster's security mode.
    pub(crate) mode: &'a crate::auth::ClusterAuth,
}

/// [`connect_etcd`] for a serving server: first the cluster's security mode
/// is read and checked against `--auth` (retried while etcd does not
/// answer; [`StoreError::AuthModeMismatch`] ends the server), then `access`
/// gets the administration service's etcd handle and the API key cache
/// connects, before the namespace opens, so an import can restore the
/// namespace even while keys are required; with `wait_for_namespace` a
/// namespace without a record is waited for (logged each retry) instead of
/// ending the server.
pub(crate) async fn connect_etcd_serving(
    settings: EtcdSettings,
    layout: snowkeep_client::Layout,
    clock: snowkeep_client::SharedClock,
    shutdown: &CancellationToken,
    serving: Option<Serving<'_>>,
    wait_for_namespace: bool,
) -> Result<Option<EtcdStore>, StoreError> {
    let endpoints = settings.endpoints.clone();
    let mut store = EtcdStore::new(settings, layout, clock.clone()).await?;
    let mut access_checked = false;
    if let Some(serving) = serving {
        let mut backoff =
            snowkeep_client::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            let settled = tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                r = async {
                    check_access_once(&store, &mut access_checked).await?;
                    let keys = store.api_keys();
                    let first = (&keys, serving.keys.1.as_ref(), &clock);
                    serving.mode.settle(store.auth_mode(), first, shutdown.clone()).await
                } => r,
            };
            match settled {
                Ok(()) => break,
                Err(e) if not_reachable_yet(&e) => {
                    let log = |delay| warn!(endpoints = ?endpoints, error = %snowkeep_core::DisplayChain(&e), retry_in = ?delay, "etcd is not reachable yet; retrying");
                    if !retry_after(&mut backoff, shutdown, log).await {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        serving.access.clients_ready(&store);
        let (cache, bootstrap) = serving.keys;
        cache.connect(store.api_keys(), bootstrap, clock, shutdown.clone());
    }
    let mut backoff =
        snowkeep_client::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        let checked = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            r = async {
                check_access_once(&store, &mut access_checked).await?;
                store.open_namespace().await
            } => r,
        };
        match checked {
            Ok(()) => return Ok(Some(store)),
            Err(e) if not_reachable_yet(&e) => {
                let log = |delay| warn!(endpoints = ?endpoints, error = %snowkeep_core::DisplayChain(&e), retry_in = ?delay, "etcd is not reachable yet; retrying");
                if !retry_after(&mut backoff, shutdown, log).await {
                    return Ok(None);
                }
            }
            Err(e @ StoreError::NamespaceNotCreated { .. }) if wait_for_namespace => {
                let log = |delay| warn!(error = %snowkeep_core::DisplayChain(&e), retry_in = ?delay, "waiting for the namespace (--wait-for-namespace): create it, or import it with snowkeepctl import");
                if !retry_after(&mut backoff, shutdown, log).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether `e` is an etcd that does not answer yet, retried. Refused
/// credentials or certificates before the first claim are configuration to
/// fix, not an etcd that is still starting.
fn not_reachable_yet(e: &StoreError) -> bool {
    e.is_retryable() && !matches!(e, StoreError::AccessRefused { .. })
}

/// etcd's refusals (certificates, credentials, permissions), checked before
/// any other request and once: `checked` says whether that happened.
async fn check_access_once(store: &EtcdStore, checked: &mut bool) -> Result<(), StoreError> {
    if !*checked {
        store.check_access().await?;
        *checked = true;
    }
    Ok(())
}

/// Waits `backoff`'s next delay, after `log` said why with it; `false` when
/// shutdown came first.
async fn retry_after(
    backoff: &mut snowkeep_client::Backoff,
    shutdown: &CancellationToken,
    log: impl FnOnce(Duration),
) -> bool {
    let delay = backoff.next_delay();
    log(delay);
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}
