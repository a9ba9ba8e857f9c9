//! The claim timing flags: the etcd lease TTL, the outage budget, the
//! fence and clock waits, the drain bound and the loss policy, checked
//! against their bounds (the claim loop takes them as plain values).

use std::time::Duration;

use snowkeep_core::claim::OnLeaseLost;

use super::{
    ConfigError, DEFAULT_LEASE_TTL, DEFAULT_MAX_BACKWARD_WAIT, DEFAULT_MAX_FENCE_WAIT,
    DEFAULT_OUTAGE_BUDGET, DEFAULT_SHUTDOWN_GRACE_PERIOD,
};

/// `--on-lease-lost`: the flag's values, for clap; the claim loop takes
/// [`OnLeaseLost`] (snowkeep-core knows nothing of clap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LeaseLostArg {
    /// Stop issuing, then claim again (machine ids, possibly the same ones).
    Reclaim,
    /// Stop issuing and exit with code 1.
    Exit,
}

impl From<LeaseLostArg> for OnLeaseLost {
    fn from(arg: LeaseLostArg) -> Self {
        match arg {
            LeaseLostArg::Reclaim => OnLeaseLost::Reclaim,
            LeaseLostArg::Exit => OnLeaseLost::Exit,
        }
    }
}

/// How the claim holds its machine ids, rides out etcd outages and drains.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Claim timing")]
pub struct TimingArgs {
    /// etcd lease TTL, whole seconds, at least 2s (e.g. 10s).
    #[arg(long, env = "SNOWKEEP_LEASE_TTL", default_value = DEFAULT_LEASE_TTL, value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
    /// How long a server keeps issuing while etcd is stalled or unreachable
    /// (e.g. 60s): a busy server keeps its fences at least this far ahead of
    /// its clock, raising them to 1.5 budgets ahead once per half budget. A
    /// crashed holder's machine ids are skipped by new claimers (or waited
    /// out) for up to 1.5 budgets. etcd store only.
    #[arg(long, env = "SNOWKEEP_OUTAGE_BUDGET", default_value = DEFAULT_OUTAGE_BUDGET, value_parser = humantime::parse_duration)]
    pub outage_budget: Duration,
    /// Longest wait for the clock to pass a claimed machine id's previous fence;
    /// a fence further ahead is refused.
    #[arg(long, env = "SNOWKEEP_MAX_FENCE_WAIT", default_value = DEFAULT_MAX_FENCE_WAIT, value_parser = humantime::parse_duration)]
    pub max_fence_wait: Duration,
    /// Largest backwards wall-clock step that is waited out; a larger one stops
    /// issuance (UNAVAILABLE) until the clock catches up.
    #[arg(long, env = "SNOWKEEP_MAX_BACKWARD_WAIT", default_value = DEFAULT_MAX_BACKWARD_WAIT, value_parser = humantime::parse_duration)]
    pub max_backward_wait: Duration,
    /// Bound on draining in-flight requests on SIGTERM/SIGINT before release.
    #[arg(long, env = "SNOWKEEP_SHUTDOWN_GRACE_PERIOD", default_value = DEFAULT_SHUTDOWN_GRACE_PERIOD, value_parser = humantime::parse_duration)]
    pub shutdown_grace_period: Duration,
    /// On a lost lease: re-claim (default) or exit with code 1.
    #[arg(long, env = "SNOWKEEP_ON_LEASE_LOST", value_enum, default_value_t = LeaseLostArg::Reclaim)]
    pub on_lease_lost: LeaseLostArg,
}

impl TimingArgs {
    /// Checks the TTL (whole seconds, at least 2 s), the outage budget (at
    /// least 1 s) and each duration's upper bound (1 h; 10 s for
    /// `--max-backward-wait`).
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if self.lease_ttl < Duration::from_secs(2) || self.lease_ttl.subsec_nanos() != 0 {
            return Err(ConfigError::LeaseTtl(self.lease_ttl));
        }
        if self.outage_budget < Duration::from_secs(1) {
            return Err(ConfigError::OutageBudget(self.outage_budget));
        }
        let hour = Duration::from_secs(3600);
        for (flag, value, max) in [
            ("--lease-ttl (SNOWKEEP_LEASE_TTL)", self.lease_ttl, hour),
            (
                "--outage-budget (SNOWKEEP_OUTAGE_BUDGET)",
                self.outage_budget,
                hour,
            ),
            (
                "--max-fence-wait (SNOWKEEP_MAX_FENCE_WAIT)",
                self.max_fence_wait,
                hour,
            ),
            (
                "--max-backward-wait (SNOWKEEP_MAX_BACKWARD_WAIT)",
                self.max_backward_wait,
                Duration::from_secs(10),
            ),
            (
                "--shutdown-grace-period (SNOWKEEP_SHUTDOWN_GRACE_PERIOD)",
                self.shutdown_grace_period,
                hour,
            ),
        ] {
            if value > max {
                return Err(ConfigError::TooLong { flag, value, max });
            }
        }
        Ok(())
    }
}
