//! The store's durable watermark: every record up to `applied_seq` is in the synced images.
//!
//! Replaced atomically (write a temporary file, fdatasync, rename, fsync the directory).
//! Layout (little-endian; docs/FORMATS.md "Store progress"): magic "MRNRPROG" (8), version u16
//! (2), reserved (2), volume count u32 (n), applied_seq u64, applied_ts u64, then n entries of
//! volume u32, reserved u32, volume_seq u64 (16 each, volumes ascending), then CRC32C of
//! everything before it (4): 36 + 16n bytes. Version 1 (40 bytes: no entries, a reserved u32
//! before the CRC) still loads, with no volume sequence numbers.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::Path;

const MAGIC: [u8; 8] = *b"MRNRPROG";
const VERSION: u16 = 2;
/// Bytes before the entries; a version 1 file is this, a reserved u32 and its CRC.
const HEAD_LEN: usize = 32;
const ENTRY_LEN: usize = 16;
/// The most volumes one file lists: far beyond any node's, so a damaged count cannot make
/// the decoder allocate.
const MAX_VOLUMES: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Progress {
    pub applied_seq: u64,
    pub applied_ts: u64,
    /// Per volume, the volume sequence number of its last record at or below `applied_seq`
    /// (mariner-log `RecordHeader::volume_seq`): where the log's numbering of a volume
    /// continues once its records are released.
    pub volume_seqs: BTreeMap<u32, u64>,
}

impl Progress {
    pub fn encode(&self) -> Vec<u8> {
        let n = self.volume_seqs.len();
        let mut b = Vec::with_capacity(HEAD_LEN + n * ENTRY_LEN + 4);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&[0; 2]);
        b.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        b.extend_from_slice(&self.applied_seq.to_le_bytes());
        b.extend_from_slice(&self.applied_ts.to_le_bytes());
        for (&volume, &seq) in &self.volume_seqs {
            b.extend_from_slice(&volume.to_le_bytes());
            b.extend_from_slice(&[0; 4]);
            b.extend_from_slice(&seq.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() < HEAD_LEN + 4 || b[0..8] != MAGIC {
            return Err("not a Mariner progress file".into());
        }
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let body = b.len() - 4;
        if crc32c::crc32c(&b[..body]) != u32_at(body) {
            return Err("progress file checksum mismatch".into());
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        let count = match version {
            1 => 0,
            2 => u32_at(12) as usize,
            other => return Err(format!("unsupported progress file version {other}")),
        };
        let expected = match version {
            1 => HEAD_LEN + 8,
            _ => HEAD_LEN + count.min(MAX_VOLUMES) * ENTRY_LEN + 4,
        };
        if count > MAX_VOLUMES || b.len() != expected {
            return Err(format!(
                "progress file of {} bytes does not hold its {count} volumes",
                b.len()
            ));
        }
        // One encoding per watermark: reserved bytes zero, volumes strictly ascending.
        if b[10..12] != [0, 0] || (version == 1 && u32_at(32) != 0) {
            return Err("progress file has nonzero reserved bytes".into());
        }
        let mut volume_seqs = BTreeMap::new();
        for i in 0..count {
            let at = HEAD_LEN + i * ENTRY_LEN;
            let volume = u32_at(at);
            if u32_at(at + 4) != 0 {
                return Err("progress file has nonzero reserved bytes".into());
            }
            if volume_seqs
                .last_key_value()
                .is_some_and(|(&v, _)| v >= volume)
            {
                return Err("progress file lists its volumes out of order".into());
            }
            volume_seqs.insert(volume, u64_at(at + 8));
        }
        Ok(Self {
            applied_seq: u64_at(16),
            applied_ts: u64_at(24),
            volume_seqs,
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

    fn sample() -> Progress {
        Progress {
            applied_seq: 77,
            applied_ts: 123_456,
            volume_seqs: [(1, 40), (7, 3)].into_iter().collect(),
        }
    }

    #[test]
    fn roundtrip_and_damage() {
        let p = sample();
        let b = p.encode();
        assert_eq!(b.len(), 36 + 2 * 16);
        assert_eq!(Progress::decode(&b), Ok(p));
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(Progress::decode(&c).is_err(), "byte {i}");
        }
        for len in 0..b.len() {
            assert!(Progress::decode(&b[..len]).is_err(), "cut to {len}");
        }
    }

    /// A version 1 file (40 bytes, before volume sequence numbers) still loads.
    #[test]
    fn version_1_still_loads() {
        let mut b = [0u8; 40];
        b[0..8].copy_from_slice(b"MRNRPROG");
        b[8..10].copy_from_slice(&1u16.to_le_bytes());
        b[16..24].copy_from_slice(&77u64.to_le_bytes());
        b[24..32].copy_from_slice(&123_456u64.to_le_bytes());
        let crc = crc32c::crc32c(&b[..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        let p = Progress::decode(&b).unwrap();
        assert_eq!((p.applied_seq, p.applied_ts), (77, 123_456));
        assert!(p.volume_seqs.is_empty());
    }

    #[test]
    fn store_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.progress");
        assert_eq!(Progress::load(&path).unwrap(), Progress::default());
        let p = sample();
        p.store(&path).unwrap();
        assert_eq!(Progress::load(&path).unwrap(), p);
    }
}
