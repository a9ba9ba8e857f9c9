//! Who may call and how: API keys and the cluster's security mode, allow lists,
//! TLS on the gRPC port, a secured etcd, and their faults.

mod allow_list;
mod allow_list_faults;
mod auth;
mod auth_faults;
mod auth_mode;
mod etcd_security;
mod tls;
