//! The holder watch: ends a hold when one of its holder keys is deleted or
//! rewritten under it, on whichever endpoint answers.

use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use snowkeep_client::MachineId;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};

use super::{keys, Claim, EtcdStore};
use snowkeep_core::claim::{LossReason, StoreError};

/// Pause before re-opening a failed holder watch.
const WATCH_RETRY: Duration = Duration::from_millis(250);

/// The next message of a watch `stream`, or `None` when its member is
/// silent. A hung member leaves the stream silent, not failed: after
/// `timeout` without a message this asks for a progress report, which a
/// live member answers at once; no answer within another `timeout` is
/// `None`, which callers count as a failed endpoint.
pub(super) async fn next_message(
    stream: &mut etcd_client::WatchStream,
    timeout: Duration,
) -> Option<Result<Option<etcd_client::WatchResponse>, etcd_client::Error>> {
    let mut probing = false;
    loop {
        match tokio::time::timeout(timeout, stream.message()).await {
            Ok(message) => return Some(message),
            Err(_) if !probing => {
                probing = true;
                if let Err(e) = stream.request_progress().await {
                    return Some(Err(e));
                }
            }
            Err(_) => return None,
        }
    }
}

impl EtcdStore {
    /// Watches the namespace's holder keys from just after the claim: the
    /// returned task ends with `HolderChanged` when one of the claim's keys is
    /// deleted or rewritten for another holder or lease (an operator's
    /// `etcdctl del`, an expiry seen by etcd). Aborted when dropped.
    pub fn watch_holders(
        &self,
        claim: &Claim,
    ) -> AbortOnDropHandle<Result<LossReason, StoreError>> {
        let prefix = keys::holder_prefix(self.ns());
        let ours: Vec<MachineId> = claim.held.iter().map(|h| h.machine_id).collect();
        // The holder value of this server's keys: its instance id. The same
        // value on another etcd lease is a second live process with it.
        let own_instance_id = self.settings.instance_id.clone();
        let holder_value = own_instance_id.clone();
        let lease_id = claim.lease.id;
        let endpoints = self.endpoints.clone();
        let timeout = self.settings.request_timeout;
        let mut next_revision = claim.lease.revision + 1;
        let is_ours = move |kv: &etcd_client::KeyValue| {
            kv.value() == holder_value.as_bytes() && kv.lease() == lease_id
        };
        AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                let opts = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(next_revision);
                let opened = endpoints
                    .call_at("watch holders", timeout, |mut c| {
                        let (key, opts) = (prefix.clone(), opts.clone());
                        async move { c.watch(key, Some(opts)).await }
                    })
                    .await;
                let (mut stream, position) = match opened {
                    Ok(opened) => opened,
                    Err(e) => {
                        debug!(error = %snowkeep_core::DisplayChain(&e), "holder watch failed to open on every endpoint; retrying");
                        tokio::time::sleep(WATCH_RETRY).await;
                        continue;
                    }
                };
                loop {
                    let message = match next_message(&mut stream, timeout).await {
                        Some(message) => message,
                        None => {
                            warn!(endpoint = endpoints.url_at(position), silent_for = ?(timeout * 2), "holder watch got no answer; reopening it on the next endpoint");
                            endpoints.failed_at(position);
                            break;
                        }
                    };
                    match message {
                        Ok(Some(resp)) if resp.canceled() => {
                            // Compacted past our revision: read the keys instead.
                            let now = endpoints
                                .call("read holders", timeout, |mut c| {
                                    let key = prefix.clone();
                                    async move {
                                        c.get(key, Some(GetOptions::new().with_prefix())).await
                                    }
                                })
                                .await;
                            match now {
                                Ok(get) => {
                                    let intact = ours.iter().all(|id| {
                                        get.kvs().iter().any(|kv| {
                                            keys::machine_id_of(kv.key(), &prefix) == Some(*id)
                                                && is_ours(kv)
                                        })
                                    });
                                    if !intact {
                                        return Ok(LossReason::HolderChanged);
                                    }
                                    next_revision =
                                        get.header().map(|h| h.revision() + 1).unwrap_or(0);
                                }
                                Err(_) => tokio::time::sleep(WATCH_RETRY).await,
                            }
                            break;
                        }
                        Ok(Some(resp)) => {
                            for event in resp.events() {
                                let Some(kv) = event.kv() else { continue };
                                next_revision = next_revision.max(kv.mod_revision() + 1);
                                let Some(id) = keys::machine_id_of(kv.key(), &prefix) else {
                                    continue;
                                };
                                if !ours.contains(&id) {
                                    continue;
                                }
                                if event.event_type() == EventType::Put
                                    && kv.value() == own_instance_id.as_bytes()
                                    && kv.lease() != lease_id
                                {
                                    // Our instance id, another lease: a second live
                                    // process with our --instance-id. Stop rather
                                    // than take it back and forth forever.
                                    return Err(StoreError::DuplicateInstance {
                                        instance_id: own_instance_id,
                                        machine_id: id,
                                    });
                                }
                                if event.event_type() != EventType::Put || !is_ours(kv) {
                                    return Ok(LossReason::HolderChanged);
                                }
                            }
                        }
                        Ok(None) | Err(_) => {
                            debug!(
                                endpoint = endpoints.url_at(position),
                                "holder watch stream failed; reopening it on the next endpoint"
                            );
                            endpoints.failed_at(position);
                            tokio::time::sleep(WATCH_RETRY).await;
                            break;
                        }
                    }
                }
            }
        }))
    }
}
