//! The Lease API flags, range-checked into [`LeaseApiConfig`].

use std::time::Duration;

use crate::lease_api::LeaseApiConfig;

use super::{
    ConfigError, DEFAULT_CLIENT_SKEW_THRESHOLD, DEFAULT_FIRST_LEASE_DURATION,
    DEFAULT_RENEWED_LEASE_DURATION,
};

/// The leases embedded requesters get, and the client clock-skew threshold.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Lease API")]
pub struct LeaseApiArgs {
    /// Lease API: the lease an embedded requester gets from Acquire (1m to 20m).
    #[arg(long, env = "SNOWKEEP_FIRST_LEASE_DURATION", default_value = DEFAULT_FIRST_LEASE_DURATION, value_parser = humantime::parse_duration)]
    pub first_lease_duration: Duration,
    /// Lease API: the lease a Renew extends to (5s to 30 days; renewals come
    /// at half of it).
    #[arg(long, env = "SNOWKEEP_RENEWED_LEASE_DURATION", default_value = DEFAULT_RENEWED_LEASE_DURATION, value_parser = humantime::parse_duration)]
    pub renewed_lease_duration: Duration,
    /// Lease API: Acquire is refused when the client's clock is behind or
    /// ahead of the server's by more than this (0 never refuses); half of it
    /// logs a warning.
    #[arg(long, env = "SNOWKEEP_CLIENT_SKEW_THRESHOLD", default_value = DEFAULT_CLIENT_SKEW_THRESHOLD, value_parser = humantime::parse_duration)]
    pub client_skew_threshold: Duration,
}

impl TryFrom<&LeaseApiArgs> for LeaseApiConfig {
    type Error = ConfigError;

    /// Checks the first lease (1 min to 20 min) and the renewed lease (5 s
    /// to 30 days); the skew threshold takes any value.
    fn try_from(args: &LeaseApiArgs) -> Result<Self, ConfigError> {
        let minute = Duration::from_secs(60);
        if !(minute..=minute * 20).contains(&args.first_lease_duration) {
            return Err(ConfigError::OutOfRange {
                flag: "--first-lease-duration (SNOWKEEP_FIRST_LEASE_DURATION)",
                value: args.first_lease_duration,
                min: minute,
                max: minute * 20,
            });
        }
        let (min_renew, max_renew) = (Duration::from_secs(5), Duration::from_secs(30 * 86_400));
        if !(min_renew..=max_renew).contains(&args.renewed_lease_duration) {
            return Err(ConfigError::OutOfRange {
                flag: "--renewed-lease-duration (SNOWKEEP_RENEWED_LEASE_DURATION)",
                value: args.renewed_lease_duration,
                min: min_renew,
                max: max_renew,
            });
        }
        Ok(LeaseApiConfig {
            first_lease: args.first_lease_duration,
            renewed_lease: args.renewed_lease_duration,
            skew_threshold: args.client_skew_threshold,
        })
    }
}
