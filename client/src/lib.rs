//! snowkeep's client crate: it owns **the snowflake generator** that both the
//! server and embedded applications run (DESIGN §5), so there is exactly one
//! implementation of the rules that keep ids unique (DESIGN §2).
//!
//! | module | owns |
//! | --- | --- |
//! | [`layout`] | bit layout, epoch, encode/decode, the `MachineId` and `Millis` newtypes |
//! | [`clock`] | the only place time is read; `ManualClock` for tests |
//! | [`generator`] | `Generator` and `Grant`: stamping under a fence and a lease deadline |
//! | [`error`] | `GenerateError` |
//!
//! The generator never talks to etcd or gRPC: a lease source publishes a
//! [`generator::Grant`] through a `tokio::sync::watch` channel and the generator
//! stamps only under it.

pub mod clock;
pub mod error;
pub mod generator;
pub mod layout;

pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use error::GenerateError;
pub use generator::{Generator, GeneratorMetrics, GeneratorSet, Grant, Step, Taken};
pub use layout::{DecodedId, Layout, LayoutError, MachineId, Millis};
