//! The scale benchmark's claimer (`snowkeep-scale`, `scripts/bench-scale`):
//! one server's claim, run on the production code (the etcd claim store and
//! the claim loop, `ClaimManager`, built exactly as `crate::run::run` builds
//! them) as a task of the caller's runtime, without the gRPC server around
//! it. Many of them in one process stand in for a fleet of servers against
//! one etcd. Not a supported API: it exists so the benchmark copies no
//! lease code, and may change with it.
//!
//! Left out, because they are not the claim: the gRPC listener, the Lease
//! API, the capacity gauges' reads of the pool every 5 s, the peer clock
//! check's calls and the one-shot overlap advice. What the claim store
//! writes is all in: the claim transactions, the peer key registered with
//! each etcd lease, fence raises, keepalives, the holder watch, the
//! namespace checks and the release.

use std::sync::Arc;

use snowkeep_client::{Generator, Grant, SystemClock};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{ServerConfig, StoreConfig};
use crate::run::{claim_timing, connect_etcd, etcd_settings, generator_slots};
use crate::ServeError;
use snowkeep_core::claim::ClaimManager;

/// The configuration names no etcd store (`--etcd-endpoints` missing):
/// the scale benchmark measures claims in etcd only.
#[derive(Debug, thiserror::Error)]
#[error("the scale benchmark claims machine ids in etcd: give --etcd-endpoints")]
pub struct NeedsEtcd;

/// Why a claimer never got a grant.
#[derive(Debug, thiserror::Error)]
pub enum ClaimerError {
    /// The claim loop stopped with an error (no free machine id, a fence
    /// too far ahead, a namespace not created, ...).
    #[error(transparent)]
    Stopped(#[from] ServeError),
    /// The claim loop ended without an error before its first grant (release
    /// was asked for first).
    #[error("the claim loop ended before its first grant")]
    Ended,
}

/// One running claim loop over the etcd claim store, with the generators it
/// grants to: what one `snowkeep-server` runs on its lease thread.
pub struct Claimer {
    grants: Vec<watch::Receiver<Option<Grant>>>,
    generators: Vec<Arc<Generator>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl std::fmt::Debug for Claimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claimer")
            .field("machine_ids", &self.grants.len())
            .finish_non_exhaustive()
    }
}

impl Claimer {
    /// Spawns the claim loop of `config` (its `--machine-ids` slots, its
    /// instance id, lease TTL and fence settings) on the current tokio
    /// runtime: it connects to etcd as a server does (retrying while etcd
    /// does not answer), opens the namespace as `config.namespace_setup`
    /// says, claims, and holds until `release` is cancelled, then drains
    /// and releases. Errors with [`NeedsEtcd`] when `config` has no etcd
    /// endpoints; everything else shows in [`Claimer::first_grant`] and
    /// [`Claimer::join`].
    pub fn spawn(config: &ServerConfig, release: CancellationToken) -> Result<Self, NeedsEtcd> {
        let StoreConfig::Etcd { endpoints } = &config.store else {
            return Err(NeedsEtcd);
        };
        let clock = SystemClock::shared();
        let (slots, grants, demand) = generator_slots(config, &clock);
        let generators = slots.iter().map(|s| s.generator.clone()).collect();
        let settings = etcd_settings(config, endpoints);
        let (layout, namespace, timing) = (
            config.layout,
            config.namespace.clone(),
            claim_timing(config),
        );
        let task = tokio::spawn(async move {
            let Some(store) = connect_etcd(settings, layout, clock.clone(), &release).await? else {
                return Ok(());
            };
            ClaimManager::new(store, layout, namespace, clock, timing, slots, demand)
                .run(release)
                .await?;
            Ok(())
        });
        Ok(Self {
            grants,
            generators,
            task: Some(task),
        })
    }

    /// Waits until every machine id of the claim has its first grant
    /// published (the claim committed and the fences raised past the
    /// floors: the moment a server turns SERVING). Errors when the claim
    /// loop ends first, with its error; after an error the claimer is done
    /// ([`Claimer::join`] returns `Ok`).
    pub async fn first_grant(&mut self) -> Result<(), ClaimerError> {
        let Some(task) = self.task.as_mut() else {
            return Err(ClaimerError::Ended);
        };
        let all_granted = async {
            for grant in &mut self.grants {
                // A closed channel means the loop ended: the task says why.
                if grant.wait_for(Option::is_some).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            () = all_granted => Ok(()),
            ended = task => {
                self.task = None;
                match ended {
                    Ok(Ok(())) => Err(ClaimerError::Ended),
                    Ok(Err(e)) => Err(e.into()),
                    Err(join) => Err(ServeError::Panic(join).into()),
                }
            }
        }
    }

    /// The generators fed by this claim, one per machine id (slot order).
    pub fn generators(&self) -> &[Arc<Generator>] {
        &self.generators
    }

    /// Waits for the claim loop to end (after `release` is cancelled it
    /// drains the generators and releases the claim), with its result.
    pub async fn join(mut self) -> Result<(), ServeError> {
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}
