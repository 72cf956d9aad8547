//! The LT index (lu-dissertation §4.6.8): a BOSC B+tree from (volume, piece, volume sequence
//! number) to where that version of the piece lies, in BOSC's own-log mode (a batch is
//! durable when [`LtIndex::insert`] returns).
//!
//! Keys use the tree's (volume, lba, timestamp) fields as (volume, [`Piece::key_lba`], volume
//! sequence number): the volume's own numbering orders its versions exactly as time does, and
//! is unique where nanosecond timestamps need not be. Values:
//!
//! | bits  | meaning |
//! |-------|---------|
//! | 63–56 | log device |
//! | 55    | 1: the version reads as zeros (trim, write-zeroes); the rest is then 0 |
//! | 54–0  | byte offset of the record on the device |
//!
//! A lookup of one sector as of V is one predecessor search per piece level the volume has
//! used ([`LtIndex::newest`]), so its cost does not depend on how often the neighbouring
//! blocks were written.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use mariner_bosc::btree::{BPlusTree, Key, LeafApp};
use mariner_bosc::{Bosc, BoscConfig, Durability, WriteGap};
use mariner_cpuclass::CpuClass;
use mariner_log::{Log, LogAddr, LogConfig, RecordKind};

use crate::digest::Digests;
use crate::files::{FileUse, Files};
use crate::pieces::{covering, decompose, sectors_of, Piece, LEVELS};
use crate::state::VolumeState;
use crate::{DigestEntry, HistoryError};

const DATA: &str = "index.data";
const LOG: &str = "index.log";
const ROUTER: &str = "index.router";
/// The identity of the index's own log.
const LOG_ID: u128 = 0x4849_5354_4C54_0001;
const ZERO: u64 = 1 << 55;
const OFFSET_MASK: u64 = ZERO - 1;

/// Where a version of a piece lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// In the payload of the log record at this address.
    Log(LogAddr),
    /// Zeros.
    Zero,
}

impl Version {
    pub fn encode(self) -> Result<u64, HistoryError> {
        match self {
            Self::Zero => Ok(ZERO),
            Self::Log(addr) if addr.offset() & !OFFSET_MASK == 0 => Ok(addr.0),
            Self::Log(addr) => Err(HistoryError::Config(format!(
                "log offset {} is past what the index encodes",
                addr.offset()
            ))),
        }
    }

    pub fn decode(v: u64) -> Self {
        if v & ZERO != 0 {
            Self::Zero
        } else {
            Self::Log(LogAddr(v))
        }
    }
}

/// Sizes of the index's files and memory.
#[derive(Debug, Clone)]
pub struct IndexConfig {
    /// Leaves the data file can hold (it is sparse: only written leaves take space).
    pub block_count: u64,
    pub block_bytes: u32,
    /// What BOSC's queues may hold.
    pub memory_budget_bytes: usize,
    /// Bytes of the index's own log.
    pub log_bytes: u64,
    pub log_segment_bytes: u64,
    /// `Some`: BOSC's commit cycle runs in the background at this interval.
    pub background: Option<Duration>,
    /// The CPU class of BOSC's threads (history's, which it moves).
    pub cpu_class: Option<Arc<CpuClass>>,
    /// What BOSC's commits wait in before each piece of their writes (history's: a gap
    /// between the log's writes, made in `History::open`).
    pub write_gap: Option<WriteGap>,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            block_count: 1 << 20,
            block_bytes: 4096,
            memory_budget_bytes: 64 << 20,
            log_bytes: 256 << 20,
            log_segment_bytes: 4 << 20,
            background: Some(Duration::from_millis(10)),
            cpu_class: None,
            write_gap: None,
        }
    }
}

impl IndexConfig {
    fn bosc(&self) -> BoscConfig {
        BoscConfig {
            block_bytes: self.block_bytes,
            block_count: self.block_count,
            memory_budget_bytes: self.memory_budget_bytes,
            background: self.background,
            // The index shares its device with the log and the images: its sweep waits until
            // the queues are half full, so each leaf written carries many entries.
            sweep_above: 0.5,
            // And leaves read for splits are kept only within a quarter of the budget:
            // modified, each would hold 4 KiB of it until committed.
            image_share: 0.25,
            // And no double-write area: the index is made from history's digests, so a leaf a
            // crash tore is rebuilt from them at open (`History::open`), and a commit writes
            // 128 KiB (one run) in place with one sync instead of twice with two. In
            // bench/history-overhead.sh (a) that was 6-7 % more depth-32 writes (the index
            // wrote 1.8 KiB a write, half of it the double write; docs/benchmarks.md). Only
            // for an index formatted now: a disk keeps its own.
            dw_runs: 0,
            cpu_class: self.cpu_class.clone(),
            write_gap: self.write_gap.clone(),
            ..BoscConfig::default()
        }
    }

    fn log(&self) -> LogConfig {
        LogConfig {
            segment_bytes: self.log_segment_bytes,
            t_wait_ns: 0,
            ..LogConfig::default()
        }
    }
}

/// The index.
pub struct LtIndex {
    tree: BPlusTree,
    /// Per volume, the piece levels it has entries at (bit L: level L): lookups skip the
    /// others. Persisted with history's state, which covers every entry it makes durable.
    levels: Mutex<BTreeMap<u32, u8>>,
}

fn io(files: &dyn Files, name: &str) -> impl Fn(std::io::Error) -> HistoryError {
    let path = files.path(name);
    move |source| HistoryError::Io {
        path: path.clone(),
        source,
    }
}

impl LtIndex {
    /// Makes a new, empty index, replacing any files an earlier attempt left.
    pub fn create(files: &dyn Files, cfg: &IndexConfig) -> Result<(), HistoryError> {
        for name in [DATA, LOG, ROUTER] {
            files.remove(name).map_err(io(files, name))?;
        }
        let data = files.open(DATA, FileUse::Random).map_err(io(files, DATA))?;
        Bosc::<LeafApp>::format(data.as_ref(), &cfg.bosc())?;
        let log = files
            .open(LOG, FileUse::Sequential)
            .map_err(io(files, LOG))?;
        log.set_len(cfg.log_bytes).map_err(io(files, LOG))?;
        // Zero-filled, so a sync of a log write does not also commit the file system's
        // journal for a newly allocated extent.
        mariner_disk::write_zeros(log.as_ref(), 0, cfg.log_bytes).map_err(io(files, LOG))?;
        log.sync().map_err(io(files, LOG))?;
        Log::format(&[log], &cfg.log(), LOG_ID)?;
        files
            .open(ROUTER, FileUse::Random)
            .map_err(io(files, ROUTER))?;
        files.sync_dir().map_err(io(files, "."))?;
        Ok(())
    }

    /// Opens (and recovers) the index; `levels` as persisted.
    pub fn open(
        files: &dyn Files,
        cfg: &IndexConfig,
        levels: BTreeMap<u32, u8>,
    ) -> Result<Self, HistoryError> {
        let data = files.open(DATA, FileUse::Random).map_err(io(files, DATA))?;
        let log = files
            .open(LOG, FileUse::Sequential)
            .map_err(io(files, LOG))?;
        let router = files
            .open(ROUTER, FileUse::Random)
            .map_err(io(files, ROUTER))?;
        let durability = Durability::OwnLog {
            devices: vec![log],
            log: cfg.log(),
            log_id: LOG_ID,
            volume: 0,
        };
        let (bosc, _report) = Bosc::open(data, cfg.bosc(), durability, Arc::new(LeafApp))?;
        let tree = BPlusTree::open_with_router(bosc, None, router)?;
        if let Some(why) = &tree.router_open().fallback {
            tracing::info!(why = %why, "history index: router rebuilt by a scan of the leaves");
        }
        Ok(Self {
            tree,
            levels: Mutex::new(levels),
        })
    }

    /// Whether `e`, from [`Self::open`], says the index is damaged (a leaf torn by a crash,
    /// or failing its checksum) rather than unreadable: then it is rebuilt ([`Self::rebuild`]).
    pub fn damaged(e: &HistoryError) -> bool {
        matches!(
            e,
            HistoryError::Index(
                mariner_bosc::Error::Torn { .. } | mariner_bosc::Error::Block { .. }
            )
        )
    }

    /// Fills a new index from the digests: what the damaged one held — every version of a
    /// volume history keeps, newer than its base, indexed through `through` (records above it
    /// are indexed again from the log, as after any restart). In batches, each durable.
    /// Returns the keys inserted.
    pub fn rebuild(
        &self,
        digests: &Digests,
        volumes: &BTreeMap<u32, VolumeState>,
        through: u64,
    ) -> Result<usize, HistoryError> {
        const BATCH: usize = 65_536;
        let mut batch = Vec::with_capacity(BATCH);
        let mut keys = 0;
        digests.for_each(0, through, None, |e| {
            if volumes
                .get(&e.volume)
                .is_some_and(|v| e.volume_seq > v.base_vseq)
            {
                batch.push(*e);
                if batch.len() == BATCH {
                    keys += self.insert(&batch)?;
                    batch.clear();
                }
            }
            Ok(())
        })?;
        keys += self.insert(&batch)?;
        Ok(keys)
    }

    /// The keys and values of `e`'s pieces; none for records that change no data.
    pub fn entries_of(e: &DigestEntry) -> Result<Vec<(Key, u64, u8)>, HistoryError> {
        let version = match e.kind {
            RecordKind::Write => Version::Log(e.addr),
            RecordKind::Trim | RecordKind::WriteZeroes => Version::Zero,
            _ => return Ok(Vec::new()),
        };
        let value = version.encode()?;
        let (start, end) = sectors_of(e.offset, u64::from(e.length)).ok_or_else(|| {
            HistoryError::Config(format!(
                "record {} covers bytes {}+{}, not whole sectors",
                e.seq, e.offset, e.length
            ))
        })?;
        Ok(decompose(start, end)
            .map(|p| {
                (
                    Key::new(e.volume, p.key_lba(), e.volume_seq),
                    value,
                    p.level,
                )
            })
            .collect())
    }

    /// Indexes `entries`; durable when it returns. Returns the keys inserted.
    pub fn insert(&self, entries: &[DigestEntry]) -> Result<usize, HistoryError> {
        let mut records = Vec::with_capacity(entries.len());
        let mut used: BTreeMap<u32, u8> = BTreeMap::new();
        for e in entries {
            for (key, value, level) in Self::entries_of(e)? {
                records.push((key, value));
                *used.entry(e.volume).or_default() |= 1 << level;
            }
        }
        if records.is_empty() {
            return Ok(0);
        }
        // Levels first: a lookup racing the insert must not skip a level it is about to hold.
        {
            let mut l = self.levels.lock().unwrap_or_else(PoisonError::into_inner);
            for (v, m) in used {
                *l.entry(v).or_default() |= m;
            }
        }
        records.sort_unstable_by_key(|r| r.0);
        self.tree.insert_batch(&records)?;
        Ok(records.len())
    }

    /// The newest version of `sector` of `volume` at or before volume sequence number `at`:
    /// (its volume sequence number, where it lies). One predecessor search per level used.
    pub fn newest(
        &self,
        volume: u32,
        sector: u64,
        at: u64,
    ) -> Result<Option<(u64, Version)>, HistoryError> {
        let mask = self.level_mask(volume);
        let mut best: Option<(u64, Version)> = None;
        for p in covering(sector) {
            if mask & (1 << p.level) == 0 {
                continue;
            }
            if let Some((vseq, v)) = self.tree.newest_at_or_before(volume, p.key_lba(), at)? {
                if best.is_none_or(|(b, _)| vseq > b) {
                    best = Some((vseq, Version::decode(v)));
                }
            }
        }
        Ok(best)
    }

    /// For each sector of `[start, end)`, the newest version at or before `at` (as
    /// [`Self::newest`]), one search per piece intersecting the range at each level used.
    pub fn newest_range(
        &self,
        volume: u32,
        start: u64,
        end: u64,
        at: u64,
    ) -> Result<Vec<Option<(u64, Version)>>, HistoryError> {
        let n = usize::try_from(end.saturating_sub(start))
            .map_err(|_| HistoryError::Config("range too large".into()))?;
        let mut out: Vec<Option<(u64, Version)>> = vec![None; n];
        if n == 0 {
            return Ok(out);
        }
        let mask = self.level_mask(volume);
        for level in 0..LEVELS as u8 {
            if mask & (1 << level) == 0 {
                continue;
            }
            let shift = crate::pieces::RADIX_BITS * u32::from(level);
            let first = start >> shift;
            let lbas: Vec<u64> = (first..=((end - 1) >> shift))
                .map(|index| Piece { level, index }.key_lba())
                .collect();
            let found = self.tree.newest_at_or_before_each(volume, &lbas, at)?;
            for (index, found) in (first..).zip(found) {
                let p = Piece { level, index };
                let Some((vseq, v)) = found else {
                    continue;
                };
                let lo = p.first_sector().max(start);
                let hi = (p.first_sector() + p.sectors()).min(end);
                for slot in &mut out[(lo - start) as usize..(hi - start) as usize] {
                    if slot.is_none_or(|(b, _)| vseq > b) {
                        *slot = Some((vseq, Version::decode(v)));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Lets go of the versions of `entries` (they left the window and are in the base
    /// images), durably, with one group commit: each leaf holding one of their keys drops
    /// every key of that volume numbered up to the newest of `entries` in it — theirs, and
    /// any an earlier round left (a leaf split while its drop was queued). One modification a
    /// leaf, not a delete a key: a round's 262,144 records touch a few thousand leaves.
    /// Returns the keys of `entries` (every one of them is gone).
    pub fn remove(&self, entries: &[DigestEntry]) -> Result<usize, HistoryError> {
        let mut keys = Vec::new();
        let mut through: BTreeMap<u32, u64> = BTreeMap::new();
        for e in entries {
            let before = keys.len();
            keys.extend(Self::entries_of(e)?.into_iter().map(|(k, _, _)| k));
            if keys.len() > before {
                let t = through.entry(e.volume).or_default();
                *t = (*t).max(e.volume_seq);
            }
        }
        keys.sort_unstable();
        self.tree
            .drop_through(&keys, |volume| through.get(&volume).copied())?;
        Ok(keys.len())
    }

    fn level_mask(&self, volume: u32) -> u8 {
        let l = self.levels.lock().unwrap_or_else(PoisonError::into_inner);
        l.get(&volume).copied().unwrap_or(0)
    }

    /// The levels each volume uses, for history's state.
    pub fn levels(&self) -> BTreeMap<u32, u8> {
        self.levels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn tree(&self) -> &BPlusTree {
        &self.tree
    }
}
