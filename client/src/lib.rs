//! snowkeep's client crate: it owns **the snowflake generator** that both the
//! server and embedded applications run (docs/design.md), so there is exactly one
//! implementation of the rules that keep ids unique (docs/design.md, the safety invariant).
//!
//! | module | owns |
//! | --- | --- |
//! | [`layout`] | bit layout, epoch, encode/decode, the `MachineId` and `Millis` newtypes |
//! | [`backoff`] | `Backoff`: the doubling, capped, optionally jittered delay between retries |
//! | [`clock`] | the only place time is read; `ManualClock` and `TokioClock` for tests |
//! | [`generator`] | `Generator` and `Grant`: stamping under a fence and a lease deadline |
//! | [`embedded`] | `EmbeddedGenerator`: ids in process from machine ids leased through the Lease API |
//! | [`remote`] | `RemoteClient` (several servers, retries) and `IdPool` (prefetch) |
//! | [`text_id`] | the text form of ids: fixed-width Crockford base32 that sorts like the ids |
//! | [`error`] | `GenerateError`, `ClientError`, `StopReason` |
//! | [`api_key`] | `ApiKey`: the key a client sends as `authorization: Bearer <id>.<secret>` on every call |
//! | `tls` (feature `tls`) | `ClientTls`: TLS and mTLS to the servers |
//!
//! The generator never talks to etcd or gRPC: a lease source publishes a
//! [`generator::Grant`] through a `tokio::sync::watch` channel and the generator
//! stamps only under it.

pub mod api_key;
pub mod backoff;
pub mod clock;
pub mod embedded;
pub mod error;
pub mod generator;
pub mod layout;
pub mod remote;
pub mod text_id;
mod ticker;
#[cfg(feature = "tls")]
pub mod tls;

pub use api_key::{ApiKey, InvalidApiKey};
pub use backoff::Backoff;
pub use clock::{Clock, ManualClock, SharedClock, SystemClock, TokioClock};
pub use embedded::{EmbeddedConfig, EmbeddedGenerator, Requester};
pub use error::{ClientError, GenerateError, StopReason};
pub use generator::{FenceDemand, Generator, GeneratorMetrics, GeneratorSet, Grant, Pinned, Taken};
pub use layout::{DecodedId, Layout, LayoutError, MachineId, Millis};
pub use remote::{IdPool, PoolConfig, RemoteClient, RemoteConfig, ResumingStream};
pub use text_id::TextIdError;
pub use ticker::MsTicks;
#[cfg(feature = "tls")]
pub use tls::ClientTls;
