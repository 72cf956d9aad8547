//! Format and open: preparing a data disk, reading its checkpoint, repairing a torn batch
//! from the double-write area, and (own-log mode) requeueing the log's records above the
//! checkpoint (lu-dissertation §3.2.3).
//!
//! Apart from the running engine because it runs once, before anything else uses the engine,
//! and reasons about the disk as a crash left it (see the recovery table in the crate docs).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Instant;

use mariner_disk::Disk;
use mariner_log::{HolderSpec, Log, RecordKind, ReplayPlan};
use rustc_hash::FxHashMap;

use super::memory::State;
use super::pending::GROUP_BLOCKS;
use mariner_cpuclass::CpuClass;

use super::{
    geometry, lock, BlockApp, Bosc, BoscConfig, BoscStats, Durability, Inner, NoSink, OpenReport,
    LOG_HOLDER,
};
use crate::format::homes::{HomeMap, LoggedHomes, HOMES_CODE};
use crate::format::{
    check_block, BlockError, BlockHeader, Checkpoint, CheckpointError, DiskId, Geometry,
    LoggedBatch, LoggedMod, Op, BATCH_CODE, CKPT_SLOTS,
};
use crate::runs::plan_runs;
use crate::Error;

impl<A: BlockApp> Bosc<A> {
    /// Prepares a data disk (growing it if needed) under a fresh random [`DiskId`]:
    /// checkpoint 0, nothing committed. An own log must be formatted separately with
    /// `Log::format`.
    pub fn format(disk: &dyn Disk, cfg: &BoscConfig) -> Result<(), Error> {
        Self::format_with_id(disk, cfg, DiskId::random()?)
    }

    /// [`Bosc::format`] with a chosen identity (reproducible disks for tests and tools). Both
    /// checkpoint slots are written valid, so the first checkpoint never overwrites the only
    /// valid one.
    pub fn format_with_id(disk: &dyn Disk, cfg: &BoscConfig, disk_id: DiskId) -> Result<(), Error> {
        let geo = geometry(cfg)?;
        if disk.len()? < geo.disk_bytes() {
            disk.set_len(geo.disk_bytes())?;
        }
        for (at, image) in Checkpoint::format_slots(geo, disk_id) {
            let mut slot = [0u8; 4096];
            slot[..image.len()].copy_from_slice(&image);
            disk.write_at(&slot, at)?;
        }
        if geo.shadow {
            // Every extent in home 0, for both checkpoints format writes.
            for counter in [0, 1] {
                let map = HomeMap::fresh(&geo, counter);
                disk.write_at(&map.encode(&geo, disk_id), geo.map_slot(counter))?;
            }
        }
        disk.sync()?;
        Ok(())
    }

    /// Opens a formatted disk and recovers (lu-dissertation §3.2.3): repairs a torn run from
    /// the double-write area, then (own-log mode) rebuilds the queues from the log records
    /// above the checkpoint and the youngest record's global frontier, filtered by each
    /// block's local frontier. Nothing is flushed; the commit cycle writes the queues later.
    pub fn open(
        disk: Arc<dyn Disk>,
        cfg: BoscConfig,
        durability: Durability,
        app: Arc<A>,
    ) -> Result<(Self, OpenReport), Error> {
        let started = Instant::now();
        let (ck, homes) = read_checkpoint(disk.as_ref())?;
        // The double-write area's size (or shadow extents instead) is the disk's, chosen when
        // it was formatted: a disk formatted under another `dw_runs` opens with its own.
        let geo = Geometry {
            dw_runs: ck.geometry.dw_runs,
            shadow: ck.geometry.shadow,
            ..geometry(&cfg)?
        };
        if ck.geometry != geo {
            return Err(Error::Config(format!(
                "disk was formatted as {:?}, configured {geo:?}",
                ck.geometry
            )));
        }
        if geo.dw_runs == 0 && matches!(durability, Durability::Caller) {
            // Torn blocks are found from the own log's modifications (`find_torn`): a caller's
            // arrive after open. Shadow extents log their moves in it.
            return Err(Error::Config(
                "a disk without a double-write area needs the own log".into(),
            ));
        }
        let mut report = OpenReport {
            checkpoint: ck.checkpoint,
            blocks_repaired: repair_from_double_write(disk.as_ref(), &geo, ck.disk_id)?,
            ..OpenReport::default()
        };
        let mut state = State {
            max_seen: ck.checkpoint,
            ckpt_counter: ck.counter,
            durable_ckpt: ck.checkpoint,
            ..State::default()
        };
        let mut replay = None;
        let log = match durability {
            Durability::Caller => None,
            Durability::OwnLog {
                devices,
                log,
                log_id,
                volume,
            } => {
                let holders = [HolderSpec::must_hold(LOG_HOLDER, ck.checkpoint, 0)];
                let t = Instant::now();
                let (log, rec) =
                    Log::open_streaming(devices, log, log_id, &holders, Arc::new(NoSink))?;
                report.log_open = t.elapsed();
                state.max_seen = rec.last_seq.max(ck.checkpoint);
                replay = Some(rec.replay);
                Some((log, volume))
            }
        };
        let holder = match &log {
            Some((log, _)) => Some(log.holder(LOG_HOLDER)?),
            None => None,
        };
        let cfg_budget = cfg.memory_budget_bytes;
        let inner = Arc::new(Inner {
            app,
            disk,
            geo,
            disk_id: ck.disk_id,
            cfg,
            log,
            holder,
            state: Mutex::new(state),
            wake: Condvar::new(),
            durable: Condvar::new(),
            commit_lock: Mutex::new(()),
            budget: AtomicUsize::new(cfg_budget),
            gate: RwLock::new(()),
            run_bufs: Mutex::new(Vec::new()),
            trim: Mutex::new(super::memory::Trim::default()),
            homes: homes.map(Mutex::new),
            filled: Mutex::new([0; 2]),
            stats: BoscStats::default(),
        });
        if let (Some(plan), Some((log, volume))) = (&replay, &inner.log) {
            let t = Instant::now();
            let (scanned, requeued, dropped) = inner.requeue(log, plan, *volume)?;
            report.requeue = t.elapsed();
            report.records_scanned = scanned;
            report.records_requeued = requeued;
            report.images_dropped = dropped;
            if inner.geo.dw_runs == 0 && !inner.geo.shadow {
                let torn = inner.find_torn()?;
                if let Some(&first) = torn.first() {
                    return Err(Error::Torn {
                        first,
                        count: torn.len() as u64,
                    });
                }
            }
        }
        let thread = match inner.cfg.background {
            Some(every) => {
                let inner = Arc::clone(&inner);
                let t = std::thread::Builder::new()
                    .name("bosc-commit".into())
                    .spawn(move || {
                        let _class = inner.cfg.cpu_class.as_ref().map(CpuClass::join);
                        inner.background(every);
                    })
                    .map_err(Error::from)?;
                Some(t)
            }
            None => None,
        };
        report.elapsed = started.elapsed();
        let bosc = Self {
            inner,
            thread: Mutex::new(thread),
        };
        Ok((bosc, report))
    }
}

/// The checkpoint to recover from, and on a disk of shadow extents the home map written with
/// it: the newest valid checkpoint whose map slot is valid and names its counter and sequence
/// number. A checkpoint written without its map (a crash before their common sync) is passed
/// over for the older one, whose map is in the other slot; the log was not released behind the
/// newer one. Both must match: a crash can land a map whose checkpoint did not, and after the
/// reopen the next checkpoint takes that counter again — a map of the same counter and
/// sequence number holds every move logged at or below it, and the moves after it are in the
/// log above it, so either map serves (found by `shadow_extents_survive_torn_moves`).
pub(super) fn read_checkpoint(disk: &dyn Disk) -> Result<(Checkpoint, Option<HomeMap>), Error> {
    let mut slots = [[0u8; crate::format::CKPT_LEN]; 2];
    for (buf, at) in slots.iter_mut().zip(CKPT_SLOTS) {
        disk.read_at(buf, at)?;
    }
    let newest = match Checkpoint::pick([&slots[0], &slots[1]]) {
        Ok(best) => best.ok_or(Error::NotFormatted)?,
        Err(CheckpointError::UnsupportedVersion(v)) => return Err(Error::UnsupportedVersion(v)),
        Err(CheckpointError::Magic | CheckpointError::Checksum) => return Err(Error::NotFormatted),
    };
    if !newest.geometry.shadow {
        return Ok((newest, None));
    }
    let mut candidates: Vec<Checkpoint> = slots
        .iter()
        .filter_map(|s| Checkpoint::decode(s).ok())
        .filter(|c| c.geometry == newest.geometry && c.disk_id == newest.disk_id)
        .collect();
    candidates.sort_by_key(|c| std::cmp::Reverse(c.counter));
    let geo = newest.geometry;
    let mut buf = vec![0u8; usize::try_from(geo.map_slot_bytes()).unwrap_or(0)];
    let mut why = None;
    for ck in candidates {
        disk.read_at(&mut buf, geo.map_slot(ck.counter))?;
        match HomeMap::decode(&buf, &geo, ck.disk_id) {
            Ok(map) if map.counter == ck.counter && map.checkpoint == ck.checkpoint => {
                return Ok((ck, Some(map)))
            }
            Ok(map) => {
                why = Some(format!(
                    "the map in its slot is of checkpoint {} (counter {})",
                    map.checkpoint, map.counter
                ))
            }
            Err(e) => why = Some(e.to_string()),
        }
    }
    Err(Error::Failed(format!(
        "no checkpoint of this disk of shadow extents has its home map: {}",
        why.unwrap_or_default()
    )))
}

/// The double-write area holds the last batch of runs, durable before any of it was written in
/// place, and whatever older batches left in the slots past it (their blocks were synced in
/// place before the next batch overwrote anything, so those copies are never newer than home).
/// Per block the copy with the highest LSN counts; a block whose in-place copy is torn or
/// older than it is restored.
pub(super) fn repair_from_double_write(
    disk: &dyn Disk,
    geo: &Geometry,
    id: DiskId,
) -> Result<u64, Error> {
    let bs = geo.block_bytes as usize;
    let mut area = vec![0u8; bs * geo.dw_slots() as usize];
    disk.read_at(&mut area, geo.dw_offset(0))?;
    let mut newest: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for (i, slot) in area.chunks(bs).enumerate() {
        let Ok(h) = check_block(slot, id, None) else {
            continue;
        };
        if h.lsn == 0 || h.block >= geo.block_count {
            continue;
        }
        let best = newest.entry(h.block).or_insert((h.lsn, i));
        if h.lsn > best.0 {
            *best = (h.lsn, i);
        }
    }
    let mut here = vec![0u8; bs];
    let mut repaired = 0;
    for (&block, &(lsn, i)) in &newest {
        disk.read_at(&mut here, geo.block_offset(block))?;
        let stale = check_block(&here, id, Some(block)).is_ok_and(|c| c.lsn >= lsn);
        if !stale {
            disk.write_at(&area[i * bs..(i + 1) * bs], geo.block_offset(block))?;
            repaired += 1;
        }
    }
    if repaired > 0 {
        disk.sync()?;
    }
    Ok(repaired)
}

/// The newest frontiers recovery has read (see [`Inner::requeue`]).
#[derive(Default)]
pub(super) struct Frontiers {
    /// Every sequence number below it is committed.
    pub(super) global: u64,
    /// Per block: every modification at or below it is committed. Looked up once per
    /// record replayed, a million and more at a reopen: FxHash, not SipHash (keys are block
    /// numbers from the engine's own log, not chosen by a peer).
    pub(super) local: FxHashMap<u64, u64>,
}

impl Frontiers {
    /// Drops the queued entries the frontiers say are committed.
    pub(super) fn prune(&self, st: &mut State) {
        let keys: Vec<u64> = st.groups.keys().copied().collect();
        for key in keys {
            let first = key * GROUP_BLOCKS;
            st.with_group(first, |g, _| {
                g.rebuild(|e| {
                    let lf = self.local.get(&(first + u64::from(e.offset))).copied();
                    (e.seq >= self.global && e.seq > lf.unwrap_or(0)).then_some(e)
                })
            });
        }
        let images: Vec<u64> = st.images.keys().copied().collect();
        for block in images {
            st.note_clean(block);
        }
    }
}

/// Records a requeue takes at a time ([`Chunk`]): about 4 MiB of them for a B+tree's.
const REQUEUE_CHUNK: usize = 65_536;

/// Replayed records waiting to be queued: they are queued a chunk at a time in block order (a
/// block's own in sequence order, as the queues need), so consecutive entries go to the same
/// group's arena and the same frontier, which in log order each lay somewhere else in memory.
/// A reopen of 2.3 M records spent most of its time on those cache misses (issue 18).
#[derive(Default)]
struct Chunk {
    /// (block, seq, op, local frontier, where its bytes are in `bytes`).
    records: Vec<(u64, u64, Op, u64, std::ops::Range<usize>)>,
    bytes: Vec<u8>,
    /// About what queueing them will take.
    memory: usize,
}

impl Chunk {
    fn push(&mut self, block: u64, seq: u64, op: Op, local_frontier: u64, bytes: &[u8]) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(bytes);
        self.records
            .push((block, seq, op, local_frontier, at..self.bytes.len()));
        self.memory += bytes.len() + 48;
    }

    /// Queues every record and notes its local frontier; leaves the chunk empty.
    fn requeue<A: BlockApp>(&mut self, inner: &Inner<A>, st: &mut State, f: &mut Frontiers) {
        // The bytes' position breaks ties: a batch record's entries for one block share its
        // sequence number and must queue in the order they were logged.
        self.records.sort_unstable_by_key(|r| (r.0, r.1, r.4.start));
        for (block, seq, op, local_frontier, range) in self.records.drain(..) {
            let lf = f.local.entry(block).or_insert(0);
            *lf = (*lf).max(local_frontier);
            inner.enqueue(st, block, seq, op, &self.bytes[range]);
        }
        self.bytes.clear();
        self.memory = 0;
    }
}

impl<A: BlockApp> Inner<A> {
    /// Own-log recovery (lu-dissertation §3.2.3), streamed: the log's records above the
    /// checkpoint arrive in sequence order and are queued as they come. Every record's
    /// frontiers are facts about the data disk when it was logged — everything below its
    /// global frontier, and everything of its block at or below its local frontier, was
    /// committed — so the newest of them (the youngest record's, in the seed) say which queued
    /// entries are committed already; those are dropped whenever the queues outgrow the budget,
    /// and once at the end. The queues thereby never hold much more than they did before the
    /// crash, where a list of the whole window (a million records) would not fit. What is
    /// left is the seed's replay window filtered by local frontiers; an entry that was
    /// committed after its block's youngest record was logged is requeued and skipped at
    /// commit by the block's LSN. Whole-block writes the disk has already are dropped as well
    /// ([`Self::settle_images`]), whenever the frontiers leave the queues over the budget and
    /// once at the end. Returns (modifications scanned, entries requeued, images dropped).
    pub(super) fn requeue(
        &self,
        log: &Log,
        plan: &ReplayPlan,
        volume: u32,
    ) -> Result<(u64, u64, u64), Error> {
        let mut st = lock(&self.state);
        let mut frontiers = Frontiers::default();
        let budget = self.budget.load(Ordering::Relaxed);
        let mut prune_above = budget;
        let (mut scanned, mut dropped, mut lsns) = (0, 0, HashMap::new());
        let mut chunk = Chunk::default();
        let mut flush = |st: &mut State, chunk: &mut Chunk, frontiers: &mut Frontiers| {
            chunk.requeue(self, st, frontiers);
            if st.memory_bytes > prune_above {
                frontiers.prune(st);
                if st.memory_bytes > budget {
                    dropped += self.settle_images(st, &mut lsns)?;
                }
                prune_above = st.memory_bytes.max(budget) + budget / 4;
            }
            Ok::<(), Error>(())
        };
        log.replay(plan, |f, payload| {
            let (seq, block) = (f.header.seq, f.header.offset);
            if f.header.kind != RecordKind::Write || f.header.volume != volume {
                return Ok(());
            }
            let mut push = |block: u64, op: Op, local_frontier: u64, bytes: &[u8]| {
                if block >= self.geo.block_count {
                    return Err::<(), Error>(Error::BadRecord(seq));
                }
                scanned += 1;
                chunk.push(block, seq, op, local_frontier, bytes);
                // A whole-block write brings a block image into memory when queued: a chunk
                // stays within an eighth of the budget, so the prune below keeps pace.
                if op == Op::Write {
                    chunk.memory += self.geo.block_bytes as usize;
                }
                Ok(())
            };
            // Extents a commit moved (shadow extents): before any later record's frontiers
            // call what the move carried committed, the map says where it is.
            if payload.get(2) == Some(&HOMES_CODE) {
                let moves = LoggedHomes::decode(payload).ok_or(Error::BadRecord(seq))?;
                let homes = self.homes.as_ref().ok_or(Error::BadRecord(seq))?;
                let mut map = lock(homes);
                for (extent, home) in moves {
                    if extent >= self.geo.extents() {
                        return Err(Error::BadRecord(seq));
                    }
                    map.set(extent, home);
                }
                return Ok(());
            }
            // A record's own frontiers lie below its sequence number, and so do those of every
            // record before it: it is queued, and the frontiers prune older entries later.
            // A batch record's entries share its number; a single modification's record is
            // what builds before batches wrote.
            let global_frontier = if payload.get(2) == Some(&BATCH_CODE) {
                let (gf, entries) = LoggedBatch::decode(payload).ok_or(Error::BadRecord(seq))?;
                for e in entries {
                    push(e.block, e.op, e.local_frontier, e.bytes)?;
                }
                gf
            } else {
                let (op, gf, local_frontier, bytes) =
                    LoggedMod::decode_parts(payload).ok_or(Error::BadRecord(seq))?;
                push(block, op, local_frontier, bytes)?;
                gf
            };
            frontiers.global = frontiers.global.max(global_frontier);
            if chunk.records.len() >= REQUEUE_CHUNK || chunk.memory > budget / 8 {
                flush(&mut st, &mut chunk, &mut frontiers)?;
            }
            Ok::<(), Error>(())
        })?;
        flush(&mut st, &mut chunk, &mut frontiers)?;
        frontiers.prune(&mut st);
        dropped += self.settle_images(&mut st, &mut lsns)?;
        Ok((scanned, st.pending as u64, dropped))
    }

    /// After a requeue: a whole-block write in the replay window (a B+tree's new leaf) is
    /// cached as an image, a block of memory, and the disk may have it already — the window
    /// reaches back to the oldest pending modification, and a local frontier drops an entry
    /// only if a later record of its block was logged after its commit. Under a B+tree
    /// splitting thousands of leaves a second, such images held 55 MB after a reopen where
    /// the queues had held 15 MB. So the blocks with images are read, in block order and in
    /// runs (new leaves bunch), and what the disk already has is dropped: entries at or below
    /// the block's LSN, and the image once nothing is pending. Returns the images dropped.
    /// Runs during recovery (nothing else uses the engine yet), under the state lock. The
    /// disk does not change meanwhile, so `lsns` keeps each block's LSN once read: a later
    /// call reads only blocks it has not seen.
    pub(super) fn settle_images(
        &self,
        st: &mut State,
        lsns: &mut HashMap<u64, u64>,
    ) -> Result<u64, Error> {
        let blocks: Vec<u64> = st
            .images
            .keys()
            .copied()
            .filter(|&b| st.has_pending(b))
            .collect();
        let unread: Vec<u64> = blocks
            .iter()
            .copied()
            .filter(|b| !lsns.contains_key(b))
            .collect();
        self.read_checked(&unread, |block, check| {
            let lsn = match check {
                Ok(h) => h.lsn,
                // Without a double-write area a block may be torn: one with an image (a
                // whole-block write) keeps everything queued and takes its content from the
                // image; `find_torn` names the others.
                Err(_) if self.geo.dw_runs == 0 && !self.geo.shadow => 0,
                Err(error) => return Err(Error::Block { block, error }),
            };
            lsns.insert(block, lsn);
            Ok(())
        })?;
        let mut dropped = 0;
        for b in blocks {
            let lsn = lsns.get(&b).copied().unwrap_or(0);
            st.with_group(b, |g, offset| {
                g.rebuild(|e| (e.offset != offset || e.seq > lsn).then_some(e))
            });
            if st.has_pending(b) {
                st.note_clean(b);
            } else {
                st.evict_image(b);
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    /// Without a double-write area (`dw_runs` 0): the blocks a crash tore in place. A commit
    /// writes in place only blocks with modifications the own log holds above the
    /// checkpoint (which is written after the batch's sync), and a record's frontiers say a
    /// block's modifications are committed only once its batch is synced; so after a requeue
    /// every block a batch was writing when the crash came still has modifications queued.
    /// Those with an image (whole-block writes, a B+tree's new leaves) take their content
    /// from it; the rest are read, in block order and in runs, and checked. Runs during
    /// recovery, before anything else uses the engine.
    pub(super) fn find_torn(&self) -> Result<Vec<u64>, Error> {
        let wanted: Vec<u64> = {
            let st = lock(&self.state);
            let mut v = Vec::new();
            for (&key, g) in &st.groups {
                for offset in g.offsets() {
                    let block = key * GROUP_BLOCKS + u64::from(offset);
                    if !st.images.contains_key(&block) {
                        v.push(block);
                    }
                }
            }
            v.sort_unstable();
            v
        };
        let mut torn = Vec::new();
        self.read_checked(&wanted, |block, check| {
            if check.is_err() && wanted.binary_search(&block).is_ok() {
                torn.push(block);
            }
            Ok(())
        })?;
        Ok(torn)
    }

    /// Reads `wanted` (ascending) in runs of up to 256 blocks, more than a tenth of each run
    /// wanted (new leaves bunch), and hands `f` every block read — wanted or read along —
    /// with its check.
    fn read_checked(
        &self,
        wanted: &[u64],
        mut f: impl FnMut(u64, Result<BlockHeader, BlockError>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        const MAX_READ: u64 = 256;
        let bs = self.geo.block_bytes as usize;
        let mut buf = Vec::new();
        for run in plan_runs(wanted, MAX_READ, 0.1) {
            buf.resize(run.len as usize * bs, 0);
            self.read_span(&mut buf, run.start, false)?;
            for (block, img) in (run.start..).zip(buf.chunks(bs)) {
                f(block, check_block(img, self.disk_id, Some(block)))?;
            }
        }
        Ok(())
    }
}
