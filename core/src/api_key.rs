//! API keys: the record kept in etcd ([`KeyRecord`]), the key a client
//! sends ([`PresentedKey`], `<id>.<secret>`), the check of one against the
//! other at a given time ([`KeyRecord::verify`]) and what a verified key may
//! do ([`KeyScope`]).
//!
//! Only the SHA-256 of a secret is stored; a presented secret is hashed and
//! compared in constant time. Neither a secret nor its hash is ever shown:
//! `Debug` of [`PresentedKey`] and [`BootstrapKey`] leaves them out.
//!
//! This module is data and checks only: the server's `auth` (the layer, the cache,
//! the security mode) and the etcd store that keeps the records both import
//! it, and it imports neither.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::text::{hex, unhex32};

/// What an API key may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// IdService (NextIds, StreamIds).
    Ids,
    /// LeaseService (the Lease API).
    Lease,
    /// AdminService.
    Admin,
}

impl Permission {
    /// The name used in JSON, messages and snowkeepctl: `ids`, `lease`, `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Ids => "ids",
            Permission::Lease => "lease",
            Permission::Admin => "admin",
        }
    }
}

/// An API key as stored at `/snowkeep/v1/apikeys/<id>` (JSON). Export and
/// import copy it verbatim.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The key id (the part before the dot).
    pub id: String,
    /// What the key is for.
    #[serde(default)]
    pub description: String,
    /// When it was created, ms since the Unix epoch.
    #[serde(default)]
    pub created_unix_ms: u64,
    /// When it stops working, ms since the Unix epoch; 0: never.
    #[serde(default)]
    pub expires_unix_ms: u64,
    /// True once revoked (for good).
    #[serde(default)]
    pub revoked: bool,
    /// The namespaces it may use; empty: all.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// What it may call.
    #[serde(default)]
    pub permissions: Vec<Permission>,
    /// The most machine ids its requesters may hold at once through the
    /// Lease API, cluster-wide; 0: none.
    #[serde(default)]
    pub max_lease_machine_ids: u32,
    /// The SHA-256 of the secret, 64 lower-case hex digits.
    pub secret_sha256: String,
}

impl std::fmt::Debug for KeyRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRecord")
            .field("id", &self.id)
            .field("expires_unix_ms", &self.expires_unix_ms)
            .field("revoked", &self.revoked)
            .field("namespaces", &self.namespaces)
            .field("permissions", &self.permissions)
            .field("max_lease_machine_ids", &self.max_lease_machine_ids)
            .finish_non_exhaustive()
    }
}

/// Why a call's API key was not accepted (all UNAUTHENTICATED). Messages
/// say what to do and never contain the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    /// No `authorization` metadata.
    #[error("no API key: authentication is on; send `authorization: Bearer <id>.<secret>` metadata with the key an administrator created (snowkeepctl key create)")]
    Missing,
    /// `authorization` is there but not `Bearer <id>.<secret>`.
    #[error("malformed API key: {0}; send `authorization: Bearer <id>.<secret>` metadata")]
    Malformed(&'static str),
    /// No key with this id (never created, or deleted).
    #[error("unknown API key id {0:?}: ask an administrator for a key (snowkeepctl key create)")]
    Unknown(String),
    /// The id exists but the secret does not match.
    #[error("wrong secret for API key {0}: send the whole key `<id>.<secret>` exactly as key create printed it")]
    WrongSecret(String),
    /// The key's expiry has passed.
    #[error("API key {id} expired at {at}: ask an administrator for a new key")]
    Expired {
        /// The key id.
        id: String,
        /// The expiry, RFC 3339.
        at: String,
    },
    /// The key was revoked.
    #[error("API key {0} is revoked: ask an administrator for a new key")]
    Revoked(String),
}

impl KeyRefusal {
    /// The `result` label of `snowkeep_auth_requests_total`.
    pub fn result(&self) -> &'static str {
        match self {
            KeyRefusal::Missing => "missing",
            KeyRefusal::Malformed(_) => "malformed",
            KeyRefusal::Unknown(_) => "unknown",
            KeyRefusal::WrongSecret(_) => "wrong_secret",
            KeyRefusal::Expired { .. } => "expired",
            KeyRefusal::Revoked(_) => "revoked",
        }
    }

    /// The `key_id` label: the id of a key that exists, `-` otherwise (so
    /// the label's values are bounded by the keys in etcd).
    pub fn key_label(&self) -> &str {
        match self {
            KeyRefusal::Missing | KeyRefusal::Malformed(_) | KeyRefusal::Unknown(_) => "-",
            KeyRefusal::WrongSecret(id) | KeyRefusal::Revoked(id) => id,
            KeyRefusal::Expired { id, .. } => id,
        }
    }
}

/// Longest key id.
pub const MAX_ID_LEN: usize = 64;
/// Shortest and longest secret, characters.
pub const SECRET_LEN: std::ops::RangeInclusive<usize> = 16..=256;

/// True for a valid key id: 1 to 64 characters of `A-Z a-z 0-9 _ -`.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(url_safe)
}

fn url_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// A key as a client sends it, `<id>.<secret>`. `Debug` shows the id only.
#[derive(Clone, PartialEq, Eq)]
pub struct PresentedKey {
    id: String,
    secret: String,
}

impl std::fmt::Debug for PresentedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PresentedKey({}.<secret>)", self.id)
    }
}

impl PresentedKey {
    /// Parses `<id>.<secret>`: the id as [`is_valid_id`], the secret 16 to
    /// 256 characters of `A-Z a-z 0-9 _ -`.
    pub fn parse(text: &str) -> Result<Self, KeyRefusal> {
        let (id, secret) = text.split_once('.').ok_or(KeyRefusal::Malformed(
            "a key is `<id>.<secret>` with one dot",
        ))?;
        if !is_valid_id(id) {
            return Err(KeyRefusal::Malformed(
                "the id (before the dot) is 1 to 64 characters of A-Z a-z 0-9 _ -",
            ));
        }
        if !SECRET_LEN.contains(&secret.len()) || !secret.bytes().all(url_safe) {
            return Err(KeyRefusal::Malformed(
                "the secret (after the dot) is 16 to 256 characters of A-Z a-z 0-9 _ -",
            ));
        }
        Ok(Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }

    /// Parses an `authorization` metadata value: `Bearer <id>.<secret>`
    /// (the scheme in any case); `None` stands for no metadata.
    pub fn from_authorization(value: Option<&[u8]>) -> Result<Self, KeyRefusal> {
        let value = value.ok_or(KeyRefusal::Missing)?;
        let text = std::str::from_utf8(value)
            .map_err(|_| KeyRefusal::Malformed("the authorization metadata is not text"))?;
        let (scheme, key) = text.trim().split_once(' ').ok_or(KeyRefusal::Malformed(
            "the authorization metadata is `Bearer <key>`",
        ))?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(KeyRefusal::Malformed(
                "the authorization scheme must be Bearer",
            ));
        }
        Self::parse(key.trim())
    }

    /// A fresh key: id `k` + 12 hex digits (48 random bits), secret 64 hex
    /// digits (32 random bytes).
    pub fn generate() -> Self {
        let text = snowkeep_client::api_key::generate_key();
        let (id, secret) = text.split_once('.').unwrap_or_default();
        Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
        }
    }

    /// The key id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `<id>.<secret>`, for the one answer that hands it out.
    pub fn reveal(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// The SHA-256 of the secret, hex, as a [`KeyRecord`] stores it.
    pub fn secret_sha256(&self) -> String {
        hex(&Sha256::digest(self.secret.as_bytes()))
    }
}

/// What a verified key may do: its id, namespaces and permissions. The
/// authentication layer puts it into the request's extensions (with
/// `audit::CallerKey`); absent when authentication is off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyScope {
    /// The key id.
    pub key_id: String,
    /// The namespaces it may use; empty: all.
    pub namespaces: Vec<String>,
    /// What it may call.
    pub permissions: Vec<Permission>,
    /// Lease API quota, machine ids held at once cluster-wide.
    pub max_lease_machine_ids: u32,
}

/// A key used for a namespace outside its scope; the message names the
/// namespaces it may use. The gRPC handlers answer it with PERMISSION_DENIED.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NamespaceDenied(String);

impl KeyScope {
    /// True when the key may use `namespace`.
    pub fn allows_namespace(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// PERMISSION_DENIED naming the namespaces the key may use, unless it
    /// may use `namespace`.
    ///
    /// # Errors
    /// [`NamespaceDenied`] (PERMISSION_DENIED on the wire) when it may not.
    pub fn check_namespace(&self, namespace: &str) -> Result<(), NamespaceDenied> {
        if self.allows_namespace(namespace) {
            return Ok(());
        }
        Err(NamespaceDenied(format!(
            "API key {} may not use namespace {namespace:?} (it may use: {}); use a key whose scope includes it",
            self.key_id,
            self.namespaces.join(", ")
        )))
    }

    /// True when the key carries `permission`.
    pub fn has(&self, permission: Permission) -> bool {
        self.permissions.contains(&permission)
    }

    /// Why an admin key limited to namespaces may not administer: the
    /// administration service and the status page act on the whole cluster.
    /// `None` for a key without namespaces.
    pub fn cluster_wide_refusal(&self) -> Option<String> {
        (!self.namespaces.is_empty()).then(|| {
            format!(
                "API key {} is limited to namespaces {:?}, but administration acts on the whole cluster: use an admin key without namespaces",
                self.key_id, self.namespaces
            )
        })
    }
}

impl KeyRecord {
    /// Checks `presented` (whose id is this record's) at `now_unix_ms`:
    /// secret (constant time), then revoked, then expiry. Returns what the
    /// key may do.
    pub fn verify(
        &self,
        presented: &PresentedKey,
        now_unix_ms: u64,
    ) -> Result<KeyScope, KeyRefusal> {
        let stored = unhex32(&self.secret_sha256);
        let given: [u8; 32] = Sha256::digest(presented.secret.as_bytes()).into();
        // A stored hash that does not parse matches nothing (all zeros is no
        // SHA-256 anyone can invert to).
        let hash_ok = stored.is_some();
        if !(bool::from(stored.unwrap_or_default().ct_eq(&given)) && hash_ok) {
            return Err(KeyRefusal::WrongSecret(self.id.clone()));
        }
        if self.revoked {
            return Err(KeyRefusal::Revoked(self.id.clone()));
        }
        if self.expires_unix_ms != 0 && now_unix_ms >= self.expires_unix_ms {
            return Err(KeyRefusal::Expired {
                id: self.id.clone(),
                at: crate::text::rfc3339(self.expires_unix_ms),
            });
        }
        Ok(self.scope())
    }

    /// What the key may do (checked or not).
    pub fn scope(&self) -> KeyScope {
        KeyScope {
            key_id: self.id.clone(),
            namespaces: self.namespaces.clone(),
            permissions: self.permissions.clone(),
            max_lease_machine_ids: self.max_lease_machine_ids,
        }
    }

    /// The JSON stored in etcd.
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers and lists always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a stored value; the error says what is wrong (never the value).
    pub fn from_json(value: &[u8]) -> Result<Self, String> {
        let record: KeyRecord = serde_json::from_slice(value).map_err(|e| e.to_string())?;
        if !is_valid_id(&record.id) {
            return Err(format!("invalid key id {:?}", record.id));
        }
        if unhex32(&record.secret_sha256).is_none() {
            return Err("secret_sha256 is not 64 hex digits".to_owned());
        }
        Ok(record)
    }
}

/// The key of `--bootstrap-admin-key-file`: its id and the SHA-256 of its
/// secret (the secret itself is dropped once hashed). `Debug` shows the id.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapKey {
    /// The key id.
    pub id: String,
    /// The SHA-256 of the secret, hex.
    pub secret_sha256: String,
}

impl std::fmt::Debug for BootstrapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BootstrapKey({})", self.id)
    }
}

impl BootstrapKey {
    /// The key in the first line of `text` (`<id>.<secret>`).
    pub fn parse(text: &str) -> Result<Self, KeyRefusal> {
        let key = PresentedKey::parse(text.lines().next().unwrap_or_default().trim())?;
        Ok(Self {
            id: key.id.clone(),
            secret_sha256: key.secret_sha256(),
        })
    }

    /// The record written when no key with this id exists: admin
    /// permission, all namespaces, no expiry, no Lease API quota.
    pub fn record(&self, now_unix_ms: u64) -> KeyRecord {
        KeyRecord {
            id: self.id.clone(),
            description: "bootstrap admin key (--bootstrap-admin-key-file)".to_owned(),
            created_unix_ms: now_unix_ms,
            expires_unix_ms: 0,
            revoked: false,
            namespaces: Vec::new(),
            permissions: vec![Permission::Admin],
            max_lease_machine_ids: 0,
            secret_sha256: self.secret_sha256.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &PresentedKey) -> KeyRecord {
        KeyRecord {
            id: key.id().to_owned(),
            description: "test".into(),
            created_unix_ms: 1_000,
            expires_unix_ms: 0,
            revoked: false,
            namespaces: vec!["orders".into()],
            permissions: vec![Permission::Ids, Permission::Lease],
            max_lease_machine_ids: 4,
            secret_sha256: key.secret_sha256(),
        }
    }

    #[test]
    fn a_generated_key_parses_back_and_verifies() {
        let key = PresentedKey::generate();
        assert_eq!(key.id().len(), 13);
        assert!(key.id().starts_with('k'));
        let text = key.reveal();
        assert_eq!(text.len(), 13 + 1 + 64);
        let parsed = PresentedKey::parse(&text).unwrap();
        assert_eq!(parsed, key);
        let scope = record(&key).verify(&parsed, 5_000).unwrap();
        assert_eq!(scope.key_id, key.id());
        assert_eq!(scope.max_lease_machine_ids, 4);
        assert!(scope.allows_namespace("orders"));
        assert!(!scope.allows_namespace("billing"));
        assert_eq!(
            scope.check_namespace("billing").unwrap_err().to_string(),
            format!(
                "API key {} may not use namespace \"billing\" (it may use: orders); use a key whose scope includes it",
                key.id()
            )
        );
        assert_ne!(PresentedKey::generate(), key);
    }

    #[test]
    fn only_the_hash_is_stored_and_debug_hides_the_secret() {
        let key = PresentedKey::generate();
        let rec = record(&key);
        let secret = key.reveal().split_once('.').unwrap().1.to_owned();
        assert!(!rec.to_json().contains(&secret));
        assert!(!format!("{rec:?}").contains(&rec.secret_sha256));
        assert!(!format!("{key:?}").contains(&secret));
        assert_eq!(rec.secret_sha256.len(), 64);
        assert_eq!(KeyRecord::from_json(rec.to_json().as_bytes()).unwrap(), rec);
    }

    #[test]
    fn a_wrong_secret_expired_or_revoked_key_is_refused() {
        let key = PresentedKey::generate();
        let other = PresentedKey::parse(&format!("{}.{}", key.id(), "a".repeat(64))).unwrap();
        let mut rec = record(&key);
        assert_eq!(
            rec.verify(&other, 5_000),
            Err(KeyRefusal::WrongSecret(key.id().to_owned()))
        );
        rec.expires_unix_ms = 5_000;
        assert!(rec.verify(&key, 4_999).is_ok(), "valid until its expiry");
        let expired = rec.verify(&key, 5_000).unwrap_err();
        assert_eq!(expired.result(), "expired");
        assert_eq!(
            expired.to_string(),
            format!(
                "API key {} expired at 1970-01-01T00:00:05Z: ask an administrator for a new key",
                key.id()
            )
        );
        rec.revoked = true;
        assert_eq!(
            rec.verify(&key, 0),
            Err(KeyRefusal::Revoked(key.id().to_owned()))
        );
        // A wrong secret is refused as such even for a revoked key: it says
        // nothing about the key's state to someone without its secret.
        assert_eq!(
            rec.verify(&other, 0),
            Err(KeyRefusal::WrongSecret(key.id().to_owned()))
        );
    }

    #[test]
    fn authorization_metadata_is_parsed_strictly() {
        let key = PresentedKey::generate();
        let header = format!("Bearer {}", key.reveal());
        assert_eq!(
            PresentedKey::from_authorization(Some(header.as_bytes())),
            Ok(key.clone())
        );
        let lower = format!("bearer {}", key.reveal());
        assert_eq!(
            PresentedKey::from_authorization(Some(lower.as_bytes())),
            Ok(key.clone())
        );
        assert_eq!(
            PresentedKey::from_authorization(None),
            Err(KeyRefusal::Missing)
        );
        for bad in [
            "Bearer",
            "Basic abc.defdefdefdefdefdefdef",
            "Bearer nodot",
            "Bearer .0123456789abcdef0123",
            "Bearer k1.short",
            "Bearer k/1.0123456789abcdef0123",
            "Bearer k1.0123456789abcdef01=3",
        ] {
            let refused = PresentedKey::from_authorization(Some(bad.as_bytes())).unwrap_err();
            assert_eq!(refused.result(), "malformed", "{bad}");
            assert_eq!(refused.key_label(), "-");
            assert!(
                refused.to_string().contains("Bearer <id>.<secret>"),
                "{refused}"
            );
        }
        let refused = KeyRefusal::Unknown("k1".into());
        assert_eq!(refused.key_label(), "-");
        assert_eq!(KeyRefusal::Revoked("k1".into()).key_label(), "k1");
    }

    #[test]
    fn a_stored_record_that_does_not_parse_is_refused() {
        assert!(KeyRecord::from_json(b"{").is_err());
        assert!(KeyRecord::from_json(br#"{"id":"k1","secret_sha256":"xyz"}"#).is_err());
        assert!(KeyRecord::from_json(br#"{"id":"k/1","secret_sha256":"00"}"#).is_err());
        let minimal = format!(r#"{{"id":"k1","secret_sha256":"{}"}}"#, "0".repeat(64));
        let rec = KeyRecord::from_json(minimal.as_bytes()).unwrap();
        assert!(rec.permissions.is_empty() && rec.namespaces.is_empty());
        let full = r#"{"id":"k1","permissions":["ids","lease","admin"],"secret_sha256":"00"}"#;
        assert!(KeyRecord::from_json(full.as_bytes()).is_err());
    }

    #[test]
    fn the_bootstrap_key_is_an_admin_key_read_from_the_first_line() {
        let key = PresentedKey::generate();
        let boot = BootstrapKey::parse(&format!("{}\n# comment\n", key.reveal())).unwrap();
        assert_eq!(boot.id, key.id());
        let rec = boot.record(7);
        assert_eq!(rec.permissions, vec![Permission::Admin]);
        assert!(rec.verify(&key, 8).is_ok());
        assert!(!format!("{boot:?}").contains(&boot.secret_sha256));
        assert!(BootstrapKey::parse("").is_err());
    }
}
