//! What operators see: the metrics catalog, clock-skew telemetry and the status page.

mod observability;
mod status_page;
