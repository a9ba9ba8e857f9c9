//! The namespace flags: the namespace, its layout, this instance's id, the
//! machine ids it claims, and the one-shot namespace setups.

use std::ops::Range;
use std::time::Duration;

use snowkeep_client::Layout;
use snowkeep_core::namespace::is_valid_namespace;
use snowkeep_etcd::namespace::{FloorSpec, NamespaceSetup};

use super::migration::migration_floor;
use super::{
    default_instance_id, ConfigError, StoreConfig, DEFAULT_LAYOUT, DEFAULT_NAMESPACE,
    MAX_MACHINE_IDS,
};

/// Which namespace this server issues in, as which instance, with how many machine ids.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Namespace and machine ids")]
pub struct NamespaceArgs {
    /// Namespace: an isolated pool of machine ids with one layout; 1-64
    /// characters of A-Z a-z 0-9 . _ -, starting with a letter or a digit.
    #[arg(long, env = "SNOWKEEP_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Id layout TIMESTAMP/MACHINE/SEQUENCE bits (sum 32 to 63), optional
    /// @EPOCH_UNIX_MS, optional /UNIT (1ms, 10ms, 100ms, 1s); or js53, the
    /// JavaScript-safe 39/6/8@1767225600000/10ms. A namespace keeps the layout
    /// it was created with.
    #[arg(long, env = "SNOWKEEP_LAYOUT", default_value = DEFAULT_LAYOUT)]
    pub layout: String,
    /// Instance id. Setting it marks a stable instance that gets its machine id
    /// back after a restart; default host:pid:random-suffix.
    #[arg(long, env = "SNOWKEEP_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Machine ids this instance holds under its one lease; a unary batch larger
    /// than one millisecond's sequence is spread across them.
    #[arg(long, env = "SNOWKEEP_MACHINE_IDS", default_value_t = 1)]
    pub machine_ids: u32,
    /// Machine ids this deployment may claim, START..END (END exclusive), so
    /// deployments with separate etcd clusters own disjoint ranges; default all.
    /// The single-instance store holds the first --machine-ids of it (5..6 means
    /// machine id 5).
    #[arg(long, env = "SNOWKEEP_MACHINE_ID_RANGE")]
    pub machine_id_range: Option<String>,
    /// Create the namespace in etcd if it does not exist (no-op when it exists
    /// with the same layout). Use it once, for a new namespace: never leave it
    /// on every replica, or a wiped etcd is silently re-created.
    #[arg(long, env = "SNOWKEEP_CREATE_NAMESPACE")]
    pub create_namespace: bool,
    /// Create the namespace as --create-namespace does, then exit 0 without
    /// serving (an init step).
    #[arg(long, env = "SNOWKEEP_CREATE_NAMESPACE_ONLY")]
    pub create_namespace_only: bool,
    /// Wait for the namespace's record when it does not exist yet (logging
    /// each retry, NOT_SERVING meanwhile, the administration service
    /// answering) instead of exiting 64: for a restore (`snowkeepctl import`
    /// creates it) or a deployment whose creation job may run later.
    #[arg(long, env = "SNOWKEEP_WAIT_FOR_NAMESPACE")]
    pub wait_for_namespace: bool,
    /// One-shot, after etcd lost writes: every claim in the namespace starts
    /// above this floor (+DURATION like +48h1m, or an RFC 3339 UTC time),
    /// every holder starts over, the namespace is usable again; then exit 0.
    /// See docs/operations.md.
    #[arg(long, env = "SNOWKEEP_CONFIRM_NAMESPACE_FLOOR", value_parser = parse_floor)]
    pub confirm_namespace_floor: Option<FloorSpec>,
    /// With --create-namespace: a migration floor, so every id of the new
    /// namespace is greater than ID, the largest id an earlier generator
    /// (Leaf, uid-generator, Sonyflake, an older namespace) may have issued
    /// by the cut-over. See docs/operations.md#moving-to-a-new-layout.
    #[arg(long, env = "SNOWKEEP_FLOOR_AFTER_ID", value_name = "ID")]
    pub floor_after_id: Option<u64>,
    /// The layout ID of --floor-after-id came from, in --layout's grammar
    /// (its total bits are what count: ID must fit them); default --layout.
    #[arg(
        long,
        env = "SNOWKEEP_FLOOR_LAYOUT",
        value_name = "LAYOUT",
        requires = "floor_after_id"
    )]
    pub floor_layout: Option<String>,
}

impl NamespaceArgs {
    /// `--layout`, parsed.
    pub(super) fn layout(&self) -> Result<Layout, ConfigError> {
        Ok(self.layout.parse()?)
    }

    /// Checks `--namespace` against the one rule for namespaces.
    pub(super) fn check_name(&self) -> Result<(), ConfigError> {
        match is_valid_namespace(&self.namespace) {
            true => Ok(()),
            false => Err(ConfigError::Namespace(self.namespace.clone())),
        }
    }

    /// The instance id, and whether it was given (a stable instance); the
    /// default is [`default_instance_id`].
    pub(super) fn instance(&self) -> Result<(String, bool), ConfigError> {
        let id = match self.instance_id.clone() {
            // No '/': embedded requesters' holder values start with
            // "requester/", so they can never equal an instance id.
            Some(id)
                if !id.is_empty()
                    && id.len() <= 256
                    && !id.chars().any(|c| c.is_control() || c == '/') =>
            {
                id
            }
            Some(id) => return Err(ConfigError::InstanceId(id)),
            None => default_instance_id(),
        };
        Ok((id, self.instance_id.is_some()))
    }

    /// Creation or floor confirmation at connect, which only etcd knows;
    /// the migration floor is checked against `layout` and the clock
    /// (`now_unix_ms`) here ([`migration_floor`]).
    pub(super) fn setup(
        &self,
        store: &StoreConfig,
        layout: &Layout,
        now_unix_ms: u64,
        max_fence_wait: Duration,
    ) -> Result<NamespaceSetup, ConfigError> {
        let create = self.create_namespace || self.create_namespace_only;
        let migration_floor = match self.floor_after_id {
            None => None,
            Some(_) if !create => {
                return Err(ConfigError::NamespaceSetup(
                    "--floor-after-id applies when the namespace is created: add --create-namespace or --create-namespace-only",
                ))
            }
            Some(id) => {
                let from = match &self.floor_layout {
                    None => *layout,
                    Some(text) => text.parse().map_err(ConfigError::FloorLayout)?,
                };
                Some(migration_floor(id, &from, layout, now_unix_ms, max_fence_wait)?)
            }
        };
        let setup = NamespaceSetup {
            create,
            confirm_floor: self.confirm_namespace_floor,
            migration_floor,
        };
        if matches!(store, StoreConfig::SingleInstance { .. })
            && (setup.create || setup.confirm_floor.is_some())
        {
            return Err(ConfigError::NamespaceSetup("--create-namespace, --create-namespace-only and --confirm-namespace-floor apply to namespaces in etcd: add --etcd-endpoints (the single-instance store creates its state file by itself)"));
        }
        Ok(setup)
    }

    /// True for the one-shots that exit after the setup instead of serving.
    pub(super) fn setup_only(&self) -> bool {
        self.create_namespace_only || self.confirm_namespace_floor.is_some()
    }

    /// `--machine-id-range` (default: every machine id of `layout`) and
    /// `--machine-ids`, at least 1 and at most the range (and
    /// [`MAX_MACHINE_IDS`]).
    pub(super) fn machine_ids(&self, layout: &Layout) -> Result<(Range<u32>, u32), ConfigError> {
        let count = layout.machine_id_count();
        let range = match &self.machine_id_range {
            None => 0..count,
            Some(text) => parse_range(text, count).ok_or(ConfigError::MachineIdRange {
                text: text.clone(),
                max: count,
            })?,
        };
        let max_ids = (range.end - range.start).min(MAX_MACHINE_IDS);
        if self.machine_ids == 0 || self.machine_ids > max_ids {
            return Err(ConfigError::MachineIds {
                got: self.machine_ids,
                max: max_ids,
            });
        }
        Ok((range, self.machine_ids))
    }
}

fn parse_floor(text: &str) -> Result<FloorSpec, String> {
    text.parse()
}

/// Parses `START..END` with `START < END <= max`.
fn parse_range(text: &str, max: u32) -> Option<Range<u32>> {
    let (start, end) = text.split_once("..")?;
    let (start, end): (u32, u32) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    (start < end && end <= max).then_some(start..end)
}
