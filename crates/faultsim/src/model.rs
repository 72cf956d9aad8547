//! The reference model: what each volume must read as, from the records known durable.
//!
//! Every record is placed by sector (512 bytes). A sector holds the data of the highest
//! sequence number that covered it, whatever order the records became durable in: two log
//! devices acknowledge out of sequence order, and the store must still resolve overlaps by
//! sequence number (mariner-paper.md §3: writes are applied in sequence order).

use bytes::Bytes;
use mariner_log::RecordKind;

pub const SECTOR: u64 = 512;

/// One record the simulation appended.
#[derive(Debug, Clone)]
pub struct Rec {
    pub seq: u64,
    pub kind: RecordKind,
    pub volume: u32,
    pub offset: u64,
    pub length: u32,
    pub payload: Bytes,
}

/// A volume as the acknowledged (or recovered) records make it.
#[derive(Debug, Clone)]
pub struct Volume {
    pub data: Vec<u8>,
    /// Per sector, the sequence number whose data it holds (0: never written).
    pub seq: Vec<u64>,
}

impl Volume {
    pub fn new(size: u64) -> Self {
        Self {
            data: vec![0; size as usize],
            seq: vec![0; (size / SECTOR) as usize],
        }
    }

    /// Applies `r` to every sector where it is the newest record.
    pub fn apply(&mut self, r: &Rec) {
        let first = r.offset / SECTOR;
        let sectors = u64::from(r.length) / SECTOR;
        for s in first..first + sectors {
            let i = s as usize;
            if self.seq[i] >= r.seq {
                continue;
            }
            self.seq[i] = r.seq;
            let at = (s * SECTOR) as usize;
            let dst = &mut self.data[at..at + SECTOR as usize];
            match r.kind {
                RecordKind::Write => {
                    let from = ((s - first) * SECTOR) as usize;
                    dst.copy_from_slice(&r.payload[from..from + SECTOR as usize]);
                }
                _ => dst.fill(0),
            }
        }
    }
}

/// The first differing byte of two equally long images, if any.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}
