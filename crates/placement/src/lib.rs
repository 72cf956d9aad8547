//! Where and when a log write goes: the placement policy of mariner-paper.md §4 and §7.4.
//!
//! The policy is a pure state machine. It does no I/O and reads no clock: the caller passes the
//! time in, and a [`DeviceModel`] predicts how long a write takes on each device. The same
//! policy therefore drives the real log writer (with [`LinearModel`], fitted to the machine) and
//! the simulator (with a rotational disk model), and a trace run through both gives identical
//! dispatch decisions.
//!
//! The rules, from the paper:
//! - One device is *active*. While devices are busy, arriving requests gather in the active
//!   device's batch until its oldest waiter has waited `T_wait` or its segment (track) has no room
//!   for the next request; then the batch is dispatched as one write and another device becomes
//!   active — the one that could write the next request earliest (§4).
//! - A request that arrives when nothing is gathering and a device is idle is dispatched at once,
//!   alone (§7.4), so a queue-depth-1 writer never pays `T_wait`.
//! - After a write completes, the device's track fragmentation `F = n / (10·(1 − u))` (eq. 2) is
//!   computed; if it exceeds `T_switch` and the device has nothing queued, the device moves to
//!   a fresh segment.
//! - Each device writes its segments in ring order; a segment becomes reusable only when the
//!   log says so ([`Policy::segment_released`]). A device with no room waits; nothing fails.
//!
//! Every segment entered gets a fresh *generation*, strictly increasing per device over the life
//! of the log; the log salts record checksums with it so stale records fail verification.
#![forbid(unsafe_code)]

mod model;
mod policy;

pub use model::{DeviceModel, LinearModel};
pub use policy::{Action, DeviceStart, Nanos, Policy, PolicyConfig, PolicyError, ReqId, Write};
