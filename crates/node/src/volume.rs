//! A volume as the front ends see it: writes go to the log and are acknowledged once durable
//! there; reads come from the store, which sees every acknowledged write.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use bytes::Bytes;
use mariner_log::{Entry, Log, LogError, RecordKind};
use mariner_nbd::{Allocation as NbdAllocation, Export, ExportError, ExportInfo};
use mariner_scsi::{Reservations, UnitState};
use mariner_store::{Allocation, Store, StoreError};

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

    /// NBD clients are not SCSI initiators and can never be registered: their writes are
    /// refused while a reservation excludes unregistered writers (every persistent type and
    /// RESERVE(6/10) do).
    fn nbd_may_write(&self) -> Result<(), ExportError> {
        if self.reservations.excludes_unregistered_writers() {
            self.stats.errors.fetch_add(1, Relaxed);
            return Err(ExportError::Refused(
                "the volume is reserved by an iSCSI initiator (SCSI reservation)".into(),
            ));
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

    /// Why the volume is read-only, if it is: the operator's flag, or an I/O failure.
    pub fn read_only_reason(&self) -> Option<String> {
        if self.with_meta(|m| m.read_only) {
            return Some("set read-only by an operator".into());
        }
        self.failure()
    }

    /// Why the volume failed, if it did: the log or the store failed.
    pub fn failure(&self) -> Option<String> {
        self.log
            .failure()
            .map(|f| format!("log failed: {f}"))
            .or_else(|| self.store.failure().map(|f| format!("store failed: {f}")))
    }

    /// Checks a request's range (and, for a write, that the volume is writable); returns the
    /// volume's id and block size. Any byte range inside the volume passes: the callers that
    /// need whole blocks check [`Checked::aligned`].
    fn check(&self, offset: u64, len: u64, writing: bool) -> Result<Checked, ExportError> {
        if self.deleted.load(Relaxed) {
            return Err(ExportError::Shutdown);
        }
        let (id, size, block, read_only) =
            self.with_meta(|m| (m.id, m.size_bytes, u64::from(m.block_size), m.read_only));
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(ExportError::OutOfRange);
        }
        if writing && (read_only || self.failure().is_some()) {
            return Err(ExportError::ReadOnly);
        }
        Ok(Checked { id, block })
    }

    async fn append(&self, entry: Entry) -> Result<(), ExportError> {
        let wait = self.log.append(entry).map_err(log_error)?;
        let result = wait.await.map_err(|_| ExportError::Shutdown)?;
        result.map(|_| ()).map_err(|e| {
            self.stats.errors.fetch_add(1, Relaxed);
            log_error(e)
        })
    }

    /// Appends a payload-free record over whole blocks, split so each fits a u32 length.
    async fn extent(&self, kind: RecordKind, offset: u64, len: u64) -> Result<(), ExportError> {
        let m = self.check(offset, len, true)?;
        if !m.aligned(offset, len) {
            return Err(ExportError::Invalid);
        }
        let id = m.id;
        let chunk = 1u64 << 30;
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            self.append(Entry::extent(kind, id, offset + done, n as u32))
                .await?;
            done += n;
        }
        Ok(())
    }

    /// Reads with the store (blocking I/O off the async threads).
    pub async fn read_bytes(&self, offset: u64, len: u64) -> Result<Vec<u8>, ExportError> {
        let m = self.check(offset, len, false)?;
        let store = Arc::clone(&self.store);
        let r = tokio::task::spawn_blocking(move || store.read(m.id, offset, len)).await;
        let data = r
            .map_err(|e| ExportError::Io(e.to_string()))?
            .map_err(store_error)?;
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(len, Relaxed);
        Ok(data)
    }

    /// Writes `data` at `offset`, durably. Whole blocks go straight to the log; a write that
    /// starts or ends inside a block is a read-modify-write of the blocks it covers
    /// ([`Volume::patch`]).
    pub async fn write_bytes(&self, offset: u64, data: Bytes) -> Result<(), ExportError> {
        let len = data.len() as u64;
        {
            let _shared = self.writers.read().await;
            let m = self.check(offset, len, true)?;
            if m.aligned(offset, len) {
                return self.write_checked(m, offset, data).await;
            }
        }
        self.patch(offset, len, |bytes| bytes.copy_from_slice(&data))
            .await?;
        self.count_write(len);
        Ok(())
    }

    /// Deallocates a range (a trim record): it reads as zeros and costs no space once applied.
    /// The bytes of a partial block at either end are written as zeros instead, so the whole
    /// range reads as zeros whatever its alignment (a client such as nbdfuse turns a file's
    /// `fallocate(PUNCH_HOLE)`, which promises zeros, into a trim).
    pub async fn trim_bytes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.check(offset, len, true)?;
        self.stats.trims.fetch_add(1, Relaxed);
        self.zero(RecordKind::Trim, offset, len).await
    }

    /// Zeroes `[offset, offset + len)` with `kind` records (trim or write-zeroes) over the
    /// whole blocks inside it and read-modify-writes of the partial blocks at its ends.
    async fn zero(&self, kind: RecordKind, offset: u64, len: u64) -> Result<(), ExportError> {
        let m = self.check(offset, len, true)?;
        if m.aligned(offset, len) {
            let _shared = self.writers.read().await;
            return self.extent(kind, offset, len).await;
        }
        let end = offset + len;
        let (inner_start, inner_end) = (offset.next_multiple_of(m.block), end / m.block * m.block);
        let _exclusive = self.writers.write().await;
        if inner_start >= inner_end {
            // No whole block inside: one record for the one or two blocks it touches.
            return self.patch_locked(m, offset, len, |b| b.fill(0)).await;
        }
        if offset < inner_start {
            self.patch_locked(m, offset, inner_start - offset, |b| b.fill(0))
                .await?;
        }
        self.extent(kind, inner_start, inner_end - inner_start)
            .await?;
        if inner_end < end {
            self.patch_locked(m, inner_end, end - inner_end, |b| b.fill(0))
                .await?;
        }
        Ok(())
    }

    /// Atomically against every other writer of the volume: if the bytes at `offset` equal
    /// `expected`, writes `data` (same length) durably. Returns the offset of the first
    /// differing byte when they do not, having written nothing.
    pub async fn compare_and_write(
        &self,
        offset: u64,
        expected: &[u8],
        data: Bytes,
    ) -> Result<Option<u64>, ExportError> {
        if expected.len() != data.len() {
            return Err(ExportError::Invalid);
        }
        self.read_modify_write(offset, data.len() as u64, |current| {
            match current.iter().zip(expected).position(|(a, b)| a != b) {
                Some(at) => (None, Some(at as u64)),
                None => (Some(data), None),
            }
        })
        .await
    }

    /// Atomically against every other writer of the volume: bitwise-ORs `data` into the bytes
    /// at `offset` and writes the result durably (SCSI ORWRITE).
    pub async fn or_write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        self.read_modify_write(offset, data.len() as u64, |mut current| {
            for (c, d) in current.iter_mut().zip(data) {
                *c |= d;
            }
            (Some(Bytes::from(current)), ())
        })
        .await
    }

    /// Reads `[offset, offset + len)`, hands it to `change` and writes back what `change`
    /// returns (if anything) at `offset`, with every other writer held off from the read until
    /// the write is durable.
    async fn read_modify_write<T>(
        &self,
        offset: u64,
        len: u64,
        change: impl FnOnce(Vec<u8>) -> (Option<Bytes>, T),
    ) -> Result<T, ExportError> {
        self.check(offset, len, true)?;
        let _exclusive = self.writers.write().await;
        let current = self.read_bytes(offset, len).await?;
        let (write, result) = change(current);
        if let Some(data) = write {
            self.write_locked(offset, data).await?;
        }
        Ok(result)
    }

    /// Writes whole blocks with `writers` already held by the caller.
    async fn write_locked(&self, offset: u64, data: Bytes) -> Result<(), ExportError> {
        let m = self.check(offset, data.len() as u64, true)?;
        self.write_checked(m, offset, data).await
    }

    /// [`Volume::write_locked`] of a range [`Volume::check`] passed.
    async fn write_checked(&self, m: Checked, offset: u64, data: Bytes) -> Result<(), ExportError> {
        let len = data.len() as u64;
        self.append_blocks(m, offset, data).await?;
        self.count_write(len);
        Ok(())
    }

    fn count_write(&self, len: u64) {
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.write_bytes.fetch_add(len, Relaxed);
    }

    /// Appends write records of whole blocks, `writers` held by the caller. Records are
    /// always block-aligned, so the log, the store and recovery never see a partial block.
    async fn append_blocks(&self, m: Checked, offset: u64, data: Bytes) -> Result<(), ExportError> {
        if !m.aligned(offset, data.len() as u64) {
            return Err(ExportError::Invalid);
        }
        // Each request is one record (atomic) when it fits; larger ones are split at block
        // boundaries. An empty write has nothing to make durable.
        let max = (u64::from(self.log.max_payload()) / m.block * m.block).max(m.block) as usize;
        for at in (0..data.len()).step_by(max) {
            let part = data.slice(at..data.len().min(at + max));
            self.append(Entry::write(m.id, offset + at as u64, part))
                .await?;
        }
        Ok(())
    }

    /// Changes `[offset, offset + len)`, which starts or ends inside a block, with every other
    /// writer (NBD and iSCSI) held off from the read of the blocks it covers until their write
    /// is durable, so a concurrent write of the same blocks is never lost to a stale copy.
    async fn patch(
        &self,
        offset: u64,
        len: u64,
        change: impl FnOnce(&mut [u8]),
    ) -> Result<(), ExportError> {
        let m = self.check(offset, len, true)?;
        let _exclusive = self.writers.write().await;
        self.patch_locked(m, offset, len, change).await
    }

    /// [`Volume::patch`] with `writers` held exclusively by the caller: reads the partial
    /// blocks at the ends of the range (the whole blocks between are overwritten, so they are
    /// not read), lets `change` rewrite the range's bytes, and writes the covering blocks
    /// back: one record, as for any write, when they fit in the log's largest record.
    async fn patch_locked(
        &self,
        m: Checked,
        offset: u64,
        len: u64,
        change: impl FnOnce(&mut [u8]),
    ) -> Result<(), ExportError> {
        let (start, end) = m.covering(offset, len);
        let (id, block) = (m.id, m.block);
        // Only the first and the last block can hold bytes outside the range.
        let partial = |at: u64| offset > at || offset + len < at + block;
        let mut edges = vec![start, end - block];
        edges.dedup();
        edges.retain(|&at| partial(at));
        let store = Arc::clone(&self.store);
        let read = tokio::task::spawn_blocking(move || {
            let mut blocks = vec![0u8; (end - start) as usize];
            for at in edges {
                let from = (at - start) as usize;
                let bytes = store.read(id, at, block)?;
                blocks[from..from + block as usize].copy_from_slice(&bytes);
            }
            Ok::<_, StoreError>(blocks)
        })
        .await;
        let mut blocks = read
            .map_err(|e| ExportError::Io(e.to_string()))?
            .map_err(store_error)?;
        let from = (offset - start) as usize;
        change(&mut blocks[from..from + len as usize]);
        let covering = self.check(start, end - start, true)?;
        self.append_blocks(covering, start, Bytes::from(blocks))
            .await
    }
}

impl Volume {
    /// The largest read or write the front ends advertise: one log record (so a write of this
    /// size is atomic), whole blocks, at most 32 MiB.
    pub fn max_io_bytes(&self) -> u64 {
        let bs = self.with_meta(|m| m.block_size);
        u64::from((self.log.max_payload() / bs * bs).min(32 << 20))
    }

    /// The volume's physical block: the store's page, or the block if that is larger.
    pub fn physical_block_bytes(&self) -> u32 {
        PAGE_BYTES.max(self.with_meta(|m| m.block_size))
    }

    /// Allocation of `[offset, offset + len)` clipped to the volume, as runs in order.
    pub async fn allocation(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Allocation)>, ExportError> {
        let m = self.meta();
        let len = len.min(m.size_bytes.saturating_sub(offset));
        if len == 0 {
            return Err(ExportError::OutOfRange);
        }
        let store = Arc::clone(&self.store);
        let r = tokio::task::spawn_blocking(move || store.allocation(m.id, offset, len)).await;
        r.map_err(|e| ExportError::Io(e.to_string()))?
            .map_err(store_error)
    }
}

/// What [`Volume::check`] found out.
#[derive(Debug, Clone, Copy)]
struct Checked {
    id: u32,
    /// The volume's logical block size in bytes.
    block: u64,
}

impl Checked {
    /// Whether `[offset, offset + len)` is made of whole blocks.
    fn aligned(&self, offset: u64, len: u64) -> bool {
        offset.is_multiple_of(self.block) && len.is_multiple_of(self.block)
    }

    /// The whole blocks covering `[offset, offset + len)`, a range [`Volume::check`] passed
    /// (the volume's size is a multiple of the block, so they lie inside it).
    fn covering(&self, offset: u64, len: u64) -> (u64, u64) {
        let start = offset / self.block * self.block;
        (start, (offset + len).next_multiple_of(self.block))
    }
}

fn log_error(e: LogError) -> ExportError {
    match e {
        LogError::Shutdown => ExportError::Shutdown,
        LogError::TooLarge { .. } => ExportError::Invalid,
        other => ExportError::Io(other.to_string()),
    }
}

fn store_error(e: StoreError) -> ExportError {
    match e {
        StoreError::OutOfRange { .. } => ExportError::OutOfRange,
        other => ExportError::Io(other.to_string()),
    }
}

#[async_trait]
impl Export for Volume {
    fn info(&self) -> ExportInfo {
        let m = self.meta();
        ExportInfo {
            name: m.name.clone(),
            description: format!("Mariner volume {} ({} bytes)", m.name, m.size_bytes),
            size_bytes: m.size_bytes,
            // Any byte range is served (a partial block costs a read-modify-write), so
            // clients send small writes as they are instead of padding them, and clients
            // that cannot pad (nbdfuse) work at all.
            block_size_min: 1,
            block_size_preferred: PAGE_BYTES.max(m.block_size),
            max_payload_bytes: self.max_io_bytes() as u32,
            read_only: self.read_only_reason().is_some(),
            can_trim: true,
            can_write_zeroes: true,
            // Every acknowledged write is durable, so a flush on any connection covers every
            // write completed on every connection.
            can_multi_conn: true,
        }
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ExportError> {
        self.read_bytes(offset, u64::from(len))
            .await
            .map(Bytes::from)
    }

    async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Result<(), ExportError> {
        // Acknowledged only when durable in the log: FUA is always satisfied.
        self.nbd_may_write()?;
        self.write_bytes(offset, data).await
    }

    async fn flush(&self) -> Result<(), ExportError> {
        // Every completed write is already durable.
        match self.failure() {
            Some(why) => Err(ExportError::Io(why)),
            None => Ok(()),
        }
    }

    async fn trim(&self, offset: u64, len: u32, _fua: bool) -> Result<(), ExportError> {
        self.nbd_may_write()?;
        self.trim_bytes(offset, u64::from(len)).await
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _fua: bool,
        _may_trim: bool,
    ) -> Result<(), ExportError> {
        self.check(offset, u64::from(len), true)?;
        self.nbd_may_write()?;
        self.zero(RecordKind::WriteZeroes, offset, u64::from(len))
            .await
    }

    async fn block_status(
        &self,
        offset: u64,
        len: u32,
    ) -> Result<Vec<(u32, NbdAllocation)>, ExportError> {
        let extents = self.allocation(offset, u64::from(len)).await?;
        Ok(extents
            .into_iter()
            .map(|(l, a)| {
                let a = match a {
                    Allocation::Data => NbdAllocation::Data,
                    Allocation::Hole => NbdAllocation::Hole,
                    Allocation::Zero => NbdAllocation::Zero,
                };
                (l as u32, a)
            })
            .collect())
    }
}
