//! The pending-rollback file (`rollback-<volume:08x>` among history's files): which instant a
//! volume is rolling back to, from which, and how far the writes got. docs/FORMATS.md
//! "History: pending rollback" has the layout.
//!
//! Two slots of [`SLOT_BYTES`] at offsets 0 and [`SLOT_BYTES`]; save N (generation N) goes to
//! slot A when N is odd, B when even, and is synced. A torn save leaves the other slot, one
//! save older: the rollback resumes from an earlier cursor and writes those bytes again, the
//! same bytes. The first save (generation 1, slot A) is synced before `begin_rollback`
//! returns; a file whose slot A is not valid while slot B was never written is a begin a crash
//! cut short, and is dropped.

use mariner_disk::Disk;

use crate::state::{u32_at, u64_at};

/// Bytes of one slot (the record, then zeros).
pub const SLOT_BYTES: usize = 512;
pub const MAGIC: [u8; 8] = *b"MRHROLLB";
pub const VERSION: u16 = 1;
/// Bytes of the record at the start of a slot.
pub const RECORD_LEN: usize = 88;

/// Field offsets.
mod f {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const RESERVED: usize = 10;
    pub const VOLUME: usize = 12;
    pub const GENERATION: usize = 16;
    pub const TO_VSEQ: usize = 24;
    pub const TO_TS: usize = 32;
    pub const FROM_VSEQ: usize = 40;
    pub const FROM_TS: usize = 48;
    pub const CURSOR: usize = 56;
    pub const DONE: usize = 64;
    pub const TOTAL: usize = 72;
    pub const CRC: usize = 80;
    pub const RESERVED2: usize = 84;
    const _: () = assert!(RESERVED2 + 4 == super::RECORD_LEN);
}

/// One save of a pending rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RollbackRecord {
    pub volume: u32,
    /// Rises by one per save; decides between the slots.
    pub generation: u64,
    /// The instant rolled back to.
    pub to_vseq: u64,
    pub to_ts: u64,
    /// The newest instant when the rollback began.
    pub from_vseq: u64,
    pub from_ts: u64,
    /// Every changed byte below this volume offset has been written (durably).
    pub cursor: u64,
    pub done_bytes: u64,
    pub total_bytes: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl RollbackRecord {
    /// The record's [`RECORD_LEN`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; RECORD_LEN];
        b[f::MAGIC..f::MAGIC + 8].copy_from_slice(&MAGIC);
        b[f::VERSION..f::VERSION + 2].copy_from_slice(&VERSION.to_le_bytes());
        b[f::VOLUME..f::VOLUME + 4].copy_from_slice(&self.volume.to_le_bytes());
        for (at, x) in [
            (f::GENERATION, self.generation),
            (f::TO_VSEQ, self.to_vseq),
            (f::TO_TS, self.to_ts),
            (f::FROM_VSEQ, self.from_vseq),
            (f::FROM_TS, self.from_ts),
            (f::CURSOR, self.cursor),
            (f::DONE, self.done_bytes),
            (f::TOTAL, self.total_bytes),
        ] {
            b[at..at + 8].copy_from_slice(&x.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b[f::CRC..f::CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a slot image: the record, then only zeros. `Ok(None)` for a slot never written
    /// (all zeros). One encoding per record: magic, version, CRC, reserved bytes zero, a
    /// generation of at least 1, `to` not after `from`, `done` not above `total`.
    pub fn decode(b: &[u8]) -> Result<Option<Self>, String> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if b.len() < RECORD_LEN {
            return Err(format!("{} bytes, a record is {RECORD_LEN}", b.len()));
        }
        if b[f::MAGIC..f::MAGIC + 8] != MAGIC {
            return Err("bad magic".into());
        }
        let mut zeroed = b[..RECORD_LEN].to_vec();
        zeroed[f::CRC..f::CRC + 4].fill(0);
        if crc32c::crc32c(&zeroed) != u32_at(b, f::CRC) {
            return Err("checksum mismatch".into());
        }
        let version = u16_at(b, f::VERSION);
        if version != VERSION {
            return Err(format!("version {version}, this build reads {VERSION}"));
        }
        if u16_at(b, f::RESERVED) != 0 || u32_at(b, f::RESERVED2) != 0 {
            return Err("reserved bytes are not zero".into());
        }
        if b[RECORD_LEN..].iter().any(|&x| x != 0) {
            return Err("bytes after the record are not zero".into());
        }
        let r = Self {
            volume: u32_at(b, f::VOLUME),
            generation: u64_at(b, f::GENERATION),
            to_vseq: u64_at(b, f::TO_VSEQ),
            to_ts: u64_at(b, f::TO_TS),
            from_vseq: u64_at(b, f::FROM_VSEQ),
            from_ts: u64_at(b, f::FROM_TS),
            cursor: u64_at(b, f::CURSOR),
            done_bytes: u64_at(b, f::DONE),
            total_bytes: u64_at(b, f::TOTAL),
        };
        if r.generation == 0 {
            return Err("generation 0".into());
        }
        if r.to_vseq > r.from_vseq {
            return Err(format!(
                "rolls back to @{} from @{}",
                r.to_vseq, r.from_vseq
            ));
        }
        if r.done_bytes > r.total_bytes {
            return Err(format!("{} of {} bytes done", r.done_bytes, r.total_bytes));
        }
        Ok(Some(r))
    }

    /// Writes the record into its generation's slot and syncs.
    pub fn save(&self, disk: &dyn Disk) -> std::io::Result<()> {
        let mut slot = self.encode();
        slot.resize(SLOT_BYTES, 0);
        let at = if self.generation % 2 == 1 {
            0
        } else {
            SLOT_BYTES as u64
        };
        if disk.len()? < 2 * SLOT_BYTES as u64 {
            disk.set_len(2 * SLOT_BYTES as u64)?;
        }
        disk.write_at(&slot, at)?;
        disk.sync()
    }

    /// The newest valid save in `disk`. `Ok(None)`: no save completed (slot A not valid, slot
    /// B never written — a begin cut short). Both slots written and neither valid is damage.
    pub fn load(disk: &dyn Disk) -> Result<Option<Self>, String> {
        let len = disk.len().map_err(|e| e.to_string())?;
        let mut b = vec![0u8; 2 * SLOT_BYTES];
        let have = len.min(b.len() as u64) as usize;
        disk.read_at(&mut b[..have], 0).map_err(|e| e.to_string())?;
        let (a, bb) = b.split_at(SLOT_BYTES);
        let (ra, rb) = (Self::decode(a), Self::decode(bb));
        let best = [&ra, &rb]
            .into_iter()
            .filter_map(|r| r.as_ref().ok().copied().flatten())
            .max_by_key(|r| r.generation);
        match (best, &rb) {
            (Some(r), _) => Ok(Some(r)),
            (None, Ok(None)) => Ok(None),
            (None, _) => Err(format!(
                "neither slot is valid (A: {}, B: {})",
                ra.err().unwrap_or_else(|| "empty".into()),
                rb.err().unwrap_or_else(|| "empty".into())
            )),
        }
    }
}
