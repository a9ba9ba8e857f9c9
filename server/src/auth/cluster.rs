//! The cluster's security mode: whether API keys are required is a
//! property of the cluster, kept in etcd at `/snowkeep/v1/auth-mode`
//! (`on` or `off`; absent means off, never set), not of one server.
//!
//! **At start** a server on etcd reads the stored mode before its
//! administration service gets etcd access or it claims a machine id
//! (`ClusterAuth::settle`):
//!
//! | `--auth` | stored absent | stored `off` | stored `on` |
//! | --- | --- | --- | --- |
//! | not given | follows: off | follows: off | follows: on |
//! | `on` | writes `on` (needs a usable admin key, else exit 64), then on | refuses to start (exit 64) | on |
//! | `off` | off | off | refuses to start (exit 64) |
//!
//! A stored value that is neither `on` nor `off` counts as `on` (a server
//! never serves without keys on a mode it cannot read).
//!
//! **While it runs** the server follows the key with a watch and enforces
//! what is stored, whatever its flag said: a change through any server (an
//! admin's `SetAuthMode`) takes effect on every server as soon as its watch
//! delivers it. While etcd is unreachable the last mode read stays in force.
//!
//! Until the mode is read ([`Enforcement::Unknown`]) the server cannot check
//! keys, so it serves only health, reflection and an anonymous GetInfo
//! (version and clock); every other call gets UNAVAILABLE. With `--auth on`
//! keys are checked from the start. Calls admitted without a key check end
//! when the mode turns on (`ClusterAuth::turned_on`).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::AuthMode;
use snowkeep_core::claim::StoreError;
use snowkeep_etcd::apikeys::FollowEnd;
use snowkeep_etcd::auth_mode::{AuthModeStore, StoredMode};
use snowkeep_etcd::keys::AUTH_MODE;

/// Pause between attempts while etcd does not answer.
const RETRY: Duration = Duration::from_millis(500);

/// Whether this server checks API keys now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// The stored mode is not read yet (and `--auth on` was not given).
    Unknown,
    /// Calls are served without keys.
    Off,
    /// Every call but health, reflection and an anonymous GetInfo needs a
    /// valid key.
    On,
}

/// What the mode key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoredValue {
    /// Absent: never set (off).
    Unset,
    /// `off`.
    Off,
    /// `on`.
    On,
    /// Anything else, quoted (enforced as on).
    Unreadable(String),
}

impl StoredValue {
    /// Interprets the stored bytes.
    pub(crate) fn of(stored: &StoredMode) -> Self {
        match stored.value.as_deref() {
            None => StoredValue::Unset,
            Some(b"on") => StoredValue::On,
            Some(b"off") => StoredValue::Off,
            Some(other) => StoredValue::Unreadable(
                String::from_utf8_lossy(&other[..other.len().min(64)]).into_owned(),
            ),
        }
    }

    /// What a server enforces under this value.
    pub(crate) fn enforcement(&self) -> Enforcement {
        match self {
            StoredValue::Unset | StoredValue::Off => Enforcement::Off,
            StoredValue::On | StoredValue::Unreadable(_) => Enforcement::On,
        }
    }
}

/// Why a server's `--auth` and the stored mode cannot both hold: `None`
/// when they agree (or no flag was given).
pub(crate) fn mismatch(flag: Option<AuthMode>, stored: &StoredValue) -> Option<String> {
    match (flag?, stored) {
        (AuthMode::On, StoredValue::Off) => Some(format!(
            "--auth on, but the cluster's security mode in etcd ({AUTH_MODE}) is off: an administrator turned API keys off for every server. Remove --auth (env SNOWKEEP_AUTH) so this server follows the cluster, or turn keys on for every server with `snowkeepctl auth enable`"
        )),
        (AuthMode::Off, StoredValue::On) => Some(format!(
            "--auth off, but the cluster's security mode in etcd ({AUTH_MODE}) is on: every server requires API keys. Remove --auth off (env SNOWKEEP_AUTH) so this server follows the cluster; only an admin key can turn keys off, with `snowkeepctl --api-key-file ADMIN_KEY auth disable`"
        )),
        (AuthMode::Off, StoredValue::Unreadable(value)) => Some(format!(
            "--auth off, but the cluster's security mode in etcd ({AUTH_MODE}) holds {value:?}, neither on nor off, which every server enforces as on. Remove --auth off, or repair the key (`etcdctl put {AUTH_MODE} on`)"
        )),
        _ => None,
    }
}

/// What `--auth on` needs to set a mode that was never set (see
/// `super::first_mode`): the API key store, the bootstrap admin key and the
/// clock.
pub(crate) type FirstOn<'a> = (
    &'a snowkeep_etcd::apikeys::ApiKeyStore,
    Option<&'a super::BootstrapKey>,
    &'a snowkeep_client::SharedClock,
);

/// This server's view of the cluster's security mode, shared by the
/// authentication layer, the administration service and the status page.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct ClusterAuth {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `--auth`, `None` when not given.
    flag: Option<AuthMode>,
    /// The [`Enforcement`], as a `u8`.
    state: AtomicU8,
    /// The etcd side, once the mode is read.
    store: OnceLock<AuthModeStore>,
    /// Tells the calls admitted without a key check when the mode turns on
    /// ([`ClusterAuth::turned_on`]).
    changes: tokio::sync::watch::Sender<Enforcement>,
}

fn encode(e: Enforcement) -> u8 {
    match e {
        Enforcement::Unknown => 0,
        Enforcement::Off => 1,
        Enforcement::On => 2,
    }
}

impl ClusterAuth {
    /// A server on etcd with `--auth` `flag`: checks keys from the start
    /// with `--auth on`, else waits for `ClusterAuth::settle`.
    pub fn on_etcd(flag: Option<AuthMode>) -> Self {
        let start = match flag {
            Some(AuthMode::On) => Enforcement::On,
            _ => Enforcement::Unknown,
        };
        Self::with(flag, start)
    }

    /// A server without etcd (the single-instance store): never checks keys.
    pub fn off() -> Self {
        Self::with(Some(AuthMode::Off), Enforcement::Off)
    }

    fn with(flag: Option<AuthMode>, start: Enforcement) -> Self {
        Self {
            inner: Arc::new(Inner {
                flag,
                state: AtomicU8::new(encode(start)),
                store: OnceLock::new(),
                changes: tokio::sync::watch::Sender::new(start),
            }),
        }
    }

    /// What this server enforces now.
    pub fn enforcement(&self) -> Enforcement {
        match self.inner.state.load(Ordering::Acquire) {
            0 => Enforcement::Unknown,
            1 => Enforcement::Off,
            _ => Enforcement::On,
        }
    }

    /// Resolves once this server enforces keys (at once if it does now): a
    /// call admitted without a key check ends then (see `super::revoke`).
    pub(crate) fn turned_on(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut changes = self.inner.changes.subscribe();
        async move {
            loop {
                if *changes.borrow_and_update() == Enforcement::On {
                    return;
                }
                if changes.changed().await.is_err() {
                    // The view is gone: the mode can no longer change.
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// The etcd side; `None` before the mode was read.
    pub(crate) fn store(&self) -> Option<AuthModeStore> {
        self.inner.store.get().cloned()
    }

    /// Applies a stored value (read, or delivered by the watch).
    fn apply(&self, stored: &StoredMode) {
        let value = StoredValue::of(stored);
        let now = value.enforcement();
        let before = self.inner.state.swap(encode(now), Ordering::AcqRel);
        if before == encode(now) {
            return;
        }
        self.inner.changes.send_replace(now);
        match &value {
            StoredValue::Unreadable(text) => {
                error!(key = AUTH_MODE, value = %text, "the cluster's security mode is neither on nor off; API keys are required until it is repaired")
            }
            _ if now == Enforcement::On => {
                info!(
                    key = AUTH_MODE,
                    "the cluster's security mode is on: API keys are required"
                )
            }
            _ => {
                info!(key = AUTH_MODE, stored = ?value, "the cluster's security mode is off: calls are served without API keys")
            }
        }
    }

    /// Reads the stored mode (writing `on` first when `--auth on` finds it
    /// absent, guarded on a usable admin key: `first`), checks it against `--auth` and starts to follow it until
    /// `shutdown`. Errors: [`StoreError::AuthModeMismatch`] when the flag
    /// disagrees (the server must not start), or what etcd answered
    /// (retried by the caller). Call until it succeeds, then no more.
    pub(crate) async fn settle(
        &self,
        store: AuthModeStore,
        first: FirstOn<'_>,
        shutdown: CancellationToken,
    ) -> Result<(), StoreError> {
        let (mut stored, mut revision) = store.read().await?;
        if self.inner.flag == Some(AuthMode::On) && stored.value.is_none() {
            let (keys, bootstrap, clock) = first;
            let (key_id, at) = super::first_mode::admin_key_for_on(keys, bootstrap, clock).await?;
            match store.write(b"on", 0, Some((&key_id, at))).await? {
                Ok(at) => {
                    info!(key = AUTH_MODE, "--auth on: set the cluster's security mode to on; every server now requires API keys");
                    (stored, revision) = (
                        StoredMode {
                            value: Some(b"on".to_vec()),
                            mod_revision: at,
                        },
                        at,
                    );
                }
                Err(now) => {
                    // Written meanwhile by someone else: judge what is there.
                    revision = now.mod_revision.max(revision);
                    stored = now;
                }
            }
        }
        if let Some(problem) = mismatch(self.inner.flag, &StoredValue::of(&stored)) {
            return Err(StoreError::AuthModeMismatch { problem });
        }
        self.apply(&stored);
        if self.inner.store.set(store.clone()).is_ok() {
            let view = self.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = view.follow(store, revision) => {}
                }
            });
        }
        Ok(())
    }

    /// Follows the mode key from just after `revision`, reading it again
    /// after a watch failure or a compaction.
    async fn follow(&self, store: AuthModeStore, mut revision: i64) {
        loop {
            match store.follow(revision + 1, |s| self.apply(&s)).await {
                FollowEnd::Compacted => {
                    info!(
                        "the security mode watch fell behind a compaction; reading the mode again"
                    )
                }
                FollowEnd::Failed => tokio::time::sleep(RETRY).await,
            }
            loop {
                match store.read().await {
                    Ok((stored, at)) => {
                        self.apply(&stored);
                        revision = at;
                        break;
                    }
                    Err(e) => {
                        warn!(error = %snowkeep_core::DisplayChain(&e), "cannot read the cluster's security mode from etcd; the last mode read stays in force; retrying");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(value: Option<&str>) -> StoredValue {
        StoredValue::of(&StoredMode {
            value: value.map(|v| v.as_bytes().to_vec()),
            mod_revision: 7,
        })
    }

    #[test]
    fn only_off_and_absent_serve_without_keys() {
        assert_eq!(stored(None).enforcement(), Enforcement::Off);
        assert_eq!(stored(Some("off")).enforcement(), Enforcement::Off);
        assert_eq!(stored(Some("on")).enforcement(), Enforcement::On);
        assert_eq!(stored(Some("On")), StoredValue::Unreadable("On".into()));
        assert_eq!(stored(Some("")).enforcement(), Enforcement::On);
    }

    #[test]
    fn an_explicit_flag_that_disagrees_with_the_stored_mode_is_refused() {
        let off = Some(AuthMode::Off);
        let on = Some(AuthMode::On);
        assert_eq!(mismatch(None, &stored(Some("on"))), None);
        assert_eq!(mismatch(None, &stored(Some("off"))), None);
        assert_eq!(mismatch(on, &stored(Some("on"))), None);
        assert_eq!(mismatch(off, &stored(None)), None);
        assert_eq!(mismatch(off, &stored(Some("off"))), None);
        assert_eq!(
            mismatch(off, &stored(Some("on"))).unwrap(),
            "--auth off, but the cluster's security mode in etcd (/snowkeep/v1/auth-mode) is on: every server requires API keys. Remove --auth off (env SNOWKEEP_AUTH) so this server follows the cluster; only an admin key can turn keys off, with `snowkeepctl --api-key-file ADMIN_KEY auth disable`"
        );
        assert!(mismatch(on, &stored(Some("off"))).unwrap().starts_with(
            "--auth on, but the cluster's security mode in etcd (/snowkeep/v1/auth-mode) is off"
        ));
        assert!(mismatch(off, &stored(Some("yes")))
            .unwrap()
            .contains("holds \"yes\", neither on nor off"));
    }

    #[test]
    fn a_server_checks_keys_from_the_start_only_with_auth_on() {
        assert_eq!(
            ClusterAuth::on_etcd(Some(AuthMode::On)).enforcement(),
            Enforcement::On
        );
        assert_eq!(
            ClusterAuth::on_etcd(None).enforcement(),
            Enforcement::Unknown
        );
        assert_eq!(
            ClusterAuth::on_etcd(Some(AuthMode::Off)).enforcement(),
            Enforcement::Unknown
        );
        assert_eq!(ClusterAuth::off().enforcement(), Enforcement::Off);
        let view = ClusterAuth::on_etcd(None);
        view.apply(&StoredMode {
            value: Some(b"on".to_vec()),
            mod_revision: 3,
        });
        assert_eq!(view.enforcement(), Enforcement::On);
        view.apply(&StoredMode {
            value: None,
            mod_revision: 0,
        });
        assert_eq!(view.enforcement(), Enforcement::Off);
    }
}
