//! The NBD front end's adapter: serves anything with a volume's write path
//! ([`WritePath`]) as an NBD export. It only translates — NBD's `u32` lengths to bytes, the
//! flags, [`VolumeError`] to NBD errors; the checks, locking and counters are the volume's
//! (crates/node/src/volume), shared with the SCSI adapter beside it (`crate::iscsi`).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use mariner_log::LogError;
use mariner_nbd::{Allocation as NbdAllocation, Export, ExportError, ExportInfo};
use mariner_store::{Allocation, StoreError};

use crate::read_buffers::{ReadBuffers, POOLED_MIN, READ_BUFFERS};
use crate::volume::{ReadPath, VolumeError, WritePath, Zeroing};

/// A volume (or anything with its write path) as an NBD export.
pub struct NbdExport<V>(pub Arc<V>);

/// A volume error as NBD reports it.
pub fn nbd_error(e: VolumeError) -> ExportError {
    match e {
        VolumeError::Gone | VolumeError::Log(LogError::Shutdown) => ExportError::Shutdown,
        VolumeError::OutOfRange | VolumeError::Store(StoreError::OutOfRange { .. }) => {
            ExportError::OutOfRange
        }
        VolumeError::ReadOnly => ExportError::ReadOnly,
        VolumeError::NoSpace => ExportError::NoSpace,
        VolumeError::Unaligned | VolumeError::Log(LogError::TooLarge { .. }) => {
            ExportError::Invalid
        }
        VolumeError::Reserved => ExportError::Refused(VolumeError::Reserved.to_string()),
        VolumeError::Failed(why) => ExportError::Io(why),
        other @ (VolumeError::Log(_)
        | VolumeError::Store(_)
        | VolumeError::Task(_)
        | VolumeError::History(_)) => ExportError::Io(other.to_string()),
    }
}

/// How NBD announces a volume (in the export list, and to the client that opens it).
pub fn export_info<V: ReadPath>(v: &V) -> ExportInfo {
    let s = v.shape();
    ExportInfo {
        description: format!("Mariner volume {} ({} bytes)", s.name, s.size_bytes),
        name: s.name,
        size_bytes: s.size_bytes,
        // Any byte range is served (a partial block costs a read-modify-write), so
        // clients send small writes as they are instead of padding them, and clients
        // that cannot pad (nbdfuse) work at all.
        block_size_min: 1,
        block_size_preferred: s.physical_block_bytes,
        max_payload_bytes: s.max_io_bytes as u32,
        read_only: s.read_only,
        can_trim: true,
        can_write_zeroes: true,
        // Every acknowledged write is durable, so a flush on any connection covers every
        // write completed on every connection.
        can_multi_conn: true,
    }
}

impl<V: WritePath> NbdExport<V> {
    /// TRIM and WRITE_ZEROES: an NBD client is never a registered SCSI initiator.
    async fn zero(&self, offset: u64, len: u32, how: Zeroing) -> Result<(), ExportError> {
        self.0.unregistered_may_write().map_err(nbd_error)?;
        self.0
            .zero(offset, u64::from(len), how)
            .await
            .map_err(nbd_error)
    }
}

#[async_trait]
impl<V: WritePath + 'static> Export for NbdExport<V> {
    fn info(&self) -> ExportInfo {
        export_info(&*self.0)
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ExportError> {
        let len = len as usize;
        if len < POOLED_MIN {
            let data = self.0.read(offset, len as u64).await;
            return data.map(Bytes::from).map_err(nbd_error);
        }
        // A large read goes into a kept buffer, which the reply gives back once sent.
        let buf = READ_BUFFERS.take(len);
        let data = self.0.read_into(offset, buf).await.map_err(nbd_error)?;
        Ok(ReadBuffers::shared(data))
    }

    async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Result<(), ExportError> {
        // Acknowledged only when durable in the log: FUA is always satisfied.
        self.0.unregistered_may_write().map_err(nbd_error)?;
        self.0.write(offset, data).await.map_err(nbd_error)
    }

    async fn flush(&self) -> Result<(), ExportError> {
        // Every completed write is already durable.
        self.0.flush().map_err(nbd_error)
    }

    async fn trim(&self, offset: u64, len: u32, _fua: bool) -> Result<(), ExportError> {
        self.zero(offset, len, Zeroing::Trim).await
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _fua: bool,
        _may_trim: bool,
    ) -> Result<(), ExportError> {
        self.zero(offset, len, Zeroing::Write).await
    }

    async fn block_status(
        &self,
        offset: u64,
        len: u32,
    ) -> Result<Vec<(u32, NbdAllocation)>, ExportError> {
        let extents = self
            .0
            .allocation(offset, u64::from(len))
            .await
            .map_err(nbd_error)?;
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
