//! The engine: per-block update queues, durability, the sequential commit cycle, recovery.
//!
//! This file holds the engine's public types and [`Bosc`]'s thin public API; the work is in
//! submodules along the engine's seams, each touching the shared `Inner` state from one side:
//! - `open`: format, checkpoint read, double-write repair, requeue from the own log;
//! - `submit`: modifications coming in (own-log bursts, caller positions, bulk load);
//! - `memory`: the queues' state and its exact accounting against the budget, forced commits;
//! - `query`: reads merged with the queues, the sequential scan, reads ahead;
//! - `commit`: the commit cycle, its pipeline, the double write and the checkpoint;
//! - `homes`: shadow extents; `ahead`: filling the data disk's holes ahead of the commits;
//! - `pending`: the per-group queue arenas.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use mariner_cpuclass::CpuClass;
use mariner_disk::Disk;
use mariner_log::{Durable, DurableSink, Holder, Log, LogConfig};

/// The name BOSC holds its own log's space under: it releases behind each checkpoint.
const LOG_HOLDER: &str = "bosc";

use crate::format::homes::HomeMap;
use crate::format::{DiskId, Geometry, Op, BLOCK_HEADER_LEN};
use crate::Error;

mod ahead;
mod commit;
mod homes;
mod memory;
mod open;
mod pending;
mod query;
mod submit;

pub(crate) use memory::map_entry_bytes;
use memory::State;
use pending::Group;
pub(crate) use submit::Submitted;

/// The application's update function (the seed's commit function). It is handed the block's
/// payload (the block minus BOSC's header) and one modification, and must be deterministic: the
/// same payload and modification give the same result. BOSC applies each modification to the
/// durable block at most once (see [`Bosc`] on idempotence), so it need not be idempotent itself.
pub trait BlockApp: Send + Sync + 'static {
    fn apply(&self, block: u64, payload: &mut [u8], modification: &[u8]);

    /// Whether a block the commit cycle just merged should stay in memory for the
    /// application to act on without reading it again ([`Bosc::take_hot`]): the B+tree's
    /// leaves due for a split (the second part of the seed's two-part commit function,
    /// lu-dissertation §3.3). Only while the memory budget has room.
    fn hot(&self, _block: u64, _payload: &[u8]) -> bool {
        false
    }
}

/// Who makes a modification durable before `modify` returns.
pub enum Durability {
    /// BOSC logs every modification to its own mariner-log before acknowledging it.
    OwnLog {
        devices: Vec<Arc<dyn Disk>>,
        log: LogConfig,
        log_id: u128,
        /// The `volume` field BOSC's records carry.
        volume: u32,
    },
    /// The caller's own record is already durable; BOSC keeps only a checkpoint of the
    /// caller's log position ([`Bosc::checkpoint`]) and the caller replays above it.
    Caller,
}

/// One modification of a [`Bosc::modify_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub block: u64,
    pub op: Op,
    /// The modification ([`Op::App`]) or the payload ([`Op::Write`]).
    pub bytes: Vec<u8>,
}

impl Change {
    /// A modification for the application's update function.
    pub fn modify(block: u64, modification: Vec<u8>) -> Self {
        Self {
            block,
            op: Op::App,
            bytes: modification,
        }
    }

    /// A plain write of a whole payload.
    pub fn write(block: u64, payload: Vec<u8>) -> Self {
        Self {
            block,
            op: Op::Write,
            bytes: payload,
        }
    }
}

/// Geometry and policy.
#[derive(Debug, Clone)]
pub struct BoscConfig {
    pub block_bytes: u32,
    pub block_count: u64,
    /// Longest commit run, in blocks (32 in the seed).
    pub max_run: u32,
    /// A run's share of blocks with pending updates must exceed this (0.5 in the seed).
    pub min_pending_ratio: f64,
    /// What the queues hold — entries, the bytes of modifications, cached block images and
    /// the maps' own overhead, as allocated; above it `modify` commits first.
    pub memory_budget_bytes: usize,
    /// Runs committed per cycle before the checkpoint is written.
    pub runs_per_cycle: usize,
    /// Runs the double-write area holds (part of the disk's geometry): a cycle's runs are
    /// double-written and written in place in batches of this many, one pair of syncs per
    /// batch instead of per run. Fixed when the disk is formatted: a disk opens with its own.
    ///
    /// 0: no double-write area (own-log mode only). A batch of one run is written in place
    /// with one sync; a block a crash tore in place is not repaired but found at open — every
    /// block the own log still has modifications for is read and checked, which covers every
    /// block a commit was writing — and open fails with [`Error::Torn`](crate::Error::Torn).
    /// For trees that can be rebuilt from elsewhere: half the bytes and syncs per commit.
    pub dw_runs: u16,
    /// Shadow extents instead of a double-write area (with `dw_runs` 0, own-log mode only;
    /// part of the disk's geometry, docs/FORMATS.md "Shadow extents"): every extent of
    /// `max_run` blocks has two homes, a commit writes an extent whole to the home it is not
    /// in and logs the move, and a torn write leaves the current home as it was. Half the
    /// bytes a double write costs, one sync per batch instead of two; twice the disk.
    pub shadow: bool,
    /// `Some(interval)`: a background thread runs the commit cycle. `None`: only
    /// [`Bosc::commit_cycle`] and forced commits do (deterministic tests).
    pub background: Option<Duration>,
    /// The background cycle sweeps only while the queues hold more than this share of the
    /// budget, or the own log is more than half full (default 0.5). 0.0: it sweeps whenever
    /// anything is pending, as the seed's BOSC does on data disks of its own (lu-dissertation
    /// §3.2). Beside other writers on one device — the own log, history's log and images — a
    /// sweep that never waits writes each block for the few modifications that came since the
    /// last pass, and its writes and syncs queue ahead of the own log's: when syncs come
    /// every 10 operations, the B+tree wrote 1.1 blocks per insert and did 9.8 k inserts/s
    /// against 22 k with the default (docs/benchmarks.md, "Issue 18's grid"). Waiting until the
    /// queues are this full gathers many modifications per block written.
    pub sweep_above: f64,
    /// Between `sweep_above` and this share of the budget (or of the own log's room) the
    /// background sweep rests after each batch it writes, so it keeps the device busy a tenth
    /// of the time just above `sweep_above`, rising to all of it here and beyond (default 0.9).
    /// Every MB/s a sweep reads and writes slows the own log's small durable writes on the
    /// same device: flat out (~160 MB/s each way) it made them 4x slower (200 -> 800 us) and a
    /// writer syncing every 10 operations 3.5x slower for as long as it ran
    /// (docs/benchmarks.md, "Issue 18: a sync every 10 operations"). Rested, the same bytes
    /// are spread out, and writers beside it never see the device taken for long. Forced
    /// commits and explicit cycles never rest. At or below `sweep_above`: never rests.
    pub sweep_full_above: f64,
    /// Share of the budget that block images a query read may take to be kept (1.0: any
    /// room). A kept image takes later modifications at once, but once modified it stays
    /// until committed: under a small budget, images of leaves each holding a few
    /// modifications crowd out the queues, and every commit writes a block for those few.
    pub image_share: f64,
    /// The CPU class of the engine's threads (the commit cycle's and its pipeline's; the
    /// B+tree's leaf readers), which the owner moves between the idle and the normal class
    /// (`mariner_cpuclass`). `None`: the normal class.
    pub cpu_class: Option<Arc<CpuClass>>,
    /// Before a commit writes past what the data disk's file has allocated, the holes of the
    /// next this many bytes (per home) are written with zeros (`ahead`): the file system then
    /// allocates in pieces of this size instead of under every batch's sync, where its journal
    /// commit delays the own log's writes on the same device. 0: never (a data disk that is
    /// not sparse, or a device, has no holes and costs one query per fill either way).
    pub fill_ahead_bytes: u64,
    /// Called before each piece ([`mariner_log::DeviceBusy::PIECE`] bytes) of a commit's in-place writes is
    /// handed to the device, ahead of the batch's sync; `None`: the batch is synced whole.
    pub write_gap: Option<WriteGap>,
}

/// What a commit calls before each piece of its in-place writes goes to the device: the
/// owner waits there for a gap in its own writes on the same device (history: between two
/// of the log's writes, while its threads are in the background class). A 128 KiB run
/// synced at once takes the device for about a millisecond, and a log write arriving then
/// waits for all of it.
#[derive(Clone)]
pub struct WriteGap(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for WriteGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteGap")
    }
}

impl Default for BoscConfig {
    fn default() -> Self {
        Self {
            block_bytes: 4096,
            block_count: 1024,
            max_run: 32,
            min_pending_ratio: 0.5,
            memory_budget_bytes: 64 << 20,
            runs_per_cycle: 64,
            dw_runs: 8,
            shadow: false,
            background: Some(Duration::from_millis(10)),
            sweep_above: 0.5,
            sweep_full_above: 0.9,
            image_share: 1.0,
            cpu_class: None,
            fill_ahead_bytes: 8 << 20,
            write_gap: None,
        }
    }
}

/// Counters, all monotonic.
#[derive(Debug, Default)]
pub struct BoscStats {
    pub modifications: AtomicU64,
    pub applied_in_memory: AtomicU64,
    pub runs_committed: AtomicU64,
    /// Double-write batches (one pair of syncs each) the runs were written in.
    pub batches_written: AtomicU64,
    pub blocks_written: AtomicU64,
    pub forced_commits: AtomicU64,
    /// Time callers of `modify` spent in forced commits.
    pub forced_wait_ns: AtomicU64,
    /// Time callers of `modify` spent waiting for their log records to become durable.
    pub log_wait_ns: AtomicU64,
    /// Runs of blocks whose whole image waited in memory, committed first by forced commits.
    pub image_runs_committed: AtomicU64,
    /// Blocks the commit cycle kept in memory because the application called them hot.
    pub kept_hot: AtomicU64,
    /// Blocks read ahead for the application ([`Bosc::read_hot`]).
    pub read_hot: AtomicU64,
    /// Times the memory commits freed was given back to the system, and the time it took.
    pub heap_trims: AtomicU64,
    pub heap_trim_ns: AtomicU64,
    /// Time the background sweep rested between batches (`sweep_full_above`).
    pub sweep_rest_ns: AtomicU64,
    /// Zeros written into holes of the data disk ahead of the commits (`fill_ahead_bytes`).
    pub filled_ahead_bytes: AtomicU64,
}

/// What opening found.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    /// The durable checkpoint: every sequence number / caller position at or below it is
    /// committed to the data disk.
    pub checkpoint: u64,
    /// Blocks restored from the double-write area.
    pub blocks_repaired: u64,
    /// Modifications read back from the own log (a batch record holds many), and those
    /// requeued.
    pub records_scanned: u64,
    pub records_requeued: u64,
    /// Of those, whole-block writes found on the data disk already and dropped
    /// ([`Bosc::open`]).
    pub images_dropped: u64,
    pub elapsed: Duration,
    /// Of `elapsed`: opening the own log (its recovery scan), and requeueing its records.
    pub log_open: Duration,
    pub requeue: Duration,
}

struct Inner<A> {
    app: Arc<A>,
    disk: Arc<dyn Disk>,
    geo: Geometry,
    /// Salts every block CRC ([`DiskId`]); from the checkpoint.
    disk_id: DiskId,
    cfg: BoscConfig,
    log: Option<(Log, u32)>,
    /// Its hold on the own log's space, released behind each checkpoint.
    holder: Option<Holder>,
    state: Mutex<State>,
    wake: Condvar,
    /// Signalled when a burst leaves `State::undurable` or the engine fails.
    durable: Condvar,
    commit_lock: Mutex<()>,
    /// The memory budget in force (starts as `cfg.memory_budget_bytes`).
    budget: AtomicUsize,
    /// Queries read the disk under `read`; commit writes blocks in place and drops committed
    /// entries under `write`, so a query never sees a half-written block, nor pairs a stale
    /// disk image with a queue that already lost its entries.
    gate: RwLock<()>,
    /// Run buffers of the commit pipeline, reused: allocated per run and freed on another
    /// thread, they left the allocator's per-thread arenas holding tens of MB.
    run_bufs: Mutex<Vec<Vec<u8>>>,
    /// What commits freed since the heap was last trimmed.
    trim: Mutex<memory::Trim>,
    /// Which home each extent is in, on a disk of shadow extents ([`homes`]).
    homes: Option<Mutex<HomeMap>>,
    /// Per home, the block below which every write of this engine lies and above which no
    /// fill has written ([`ahead`]).
    filled: Mutex<[u64; 2]>,
    stats: BoscStats,
}

/// A BOSC engine over one data disk.
///
/// Idempotence: every block carries the LSN of the last modification applied to it, and a
/// block's modifications are always committed as a prefix in sequence order. Recovery may
/// requeue a modification that was already committed (a record's local frontier is captured
/// when it is logged, so later commits are not reflected); commit and query apply only
/// modifications whose sequence number is above the block's LSN, so a committed one is never
/// applied twice, whatever the application's function does.
pub struct Bosc<A: BlockApp> {
    inner: Arc<Inner<A>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct NoSink;
impl DurableSink for NoSink {
    fn durable(&self, _records: &[Durable]) {}
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn apply_op<A: BlockApp>(app: &A, block: u64, image: &mut [u8], op: Op, bytes: &[u8]) {
    let payload = &mut image[BLOCK_HEADER_LEN..];
    match op {
        Op::App => app.apply(block, payload, bytes),
        Op::Write => {
            let n = bytes.len().min(payload.len());
            payload[..n].copy_from_slice(&bytes[..n]);
            payload[n..].fill(0);
        }
    }
}

fn geometry(cfg: &BoscConfig) -> Result<Geometry, Error> {
    if cfg.block_bytes < 512 || !cfg.block_bytes.is_power_of_two() || cfg.max_run == 0 {
        return Err(Error::Config(
            "block size a power of two >= 512, max_run >= 1".into(),
        ));
    }
    if cfg.shadow && cfg.dw_runs != 0 {
        return Err(Error::Config(
            "shadow extents take the place of a double-write area: dw_runs must be 0".into(),
        ));
    }
    Ok(Geometry {
        block_bytes: cfg.block_bytes,
        block_count: cfg.block_count,
        max_run: cfg.max_run,
        dw_runs: cfg.dw_runs,
        shadow: cfg.shadow,
    })
}

impl<A: BlockApp> Bosc<A> {
    /// Own-log mode: logs the modification (synchronously, group-committed by the log), then
    /// queues it, or applies it at once when the block is in memory. Returns its sequence
    /// number.
    pub fn modify(&self, block: u64, modification: &[u8]) -> Result<u64, Error> {
        self.inner.logged(block, Op::App, modification)
    }

    /// Plain write of a whole payload (shorter data is zero-padded), through the same path.
    pub fn write(&self, block: u64, payload: &[u8]) -> Result<u64, Error> {
        self.inner.logged(block, Op::Write, payload)
    }

    /// Own-log mode: logs every change in order (the log group-commits them, typically one
    /// device write for the whole batch) and queues them while the log writes, then waits
    /// until all are durable. Returns their sequence numbers.
    ///
    /// A change is visible to queries from when it is queued, before it is durable (no commit
    /// writes it to the data disk before it is durable, so a crash loses it whole). If the log
    /// fails to make one durable, the engine fails: its queues may hold changes the log lost.
    pub fn modify_batch(&self, changes: Vec<Change>) -> Result<Vec<u64>, Error> {
        self.inner.submit(changes)?.wait()
    }

    /// [`Self::modify_batch`] in two halves: the changes are logged and queued when this
    /// returns, and durable once the answer is waited for (or dropped). `previous`, a
    /// submission of the caller's not yet waited for, is waited for first: a caller never
    /// holds two, because a forced commit here may wait for the durability of every
    /// submission but its own.
    pub(crate) fn submit_after(
        &self,
        previous: Option<Submitted<'_, A>>,
        changes: Vec<Change>,
    ) -> Result<Submitted<'_, A>, Error> {
        if let Some(p) = previous {
            p.wait()?;
        }
        self.inner.submit(changes)
    }

    /// Bulk load: writes whole payloads (`payloads` holds a multiple of
    /// [`Bosc::payload_bytes`]) straight to consecutive blocks from `first`, sealed with LSN 0,
    /// bypassing log and queues, then syncs. Only on an engine that has never been modified
    /// since it was formatted (refused otherwise), to build an index before use. Not
    /// crash-atomic: a crash during a load leaves a disk to format again. On a disk of shadow
    /// extents the blocks are written to both homes, so the second home is allocated before
    /// commits first move extents into it.
    pub fn load(&self, first: u64, payloads: &[u8]) -> Result<(), Error> {
        self.inner.load(first, payloads)
    }

    /// Caller-durable mode: the caller's record at `position` is durable already. Positions
    /// must increase strictly across calls; after a restart the caller replays every record
    /// above [`Bosc::checkpoint`].
    pub fn modify_at(&self, block: u64, modification: &[u8], position: u64) -> Result<(), Error> {
        self.inner
            .at_position(block, Op::App, modification, position)
    }

    /// Caller-durable plain write.
    pub fn write_at(&self, block: u64, payload: &[u8], position: u64) -> Result<(), Error> {
        self.inner.at_position(block, Op::Write, payload, position)
    }

    /// Runs `f` over the block as it stands with every acknowledged modification applied
    /// (lu-dissertation §3.2.4): from memory if cached, else read and merged with its queue.
    pub fn query<R>(&self, block: u64, f: impl FnOnce(&[u8]) -> R) -> Result<R, Error> {
        self.inner.query(block, f)
    }

    /// Plain read of a payload.
    pub fn read(&self, block: u64) -> Result<Vec<u8>, Error> {
        self.query(block, <[u8]>::to_vec)
    }

    /// One commit cycle: up to `runs_per_cycle` runs from the sweep cursor, then the
    /// checkpoint. Returns how many blocks were written.
    pub fn commit_cycle(&self) -> Result<u64, Error> {
        self.inner.commit_cycle()
    }

    /// Commits until nothing is pending.
    pub fn commit_all(&self) -> Result<(), Error> {
        while self.pending_blocks() > 0 {
            self.inner.commit_cycle()?;
        }
        Ok(())
    }

    /// The durable checkpoint (caller-durable mode: the caller may release its log up to it).
    pub fn checkpoint(&self) -> u64 {
        lock(&self.inner.state).durable_ckpt
    }

    /// Whether the block's image is in memory, so a query costs no I/O.
    pub fn cached(&self, block: u64) -> bool {
        let st = lock(&self.inner.state);
        st.images.contains_key(&block)
    }

    /// Reads the block and keeps it as a commit keeps a hot block's copy, for
    /// [`Bosc::take_hot`] to hand out (what is queued for it meanwhile applied): a read the
    /// application asks for ahead of need, off its own path. Nothing if the block's image is
    /// cached (a query costs no I/O then) or the copies already hold a sixteenth of the
    /// memory budget.
    pub fn read_hot(&self, block: u64) -> Result<(), Error> {
        self.inner.read_hot(block)
    }

    /// The payloads of the blocks the commit cycle found hot ([`BlockApp::hot`]) since the
    /// last call, each as [`Bosc::query`] would return it now, read from memory: the commit
    /// kept a copy, and what was queued for the block since is applied to it. The copies are
    /// held until taken (a sixteenth of the memory budget at most), so an application that
    /// calls blocks hot takes them often.
    pub fn take_hot(&self) -> Vec<(u64, Vec<u8>)> {
        let mut st = lock(&self.inner.state);
        let blocks: Vec<u64> = st.hot.keys().copied().collect();
        let mut out = Vec::with_capacity(blocks.len());
        for block in blocks {
            let Some(mut c) = st.drop_hot(block) else {
                continue;
            };
            match st.images.get(&block) {
                Some(now) => c.image.copy_from_slice(&now.image),
                None => drop(self.inner.apply_queued(&st, block, &mut c.image, c.lsn)),
            }
            out.push((block, c.image.split_off(BLOCK_HEADER_LEN)));
        }
        out
    }

    /// Blocks with pending modifications.
    pub fn pending_blocks(&self) -> usize {
        let st = lock(&self.inner.state);
        st.groups.values().map(Group::blocks).sum()
    }

    /// Pending modifications.
    pub fn pending_modifications(&self) -> usize {
        lock(&self.inner.state).pending
    }

    /// Bytes the queues hold (entries, modifications, cached images, map overhead).
    pub fn memory_bytes(&self) -> usize {
        lock(&self.inner.state).memory_bytes
    }

    /// Changes the memory budget, e.g. as an index on the engine grows its own structures
    /// within one overall budget. Takes effect at the next `modify` or query.
    pub fn set_memory_budget(&self, bytes: usize) {
        self.inner.budget.store(bytes, Ordering::Relaxed);
    }

    /// The memory budget in force.
    pub fn memory_budget(&self) -> usize {
        self.inner.budget.load(Ordering::Relaxed)
    }

    /// The own log's counters (own-log mode).
    pub fn log_stats(&self) -> Option<&mariner_log::LogStats> {
        self.inner.log.as_ref().map(|(log, _)| log.stats())
    }

    pub fn stats(&self) -> &BoscStats {
        &self.inner.stats
    }

    /// The CPU class the engine's threads are in ([`BoscConfig::cpu_class`]).
    pub fn cpu_class(&self) -> Option<&Arc<CpuClass>> {
        self.inner.cfg.cpu_class.as_ref()
    }

    pub fn geometry(&self) -> Geometry {
        self.inner.geo
    }

    /// The data disk's identity ([`DiskId`]): what an index's files beside it name it by.
    pub fn disk_id(&self) -> DiskId {
        self.inner.disk_id
    }

    pub fn block_count(&self) -> u64 {
        self.inner.geo.block_count
    }

    /// Payload bytes per block.
    pub fn payload_bytes(&self) -> usize {
        self.inner.geo.payload_bytes()
    }

    pub fn app(&self) -> &A {
        &self.inner.app
    }

    /// Stops the background thread and the log. Pending modifications stay queued (durable in
    /// the log or the caller's log); call [`Bosc::commit_all`] first for a clean shutdown.
    pub fn close(&self) {
        lock(&self.inner.state).shutdown = true;
        self.inner.wake.notify_all();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
        if let Some((log, _)) = &self.inner.log {
            log.shutdown();
        }
    }
}

impl<A: BlockApp> Drop for Bosc<A> {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests;
