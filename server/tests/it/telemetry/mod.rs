//! What operators see: the metrics catalog, clock-skew telemetry, the layout's lifetime and the status page.

pub(crate) mod lifetime;
mod observability;
pub(crate) mod status_page;
