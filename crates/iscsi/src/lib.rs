//! iSCSI target (RFC 7143) for Mariner.
//!
//! - [`pdu`]: the PDU layout, open [`Opcode`](pdu::Opcode) enum and a sans-I/O codec with
//!   CRC32C digests, padding and a cap on the data segment.
//! - [`text`]: key=value text segments; [`params`]: operational negotiation; [`chap`]: CHAP
//!   MD5; [`login`]: the login state machine (sans-I/O).
//! - [`targets`]: the [`Targets`] trait (IQN → LUN 0, CHAP, ACL) and an in-memory one.
//! - [`server`]: the tokio server ([`serve`]), full feature phase over `mariner-scsi`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admission;
pub mod chap;
pub mod fuzzing;
pub mod login;
pub mod params;
pub mod pdu;
pub mod server;
mod session;
pub mod targets;
mod task;
pub mod text;
mod wire;

pub use login::{Login, LoginStatus};
pub use params::{SessionParams, TargetLimits};
pub use server::{serve, serve_connection, ConnectionError, ServerConfig};
pub use targets::{Chap, MemoryTargets, Target, Targets};
