//! A volume: writes go to the log and are acknowledged once durable there; reads come from
//! the store, which sees every acknowledged write.
//!
//! The volume belongs to no front end. It offers its reads and writes through the seam in
//! [`path`] ([`ReadPath`], [`WritePath`]): whole requests in bytes, with the checks, the
//! locking of read-modify-writes and the counters every front end shares ([`io`]), and errors
//! of its own ([`VolumeError`]). The NBD adapter (`crate::nbd`) and the SCSI adapter
//! (`crate::iscsi`) sit beside each other and only translate: protocol units to bytes,
//! [`VolumeError`] to the protocol's errors. A point-in-time view (history) or a replication
//! gateway can implement the same seam later and be served by both.

mod error;
mod io;
pub mod path;

pub use error::VolumeError;
pub use path::{ReadPath, Shape, WritePath, Zeroing};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use mariner_log::Log;
use mariner_scsi::{Reservations, UnitState};
use mariner_store::Store;

use crate::datadir::VolumeMeta;

/// The page the store's images and the page cache work in: a write of fewer bytes costs a
/// read-modify-write of the page, so the front ends report it as the preferred I/O size (NBD)
/// and the physical block (SCSI).
pub const PAGE_BYTES: u32 = 4096;

/// Per-volume counters for `/metrics`.
#[derive(Debug, Default)]
pub struct VolumeStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub trims: AtomicU64,
    /// Trims and write-zeroes acknowledged without a record: the range read as zeros already.
    pub zeroings_elided: AtomicU64,
    pub errors: AtomicU64,
}

pub struct Volume {
    meta: RwLock<VolumeMeta>,
    log: Log,
    store: Arc<Store>,
    /// Set by delete: a client that opened the volume just before cannot write into nothing.
    deleted: AtomicBool,
    /// Makes COMPARE AND WRITE, ORWRITE and NBD writes, trims and write-zeroes of partial
    /// blocks atomic against every other writer: block-aligned writes, trims and write-zeroes
    /// hold it shared until durable, a read-modify-write holds it exclusively across its read
    /// and write. Shared acquisition is one atomic operation while no read-modify-write is
    /// waiting.
    writers: tokio::sync::RwLock<()>,
    /// SCSI reservations, shared by every iSCSI session of the volume; NBD writes are refused
    /// while they exclude initiators that are not registered.
    reservations: Arc<Reservations>,
    /// The SCSI task set and unit attentions, shared by every iSCSI session of the volume (a
    /// LUN reset from one session aborts the tasks of all).
    unit: Arc<UnitState>,
    pub stats: VolumeStats,
    /// The SCSI unit serial number, made once: the id and creation time it is made of never
    /// change, and the geometry that reports it is built for every iSCSI command.
    serial: Arc<str>,
}

impl Volume {
    pub fn new(
        meta: VolumeMeta,
        log: Log,
        store: Arc<Store>,
        reservations: Arc<Reservations>,
    ) -> Self {
        let serial = format!("MARINER{:08X}{:016X}", meta.id, meta.created_ns).into();
        Self {
            serial,
            meta: RwLock::new(meta),
            log,
            store,
            deleted: AtomicBool::new(false),
            writers: tokio::sync::RwLock::new(()),
            reservations,
            unit: Arc::new(UnitState::new()),
            stats: VolumeStats::default(),
        }
    }

    /// Runs `f` on the volume's metadata without copying it (the hot paths need a field or
    /// two per request; [`Volume::meta`] clones the name too).
    pub fn with_meta<R>(&self, f: impl FnOnce(&VolumeMeta) -> R) -> R {
        match self.meta.read() {
            Ok(m) => f(&m),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    pub fn meta(&self) -> VolumeMeta {
        self.meta
            .read()
            .map(|m| m.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// The SCSI unit serial number.
    pub fn serial(&self) -> &Arc<str> {
        &self.serial
    }

    /// The volume's SCSI reservations.
    pub fn reservations(&self) -> &Arc<Reservations> {
        &self.reservations
    }

    /// The volume's SCSI task set and unit attentions.
    pub fn unit(&self) -> &Arc<UnitState> {
        &self.unit
    }

    /// Writers that are not SCSI initiators (NBD clients) can never be registered: their
    /// writes are refused while a reservation excludes unregistered writers (every
    /// persistent type and RESERVE(6/10) do).
    pub(crate) fn unregistered_may_write(&self) -> Result<(), VolumeError> {
        if self.reservations.excludes_unregistered_writers() {
            self.stats.errors.fetch_add(1, Relaxed);
            return Err(VolumeError::Reserved);
        }
        Ok(())
    }

    /// Marks the volume deleted: every later request fails.
    pub fn mark_deleted(&self) {
        self.deleted.store(true, Relaxed);
    }

    pub fn set_size(&self, size: u64) {
        if let Ok(mut m) = self.meta.write() {
            m.size_bytes = size;
        }
    }

    /// Sets or clears the operator's read-only flag (the caller saves the metadata).
    pub fn set_read_only(&self, read_only: bool) {
        if let Ok(mut m) = self.meta.write() {
            m.read_only = read_only;
        }
    }

    /// Why the volume is read-only, if it is: the operator's flag, an I/O failure, or no room
    /// to store its writes (until there is again).
    pub fn read_only_reason(&self) -> Option<String> {
        if self.with_meta(|m| m.read_only) {
            return Some("set read-only by an operator".into());
        }
        self.failure().or_else(|| self.out_of_space())
    }

    /// Why the volume's writes cannot be stored for now, if they cannot: its image's file
    /// system is full (the store applies what waits once there is room, without a restart).
    pub fn out_of_space(&self) -> Option<String> {
        let id = self.with_meta(|m| m.id);
        self.store
            .out_of_space(id)
            .map(|why| format!("out of space: {why}"))
    }

    /// Read-only for good (until an operator acts): the operator's flag or an I/O failure.
    /// What the front ends announce; running out of space passes, so a client that connects
    /// meanwhile gets ENOSPC for its writes rather than a read-only disk for its session.
    pub fn read_only_lasting(&self) -> bool {
        self.with_meta(|m| m.read_only) || self.failure().is_some()
    }

    /// Why the volume failed, if it did: the log or the store failed.
    pub fn failure(&self) -> Option<String> {
        self.log
            .failure()
            .map(|f| format!("log failed: {f}"))
            .or_else(|| self.store.failure().map(|f| format!("store failed: {f}")))
    }
}
