//! The stores and their state: several etcd endpoints, etcd outages and the outage
//! budget, corrupt keys, wiped and rolled-back etcd, restores, the single-instance store.

mod corrupt_keys;
mod endpoints;
mod etcd_faults;
mod outage_budget_faults;
mod restore;
mod restore_marking;
mod rollback;
mod single_instance;
mod single_instance_ranges;
mod store_conformance;
