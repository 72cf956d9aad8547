//! The store's durable watermark: every record up to `applied_seq` is in the synced images.
//!
//! A 40-byte file, replaced atomically (write a temporary file, fdatasync, rename, fsync the
//! directory). Layout (little-endian): magic "MRNRPROG" (8), version u16 (2), reserved (6),
//! applied_seq u64, applied_ts u64, reserved u32, CRC32C of bytes 0..36 (4).

use std::fs;
use std::io::{self, Write};
use std::path::Path;

const MAGIC: [u8; 8] = *b"MRNRPROG";
const VERSION: u16 = 1;
pub const PROGRESS_LEN: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    pub applied_seq: u64,
    pub applied_ts: u64,
}

impl Progress {
    pub fn encode(&self) -> [u8; PROGRESS_LEN] {
        let mut b = [0u8; PROGRESS_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.applied_seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.applied_ts.to_le_bytes());
        let crc = crc32c::crc32c(&b[..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != PROGRESS_LEN || b[0..8] != MAGIC {
            return Err("not a Mariner progress file".into());
        }
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&b[36..40]);
        if crc32c::crc32c(&b[..36]) != u32::from_le_bytes(crc) {
            return Err("progress file checksum mismatch".into());
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != VERSION {
            return Err(format!("unsupported progress file version {version}"));
        }
        Ok(Self {
            applied_seq: u64_at(16),
            applied_ts: u64_at(24),
        })
    }

    /// Reads the file; a missing file is a fresh store.
    pub fn load(path: &Path) -> io::Result<Self> {
        match fs::read(path) {
            Ok(b) => Self::decode(&b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the file atomically and durably.
    pub fn store(&self, path: &Path) -> io::Result<()> {
        let tmp = path.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&self.encode())?;
        f.sync_data()?;
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_damage() {
        let p = Progress {
            applied_seq: 77,
            applied_ts: 123_456,
        };
        let b = p.encode();
        assert_eq!(Progress::decode(&b), Ok(p));
        for i in 0..PROGRESS_LEN {
            let mut c = b;
            c[i] ^= 0x40;
            assert!(Progress::decode(&c).is_err(), "byte {i}");
        }
    }

    #[test]
    fn store_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.progress");
        assert_eq!(Progress::load(&path).unwrap(), Progress::default());
        let p = Progress {
            applied_seq: 5,
            applied_ts: 6,
        };
        p.store(&path).unwrap();
        assert_eq!(Progress::load(&path).unwrap(), p);
    }
}
