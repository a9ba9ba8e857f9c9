//! Integration tests of snowkeep-server against real etcd processes that the
//! tests start themselves (free ports, temp dirs), and of the embedded store.

mod embedded;
mod etcd_faults;
mod issuance;
mod release;
mod support;
