//! What operators see: the metrics catalog, clock-skew telemetry, the layout's lifetime and the status page.

mod lifetime;
mod observability;
mod status_page;
