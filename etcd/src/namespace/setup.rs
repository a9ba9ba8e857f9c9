//! Opening the namespace when the server connects: create it, confirm a
//! floor, or check it is usable.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use snowkeep_client::Millis;
use tracing::{info, warn};

use super::super::fence_count::CountBase;
use super::super::{keys, restore_record, Endpoints, EtcdStore};
use super::{check_floor, guard, progress, read, NamespaceRecord, NamespaceSetup, NamespaceState};
use snowkeep_core::claim::StoreError;
use snowkeep_core::text::rfc3339;

/// What a confirmation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The namespace floor now, layout ms.
    pub floor: Millis,
    /// The gap acknowledged.
    pub acknowledged_gap: i64,
    /// Holder keys and requester records removed.
    pub cleared_keys: i64,
    /// Leases revoked.
    pub revoked_leases: usize,
}

/// Confirms `floor` (layout ms) on an existing namespace: in one transaction
/// guarded by the record read at `mod_revision`, raises the namespace floor,
/// records the current gap as acknowledged, sets state `ok`, and removes every
/// holder key and requester record (every holder starts over above the floor);
/// then revokes the leases they were bound to.
async fn confirm_existing(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    record: NamespaceRecord,
    mod_revision: i64,
    floor: Millis,
    unix_ms: u64,
) -> Result<Option<Confirmed>, StoreError> {
    let key = keys::layout(namespace);
    let holder_prefix = keys::holder_prefix(namespace);
    let requester_prefix = keys::requester(namespace, "");
    let leases = leases_under(endpoints, timeout, [&holder_prefix, &requester_prefix]).await?;
    let progress = progress(endpoints, timeout).await?;
    let was = record.state.clone();
    let record = record.with_incarnation();
    let new = NamespaceRecord {
        state: NamespaceState::Ok,
        floor: record.floor.max(floor),
        acknowledged_gap: progress.gap(),
        confirmed_at: Some(rfc3339(unix_ms)),
        ..record
    };
    // The failure branch reads the record: a transaction retried on another
    // endpoint after its first attempt committed (and the answer was lost)
    // finds exactly this new record, and must not confirm again (a second
    // confirmation would clear holders that claimed above the floor since).
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            mod_revision,
        )])
        .and_then([
            TxnOp::delete(holder_prefix, Some(DeleteOptions::new().with_prefix())),
            TxnOp::delete(requester_prefix, Some(DeleteOptions::new().with_prefix())),
            TxnOp::put(key.clone(), new.encode(), None),
        ])
        .or_else([TxnOp::get(key, None)]);
    let resp = endpoints.txn("confirm floor", timeout, txn).await?;
    if !resp.succeeded() && !holds_value(&resp, &new.encode()) {
        return Ok(None);
    }
    let cleared_keys = resp
        .op_responses()
        .into_iter()
        .map(|r| match r {
            etcd_client::TxnOpResponse::Delete(d) => d.deleted(),
            _ => 0,
        })
        .sum();
    let mut revoked_leases = 0;
    for lease in leases {
        if endpoints.revoke(timeout, lease).await.is_ok() {
            revoked_leases += 1;
        }
    }
    if was == NamespaceState::Ok {
        warn!(
            namespace,
            "the namespace was not marked rolled back; confirmed the floor anyway"
        );
    }
    Ok(Some(Confirmed {
        floor: new.floor,
        acknowledged_gap: new.acknowledged_gap,
        cleared_keys,
        revoked_leases,
    }))
}

/// The etcd leases of the keys under `prefixes` (keys on no lease left
/// out), each once, in order.
async fn leases_under(
    endpoints: &Endpoints,
    timeout: Duration,
    prefixes: [&String; 2],
) -> Result<std::collections::BTreeSet<i64>, StoreError> {
    let mut leases = std::collections::BTreeSet::new();
    for prefix in prefixes {
        let resp = endpoints
            .call("read holders", timeout, |mut c| {
                let p = prefix.clone();
                async move {
                    c.get(p, Some(GetOptions::new().with_prefix().with_keys_only()))
                        .await
                }
            })
            .await?;
        leases.extend(resp.kvs().iter().map(|kv| kv.lease()).filter(|&l| l != 0));
    }
    Ok(leases)
}

/// True when `resp` (a failed transaction whose `or_else` read one key)
/// found the key holding `value`.
fn holds_value(resp: &etcd_client::TxnResponse, value: &str) -> bool {
    resp.op_responses().into_iter().any(|r| match r {
        etcd_client::TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == value.as_bytes()),
        _ => false,
    })
}

/// Creates the record when the key is absent; `Ok(None)` when it already
/// existed. When nothing at all is stored under the namespace's prefix (so no
/// fence key can have been deleted from it), the same transaction, guarded
/// by the whole prefix being empty, writes the fence-count root (`base 0`):
/// `Ok(Some(true))`. When keys are there without a record (it was deleted by
/// hand, say) the record alone is created, guarded by `create_revision ==
/// 0`: `Ok(Some(false))`, and each fence-count block is counted from its
/// first claim of a machine id without a fence key, which starts one fence
/// lead ahead. A transaction retried on another endpoint after its
/// first attempt committed finds this very record (its incarnation is
/// random) and counts as created.
async fn create(
    endpoints: &Endpoints,
    timeout: Duration,
    namespace: &str,
    record: &NamespaceRecord,
) -> Result<Option<bool>, StoreError> {
    let key = keys::layout(namespace);
    let value = record.encode();
    let ops = [
        TxnOp::put(key.clone(), value.clone(), None),
        TxnOp::put(
            keys::fence_count_root(namespace),
            CountBase::NEW.encode(),
            None,
        ),
    ];
    let empty = Compare::create_revision(keys::namespace_prefix(namespace), CompareOp::Equal, 0)
        .with_prefix();
    // Without a floor, only on an etcd never restored by the script: a
    // restore between the caller's check and here fails both transactions,
    // and the caller's next look refuses.
    let guards = |first: Compare| {
        let mut guards = vec![first];
        guards.extend(record.confirmed_at.is_none().then(restore_record::absent));
        guards
    };
    let txn = Txn::new()
        .when(guards(empty))
        .and_then(ops)
        .or_else([TxnOp::get(key.clone(), None)]);
    let resp = endpoints.txn("create namespace", timeout, txn).await?;
    if resp.succeeded() || holds_value(&resp, &value) {
        return Ok(Some(true));
    }
    let found_record = resp.op_responses().into_iter().any(|r| match r {
        etcd_client::TxnOpResponse::Get(get) => !get.kvs().is_empty(),
        _ => false,
    });
    if found_record {
        return Ok(None);
    }
    let txn = Txn::new()
        .when(guards(Compare::create_revision(
            key.clone(),
            CompareOp::Equal,
            0,
        )))
        .and_then([TxnOp::put(key.clone(), value.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    let resp = endpoints.txn("create namespace", timeout, txn).await?;
    Ok((resp.succeeded() || holds_value(&resp, &value)).then_some(false))
}

impl EtcdStore {
    fn endpoint_list(&self) -> String {
        self.settings.endpoints.join(",")
    }

    fn layout_ms(&self, unix_ms: u64) -> Millis {
        self.layout.to_layout_ms(unix_ms).unwrap_or_default()
    }

    /// Opens the namespace at connect, as [`NamespaceSetup`] says:
    ///
    /// * no record: create it with `create`, else
    ///   [`StoreError::NamespaceNotCreated`] (with `confirm_floor` too, the new
    ///   record carries the floor);
    /// * a record: check its layout ([`StoreError::LayoutMismatch`]); with
    ///   `confirm_floor`, confirm it; else refuse a rolled-back namespace or
    ///   a store that shows a restore ([`StoreError::NamespaceRolledBack`],
    ///   marking it), then, with `create`, upgrade an older version's record.
    ///
    /// The first request after [`EtcdStore::new`]. Each request fails over
    /// to the next endpoint like any other; with a retryable error when no
    /// endpoint answers, call it again (it starts on the endpoint after the
    /// last one that failed).
    pub async fn open_namespace(&mut self) -> Result<(), StoreError> {
        let timeout = self.settings.request_timeout;
        let setup = self.settings.namespace_setup.clone();
        let ns = self.settings.namespace.clone();
        if let Some(spec) = setup.confirm_floor {
            check_floor(spec, self.clock.unix_ms())?;
        }
        for _ in 0..8 {
            let unix_ms = self.clock.unix_ms();
            let floor = setup
                .confirm_floor
                .map(|f| self.layout_ms(f.resolve(unix_ms)));
            let Some((record, mod_revision)) = read(&self.endpoints, timeout, &ns).await? else {
                if self.create_namespace(&setup, floor, unix_ms).await? {
                    return Ok(());
                }
                continue; // created concurrently: check theirs
            };
            if record.layout != self.layout {
                return Err(StoreError::LayoutMismatch {
                    namespace: ns,
                    stored: record.layout,
                    configured: self.layout,
                });
            }
            if let Some(wanted) = setup.migration_floor.filter(|&w| w > record.floor) {
                return Err(StoreError::MigrationFloorNotSet {
                    namespace: ns,
                    floor: rfc3339(self.layout.to_unix_ms(record.floor)),
                    wanted: rfc3339(self.layout.to_unix_ms(wanted)),
                });
            }
            if let Some(floor) = floor {
                let confirmed = confirm_existing(
                    &self.endpoints,
                    timeout,
                    &ns,
                    record,
                    mod_revision,
                    floor,
                    unix_ms,
                )
                .await?;
                match confirmed {
                    Some(c) => {
                        info!(namespace = %ns, floor_ms = c.floor.get(), floor = %rfc3339(self.layout.to_unix_ms(c.floor)), acknowledged_gap = c.acknowledged_gap, cleared_keys = c.cleared_keys, revoked_leases = c.revoked_leases, "confirmed the namespace floor: claims resume, each above the floor");
                        return Ok(());
                    }
                    None => continue, // the record changed meanwhile
                }
            }
            let (record, mod_revision) = match record.refusal(&ns) {
                Some(refusal) => return Err(refusal),
                None => guard(&self.endpoints, timeout, &ns, unix_ms).await?,
            };
            if setup.create
                && record.incarnation == 0
                && !self.upgrade_record(&record, mod_revision).await?
            {
                continue;
            }
            return Ok(());
        }
        Err(StoreError::Timeout {
            op: "open namespace (the record kept changing)",
            after: timeout,
        })
    }

    /// The open of a namespace without a record: creates it as `setup`
    /// says (with the confirmed `floor`, when one is asked, stamped at
    /// `unix_ms`); `false` when another server created it meanwhile.
    /// [`StoreError::NamespaceNotCreated`] without `create`, and the refusal
    /// of a creation without a floor after a restore.
    async fn create_namespace(
        &self,
        setup: &NamespaceSetup,
        floor: Option<Millis>,
        unix_ms: u64,
    ) -> Result<bool, StoreError> {
        let timeout = self.settings.request_timeout;
        let ns = self.settings.namespace.as_str();
        let key = keys::layout(ns);
        if !setup.create {
            return Err(StoreError::NamespaceNotCreated {
                namespace: ns.to_owned(),
                endpoints: self.endpoint_list(),
            });
        }
        if floor.is_none() {
            let list = self.endpoint_list();
            restore_record::refuse_creation_without_floor(&self.endpoints, timeout, ns, list)
                .await?;
        }
        let gap = progress(&self.endpoints, timeout).await?.gap();
        let mut record = NamespaceRecord::new(self.layout, gap);
        if let Some(floor) = floor {
            record.floor = floor;
            record.confirmed_at = Some(rfc3339(unix_ms));
        }
        if let Some(migration) = setup.migration_floor {
            record.floor = record.floor.max(migration);
        }
        if let Some(counted) = create(&self.endpoints, timeout, ns, &record).await? {
            info!(namespace = %ns, key = %key, layout = %self.layout, incarnation = %format!("{:016x}", record.incarnation), floor_ms = record.floor.get(), acknowledged_gap = gap, fence_counts = counted, "created the namespace");
            if !counted {
                warn!(namespace = %ns, prefix = %keys::namespace_prefix(ns), "created the namespace over keys already stored under it: a fence key may have been deleted there, so in each fence-count block the first claim of a machine id without a fence key starts one fence lead ahead, and counts from then on");
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Gives an older version's `record` (read at `mod_revision`) an
    /// incarnation and a state, guarded by it being unchanged: `false` when
    /// it changed meanwhile.
    async fn upgrade_record(
        &self,
        record: &NamespaceRecord,
        mod_revision: i64,
    ) -> Result<bool, StoreError> {
        let timeout = self.settings.request_timeout;
        let ns = self.settings.namespace.as_str();
        let key = keys::layout(ns);
        let gap = progress(&self.endpoints, timeout).await?.gap();
        let upgraded = NamespaceRecord::new(record.layout, gap);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                mod_revision,
            )])
            .and_then([TxnOp::put(key.clone(), upgraded.encode(), None)]);
        if !self
            .endpoints
            .txn("upgrade namespace record", timeout, txn)
            .await?
            .succeeded()
        {
            return Ok(false);
        }
        info!(namespace = %ns, incarnation = %format!("{:016x}", upgraded.incarnation), "gave the namespace record of an older version an incarnation and a state");
        Ok(true)
    }

    /// The check before every claim and, while holding, on every renewal: the
    /// namespace exists and is `ok`, etcd shows no restore (one found is
    /// marked), the layout is still ours and the confirmed floor is within
    /// `--max-fence-wait`. Returns the namespace floor (layout ms).
    ///
    /// Errors: [`StoreError::NamespaceNotCreated`], [`StoreError::CorruptNamespace`],
    /// [`StoreError::NamespaceRolledBack`], [`StoreError::LayoutMismatch`],
    /// [`StoreError::NamespaceFloorAhead`], or the etcd failure.
    pub async fn guard_namespace(&mut self) -> Result<Millis, StoreError> {
        let timeout = self.settings.request_timeout;
        let unix_ms = self.clock.unix_ms();
        let ns = self.settings.namespace.clone();
        let (record, _) = match guard(&self.endpoints, timeout, &ns, unix_ms).await {
            Err(StoreError::UnknownNamespace { namespace }) => {
                return Err(StoreError::NamespaceNotCreated {
                    namespace,
                    endpoints: self.endpoint_list(),
                })
            }
            other => other?,
        };
        if record.layout != self.layout {
            return Err(StoreError::LayoutMismatch {
                namespace: ns,
                stored: record.layout,
                configured: self.layout,
            });
        }
        let now = self.layout_ms(unix_ms);
        let max_wait = self.settings.max_fence_wait;
        let ahead = Duration::from_millis(record.floor.get().saturating_sub(now.get()));
        if ahead > max_wait {
            return Err(StoreError::NamespaceFloorAhead {
                namespace: ns,
                until: rfc3339(self.layout.to_unix_ms(record.floor)),
                ahead,
                max: max_wait,
            });
        }
        Ok(record.floor)
    }
}
