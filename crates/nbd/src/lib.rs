//! NBD (Network Block Device) server for Mariner.
//!
//! Layers, from the wire up:
//!
//! - [`wire`]: magics, open enums for every code space (`Unknown(raw)` for codes this crate
//!   does not know), flag sets, bounded protocol strings.
//! - [`option`] / [`option_reply`]: option haggling messages, parsed and encoded.
//! - [`negotiation`]: what the server answers to each option; [`handshake`]: the byte-level,
//!   sans-I/O handshake state machine (bytes in, bytes out, then an [`Outcome`]).
//! - [`request`] / [`reply`]: transmission-phase messages, request checks, and a sans-I/O
//!   request decoder.
//! - [`backend`]: the [`Export`] / [`Exports`] traits the rest of Mariner implements;
//!   [`memory`]: a RAM-backed implementation for tests and examples.
//! - [`server`]: the tokio server ([`serve`], [`serve_connection`]).
//!
//! Only the fixed-newstyle handshake is spoken; TLS is refused with `NBD_REP_ERR_POLICY`.
//! See `docs` in the protocol spec (`doc/proto.md` of the NBD project) for the message layouts
//! summarized in each module's documentation.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod fuzzing;
pub mod handshake;
pub mod memory;
pub mod negotiation;
pub mod option;
pub mod option_reply;
pub mod reply;
pub mod request;
pub mod server;
pub mod wire;

pub use backend::{Allocation, ConnectionGuard, Export, ExportError, ExportInfo, Exports};
pub use handshake::{Handshake, HandshakeConfig, Outcome};
pub use negotiation::{HandshakeError, Negotiated};
pub use server::{serve, serve_connection, ConnectionError, ServerConfig};
