//! Integration tests of snowkeep-server against real etcd processes that the
//! tests start themselves (free ports, temp dirs), and of the single-instance store.

// A test binary: helpers panic on anything unexpected, like the tests do.
#![allow(clippy::unwrap_used)]

mod admin_faults;
mod admin_input;
mod admin_state;
mod allow_list;
mod allow_list_faults;
mod auth;
mod auth_faults;
mod auth_mode;
mod claim_lifecycle;
mod claims;
mod client_skew;
mod config_refusals;
mod corrupt_keys;
mod ctl_faults;
mod ctl_keys;
mod ctl_state;
mod deploy_files;
mod endpoints;
mod etcd_faults;
mod etcd_security;
mod export_import;
mod export_import_large;
mod fairness;
mod fence_counts;
mod instance_ids;
mod issuance;
mod layout_change;
mod lease_api;
mod lease_api_records;
mod lease_api_skew;
mod lease_api_tokens;
mod limits;
mod namespace_overlap;
mod observability;
mod outage_budget_faults;
mod pool_reads;
mod protos;
mod release;
mod restore;
mod restore_marking;
mod rollback;
mod scale;
mod single_instance;
mod single_instance_ranges;
mod starve;
mod status_page;
mod store_conformance;
mod streams;
mod support;
mod tampering;
mod tls;
mod tools;
