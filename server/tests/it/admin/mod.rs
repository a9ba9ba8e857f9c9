//! The administration service and snowkeepctl: state, input checks, export and
//! import, and their faults.

mod admin_faults;
mod admin_input;
mod admin_state;
mod ctl_faults;
mod ctl_keys;
mod ctl_state;
mod evict_race;
mod export_import;
mod export_import_large;
