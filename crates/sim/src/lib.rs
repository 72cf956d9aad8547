//! Disk and disk-array simulator (issue 5): rotational disk models, synthetic workloads and
//! traces, and the experiments of the Trail, Mariner and EW-Array papers. The Mariner experiments drive
//! the same [`mariner_placement::Policy`] as the real log, over a rotational
//! [`mariner_placement::DeviceModel`]. See docs/simulation.md.
#![forbid(unsafe_code)]

pub mod conventional;
pub mod disk;
pub mod driver;
pub mod ewarray;
pub mod ewdisk;
pub mod ewexp;
pub mod ewmap;
pub mod experiments;
pub mod logdisk;
pub mod mariner;
pub mod replay;
pub mod report;
pub mod rng;
pub mod stats;
pub mod trail;
pub mod workload;
