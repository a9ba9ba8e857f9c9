//! The holder watch: ends a hold when one of its holder keys is deleted or
//! rewritten under it, on whichever endpoint answers.

use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use snowkeep_client::MachineId;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};

use super::endpoints::Endpoints;
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
        let watched = Watched {
            prefix: keys::holder_prefix(self.ns()),
            ours: claim.held.iter().map(|h| h.machine_id).collect(),
            instance_id: self.settings.instance_id.clone(),
            lease_id: claim.lease.id,
        };
        let endpoints = self.endpoints.clone();
        let timeout = self.settings.request_timeout;
        let mut next_revision = claim.lease.revision + 1;
        AbortOnDropHandle::new(tokio::spawn(async move {
            let prefix = &watched.prefix;
            loop {
                let Some((mut stream, position)) =
                    open(&endpoints, timeout, prefix, next_revision).await
                else {
                    continue;
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
                                    if !watched.intact(&get) {
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
                            if let Some(loss) = watched.judge(&resp, &mut next_revision)? {
                                return Ok(loss);
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

/// Opens the holder watch on `prefix` from `next_revision`, failing over:
/// the stream and the endpoint position it is on, or `None` (after a pause)
/// when no endpoint opened it.
async fn open(
    endpoints: &Endpoints,
    timeout: Duration,
    prefix: &str,
    next_revision: i64,
) -> Option<(etcd_client::WatchStream, usize)> {
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(next_revision);
    let opened = endpoints
        .call_at("watch holders", timeout, |mut c| {
            let (key, opts) = (prefix.to_owned(), opts.clone());
            async move { c.watch(key, Some(opts)).await }
        })
        .await;
    match opened {
        Ok(opened) => Some(opened),
        Err(e) => {
            debug!(error = %snowkeep_core::DisplayChain(&e), "holder watch failed to open on every endpoint; retrying");
            tokio::time::sleep(WATCH_RETRY).await;
            None
        }
    }
}

/// What a holder watch watches: the claim's machine ids under the holder
/// prefix, held with this server's instance id on the claim's lease.
struct Watched {
    prefix: String,
    ours: Vec<MachineId>,
    /// The holder value of this server's keys: its instance id. The same
    /// value on another etcd lease is a second live process with it.
    instance_id: String,
    lease_id: i64,
}

impl Watched {
    /// Whether `kv` is a holder key of this claim: our value, our lease.
    fn is_ours(&self, kv: &etcd_client::KeyValue) -> bool {
        kv.value() == self.instance_id.as_bytes() && kv.lease() == self.lease_id
    }

    /// Whether every machine id of the claim is still held by it in `get`
    /// (a read of the whole holder prefix).
    fn intact(&self, get: &etcd_client::GetResponse) -> bool {
        self.ours.iter().all(|id| {
            get.kvs().iter().any(|kv| {
                keys::machine_id_of(kv.key(), &self.prefix) == Some(*id) && self.is_ours(kv)
            })
        })
    }

    /// Reads the events of `resp`, moving `next_revision` past each:
    /// `Some(HolderChanged)` when one of our keys was deleted or rewritten,
    /// [`StoreError::DuplicateInstance`] when it was put with our instance
    /// id on another lease, `None` when the claim stands.
    fn judge(
        &self,
        resp: &etcd_client::WatchResponse,
        next_revision: &mut i64,
    ) -> Result<Option<LossReason>, StoreError> {
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            *next_revision = (*next_revision).max(kv.mod_revision() + 1);
            let Some(id) = keys::machine_id_of(kv.key(), &self.prefix) else {
                continue;
            };
            if !self.ours.contains(&id) {
                continue;
            }
            if event.event_type() == EventType::Put
                && kv.value() == self.instance_id.as_bytes()
                && kv.lease() != self.lease_id
            {
                // Our instance id, another lease: a second live
                // process with our --instance-id. Stop rather
                // than take it back and forth forever.
                return Err(StoreError::DuplicateInstance {
                    instance_id: self.instance_id.clone(),
                    machine_id: id,
                });
            }
            if event.event_type() != EventType::Put || !self.is_ours(kv) {
                return Ok(Some(LossReason::HolderChanged));
            }
        }
        Ok(None)
    }
}
