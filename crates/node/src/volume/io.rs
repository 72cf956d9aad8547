//! The code path every front end shares: range and state checks, whole-block writes as one
//! log record each, read-modify-writes of partial blocks under the volume's writer lock,
//! reads from the store off the async threads, and the counters.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use mariner_log::{Entry, RecordKind};
use mariner_store::{Allocation, StoreError};

use super::{Volume, VolumeError, PAGE_BYTES};

/// The largest read served on an async thread when it is all in memory: copying it takes a
/// few tens of microseconds, about what a hand-off to the blocking pool costs, and holds up
/// the thread's other requests no longer than that.
const INLINE_READ_MAX: u64 = 256 * 1024;

impl Volume {
    /// Checks a request's range (and, for a write, that the volume is writable); returns the
    /// volume's id and block size. Any byte range inside the volume passes: the callers that
    /// need whole blocks check [`Checked::aligned`].
    fn check(&self, offset: u64, len: u64, writing: bool) -> Result<Checked, VolumeError> {
        if self.deleted.load(Relaxed) {
            return Err(VolumeError::Gone);
        }
        let (id, size, block, read_only) =
            self.with_meta(|m| (m.id, m.size_bytes, u64::from(m.block_size), m.read_only));
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(VolumeError::OutOfRange);
        }
        if writing && (read_only || self.failure().is_some()) {
            return Err(VolumeError::ReadOnly);
        }
        if writing && self.store.out_of_space(id).is_some() {
            self.stats.errors.fetch_add(1, Relaxed);
            return Err(VolumeError::NoSpace);
        }
        Ok(Checked { id, block })
    }

    async fn append(&self, entry: Entry) -> Result<(), VolumeError> {
        let wait = self.log.append(entry).map_err(VolumeError::Log)?;
        let result = wait.await.map_err(|_| VolumeError::Gone)?;
        result.map(|_| ()).map_err(|e| {
            self.stats.errors.fetch_add(1, Relaxed);
            VolumeError::Log(e)
        })
    }

    /// Appends a payload-free record over whole blocks, split so each fits a u32 length.
    async fn extent(&self, kind: RecordKind, offset: u64, len: u64) -> Result<(), VolumeError> {
        let m = self.check(offset, len, true)?;
        if !m.aligned(offset, len) {
            return Err(VolumeError::Unaligned);
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

    /// Reads with the store: on the calling (async) thread when everything asked for is in
    /// memory — unapplied payloads the store holds, zeros, image pages in the page cache —
    /// and small enough to copy at once ([`INLINE_READ_MAX`]); otherwise off the async
    /// threads, where the store may wait for the log or the image's device.
    pub(crate) async fn read_bytes(&self, offset: u64, len: u64) -> Result<Vec<u8>, VolumeError> {
        let m = self.check(offset, len, false)?;
        self.read_checked(m, offset, vec![0u8; len as usize]).await
    }

    /// [`Volume::read_bytes`] into `buf`, `buf.len()` bytes at `offset`; every byte of it is
    /// overwritten, so a reused buffer reads the same as a new one.
    pub(crate) async fn read_bytes_into(
        &self,
        offset: u64,
        buf: Vec<u8>,
    ) -> Result<Vec<u8>, VolumeError> {
        let m = self.check(offset, buf.len() as u64, false)?;
        self.read_checked(m, offset, buf).await
    }

    async fn read_checked(
        &self,
        m: Checked,
        offset: u64,
        mut buf: Vec<u8>,
    ) -> Result<Vec<u8>, VolumeError> {
        let len = buf.len() as u64;
        if !self.read_inline(m, offset, &mut buf)? {
            let store = Arc::clone(&self.store);
            let read = move || store.read_into(m.id, offset, &mut buf).map(|()| buf);
            buf = tokio::task::spawn_blocking(read)
                .await
                .map_err(|e| VolumeError::Task(e.to_string()))?
                .map_err(VolumeError::Store)?;
        }
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(len, Relaxed);
        Ok(buf)
    }

    /// Whether a read small enough to copy on this thread was served into `buf`, everything
    /// it asks for being in memory.
    fn read_inline(&self, m: Checked, offset: u64, buf: &mut [u8]) -> Result<bool, VolumeError> {
        if buf.len() as u64 > INLINE_READ_MAX {
            return Ok(false);
        }
        let served = self.store.read_cached(m.id, offset, buf);
        served.map_err(VolumeError::Store)
    }

    /// Writes `data` at `offset`, durably. Whole blocks go straight to the log; a write that
    /// starts or ends inside a block is a read-modify-write of the blocks it covers
    /// ([`Volume::patch`]).
    pub(crate) async fn write_bytes(&self, offset: u64, data: Bytes) -> Result<(), VolumeError> {
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
    pub(crate) async fn trim_bytes(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        self.check(offset, len, true)?;
        self.stats.trims.fetch_add(1, Relaxed);
        self.zero(RecordKind::Trim, offset, len).await
    }

    /// Writes zeros over `[offset, offset + len)` (write-zeroes records over the whole blocks).
    pub(crate) async fn zero_bytes(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        self.check(offset, len, true)?;
        self.zero(RecordKind::WriteZeroes, offset, len).await
    }

    /// Zeroes `[offset, offset + len)` with `kind` records (trim or write-zeroes) over the
    /// whole blocks inside it and read-modify-writes of the partial blocks at its ends.
    async fn zero(&self, kind: RecordKind, offset: u64, len: u64) -> Result<(), VolumeError> {
        let m = self.check(offset, len, true)?;
        if m.aligned(offset, len) {
            let _shared = self.writers.read().await;
            if self.reads_as_zeros(m, offset, len).await {
                self.stats.zeroings_elided.fetch_add(1, Relaxed);
                return Ok(());
            }
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

    /// Whether `[offset, offset + len)` already reads as zeros for good, so zeroing it would
    /// change nothing: no durable record in the overlay but trims and write-zeroes, and holes
    /// in the image. Such a request needs no record: a crash cannot bring data back there
    /// (the image's holes are what its synced state plus the replay of every record above
    /// the watermark gives, and any such record is in the overlay). Clients zero whole disks
    /// a few MiB at a time (`qemu-img convert` onto a new volume), which would otherwise
    /// cost a log write and its sync each. `false` when unsure, e.g. the query failed.
    async fn reads_as_zeros(&self, m: Checked, offset: u64, len: u64) -> bool {
        let store = Arc::clone(&self.store);
        let query = tokio::task::spawn_blocking(move || store.allocation(m.id, offset, len));
        match query.await {
            Ok(Ok(runs)) => {
                runs.iter().map(|r| r.0).sum::<u64>() == len
                    && runs.iter().all(|r| r.1 != Allocation::Data)
            }
            _ => false,
        }
    }

    /// Atomically against every other writer of the volume: if the bytes at `offset` equal
    /// `expected`, writes `data` (same length) durably. Returns the offset of the first
    /// differing byte when they do not, having written nothing.
    pub(crate) async fn compare_and_write_bytes(
        &self,
        offset: u64,
        expected: &[u8],
        data: Bytes,
    ) -> Result<Option<u64>, VolumeError> {
        if expected.len() != data.len() {
            return Err(VolumeError::Unaligned);
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
    pub(crate) async fn or_write_bytes(&self, offset: u64, data: &[u8]) -> Result<(), VolumeError> {
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
    ) -> Result<T, VolumeError> {
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
    async fn write_locked(&self, offset: u64, data: Bytes) -> Result<(), VolumeError> {
        let m = self.check(offset, data.len() as u64, true)?;
        self.write_checked(m, offset, data).await
    }

    /// [`Volume::write_locked`] of a range [`Volume::check`] passed.
    async fn write_checked(&self, m: Checked, offset: u64, data: Bytes) -> Result<(), VolumeError> {
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
    async fn append_blocks(&self, m: Checked, offset: u64, data: Bytes) -> Result<(), VolumeError> {
        if !m.aligned(offset, data.len() as u64) {
            return Err(VolumeError::Unaligned);
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
    ) -> Result<(), VolumeError> {
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
    ) -> Result<(), VolumeError> {
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
            .map_err(|e| VolumeError::Task(e.to_string()))?
            .map_err(VolumeError::Store)?;
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
    pub(crate) async fn allocated(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        let m = self.meta();
        let len = len.min(m.size_bytes.saturating_sub(offset));
        if len == 0 {
            return Err(VolumeError::OutOfRange);
        }
        let store = Arc::clone(&self.store);
        let r = tokio::task::spawn_blocking(move || store.allocation(m.id, offset, len)).await;
        r.map_err(|e| VolumeError::Task(e.to_string()))?
            .map_err(VolumeError::Store)
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
