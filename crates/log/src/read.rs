//! Reading records back: one record by its address ([`Log::read`]), a run of them with one
//! read ([`Log::read_following`]), and part of one record's payload ([`Log::read_part`]), the
//! way history reads an old version of a few blocks out of a large write.

use std::sync::Arc;

use mariner_disk::{AlignedBuf, Disk};

use crate::format::{LogAddr, RecordHeader, RECORD_HEADER_LEN};
use crate::{FormatError, Log, LogError};

/// Most bytes [`Log::read_part`] reads with its record's header in one read, guessing the part
/// starts the payload: a few small writes' worth.
const JOINT_READ: usize = 64 << 10;

impl Log {
    /// The device `addr` lies on, with its index; `Gone` for a device the log does not have.
    fn device_of(&self, addr: LogAddr) -> Result<(usize, &Arc<dyn Disk>), LogError> {
        let dev = addr.dev();
        let disk = self
            .inner
            .devices
            .get(dev)
            .ok_or(LogError::Gone { addr: addr.0 })?;
        Ok((dev, disk))
    }

    /// Reads back the record at `addr` and verifies it; `Gone` when the space was reused.
    pub fn read(
        &self,
        addr: LogAddr,
        expect_seq: u64,
    ) -> Result<(RecordHeader, Vec<u8>), LogError> {
        let read =
            |disk: &dyn Disk, out: &mut [u8], at: u64| read_unaligned(disk, out, at).map(|()| true);
        let record = self.read_with(addr, expect_seq, read)?;
        record.ok_or(LogError::Gone { addr: addr.0 })
    }

    /// [`Log::read`] if the record's bytes are in memory (the page cache of a buffered log
    /// device: [`Disk::read_cached`]); `Ok(None)` when reading it would wait for the device.
    /// Lets an async front end answer a read of a write not yet applied on its own thread.
    pub fn read_cached(
        &self,
        addr: LogAddr,
        expect_seq: u64,
    ) -> Result<Option<(RecordHeader, Vec<u8>)>, LogError> {
        let read = |disk: &dyn Disk, out: &mut [u8], at: u64| disk.read_cached(out, at);
        self.read_with(addr, expect_seq, read)
    }

    /// The record at `addr`, verified, read with `read` (which may decline: `Ok(None)`).
    fn read_with(
        &self,
        addr: LogAddr,
        expect_seq: u64,
        read: impl Fn(&dyn Disk, &mut [u8], u64) -> std::io::Result<bool>,
    ) -> Result<Option<(RecordHeader, Vec<u8>)>, LogError> {
        let (dev, disk) = self.device_of(addr)?;
        let io = |source| LogError::Io { dev, source };
        let mut hb = [0u8; RECORD_HEADER_LEN];
        if !read(disk.as_ref(), &mut hb, addr.offset()).map_err(io)? {
            return Ok(None);
        }
        let corrupt = |source| LogError::Corrupt {
            addr: addr.0,
            source,
        };
        let header = RecordHeader::decode(&hb, self.inner.sb.log_id, None).map_err(corrupt)?;
        if header.seq != expect_seq {
            return Err(LogError::Gone { addr: addr.0 });
        }
        let mut payload = vec![0u8; header.payload_len as usize];
        let at = addr.offset() + RECORD_HEADER_LEN as u64;
        if !read(disk.as_ref(), &mut payload, at).map_err(io)? {
            return Ok(None);
        }
        header.verify_payload(&payload).map_err(corrupt)?;
        Ok(Some((header, payload)))
    }

    /// Part of a record's payload: the bytes of volume range `[offset, offset + out.len())`,
    /// which the record at `addr` must cover. The record must be `volume`'s record number
    /// `volume_seq`, else `Gone`: its space was reused. The header's checksum is verified
    /// before the payload bytes are read and the header read and compared again after, so a
    /// record overwritten meanwhile is `Gone`, never returned. The payload's own checksum
    /// covers the whole payload and is not checked here: that would read all of a 32 MiB
    /// write to return 4 KiB of it.
    pub fn read_part(
        &self,
        addr: LogAddr,
        volume: u32,
        volume_seq: u64,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), LogError> {
        let (dev, disk) = self.device_of(addr)?;
        let io = |source| LogError::Io { dev, source };
        let check = |hb: &[u8; RECORD_HEADER_LEN]| -> Result<RecordHeader, LogError> {
            let h = RecordHeader::decode(hb, self.inner.sb.log_id, None)
                .map_err(|_| LogError::Gone { addr: addr.0 })?;
            if h.volume != volume || h.volume_seq != volume_seq || !h.kind.has_payload() {
                return Err(LogError::Gone { addr: addr.0 });
            }
            Ok(h)
        };
        let header = |disk: &dyn Disk| -> Result<[u8; RECORD_HEADER_LEN], LogError> {
            let mut hb = [0u8; RECORD_HEADER_LEN];
            read_unaligned(disk, &mut hb, addr.offset()).map_err(io)?;
            Ok(hb)
        };
        let now = self.inner.clock.now();
        let prefetch = &self.inner.prefetch;
        // Most parts asked for start their record's payload (a small write read whole): the
        // header and the part come with one read, one wait for the device instead of two.
        let joint = RECORD_HEADER_LEN + out.len();
        let mut first = None;
        if joint <= JOINT_READ {
            let mut both = vec![0u8; joint];
            // A failure here (a part past the device's end, say) is left to the reads below
            // to report as such.
            let read = read_unaligned(disk.as_ref(), &mut both, addr.offset());
            prefetch.after_read(disk.as_ref(), dev, addr.offset(), joint, now);
            if read.is_ok() {
                let mut hb = [0u8; RECORD_HEADER_LEN];
                hb.copy_from_slice(&both[..RECORD_HEADER_LEN]);
                let h = check(&hb)?;
                if h.offset == offset && out.len() as u64 <= u64::from(h.payload_len) {
                    out.copy_from_slice(&both[RECORD_HEADER_LEN..]);
                    return self.unchanged(disk.as_ref(), addr, &hb, header);
                }
                first = Some((hb, h));
            }
        }
        let (before, h) = match first {
            Some(found) => found,
            None => {
                let hb = header(disk.as_ref())?;
                (hb, check(&hb)?)
            }
        };
        let end = offset.checked_add(out.len() as u64);
        let covered =
            end.is_some_and(|end| offset >= h.offset && end <= h.offset + u64::from(h.payload_len));
        if !covered {
            return Err(LogError::Corrupt {
                addr: addr.0,
                source: FormatError::Inconsistent("the record does not cover the part asked for"),
            });
        }
        let at = addr.offset() + RECORD_HEADER_LEN as u64 + (offset - h.offset);
        read_unaligned(disk.as_ref(), out, at).map_err(io)?;
        prefetch.after_read(disk.as_ref(), dev, at, out.len(), now);
        self.unchanged(disk.as_ref(), addr, &before, header)
    }

    /// The header read again after a part of its payload, `Gone` unless it is still
    /// `before`: the record's space was reused while the part was read.
    fn unchanged(
        &self,
        disk: &dyn Disk,
        addr: LogAddr,
        before: &[u8; RECORD_HEADER_LEN],
        header: impl Fn(&dyn Disk) -> Result<[u8; RECORD_HEADER_LEN], LogError>,
    ) -> Result<(), LogError> {
        if *before != header(disk)? {
            return Err(LogError::Gone { addr: addr.0 });
        }
        Ok(())
    }

    /// Reads back records that follow each other on one device with one read, verifying
    /// each as [`Log::read`] does: the first at `addr`, each next one where the previous
    /// one's span ends, `seqs` their expected sequence numbers. `len` is the number of bytes
    /// from `addr` to the end of the last record's payload (its reader knows the headers).
    /// The bytes land in `buf` (resized to `len`; pass the same one again to reuse it), and
    /// each record comes back with the range of its payload in `buf`. `Gone` when a
    /// record's space was reused.
    ///
    /// The store's applier reads most records back (it does not keep their payloads in
    /// memory): one read for a run of records instead of two reads and an allocation each.
    pub fn read_following(
        &self,
        addr: LogAddr,
        seqs: &[u64],
        len: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<(RecordHeader, std::ops::Range<usize>)>, LogError> {
        let (dev, disk) = self.device_of(addr)?;
        let io = |source| LogError::Io { dev, source };
        let max = self.max_read_following();
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l as u64 <= max)
            .ok_or(LogError::TooLarge { bytes: len, max })?;
        buf.resize(len, 0);
        read_unaligned(disk.as_ref(), buf, addr.offset()).map_err(io)?;
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0usize;
        for &seq in seqs {
            let here = LogAddr::new(dev as u8, addr.offset() + at as u64);
            let (header, payload) = self.record_in(buf, at, here, seq, None)?;
            out.push((header, payload));
            at += header.span as usize;
        }
        Ok(out)
    }

    /// Reads records lying near each other on one device with one read, as a reader that
    /// knows their addresses but not what lies between them (other volumes' records,
    /// versions it does not need) reads them: `records` are (address, expected sequence
    /// number, payload length), on one device, in ascending address order, from the first's
    /// address to the last's payload end at most [`Log::max_read_following`] bytes. The
    /// bytes land in `buf` (pass the same one again to reuse it). Each record comes back
    /// verified as [`Log::read`] verifies it, with the range of its payload in `buf`, or
    /// with its own error (`Gone` when its space was reused): one reused record does not
    /// fail the others. The outer error is the read's, or `records` breaking the rules.
    ///
    /// History's roll-forward reads the newest versions of a round's blocks this way: one
    /// read per run of nearby records instead of two reads and an allocation each.
    #[allow(clippy::type_complexity)]
    pub fn read_near(
        &self,
        records: &[(LogAddr, u64, u32)],
        buf: &mut Vec<u8>,
    ) -> Result<Vec<Result<(RecordHeader, std::ops::Range<usize>), LogError>>, LogError> {
        let (Some(first), Some(last)) = (records.first(), records.last()) else {
            return Ok(Vec::new());
        };
        let (dev, disk) = self.device_of(first.0)?;
        let ordered = records
            .windows(2)
            .all(|w| w[0].0.dev() == w[1].0.dev() && w[0].0.offset() < w[1].0.offset());
        if !ordered {
            return Err(LogError::Config(
                "records read together must be on one device in ascending order".into(),
            ));
        }
        let start = first.0.offset();
        let end = last.0.offset() + RECORD_HEADER_LEN as u64 + u64::from(last.2);
        let max = self.max_read_following();
        let len = usize::try_from(end - start)
            .ok()
            .filter(|&l| l as u64 <= max)
            .ok_or(LogError::TooLarge {
                bytes: end - start,
                max,
            })?;
        buf.resize(len, 0);
        read_unaligned(disk.as_ref(), buf, start).map_err(|source| LogError::Io { dev, source })?;
        let one = |&(addr, seq, payload_len): &(LogAddr, u64, u32)| {
            self.record_in(
                buf,
                (addr.offset() - start) as usize,
                addr,
                seq,
                Some(payload_len),
            )
        };
        Ok(records.iter().map(one).collect())
    }

    /// The record at `at` in `buf` (read from `addr`), verified as [`Log::read`] verifies
    /// it: `Gone` when it is not record `seq`; `Corrupt` when it does not decode, runs past
    /// `buf`, fails its checksum, or (with `payload_len`) has another length than its reader
    /// expected. Returns its header and the range of its payload in `buf`.
    fn record_in(
        &self,
        buf: &[u8],
        at: usize,
        addr: LogAddr,
        seq: u64,
        payload_len: Option<u32>,
    ) -> Result<(RecordHeader, std::ops::Range<usize>), LogError> {
        let corrupt = |source| LogError::Corrupt {
            addr: addr.0,
            source,
        };
        let hb = buf.get(at..).unwrap_or_default();
        let header = RecordHeader::decode(hb, self.inner.sb.log_id, None).map_err(corrupt)?;
        if header.seq != seq {
            return Err(LogError::Gone { addr: addr.0 });
        }
        if payload_len.is_some_and(|l| l != header.payload_len) {
            return Err(corrupt(FormatError::Inconsistent(
                "the record's length is not the one its reader expected",
            )));
        }
        let body = at + RECORD_HEADER_LEN;
        let payload = body..body + header.payload_len as usize;
        let bytes = buf
            .get(payload.clone())
            .ok_or_else(|| corrupt(FormatError::Truncated))?;
        header.verify_payload(bytes).map_err(corrupt)?;
        Ok((header, payload))
    }

    /// The most bytes one [`Log::read_following`] reads: a segment, or one largest record
    /// if that is more. A run of records read back together must fit in it.
    pub fn max_read_following(&self) -> u64 {
        let max = u64::from(self.inner.max_payload) + RECORD_HEADER_LEN as u64;
        self.inner.sb.segment_bytes.max(max)
    }
}

/// Reads through a bounce buffer when the device needs aligned I/O.
fn read_unaligned(disk: &dyn Disk, out: &mut [u8], offset: u64) -> std::io::Result<()> {
    let align = disk.alignment() as u64;
    if align <= 1 {
        return disk.read_at(out, offset);
    }
    let start = offset / align * align;
    let end = (offset + out.len() as u64).div_ceil(align) * align;
    let mut buf = AlignedBuf::new((end - start) as usize, align as usize)?;
    disk.read_at(&mut buf, start)?;
    let skip = (offset - start) as usize;
    out.copy_from_slice(&buf[skip..skip + out.len()]);
    Ok(())
}
