//! History's state file: how far the index and digests are durable, and per volume the base
//! image's instant and the piece levels its index entries use. docs/FORMATS.md "History
//! state" has the layout.
//!
//! Two slots of [`SLOT_BYTES`] at offsets 0 and [`SLOT_BYTES`]; each save writes the slot
//! the newest valid one is not in, with the next generation, and syncs. Open takes the valid
//! slot with the higher generation, so a torn save leaves the one before it.

use std::collections::BTreeMap;

use mariner_disk::Disk;

/// Bytes of one slot.
pub const SLOT_BYTES: usize = 256 * 1024;
pub const MAGIC: [u8; 8] = *b"MRHSTATE";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 56;
pub const VOLUME_LEN: usize = 80;
/// Volumes one slot holds.
pub const MAX_VOLUMES: usize = (SLOT_BYTES - HEADER_LEN) / VOLUME_LEN;

/// Header field offsets.
mod h {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const RESERVED: usize = 10;
    pub const COUNT: usize = 12;
    pub const GENERATION: usize = 16;
    pub const INDEXED_SEQ: usize = 24;
    pub const INDEXED_TS: usize = 32;
    pub const PRUNED_SEQ: usize = 40;
    pub const CRC: usize = 48;
    pub const RESERVED2: usize = 52;
    const _: () = assert!(RESERVED2 + 4 == super::HEADER_LEN);
}

/// Volume entry field offsets (relative to the entry).
mod v {
    pub const VOLUME: usize = 0;
    pub const FLAGS: usize = 4;
    pub const LEVELS: usize = 8;
    pub const BLOCK_SIZE: usize = 12;
    pub const SIZE: usize = 16;
    pub const BASE_SEQ: usize = 24;
    pub const BASE_VSEQ: usize = 32;
    pub const BASE_TS: usize = 40;
    pub const ROLLING_SEQ: usize = 48;
    pub const ROLLING_VSEQ: usize = 56;
    pub const ROLLING_TS: usize = 64;
    pub const RESERVED: usize = 72;
    const _: () = assert!(RESERVED + 8 == super::VOLUME_LEN);
}

/// Flag: the volume was deleted; its history stays until it leaves the window.
pub const FLAG_DELETED: u32 = 1;
/// Flag: the log let go of records the base image did not have yet: the volume's history
/// cannot be read until it is seeded again.
pub const FLAG_BROKEN: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_DELETED | FLAG_BROKEN;

/// One volume's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VolumeState {
    pub flags: u32,
    /// Piece levels its index entries use (bit L: level L).
    pub levels: u8,
    pub block_size: u32,
    /// Bytes, as of the newest record history has.
    pub size: u64,
    /// The base image holds every record of the volume up to this log sequence number.
    pub base_seq: u64,
    /// The volume sequence number of the newest record in the base (0: none).
    pub base_vseq: u64,
    /// The instant the base is as of: the oldest instant that can be read.
    pub base_ts: u64,
    /// A roll-forward of the base to here was under way (0: none): the base may hold any
    /// mix of the records up to it, and the roll-forward is finished before anything is read.
    pub rolling_seq: u64,
    pub rolling_vseq: u64,
    pub rolling_ts: u64,
}

impl VolumeState {
    /// A volume created (`e`, its `VolumeCreated` record) while history is on: an empty base
    /// as of its creation.
    pub(crate) fn created(e: &crate::DigestEntry) -> Self {
        Self {
            block_size: e.length,
            size: e.offset,
            base_seq: e.seq,
            base_vseq: e.volume_seq,
            base_ts: e.timestamp_ns,
            ..Self::default()
        }
    }
}

/// The whole state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    pub generation: u64,
    /// Every record up to this log sequence number is in the digests and the index, durably.
    pub indexed_seq: u64,
    pub indexed_ts: u64,
    /// The index entries of every record up to this log sequence number that the bases
    /// hold are removed (the ones above it, up to the bases, are removed next).
    pub pruned_seq: u64,
    pub volumes: BTreeMap<u32, VolumeState>,
}

/// The little-endian `u32` at `at` (the caller checked the length; history's file formats
/// share these readers).
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The little-endian `u64` at `at` (the caller checked the length).
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl State {
    /// The slot image: header, then the volumes in ascending order.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        if self.volumes.len() > MAX_VOLUMES {
            return Err(format!(
                "history keeps the state of at most {MAX_VOLUMES} volumes"
            ));
        }
        let mut b = vec![0u8; HEADER_LEN + VOLUME_LEN * self.volumes.len()];
        b[h::MAGIC..h::MAGIC + 8].copy_from_slice(&MAGIC);
        b[h::VERSION..h::VERSION + 2].copy_from_slice(&VERSION.to_le_bytes());
        b[h::COUNT..h::COUNT + 4].copy_from_slice(&(self.volumes.len() as u32).to_le_bytes());
        b[h::GENERATION..h::GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        b[h::INDEXED_SEQ..h::INDEXED_SEQ + 8].copy_from_slice(&self.indexed_seq.to_le_bytes());
        b[h::INDEXED_TS..h::INDEXED_TS + 8].copy_from_slice(&self.indexed_ts.to_le_bytes());
        b[h::PRUNED_SEQ..h::PRUNED_SEQ + 8].copy_from_slice(&self.pruned_seq.to_le_bytes());
        for (i, (&id, s)) in self.volumes.iter().enumerate() {
            let e = &mut b[HEADER_LEN + i * VOLUME_LEN..HEADER_LEN + (i + 1) * VOLUME_LEN];
            e[v::VOLUME..v::VOLUME + 4].copy_from_slice(&id.to_le_bytes());
            e[v::FLAGS..v::FLAGS + 4].copy_from_slice(&s.flags.to_le_bytes());
            e[v::LEVELS..v::LEVELS + 4].copy_from_slice(&u32::from(s.levels).to_le_bytes());
            e[v::BLOCK_SIZE..v::BLOCK_SIZE + 4].copy_from_slice(&s.block_size.to_le_bytes());
            for (at, x) in [
                (v::SIZE, s.size),
                (v::BASE_SEQ, s.base_seq),
                (v::BASE_VSEQ, s.base_vseq),
                (v::BASE_TS, s.base_ts),
                (v::ROLLING_SEQ, s.rolling_seq),
                (v::ROLLING_VSEQ, s.rolling_vseq),
                (v::ROLLING_TS, s.rolling_ts),
            ] {
                e[at..at + 8].copy_from_slice(&x.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&b);
        b[h::CRC..h::CRC + 4].copy_from_slice(&crc.to_le_bytes());
        Ok(b)
    }

    /// Decodes a slot image (trailing bytes after the volumes must be zero); `Ok(None)` for
    /// a slot never written (all zeros). One encoding per state: reserved bytes zero,
    /// volumes strictly ascending, flags known, levels within range.
    pub fn decode(b: &[u8]) -> Result<Option<Self>, String> {
        if b.len() < HEADER_LEN {
            return Err("shorter than a header".into());
        }
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if b[h::MAGIC..h::MAGIC + 8] != MAGIC {
            return Err("not a history state (bad magic)".into());
        }
        let version = u16::from_le_bytes([b[h::VERSION], b[h::VERSION + 1]]);
        if version != VERSION {
            return Err(format!("unsupported history state version {version}"));
        }
        if b[h::RESERVED..h::RESERVED + 2] != [0, 0] || u32_at(b, h::RESERVED2) != 0 {
            return Err("reserved header bytes are not zero".into());
        }
        let count = u32_at(b, h::COUNT) as usize;
        let len = count
            .checked_mul(VOLUME_LEN)
            .and_then(|n| n.checked_add(HEADER_LEN))
            .filter(|&n| n <= b.len() && count <= MAX_VOLUMES)
            .ok_or("volume count larger than the slot")?;
        if b[len..].iter().any(|&x| x != 0) {
            return Err("bytes after the last volume are not zero".into());
        }
        let mut body = b[..len].to_vec();
        body[h::CRC..h::CRC + 4].fill(0);
        if crc32c::crc32c(&body) != u32_at(b, h::CRC) {
            return Err("checksum mismatch".into());
        }
        let mut volumes = BTreeMap::new();
        let mut last = None;
        for i in 0..count {
            let e = &b[HEADER_LEN + i * VOLUME_LEN..HEADER_LEN + (i + 1) * VOLUME_LEN];
            let id = u32_at(e, v::VOLUME);
            if last.is_some_and(|l| id <= l) {
                return Err("volumes not strictly ascending".into());
            }
            last = Some(id);
            let flags = u32_at(e, v::FLAGS);
            let levels = u8::try_from(u32_at(e, v::LEVELS)).map_err(|_| "levels out of range")?;
            if flags & !KNOWN_FLAGS != 0 || u64_at(e, v::RESERVED) != 0 {
                return Err(format!("volume {id}: unknown flags or reserved bytes set"));
            }
            volumes.insert(
                id,
                VolumeState {
                    flags,
                    levels,
                    block_size: u32_at(e, v::BLOCK_SIZE),
                    size: u64_at(e, v::SIZE),
                    base_seq: u64_at(e, v::BASE_SEQ),
                    base_vseq: u64_at(e, v::BASE_VSEQ),
                    base_ts: u64_at(e, v::BASE_TS),
                    rolling_seq: u64_at(e, v::ROLLING_SEQ),
                    rolling_vseq: u64_at(e, v::ROLLING_VSEQ),
                    rolling_ts: u64_at(e, v::ROLLING_TS),
                },
            );
        }
        Ok(Some(Self {
            generation: u64_at(b, h::GENERATION),
            indexed_seq: u64_at(b, h::INDEXED_SEQ),
            indexed_ts: u64_at(b, h::INDEXED_TS),
            pruned_seq: u64_at(b, h::PRUNED_SEQ),
            volumes,
        }))
    }

    /// Reads both slots: the valid one with the higher generation; `Ok(None)` for a file
    /// never saved. A damaged slot beside a valid one is the torn save before a crash; both
    /// damaged is an error.
    pub fn load(disk: &dyn Disk) -> Result<Option<Self>, String> {
        let len = disk.len().map_err(|e| e.to_string())?;
        if len == 0 {
            return Ok(None);
        }
        let mut slots = Vec::new();
        for i in 0..2u64 {
            // The header says how long the state is; what follows it in the slot (an older,
            // longer state's end) is not part of it.
            let at = i * SLOT_BYTES as u64;
            let room = len.saturating_sub(at).min(SLOT_BYTES as u64) as usize;
            let mut b = vec![0u8; HEADER_LEN];
            let n = room.min(HEADER_LEN);
            if n > 0 {
                disk.read_at(&mut b[..n], at).map_err(|e| e.to_string())?;
            }
            let count = (u32_at(&b, h::COUNT) as usize).min(MAX_VOLUMES);
            let want = HEADER_LEN + count * VOLUME_LEN;
            b.resize(want, 0);
            let n = room.min(want);
            if n > HEADER_LEN {
                disk.read_at(&mut b[HEADER_LEN..n], at + HEADER_LEN as u64)
                    .map_err(|e| e.to_string())?;
            }
            slots.push(Self::decode(&b));
        }
        let mut best: Option<Self> = None;
        let mut errors = Vec::new();
        for s in slots {
            match s {
                Ok(Some(s)) => {
                    if best.as_ref().is_none_or(|b| s.generation > b.generation) {
                        best = Some(s);
                    }
                }
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        match best {
            Some(b) => Ok(Some(b)),
            None if errors.len() == 2 => Err(format!("both slots damaged: {}", errors.join("; "))),
            None if errors.is_empty() => Ok(None),
            // One slot damaged, the other never written: the first save was torn.
            None => Ok(None),
        }
    }

    /// Saves into the slot the current generation is not in, with the next generation,
    /// durably.
    pub fn save(&mut self, disk: &dyn Disk) -> Result<(), String> {
        self.generation += 1;
        // Only the state itself, to a whole 4 KiB: a save costs a page, not the slot.
        let mut b = self.encode()?;
        b.resize(b.len().next_multiple_of(4096), 0);
        let at = (self.generation % 2) * SLOT_BYTES as u64;
        if disk.len().map_err(|e| e.to_string())? < 2 * SLOT_BYTES as u64 {
            disk.set_len(2 * SLOT_BYTES as u64)
                .map_err(|e| e.to_string())?;
        }
        disk.write_at(&b, at).map_err(|e| e.to_string())?;
        disk.sync().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mariner_disk::MemDisk;

    pub(crate) fn sample() -> State {
        let mut volumes = BTreeMap::new();
        volumes.insert(
            3,
            VolumeState {
                flags: 0,
                levels: 0b1010,
                block_size: 4096,
                size: 1 << 30,
                base_seq: 100,
                base_vseq: 40,
                base_ts: 1_000,
                rolling_seq: 0,
                rolling_vseq: 0,
                rolling_ts: 0,
            },
        );
        volumes.insert(
            9,
            VolumeState {
                flags: FLAG_DELETED,
                levels: 1,
                block_size: 512,
                size: 1 << 20,
                base_seq: 90,
                base_vseq: 2,
                base_ts: 900,
                rolling_seq: 120,
                rolling_vseq: 5,
                rolling_ts: 1_200,
            },
        );
        State {
            generation: 7,
            indexed_seq: 130,
            indexed_ts: 1_300,
            pruned_seq: 80,
            volumes,
        }
    }

    #[test]
    fn round_trips_and_rejects_every_flipped_bit() {
        let s = sample();
        let b = s.encode().unwrap();
        assert_eq!(State::decode(&b).unwrap(), Some(s));
        for i in 0..b.len() * 8 {
            let mut c = b.clone();
            c[i / 8] ^= 1 << (i % 8);
            assert!(State::decode(&c).is_err(), "bit {i} flipped was accepted");
        }
    }

    #[test]
    fn a_torn_save_leaves_the_one_before() {
        let disk = MemDisk::new(0);
        assert_eq!(State::load(&disk).unwrap(), None);
        let mut s = sample();
        s.save(&disk).unwrap();
        let first = s.clone();
        s.indexed_seq = 500;
        s.save(&disk).unwrap();
        assert_eq!(State::load(&disk).unwrap(), Some(s.clone()));
        // The next save tears: its slot holds garbage.
        let at = ((s.generation + 1) % 2) * SLOT_BYTES as u64;
        disk.write_at(&[0xAB; 100], at).unwrap();
        assert_eq!(State::load(&disk).unwrap(), Some(s));
        assert_ne!(first.generation, 0);
    }
}
