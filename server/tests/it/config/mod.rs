//! Configuration and operator mistakes: flags refused at start, a changed layout,
//! overlapping namespaces, duplicate instance ids, tampered etcd state.

mod config_refusals;
mod id_shapes;
mod instance_ids;
mod layout_change;
mod migration_floor;
mod namespace_overlap;
mod tampering;
