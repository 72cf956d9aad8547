//! A volume as of an instant, behind the same seam as the volume itself ([`ReadPath`],
//! [`WritePath`], [`ScsiUnit`]), so the NBD and SCSI adapters serve it unchanged.
//!
//! Reads come from history as of the instant (`History::read_at`: the unindexed tail, the
//! index, the base image), off the async threads, widened to history's 512-byte sectors.
//! Without a scratch overlay every write is refused (read-only export); with one, writes go
//! to it in whole pages and reads see them over the past.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use mariner_history::{Held, History, HistoryError, ALLOCATION_SPAN};
use mariner_scsi::{Geometry, Reservations, UnitState};
use mariner_store::Allocation;

use super::scratch::Scratch;
use crate::iscsi::{naa_id, ScsiUnit};
use crate::volume::{ReadPath, Shape, Volume, VolumeError, WritePath, Zeroing, PAGE_BYTES};

const SECTOR: u64 = 512;
const PAGE: u64 = PAGE_BYTES as u64;

pub struct View {
    /// The export's name, `<volume>@<snapshot>`.
    pub(super) export: String,
    pub(super) volume: Arc<Volume>,
    pub(super) history: History,
    pub(super) volume_id: u32,
    /// The volume after this write.
    pub(super) at: u64,
    pub(super) scratch: Option<Scratch>,
    pub(super) removed: AtomicBool,
    serial: Arc<str>,
    naa: [u8; 16],
    pub(crate) reservations: Arc<Reservations>,
    pub(crate) unit: Arc<UnitState>,
}

impl View {
    pub(super) fn new(
        export: String,
        volume: Arc<Volume>,
        history: History,
        at: u64,
        created_ns: u64,
        scratch: Option<Scratch>,
    ) -> Self {
        let volume_id = volume.with_meta(|m| m.id);
        // Unique per export: the volume's id, the instant and the export's creation time.
        let serial = format!("MARINER{volume_id:08X}S{at:X}").into();
        Self {
            export,
            volume,
            history,
            volume_id,
            at,
            scratch,
            removed: AtomicBool::new(false),
            serial,
            naa: naa_id(volume_id ^ 0x8000_0000, created_ns),
            reservations: Arc::new(Reservations::in_memory()),
            unit: Arc::new(UnitState::new()),
        }
    }

    fn size(&self) -> u64 {
        self.volume.with_meta(|m| m.size_bytes)
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        if self.removed.load(Relaxed) {
            return Err(VolumeError::Gone);
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size()) {
            return Err(VolumeError::OutOfRange);
        }
        Ok(())
    }

    fn writable(&self) -> Result<&Scratch, VolumeError> {
        self.scratch.as_ref().ok_or(VolumeError::ReadOnly)
    }

    /// The snapshot's bytes at `offset` into `buf` — history as of the instant, with the
    /// scratch pages over it — on a blocking thread.
    async fn read_past(
        self: &Arc<Self>,
        offset: u64,
        buf: Vec<u8>,
    ) -> Result<Vec<u8>, VolumeError> {
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || me.read_blocking(offset, buf))
            .await
            .map_err(|e| VolumeError::Task(e.to_string()))?
    }

    pub(super) fn read_blocking(
        &self,
        offset: u64,
        mut buf: Vec<u8>,
    ) -> Result<Vec<u8>, VolumeError> {
        let len = buf.len() as u64;
        if len == 0 {
            return Ok(buf);
        }
        let start = offset / SECTOR * SECTOR;
        let end = (offset + len).div_ceil(SECTOR) * SECTOR;
        let history_err = |e: HistoryError| match e {
            HistoryError::BadRange { .. } => VolumeError::OutOfRange,
            other => VolumeError::History(other.to_string()),
        };
        if start == offset && end == offset + len {
            self.history
                .read_at(self.volume_id, self.at, offset, &mut buf)
                .map_err(history_err)?;
        } else {
            let mut wide = vec![0u8; (end - start) as usize];
            self.history
                .read_at(self.volume_id, self.at, start, &mut wide)
                .map_err(history_err)?;
            let skip = (offset - start) as usize;
            buf.copy_from_slice(&wide[skip..skip + len as usize]);
        }
        if let Some(s) = &self.scratch {
            s.overlay(offset, &mut buf)?;
        }
        Ok(buf)
    }

    /// How `[offset, offset + len)` (inside the volume) is held as of the instant
    /// (`History::allocation_at`), the scratch's pages as data over it, in runs of whole
    /// blocks clipped to the range: a block with any data in it is data, else one with any
    /// zeros is zeros, else a hole. Covers at most about [`ALLOCATION_SPAN`] bytes; callers
    /// ask again for the rest.
    fn allocation_blocking(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        let bs = u64::from(self.volume.with_meta(|m| m.block_size)).max(SECTOR);
        let start = offset / bs * bs;
        let end = (offset + len)
            .div_ceil(bs)
            .saturating_mul(bs)
            .min(self.size().div_ceil(SECTOR) * SECTOR)
            .min(start + ALLOCATION_SPAN);
        let runs = self
            .history
            .allocation_at(self.volume_id, self.at, start, end - start)
            .map_err(|e| match e {
                HistoryError::BadRange { .. } => VolumeError::OutOfRange,
                other => VolumeError::History(other.to_string()),
            })?;
        // Per block, the strongest of what its sectors hold: data, zeros, a hole.
        let rank = |a: Allocation| match a {
            Allocation::Hole => 0,
            Allocation::Zero => 1,
            Allocation::Data => 2,
        };
        let blocks = (end - start).div_ceil(bs) as usize;
        let mut per_block = vec![Allocation::Hole; blocks];
        let mut at = start;
        for (n, held) in runs {
            let a = match held {
                Held::Data => Allocation::Data,
                Held::Zero => Allocation::Zero,
                Held::Hole => Allocation::Hole,
            };
            if a != Allocation::Hole {
                let first = ((at - start) / bs) as usize;
                let last = ((at + n - start).div_ceil(bs) as usize).min(blocks);
                for b in &mut per_block[first..last] {
                    if rank(a) > rank(*b) {
                        *b = a;
                    }
                }
            }
            at += n;
        }
        if let Some(s) = &self.scratch {
            for page in s.pages_in(start, end - start)? {
                let from = (page * PAGE).max(start);
                let to = ((page + 1) * PAGE).min(end);
                let first = ((from - start) / bs) as usize;
                let last = ((to - start).div_ceil(bs) as usize).min(blocks);
                per_block[first..last].fill(Allocation::Data);
            }
        }
        // Runs of blocks, the first and last clipped to `[offset, offset + len)`.
        let stop = (offset + len).min(end);
        let mut out: Vec<(u64, Allocation)> = Vec::new();
        for (i, a) in per_block.into_iter().enumerate() {
            let from = (start + i as u64 * bs).max(offset);
            let to = (start + (i as u64 + 1) * bs).min(stop);
            if to <= from {
                continue;
            }
            match out.last_mut() {
                Some((l, last)) if *last == a => *l += to - from,
                _ => out.push((to - from, a)),
            }
        }
        Ok(out)
    }

    /// Writes `data` at `offset` into the scratch pages, under the scratch's writer lock.
    async fn write_scratch(self: &Arc<Self>, offset: u64, data: Bytes) -> Result<(), VolumeError> {
        let s = self.writable()?;
        self.check(offset, data.len() as u64)?;
        let _g = s.writing.lock().await;
        self.write_locked(offset, data).await
    }

    /// [`Self::write_scratch`] with the writer lock held by the caller: whole pages as they
    /// are, partial ones merged with the snapshot's bytes.
    async fn write_locked(self: &Arc<Self>, offset: u64, data: Bytes) -> Result<(), VolumeError> {
        let len = data.len() as u64;
        let first = offset / PAGE;
        let end = (offset + len).div_ceil(PAGE) * PAGE;
        let aligned = offset.is_multiple_of(PAGE) && end == offset + len;
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || -> Result<(), VolumeError> {
            let s = me.writable()?;
            if aligned {
                return s.write_pages(first, &data);
            }
            // The covered pages as the snapshot reads them (clipped to the volume's end),
            // then the new bytes over them.
            let from = first * PAGE;
            let upto = end.min(me.size());
            let mut pages = me.read_blocking(from, vec![0u8; (upto - from) as usize])?;
            pages.resize((end - from) as usize, 0);
            let at = (offset - from) as usize;
            pages[at..at + data.len()].copy_from_slice(&data);
            s.write_pages(first, &pages)
        })
        .await
        .map_err(|e| VolumeError::Task(e.to_string()))?
    }
}

/// The seam's methods take `&self`; a view is always served from an `Arc` ([`ViewRef`]).
pub struct ViewRef(pub Arc<View>);

impl ReadPath for ViewRef {
    fn shape(&self) -> Shape {
        let v = &self.0;
        let (size_bytes, block_size) = v.volume.with_meta(|m| (m.size_bytes, m.block_size));
        Shape {
            name: v.export.clone(),
            size_bytes,
            block_size,
            physical_block_bytes: PAGE_BYTES.max(block_size),
            max_io_bytes: v.volume.max_io_bytes(),
            read_only: v.scratch.is_none(),
        }
    }

    async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, VolumeError> {
        self.0.check(offset, len)?;
        self.0.read_past(offset, vec![0u8; len as usize]).await
    }

    async fn read_into(&self, offset: u64, buf: Vec<u8>) -> Result<Vec<u8>, VolumeError> {
        self.0.check(offset, buf.len() as u64)?;
        self.0.read_past(offset, buf).await
    }

    async fn allocation(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        let v = &self.0;
        if v.removed.load(Relaxed) {
            return Err(VolumeError::Gone);
        }
        let size = v.size();
        if offset >= size {
            return Err(VolumeError::OutOfRange);
        }
        let len = len.min(size - offset);
        let me = Arc::clone(v);
        tokio::task::spawn_blocking(move || me.allocation_blocking(offset, len))
            .await
            .map_err(|e| VolumeError::Task(e.to_string()))?
    }

    fn flush(&self) -> Result<(), VolumeError> {
        match &self.0.scratch {
            Some(s) => s.sync(),
            None => Ok(()),
        }
    }
}

impl WritePath for ViewRef {
    async fn write(&self, offset: u64, data: Bytes) -> Result<(), VolumeError> {
        self.0.write_scratch(offset, data).await
    }

    async fn zero(&self, offset: u64, len: u64, _how: Zeroing) -> Result<(), VolumeError> {
        self.0.writable()?;
        self.0.check(offset, len)?;
        // Zeros are written, not punched: an allocated page is what says the scratch holds it.
        let chunk = 1u64 << 20;
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            let zeros = Bytes::from(vec![0u8; n as usize]);
            self.0.write_scratch(offset + done, zeros).await?;
            done += n;
        }
        Ok(())
    }

    async fn compare_and_write(
        &self,
        offset: u64,
        expected: &[u8],
        data: Bytes,
    ) -> Result<Option<u64>, VolumeError> {
        let s = self.0.writable()?;
        self.0.check(offset, data.len() as u64)?;
        // Held across the read and the write: no other scratch write comes between.
        let _g = s.writing.lock().await;
        let now = self.0.read_past(offset, vec![0u8; expected.len()]).await?;
        if let Some(i) = now.iter().zip(expected).position(|(a, b)| a != b) {
            return Ok(Some(offset + i as u64));
        }
        self.0.write_locked(offset, data).await.map(|()| None)
    }

    async fn or_write(&self, offset: u64, data: &[u8]) -> Result<(), VolumeError> {
        let s = self.0.writable()?;
        self.0.check(offset, data.len() as u64)?;
        let _g = s.writing.lock().await;
        let mut now = self.0.read_past(offset, vec![0u8; data.len()]).await?;
        for (a, b) in now.iter_mut().zip(data) {
            *a |= b;
        }
        self.0.write_locked(offset, Bytes::from(now)).await
    }

    fn unregistered_may_write(&self) -> Result<(), VolumeError> {
        if self.0.reservations.excludes_unregistered_writers() {
            return Err(VolumeError::Reserved);
        }
        Ok(())
    }
}

impl ScsiUnit for ViewRef {
    fn block_size(&self) -> u32 {
        self.0.volume.with_meta(|m| m.block_size)
    }

    fn geometry(&self) -> Geometry {
        let v = &self.0;
        let (size_bytes, block_size) = v.volume.with_meta(|m| (m.size_bytes, m.block_size));
        let max_blocks = (v.volume.max_io_bytes() / u64::from(block_size)) as u32;
        Geometry {
            block_size,
            block_count: size_bytes / u64::from(block_size),
            read_only: v.scratch.is_none(),
            can_unmap: v.scratch.is_some(),
            max_transfer_blocks: max_blocks,
            physical_block_size: PAGE_BYTES.max(block_size),
            max_atomic_blocks: max_blocks,
            serial: v.serial.clone(),
            naa_id: v.naa,
        }
    }
}
