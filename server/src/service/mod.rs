//! gRPC adapters only: each handler turns a request into a domain call and the
//! result into a response; errors become statuses in [`status`]. The
//! handlers reach the store through [`StoreAccess`]; `crate::router` puts
//! them, the Lease API's and the administration service's on one port.

mod access;
pub mod convert;
pub mod health;
pub mod id;
pub mod info;
pub mod status;
pub mod text;
pub mod weight;

pub use access::{Reach, StoreAccess};
