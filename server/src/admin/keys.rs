//! The API-key half of `AdminService`: create, list, expire and revoke keys,
//! and tail the audit trail. Keys are read from and written to etcd (every
//! server answers the same); each change is one audit event (`key.create`,
//! `key.expire`, `key.revoke`, and `auth.enable` or `auth.disable` for the
//! cluster's security mode).

use std::pin::Pin;

use futures_util::Stream;
use snowkeep_client::SharedClock;
use snowkeep_proto::v1 as pb;
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status};

use crate::audit::{self, AuditEvent, Who};
use crate::auth::{ClusterAuth, KeyCache, KeyScope};
use crate::service::StoreAccess;
use snowkeep_core::api_key::{is_valid_id, KeyRecord, Permission, PresentedKey};
use snowkeep_core::claim::StoreError;
use snowkeep_etcd::apikeys::{ApiKeyStore, KeyWrite};

/// The stream TailAudit answers with.
pub type AuditStream = Pin<Box<dyn Stream<Item = Result<pb::TailAuditResponse, Status>> + Send>>;

/// Longest key description, characters.
const MAX_DESCRIPTION: usize = 256;
/// Most namespaces one key may name.
const MAX_NAMESPACES: usize = 64;
/// How often a changed record is re-read and written again when another
/// change raced it.
const UPDATE_ATTEMPTS: usize = 8;

/// Answers the key and audit RPCs.
#[derive(Clone)]
pub struct KeyAdmin {
    access: StoreAccess,
    cache: KeyCache,
    mode: ClusterAuth,
    clock: SharedClock,
}

fn unavailable(e: &StoreError) -> Status {
    Status::unavailable(format!(
        "etcd did not answer: {}; retry",
        snowkeep_core::DisplayChain(e)
    ))
}

impl KeyAdmin {
    /// Creates it on the server's store, with the server's key cache (to
    /// reach etcd, and to answer with a change at once), its view of the
    /// cluster's security mode and its clock.
    pub fn new(
        access: StoreAccess,
        cache: KeyCache,
        mode: ClusterAuth,
        clock: SharedClock,
    ) -> Self {
        Self {
            access,
            cache,
            mode,
            clock,
        }
    }

    /// The guard of a key change (see [`super::mode::keyless_guard`]):
    /// `None` for a call the authentication layer verified an admin key
    /// for, else the mod revision the security mode key must keep.
    async fn guard<T>(&self, request: &Request<T>) -> Result<Option<i64>, Status> {
        self.store()?;
        if request
            .extensions()
            .get::<std::sync::Arc<KeyScope>>()
            .is_some()
        {
            return Ok(None);
        }
        super::mode::keyless_guard(&self.mode).await.map(Some)
    }

    fn store(&self) -> Result<ApiKeyStore, Status> {
        if let StoreAccess::SingleInstance { .. } = self.access {
            return Err(Status::failed_precondition(
                "API keys are kept in etcd; this server runs on the single-instance store",
            ));
        }
        self.cache.store().ok_or_else(|| {
            Status::unavailable("this server has not reached etcd yet; retry shortly")
        })
    }

    fn audit<T>(&self, action: &'static str, who: Who, subject: &str, r: &Result<T, Status>) {
        audit::record(AuditEvent {
            unix_ms: self.clock.unix_ms(),
            action,
            who,
            requester: String::new(),
            namespace: String::new(),
            subject: subject.to_owned(),
            result: audit::result_of(r),
        });
    }

    /// See `AdminService.CreateKey`.
    pub async fn create_key(
        &self,
        request: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::CreateKeyResponse>, Status> {
        let who = Who::of(request.extensions());
        let key = PresentedKey::generate();
        let result = match self.guard(&request).await {
            Ok(guard) => self.create(key.clone(), request.into_inner(), guard).await,
            Err(refused) => Err(refused),
        };
        self.audit("key.create", who, key.id(), &result);
        result
    }

    async fn create(
        &self,
        key: PresentedKey,
        req: pb::CreateKeyRequest,
        guard: Option<i64>,
    ) -> Result<Response<pb::CreateKeyResponse>, Status> {
        let permissions = checked_key_request(&req)?;
        let now = self.clock.unix_ms();
        if req.expires_unix_ms != 0 && req.expires_unix_ms <= now {
            return Err(Status::invalid_argument(format!(
                "expires_unix_ms {} is not in the future (now {now}); 0 never expires",
                req.expires_unix_ms
            )));
        }
        let mut namespaces = req.namespaces;
        namespaces.sort();
        namespaces.dedup();
        let record = KeyRecord {
            id: key.id().to_owned(),
            description: req.description,
            created_unix_ms: now,
            expires_unix_ms: req.expires_unix_ms,
            revoked: false,
            namespaces,
            permissions,
            max_lease_machine_ids: req.max_lease_machine_ids,
            secret_sha256: key.secret_sha256(),
        };
        let store = self.store()?;
        let revision = match store
            .create(key.id(), record.to_json().as_bytes(), guard)
            .await
            .map_err(|e| unavailable(&e))?
        {
            KeyWrite::Written(revision) => revision,
            // 48 random bits met an existing id.
            KeyWrite::Conflict => {
                return Err(Status::aborted("the generated key id exists; retry"))
            }
            KeyWrite::ModeChanged => return Err(super::mode::mode_changed()),
        };
        self.cache.note(record.clone(), revision);
        Ok(Response::new(pb::CreateKeyResponse {
            key: Some(key_to_pb(&record)),
            secret: key.reveal(),
        }))
    }

    /// See `AdminService.ListKeys`.
    pub async fn list_keys(
        &self,
        request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        self.guard(&request).await?;
        let (stored, _) = self.store()?.list().await.map_err(|e| unavailable(&e))?;
        let mut keys: Vec<pb::ApiKey> = stored
            .iter()
            .filter_map(|s| KeyRecord::from_json(&s.value).ok())
            .map(|r| key_to_pb(&r))
            .collect();
        keys.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Response::new(pb::ListKeysResponse { keys }))
    }

    /// INVALID_ARGUMENT for a malformed key id, checked before a call is
    /// audited: the id of a call that names no key is no one's to log.
    fn checked_id(id: &str) -> Result<(), Status> {
        if is_valid_id(id) {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "invalid key id {id:?}: 1 to 64 characters of A-Z a-z 0-9 _ - (the part of the key before the dot)"
        )))
    }

    /// Reads the record of `id`, applies `change` and writes it back unless
    /// another write came in between (then again, a few times).
    async fn update(
        &self,
        id: &str,
        guard: Option<i64>,
        change: impl Fn(&mut KeyRecord),
    ) -> Result<KeyRecord, Status> {
        if !is_valid_id(id) {
            return Err(Status::invalid_argument(format!(
                "invalid key id {id:?}: 1 to 64 characters of A-Z a-z 0-9 _ - (the part of the key before the dot)"
            )));
        }
        let store = self.store()?;
        for _ in 0..UPDATE_ATTEMPTS {
            let stored = store
                .get(id)
                .await
                .map_err(|e| unavailable(&e))?
                .ok_or_else(|| {
                    Status::not_found(format!("no API key {id}; snowkeepctl key list shows them"))
                })?;
            let mut record = KeyRecord::from_json(&stored.value).map_err(|problem| {
                Status::failed_precondition(format!(
                    "the record of API key {id} is unreadable ({problem}); repair or delete {}",
                    snowkeep_etcd::keys::apikey(id)
                ))
            })?;
            change(&mut record);
            match store
                .replace(id, record.to_json().as_bytes(), stored.mod_revision, guard)
                .await
                .map_err(|e| unavailable(&e))?
            {
                KeyWrite::Written(revision) => {
                    self.cache.note(record.clone(), revision);
                    return Ok(record);
                }
                KeyWrite::Conflict => {}
                KeyWrite::ModeChanged => return Err(super::mode::mode_changed()),
            }
        }
        Err(Status::aborted(format!(
            "API key {id} kept changing under this update; retry"
        )))
    }

    /// See `AdminService.ExpireKey`.
    pub async fn expire_key(
        &self,
        request: Request<pb::ExpireKeyRequest>,
    ) -> Result<Response<pb::ExpireKeyResponse>, Status> {
        let who = Who::of(request.extensions());
        let guard = self.guard(&request).await;
        let req = request.into_inner();
        Self::checked_id(&req.id)?;
        let at = match req.expires_unix_ms {
            0 => self.clock.unix_ms(),
            at => at,
        };
        let result = match guard {
            Ok(guard) => {
                self.update(&req.id, guard, |r| r.expires_unix_ms = at)
                    .await
            }
            Err(refused) => Err(refused),
        }
        .map(|r| {
            Response::new(pb::ExpireKeyResponse {
                key: Some(key_to_pb(&r)),
            })
        });
        self.audit("key.expire", who, &req.id, &result);
        result
    }

    /// See `AdminService.RevokeKey`.
    pub async fn revoke_key(
        &self,
        request: Request<pb::RevokeKeyRequest>,
    ) -> Result<Response<pb::RevokeKeyResponse>, Status> {
        let who = Who::of(request.extensions());
        let guard = self.guard(&request).await;
        let req = request.into_inner();
        Self::checked_id(&req.id)?;
        let result = match guard {
            Ok(guard) => self.update(&req.id, guard, |r| r.revoked = true).await,
            Err(refused) => Err(refused),
        }
        .map(|r| {
            Response::new(pb::RevokeKeyResponse {
                key: Some(key_to_pb(&r)),
            })
        });
        self.audit("key.revoke", who, &req.id, &result);
        result
    }

    /// See `AdminService.SetAuthMode`: one audit event, `auth.enable` or
    /// `auth.disable`.
    pub async fn set_auth_mode(
        &self,
        request: Request<pb::SetAuthModeRequest>,
    ) -> Result<Response<pb::SetAuthModeResponse>, Status> {
        let who = Who::of(request.extensions());
        let authenticated = request
            .extensions()
            .get::<std::sync::Arc<KeyScope>>()
            .is_some();
        let enabled = request.into_inner().enabled;
        let result = match self.store() {
            Ok(_) => {
                let now = self.clock.unix_ms();
                super::mode::set(&self.mode, &self.cache, now, enabled, authenticated)
                    .await
                    .map(Response::new)
            }
            Err(refused) => Err(refused),
        };
        let action = if enabled {
            "auth.enable"
        } else {
            "auth.disable"
        };
        self.audit(action, who, snowkeep_etcd::keys::AUTH_MODE, &result);
        result
    }

    /// See `AdminService.TailAudit`: the events this server records from
    /// now on. A follower that falls more than the backlog behind gets an
    /// event of action `audit.missed` whose subject says how many it
    /// missed, and goes on.
    pub async fn tail_audit(
        &self,
        _request: Request<pb::TailAuditRequest>,
    ) -> Result<Response<AuditStream>, Status> {
        let rx = audit::subscribe();
        let clock = self.clock.clone();
        let stream = futures_util::stream::unfold(rx, move |mut rx| {
            let clock = clock.clone();
            async move {
                let event = match rx.recv().await {
                    Ok(e) => event_to_pb(e),
                    Err(RecvError::Lagged(n)) => pb::AuditEvent {
                        unix_ms: clock.unix_ms(),
                        action: "audit.missed".to_owned(),
                        subject: format!("{n} events missed: this follower fell behind"),
                        result: "ok".to_owned(),
                        ..Default::default()
                    },
                    Err(RecvError::Closed) => return None,
                };
                Some((Ok(pb::TailAuditResponse { event: Some(event) }), rx))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

fn event_to_pb(e: AuditEvent) -> pb::AuditEvent {
    pb::AuditEvent {
        unix_ms: e.unix_ms,
        action: e.action.to_owned(),
        key_id: e.who.key_id,
        peer: e.who.peer,
        requester_hash: e.requester,
        namespace: e.namespace,
        subject: e.subject,
        result: e.result,
    }
}

/// A permission from the protobuf enum; `None` for `PERMISSION_UNSPECIFIED`
/// or an unknown value.
fn permission_from_pb(value: i32) -> Option<Permission> {
    match pb::Permission::try_from(value).ok()? {
        pb::Permission::Ids => Some(Permission::Ids),
        pb::Permission::Lease => Some(Permission::Lease),
        pb::Permission::Admin => Some(Permission::Admin),
        pb::Permission::Unspecified => None,
    }
}

/// The protobuf enum value of a permission.
fn permission_to_pb(permission: Permission) -> pb::Permission {
    match permission {
        Permission::Ids => pb::Permission::Ids,
        Permission::Lease => pb::Permission::Lease,
        Permission::Admin => pb::Permission::Admin,
    }
}

/// The administration service's view of a key record (never the hash).
fn key_to_pb(record: &KeyRecord) -> pb::ApiKey {
    pb::ApiKey {
        id: record.id.clone(),
        description: record.description.clone(),
        created_unix_ms: record.created_unix_ms,
        expires_unix_ms: record.expires_unix_ms,
        revoked: record.revoked,
        namespaces: record.namespaces.clone(),
        permissions: record
            .permissions
            .iter()
            .map(|&p| permission_to_pb(p) as i32)
            .collect(),
        max_lease_machine_ids: record.max_lease_machine_ids,
    }
}

/// The permissions of a CreateKey request, sorted and without repeats, once
/// its description, namespaces and permissions are checked, in that order:
/// INVALID_ARGUMENT with what to change for the first that is not right.
fn checked_key_request(req: &pb::CreateKeyRequest) -> Result<Vec<Permission>, Status> {
    if req.description.chars().count() > MAX_DESCRIPTION
        || req.description.chars().any(char::is_control)
    {
        return Err(Status::invalid_argument(format!(
            "a description is at most {MAX_DESCRIPTION} characters without control characters"
        )));
    }
    if req.namespaces.len() > MAX_NAMESPACES {
        return Err(Status::invalid_argument(format!(
            "a key names at most {MAX_NAMESPACES} namespaces (none: all)"
        )));
    }
    if let Some(bad) = req
        .namespaces
        .iter()
        .find(|n| !snowkeep_core::namespace::is_valid_namespace(n))
    {
        return Err(Status::invalid_argument(format!(
            "invalid namespace {bad:?}: a namespace is {}",
            snowkeep_core::namespace::NAMESPACE_RULE
        )));
    }
    let mut permissions = Vec::new();
    for &p in &req.permissions {
        let p = permission_from_pb(p).ok_or_else(|| {
            Status::invalid_argument(format!(
                "unknown permission {p}: use PERMISSION_IDS, PERMISSION_LEASE or PERMISSION_ADMIN"
            ))
        })?;
        if !permissions.contains(&p) {
            permissions.push(p);
        }
    }
    if permissions.is_empty() {
        return Err(Status::invalid_argument(
            "a key needs at least one permission (ids, lease, admin)",
        ));
    }
    permissions.sort();
    if permissions.contains(&Permission::Admin) && !req.namespaces.is_empty() {
        // Administration acts on the whole cluster (keys, export,
        // import, every namespace's holders): a scoped admin key would
        // only look scoped.
        return Err(Status::invalid_argument(
            "an admin key cannot be limited to namespaces: administration acts on the whole cluster (keys, export, import); create it without --namespace, or give the key only ids and lease",
        ));
    }
    Ok(permissions)
}
