//! [`FaultyDisk`]: a memory disk that can crash, tear writes, corrupt sectors and fail I/O.
//!
//! The fault model (redb `crash_consistency.rs`, TigerBeetle `testing/storage.zig`):
//!
//! - Two images. Reads see the *live* one; a crash leaves the *durable* one. Every write,
//!   punch and `set_len` changes the live image at once and is queued as pending; `sync` moves
//!   the pending queue, in order, to the durable image.
//! - A crash ([`Faults::crash`]) returns a fresh disk holding the durable image, plus — drawn from
//!   the seeded generator — any subset of the pending operations, applied in any order, some of
//!   them torn (only a prefix of their sectors written). What did not arrive leaves the old bytes
//!   behind: lost writes, stale data, untruncated or unextended tails.
//! - A failed sync is final ([`Faults::fail_after`]), and like Linux after a writeback error it
//!   drops the pending writes: reads still see them, but they will never become durable.
//! - A power cut ([`Faults::power_cut_after`]) stops the disk after a chosen number of writes
//!   or syncs, its pending writes kept for the crash that follows: a crash between a write and
//!   its sync, where `fail_after` on the sync would drop them.
//! - [`Faults::corrupt`] flips bits wherever the data of a range lives.
//!
//! Everything is deterministic given the seed and the sequence of operations.

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::range::{eof, invalid, past_end, to_usize, within};
use crate::rng::Rng;
use crate::Disk;

/// Sector size used for torn writes unless [`Faults::set_sector_size`] changes it.
pub const DEFAULT_SECTOR_SIZE: usize = 512;

/// What a crash does with the operations that were not synced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CrashMode {
    /// Each unsynced operation independently is lost, arrives whole or arrives torn, and the
    /// arriving ones land in a random order. Drawn from the disk's seeded generator.
    #[default]
    Random,
    /// Every unsynced operation is lost: only synced data survives.
    LoseUnsynced,
    /// Every unsynced operation arrives, in order, whole (like a clean shutdown).
    KeepUnsynced,
}

/// An operation not yet durable, with offsets already checked against the live image.
#[derive(Debug, Clone)]
enum Pending {
    Write { offset: usize, data: Vec<u8> },
    SetLen(usize),
}

impl Pending {
    /// Applies the first `keep` bytes of the operation (all of a `SetLen`) to `image`.
    fn apply(&self, image: &mut Vec<u8>, keep: usize) {
        match self {
            Pending::Write { offset, data } => {
                let data = &data[..keep.min(data.len())];
                let end = offset + data.len();
                if image.len() < end {
                    // The write extended the file in the same breath (its `set_len` may not have
                    // arrived): a file system persists the size along with the data.
                    image.resize(end, 0);
                }
                image[*offset..end].copy_from_slice(data);
            }
            Pending::SetLen(len) => image.resize(*len, 0),
        }
    }

    fn len(&self) -> usize {
        match self {
            Pending::Write { data, .. } => data.len(),
            Pending::SetLen(_) => 0,
        }
    }
}

struct State {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    rng: Rng,
    sector_size: usize,
    /// Writes or syncs left to succeed before one fails.
    countdown: Option<u64>,
    /// Writes or syncs left to succeed before the power goes ([`Faults::power_cut_after`]).
    power_left: Option<u64>,
    /// An injected failure happened: every later sync fails.
    failed: bool,
    sync_fails: bool,
    crashed: bool,
    writes: u64,
    syncs: u64,
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("State")
            .field("live_len", &self.live.len())
            .field("durable_len", &self.durable.len())
            .field("pending", &self.pending.len())
            .field("failed", &self.failed)
            .field("crashed", &self.crashed)
            .field("writes", &self.writes)
            .field("syncs", &self.syncs)
            .finish_non_exhaustive()
    }
}

impl State {
    fn new(image: Vec<u8>, seed: u64, sector_size: usize) -> State {
        State {
            live: image.clone(),
            durable: image,
            pending: Vec::new(),
            rng: Rng::new(seed),
            sector_size,
            countdown: None,
            power_left: None,
            failed: false,
            sync_fails: false,
            crashed: false,
            writes: 0,
            syncs: 0,
        }
    }

    fn check_alive(&self) -> io::Result<()> {
        if self.crashed {
            return Err(io::Error::other("faulty disk: used after crash"));
        }
        Ok(())
    }

    /// Counts one write or sync against a power cut: when it comes, the disk stops as at a
    /// crash, keeping its pending writes for the crash to land, lose or tear.
    fn power(&mut self) -> io::Result<()> {
        match self.power_left {
            Some(0) => {
                self.power_left = None;
                self.crashed = true;
                Err(io::Error::other("faulty disk: power cut"))
            }
            Some(n) => {
                self.power_left = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Counts one write or sync against the failure countdown.
    fn tick(&mut self) -> io::Result<()> {
        match self.countdown {
            Some(0) => {
                self.countdown = None;
                self.failed = true;
                Err(injected("I/O"))
            }
            Some(n) => {
                self.countdown = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_alive()?;
        let range = within(offset, buf.len(), self.live.len())
            .ok_or_else(|| eof(offset, buf.len(), self.live.len() as u64))?;
        buf.copy_from_slice(&self.live[range]);
        Ok(())
    }

    /// A write of `data`, or of `len` zeros when `data` is `None` (a punched hole).
    fn write(&mut self, data: Option<&[u8]>, len: usize, offset: u64) -> io::Result<()> {
        self.check_alive()?;
        let range = within(offset, len, self.live.len())
            .ok_or_else(|| past_end(offset, len as u64, self.live.len() as u64))?;
        self.power()?;
        self.writes += 1;
        self.tick()?;
        let data = data.map_or_else(|| vec![0; len], <[u8]>::to_vec);
        self.live[range.clone()].copy_from_slice(&data);
        self.pending.push(Pending::Write {
            offset: range.start,
            data,
        });
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.check_alive()?;
        let len = to_usize(len)?;
        self.power()?;
        self.writes += 1;
        self.tick()?;
        self.live.resize(len, 0);
        self.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.check_alive()?;
        self.power()?;
        self.syncs += 1;
        let ticked = self.tick();
        if ticked.is_err() || self.failed || self.sync_fails {
            // fsyncgate: the kernel reports the error once and forgets the dirty pages. Reads
            // still see the data; it will never reach the media.
            self.pending.clear();
            return Err(injected("sync"));
        }
        for op in std::mem::take(&mut self.pending) {
            op.apply(&mut self.durable, op.len());
        }
        Ok(())
    }

    /// XORs every byte of `[offset, offset+len)` with a random non-zero mask, in both images and
    /// in the pending writes, so that no later sync or crash brings the old bytes back.
    fn corrupt(&mut self, offset: u64, len: u64) {
        let size = self.live.len().max(self.durable.len()) as u64;
        let end = offset.saturating_add(len).min(size);
        let (Ok(start), Ok(end)) = (usize::try_from(offset), usize::try_from(end)) else {
            return;
        };
        let masks: Vec<u8> = (start..end).map(|_| self.rng.nonzero_byte()).collect();
        xor_at(&mut self.live, start, &masks);
        xor_at(&mut self.durable, start, &masks);
        for op in &mut self.pending {
            if let Pending::Write { offset, data } = op {
                xor_into_write(*offset, data, start, &masks);
            }
        }
    }

    /// Ends this disk and returns the state of the one that boots after the crash.
    fn crash(&mut self, mode: CrashMode) -> State {
        let pending = std::mem::take(&mut self.pending);
        // The durable image stays, so crashing a crashed disk again boots the same image.
        let mut image = self.durable.clone();
        match mode {
            CrashMode::LoseUnsynced => {}
            CrashMode::KeepUnsynced => pending.iter().for_each(|op| op.apply(&mut image, op.len())),
            CrashMode::Random => self.apply_random(&pending, &mut image),
        }
        self.crashed = true;
        self.live = Vec::new();
        State::new(image, self.rng.next_u64(), self.sector_size)
    }

    fn apply_random(&mut self, pending: &[Pending], image: &mut Vec<u8>) {
        let mut arrived: Vec<(&Pending, usize)> = Vec::new();
        for op in pending {
            let keep = match self.rng.below(3) {
                0 => None,
                1 => Some(op.len()),
                _ => self.torn_len(op),
            };
            if let Some(keep) = keep {
                arrived.push((op, keep));
            }
        }
        self.rng.shuffle(&mut arrived);
        for (op, keep) in arrived {
            op.apply(image, keep);
        }
    }

    /// How many bytes of a torn write arrive: a random non-empty, proper prefix of its sectors.
    /// `None` (lost) for a write within a single sector, which cannot tear.
    fn torn_len(&mut self, op: &Pending) -> Option<usize> {
        let Pending::Write { offset, data } = op else {
            return None;
        };
        let s = self.sector_size;
        let first_cut = (offset / s + 1) * s;
        let last_cut = (offset + data.len()).checked_sub(1)? / s * s;
        if data.is_empty() || first_cut > last_cut {
            return None;
        }
        let cuts = (last_cut - first_cut) / s + 1;
        let cut = first_cut + self.rng.below(cuts) * s;
        Some(cut - offset)
    }
}

/// The error a real device returns, so callers see the same `raw_os_error()`.
fn injected(what: &str) -> io::Error {
    tracing::debug!("faulty disk: injecting an EIO on {what}");
    io::Error::from_raw_os_error(libc::EIO)
}

fn xor_at(image: &mut [u8], start: usize, masks: &[u8]) {
    for (b, m) in image.iter_mut().skip(start).zip(masks) {
        *b ^= m;
    }
}

/// XORs the bytes of a write at `write_offset` that fall in `[start, start+masks.len())`.
fn xor_into_write(write_offset: usize, data: &mut [u8], start: usize, masks: &[u8]) {
    let lo = write_offset.max(start);
    let hi = (write_offset + data.len()).min(start + masks.len());
    for i in lo..hi {
        data[i - write_offset] ^= masks[i - start];
    }
}

/// The test's handle on a [`FaultyDisk`]: clone it, give the disk away, and inject faults or
/// crash it from the test.
#[derive(Debug, Clone)]
pub struct Faults {
    state: Arc<Mutex<State>>,
}

impl Faults {
    // A panic in a test thread must not hide the disk from the test's assertions.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Crashes with [`CrashMode::Random`]; see [`Faults::crash_with`].
    pub fn crash(&self) -> FaultyDisk {
        self.crash_with(CrashMode::Random)
    }

    /// Crashes the disk: it fails every later operation, and the returned disk (with its own
    /// [`Faults`], same sector size, generator seeded from this one) holds what reached the
    /// media. The new disk's live and durable images are equal.
    pub fn crash_with(&self, mode: CrashMode) -> FaultyDisk {
        let next = self.lock().crash(mode);
        FaultyDisk::from_state(next)
    }

    /// After `n` more writes (including punches and `set_len`s) or syncs succeed, the next one
    /// fails with EIO — and every sync after it fails too: a failed fsync is final.
    pub fn fail_after(&self, n: u64) {
        self.lock().countdown = Some(n);
    }

    /// After `n` more writes (including punches and `set_len`s) or syncs succeed, the power
    /// goes: that operation and every later one fail, and the unsynced writes stay pending for
    /// [`Faults::crash`] — a crash between a write and its sync, at a chosen point.
    pub fn power_cut_after(&self, n: u64) {
        self.lock().power_left = Some(n);
    }

    /// Disarms [`Faults::fail_after`] if it has not fired yet.
    pub fn cancel_fail_after(&self) {
        self.lock().countdown = None;
    }

    /// While `true`, every sync fails with EIO and drops the pending writes (see the module doc).
    pub fn set_sync_fails(&self, fails: bool) {
        self.lock().sync_fails = fails;
    }

    /// Flips bits in every byte of `[offset, offset+len)` that exists, in the live and the
    /// durable image alike.
    pub fn corrupt(&self, offset: u64, len: u64) {
        self.lock().corrupt(offset, len);
    }

    /// The sector size that bounds torn writes; `InvalidInput` for 0.
    pub fn set_sector_size(&self, sector_size: usize) -> io::Result<()> {
        if sector_size == 0 {
            return Err(invalid("sector size must not be 0"));
        }
        self.lock().sector_size = sector_size;
        Ok(())
    }

    /// Writes, punches and `set_len`s accepted so far (including one that failed by injection).
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// Syncs attempted so far.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Operations not yet synced.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Whether an injected failure has fired (so every sync now fails).
    pub fn has_failed(&self) -> bool {
        self.lock().failed
    }

    /// A copy of what reads see.
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().live.clone()
    }

    /// A copy of what has been synced.
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }
}

/// A fault-injecting memory disk (see the module documentation). Like [`crate::MemDisk`] it
/// grows only through `set_len`.
#[derive(Debug)]
pub struct FaultyDisk {
    faults: Faults,
}

impl FaultyDisk {
    /// A disk of `len` zero bytes whose faults are drawn from `seed`.
    pub fn new(len: usize, seed: u64) -> FaultyDisk {
        FaultyDisk::from_image(vec![0; len], seed)
    }

    /// A disk holding `image`, live and durable.
    pub fn from_image(image: Vec<u8>, seed: u64) -> FaultyDisk {
        FaultyDisk::from_state(State::new(image, seed, DEFAULT_SECTOR_SIZE))
    }

    fn from_state(state: State) -> FaultyDisk {
        FaultyDisk {
            faults: Faults {
                state: Arc::new(Mutex::new(state)),
            },
        }
    }

    /// A handle for injecting faults that stays valid when the disk is moved elsewhere.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// Same as [`Faults::crash`].
    pub fn crash(&self) -> FaultyDisk {
        self.faults.crash()
    }
}

impl Disk for FaultyDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.faults.lock().read(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.faults.lock().write(Some(buf), buf.len(), offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.faults.lock().sync()
    }

    fn len(&self) -> io::Result<u64> {
        let state = self.faults.lock();
        state.check_alive()?;
        Ok(state.live.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.faults.lock().set_len(len)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.faults.lock().write(None, to_usize(len)?, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(data: &[u8], offset: usize) -> Pending {
        Pending::Write {
            offset,
            data: data.to_vec(),
        }
    }

    #[test]
    fn torn_len_cuts_at_sector_boundaries() {
        let mut state = State::new(Vec::new(), 1, 4);
        for _ in 0..100 {
            // Bytes 2..14 span sectors [0,4) [4,8) [8,12) [12,16): cuts at 4, 8, 12.
            let keep = state.torn_len(&write(&[1; 12], 2));
            assert!(matches!(keep, Some(2 | 6 | 10)), "{keep:?}");
        }
        assert_eq!(state.torn_len(&write(&[1; 4], 4)), None);
        assert_eq!(state.torn_len(&write(&[], 4)), None);
        assert_eq!(state.torn_len(&Pending::SetLen(3)), None);
    }

    #[test]
    fn corrupt_reaches_pending_writes() -> io::Result<()> {
        let disk = FaultyDisk::new(16, 3);
        let faults = disk.faults();
        disk.write_at(&[0xAA; 8], 4)?;
        faults.corrupt(6, 4);
        let live = faults.live_image();
        disk.sync()?;
        assert_eq!(faults.durable_image(), live);
        assert!(live[6..10].iter().all(|&b| b != 0xAA));
        assert_eq!(&live[4..6], &[0xAA; 2]);
        Ok(())
    }

    #[test]
    fn crashed_disk_refuses_io_and_crashes_to_the_same_image() -> io::Result<()> {
        let disk = FaultyDisk::new(16, 3);
        disk.write_at(b"synced", 0)?;
        disk.sync()?;
        disk.write_at(b"pending", 8)?;
        let first = disk.faults().crash_with(CrashMode::LoseUnsynced);
        assert!(disk.write_at(b"x", 0).is_err());
        assert!(disk.sync().is_err());
        assert!(disk.len().is_err());
        let again = disk.crash();
        assert_eq!(again.faults().live_image(), first.faults().live_image());
        Ok(())
    }
}
