//! The Lease API's settings, from `--first-lease-duration`,
//! `--renewed-lease-duration` and `--client-skew-threshold` (parsed and
//! range-checked in `crate::config`).

use std::time::Duration;

/// Settings of the Lease API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseApiConfig {
    /// Lease granted by Acquire.
    pub first_lease: Duration,
    /// Lease granted by Renew.
    pub renewed_lease: Duration,
    /// Client clock-skew threshold (0: never refuse).
    pub skew_threshold: Duration,
}
