//! Commands on API keys and the audit trail.

use anyhow::{bail, Context};
use snowkeep_client::{Clock, Millis};
use snowkeep_proto::v1 as pb;

use crate::conn::ConnArgs;
use crate::output::{print, shown, Output};

/// A permission as snowkeepctl names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PermissionArg {
    /// IdService.
    Ids,
    /// LeaseService (the Lease API).
    Lease,
    /// AdminService.
    Admin,
}

impl PermissionArg {
    fn to_pb(self) -> pb::Permission {
        match self {
            PermissionArg::Ids => pb::Permission::Ids,
            PermissionArg::Lease => pb::Permission::Lease,
            PermissionArg::Admin => pb::Permission::Admin,
        }
    }
}

/// API key commands.
#[derive(clap::Subcommand)]
pub enum KeyCommand {
    /// Create an API key; its secret is printed once, here (or written to
    /// --secret-file).
    Create(CreateArgs),
    /// List API keys (never their secrets).
    List,
    /// Set a key's expiry: now, or at --at.
    Expire {
        /// The key id (before the dot).
        id: String,
        /// When: a duration from now (1h) or an RFC 3339 time; now when left out.
        #[arg(long)]
        at: Option<String>,
    },
    /// Revoke a key for good.
    Revoke {
        /// The key id (before the dot).
        id: String,
    },
    /// Print a fresh random key `<id>.<secret>`, offline (no server): the
    /// content of a `--bootstrap-admin-key-file`. It is a key only once a
    /// server has written it to etcd.
    Generate,
}

/// `key create`.
#[derive(clap::Args)]
pub struct CreateArgs {
    /// What the key is for.
    #[arg(long)]
    description: String,
    /// When it stops working: a duration from now (30d, 12h) or an RFC
    /// 3339 time (2026-07-01T00:00:00Z); never when left out.
    #[arg(long)]
    expires: Option<String>,
    /// A namespace it may use (repeat for more); all when left out.
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// What it may call (repeat for more): ids, lease, admin.
    #[arg(long = "permission", value_enum, required = true)]
    permissions: Vec<PermissionArg>,
    /// The most machine ids its requesters may hold at once through the
    /// Lease API, cluster-wide.
    #[arg(long, default_value_t = 0)]
    max_lease_machine_ids: u32,
    /// Write the key (`<id>.<secret>` and a newline) to this new file,
    /// readable by its owner only (mode 0600), instead of printing the
    /// secret; fails if the file exists.
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
    /// Create the key even when a --namespace does not exist in the
    /// cluster (yet); warns on stderr. Without it, such a namespace is
    /// refused: it is most often a typo.
    #[arg(long)]
    allow_missing_namespace: bool,
}

/// A time as given: a duration from `now_ms` or RFC 3339; ms since the epoch.
fn parse_when(text: &str, now_ms: u64) -> anyhow::Result<u64> {
    if let Ok(d) = humantime::parse_duration(text) {
        return Ok(Millis(now_ms).saturating_add(d).get());
    }
    let t = humantime::parse_rfc3339_weak(text).with_context(|| {
        format!(
            "{text:?} is neither a duration (30d, 12h) nor an RFC 3339 time (2026-07-01T00:00:00Z)"
        )
    })?;
    let since_epoch = t
        .duration_since(std::time::UNIX_EPOCH)
        .context("a time before 1970")?;
    Ok(Millis::of(since_epoch).get())
}

fn time(unix_ms: u64) -> String {
    if unix_ms == 0 {
        return "never".to_owned();
    }
    crate::output::utc(unix_ms, false)
}

fn permission_name(p: i32) -> &'static str {
    match pb::Permission::try_from(p) {
        Ok(pb::Permission::Ids) => "ids",
        Ok(pb::Permission::Lease) => "lease",
        Ok(pb::Permission::Admin) => "admin",
        _ => "?",
    }
}

fn key_json(k: &pb::ApiKey) -> serde_json::Value {
    serde_json::json!({
        "id": k.id,
        "description": k.description,
        "created_unix_ms": k.created_unix_ms,
        "expires_unix_ms": k.expires_unix_ms,
        "revoked": k.revoked,
        "namespaces": k.namespaces,
        "permissions": k.permissions.iter().map(|&p| permission_name(p)).collect::<Vec<_>>(),
        "max_lease_machine_ids": k.max_lease_machine_ids,
    })
}

const KEY_HEADER: &[&str] = &[
    "ID",
    "DESCRIPTION",
    "PERMISSIONS",
    "NAMESPACES",
    "MAX LEASE IDS",
    "CREATED",
    "EXPIRES",
    "REVOKED",
];

fn key_row(k: &pb::ApiKey) -> Vec<String> {
    vec![
        k.id.clone(),
        k.description.clone(),
        k.permissions
            .iter()
            .map(|&p| permission_name(p))
            .collect::<Vec<_>>()
            .join(","),
        if k.namespaces.is_empty() {
            "*".to_owned()
        } else {
            k.namespaces.join(",")
        },
        k.max_lease_machine_ids.to_string(),
        time(k.created_unix_ms),
        time(k.expires_unix_ms),
        k.revoked.to_string(),
    ]
}

impl KeyCommand {
    /// Runs the command.
    pub async fn run(self, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
        if let KeyCommand::Generate = self {
            return crate::output::line(snowkeep_client::api_key::generate_key());
        }
        let now = snowkeep_client::SystemClock.unix_ms();
        let mut admin = conn.admin().await?;
        match self {
            KeyCommand::Create(a) => create(a, &mut admin, now, output).await,
            KeyCommand::List => list(&mut admin, output).await,
            KeyCommand::Expire { id, at } => {
                let expires_unix_ms = at
                    .as_deref()
                    .map(|a| parse_when(a, now))
                    .transpose()?
                    .unwrap_or(0);
                let request = pb::ExpireKeyRequest {
                    id,
                    expires_unix_ms,
                };
                let r = admin.expire_key(request).await?.into_inner();
                print_key(&r.key.unwrap_or_default(), output)
            }
            KeyCommand::Revoke { id } => {
                let request = pb::RevokeKeyRequest { id };
                let r = admin.revoke_key(request).await?.into_inner();
                print_key(&r.key.unwrap_or_default(), output)
            }
            // Answered above, without a server.
            KeyCommand::Generate => Ok(()),
        }
    }
}

/// `key create`: checks the namespaces, creates the key and prints it with
/// its secret, or writes the secret to `--secret-file`.
async fn create(
    a: CreateArgs,
    admin: &mut crate::conn::Admin,
    now: u64,
    output: Output,
) -> anyhow::Result<()> {
    check_namespaces(admin, &a.namespaces, a.allow_missing_namespace).await?;
    let expires_unix_ms = a
        .expires
        .as_deref()
        .map(|e| parse_when(e, now))
        .transpose()?
        .unwrap_or(0);
    // Made before the key, so an existing file refuses before
    // a key nobody can use exists.
    let mut file = a
        .secret_file
        .as_deref()
        .map(|path| new_secret_file(path).map(|f| (path, f)))
        .transpose()?;
    let r = admin
        .create_key(pb::CreateKeyRequest {
            description: a.description,
            expires_unix_ms,
            namespaces: a.namespaces,
            permissions: a.permissions.iter().map(|p| p.to_pb() as i32).collect(),
            max_lease_machine_ids: a.max_lease_machine_ids,
        })
        .await;
    let r = match r {
        Ok(r) => r.into_inner(),
        Err(status) => {
            if let Some((path, _)) = file.take() {
                let _ = std::fs::remove_file(path);
            }
            return Err(status.into());
        }
    };
    let Some(key) = r.key else {
        bail!("the server answered without the key");
    };
    match file {
        Some((path, f)) => write_secret_file(&key, &r.secret, path, f, output),
        None => print_key_and_secret(&key, r.secret, output),
    }
}

/// Writes the key `<id>.<secret>` to the new `file` at `path` and prints
/// the key with where its secret went.
fn write_secret_file(
    key: &pb::ApiKey,
    secret: &str,
    path: &std::path::Path,
    mut file: std::fs::File,
    output: Output,
) -> anyhow::Result<()> {
    use std::io::Write;
    file.write_all(format!("{secret}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| {
            format!(
                "writing the key to {} (key {} exists: revoke it)",
                path.display(),
                key.id
            )
        })?;
    let mut json = key_json(key);
    json["secret_file"] = serde_json::Value::String(path.display().to_string());
    print(output, KEY_HEADER, vec![key_row(key)], json)?;
    if output == Output::Table {
        crate::output::line(format_args!(
            "the key (<id>.<secret>) is in {} (mode 0600): give it to the client",
            path.display()
        ))?;
    }
    Ok(())
}

/// Prints the key with its secret, the one time it is shown.
fn print_key_and_secret(key: &pb::ApiKey, secret: String, output: Output) -> anyhow::Result<()> {
    let mut json = key_json(key);
    json["secret"] = serde_json::Value::String(secret.clone());
    let mut row = key_row(key);
    row.push(secret);
    let mut header = KEY_HEADER.to_vec();
    header.push("SECRET (shown once: give it to the client now)");
    print(output, &header, vec![row], json)
}

/// `key list`: every key, never a secret.
async fn list(admin: &mut crate::conn::Admin, output: Output) -> anyhow::Result<()> {
    let r = admin.list_keys(pb::ListKeysRequest {}).await?.into_inner();
    let rows = r.keys.iter().map(key_row).collect();
    let json = serde_json::json!(r.keys.iter().map(key_json).collect::<Vec<_>>());
    print(output, KEY_HEADER, rows, json)
}

/// Prints one key as `key list` does.
fn print_key(key: &pb::ApiKey, output: Output) -> anyhow::Result<()> {
    print(output, KEY_HEADER, vec![key_row(key)], key_json(key))
}

/// Refuses a key for namespaces the cluster does not have (`snowkeepctl
/// namespaces` lists the ones it has), or with `allow_missing` warns about
/// each on stderr.
async fn check_namespaces(
    admin: &mut crate::conn::Admin,
    wanted: &[String],
    allow_missing: bool,
) -> anyhow::Result<()> {
    if wanted.is_empty() {
        return Ok(());
    }
    let known = admin
        .list_namespaces(pb::ListNamespacesRequest {})
        .await?
        .into_inner()
        .namespaces;
    for ns in wanted {
        if known.iter().any(|k| &k.name == ns) {
            continue;
        }
        if !allow_missing {
            bail!(
                "namespace {ns:?} does not exist in this cluster (snowkeepctl namespaces lists them): check the spelling, or pass --allow-missing-namespace for a namespace created later"
            );
        }
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "snowkeepctl: warning: namespace {ns:?} does not exist in this cluster yet: the key works there once it is created"
            );
        }
    }
    Ok(())
}

/// Audit trail commands.
#[derive(clap::Subcommand)]
pub enum AuditCommand {
    /// Follow the audit trail of the server answering (events from now on),
    /// one line (JSON with --output json) per event.
    Tail {
        /// Exit after this many events (for scripts); follow until
        /// interrupted when left out.
        #[arg(long)]
        count: Option<u64>,
    },
}

fn event_json(e: &pb::AuditEvent) -> serde_json::Value {
    serde_json::json!({
        "unix_ms": e.unix_ms,
        "action": e.action,
        "key_id": e.key_id,
        "peer": e.peer,
        "requester_hash": e.requester_hash,
        "namespace": e.namespace,
        "subject": e.subject,
        "result": e.result,
    })
}

impl AuditCommand {
    /// Runs the command.
    pub async fn run(self, conn: &ConnArgs, output: Output) -> anyhow::Result<()> {
        let AuditCommand::Tail { count } = self;
        let mut admin = conn.admin().await?;
        let mut stream = admin
            .tail_audit(pb::TailAuditRequest {})
            .await?
            .into_inner();
        let mut seen = 0u64;
        while count.is_none_or(|c| seen < c) {
            let Some(r) = stream.message().await? else {
                bail!("the server ended the audit stream");
            };
            let Some(e) = r.event else { continue };
            seen += 1;
            match output {
                // One compact JSON object per line, so scripts can read events as they come.
                Output::Json => crate::output::line(event_json(&e))?,
                // Every field escaped: no value can forge a line or reach the terminal raw.
                Output::Table => crate::output::line(format_args!(
                    "{} {} key={} peer={} requester={} namespace={} subject=\"{}\" result={}",
                    time(e.unix_ms),
                    shown(&e.action),
                    shown(or_dash(&e.key_id)),
                    shown(or_dash(&e.peer)),
                    shown(or_dash(&e.requester_hash)),
                    shown(or_dash(&e.namespace)),
                    shown(&e.subject).replace('"', "\\\""),
                    shown(&e.result)
                ))?,
            }
        }
        Ok(())
    }
}

/// Creates `path` for a key: new (an existing file is an error), readable
/// and writable by its owner only.
fn new_secret_file(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path).with_context(|| {
        format!(
            "--secret-file {}: cannot create it (it must not exist yet)",
            path.display()
        )
    })
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_is_a_duration_from_now_or_an_rfc3339_time() {
        assert_eq!(parse_when("30d", 1_000).unwrap(), 1_000 + 30 * 86_400_000);
        assert_eq!(
            parse_when("2026-01-01T00:00:00Z", 0).unwrap(),
            1_767_225_600_000
        );
        assert!(parse_when("soon", 0).is_err());
    }

    #[test]
    fn a_secret_file_is_new_and_private() {
        let dir = std::env::temp_dir().join(format!("snowkeepctl-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("orders.key");
        let _ = std::fs::remove_file(&path);
        drop(new_secret_file(&path).unwrap());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let err = new_secret_file(&path).unwrap_err();
        assert_eq!(
            format!("{err}"),
            format!(
                "--secret-file {}: cannot create it (it must not exist yet)",
                path.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
