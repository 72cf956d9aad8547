//! The current-image store: one sparse image per volume, kept current by applying durable log
//! records in sequence order (trail-paper.md §2.1: the log is a safety net, the images serve
//! reads; mariner-paper.md §3: the storage node applies writes in sequence order).
//!
//! - Writes reach the store as durable log records through [`mariner_log::DurableSink`]. Each is
//!   first mapped in the volume's overlay ([`extents::ExtentMap`]) so reads see it at once, then
//!   applied to the image by the applier thread in sequence order, then unmapped.
//! - The applier is write-back, like the kernel's dirty-page flusher: while writers are busy it
//!   leaves records in the log (durable there, visible through the overlay) and applies them
//!   once the writers pause for `apply_idle_ms`, when three quarters of the log are in use or a
//!   writer waits for space, when a record has waited `apply_max_delay_ms`, or at shutdown. A
//!   burst then costs the write path the log write alone (trail-paper.md §2.1: the data disk
//!   is updated in the background).
//! - Every so often the applier syncs the images and persists its watermark
//!   ([`progress::Progress`]); only then does it let the log reuse the space (`Log::release`).
//! - Memory: the overlay and the apply queue hold at most one entry per record still in the log,
//!   so they are bounded by the log's size, never by the volumes' size; payload bytes kept in
//!   memory for the applier are capped by `payload_budget_bytes` (beyond it the applier reads
//!   the record back from the log).
//! - An I/O error while applying or syncing fails the store for good: volumes turn read-only,
//!   nothing is retried, the log keeps what was not applied.
//! - Except running out of space (ENOSPC, EDQUOT): the images are sparse, so applying a write
//!   can find the file system full. The log still holds every record not yet synced into the
//!   images, so the applier waits and applies them again, from the last sync on when a sync
//!   failed ([`Store::out_of_space`] says why meanwhile; the volume refuses writes with ENOSPC).

pub mod extents;
pub mod fuzzing;
pub mod progress;

mod apply;
mod read;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::Instant;

use bytes::Bytes;
use mariner_disk::Disk;
use mariner_log::clock::{Clock, SystemClock};
use mariner_log::{
    Durable, DurableSink, Holder, HolderSpec, Log, LogAddr, LogError, RecordHeader, RecordKind,
    Recovery,
};

pub use apply::{AtRest, RestJob};
use extents::{ExtentMap, Source};
pub use progress::Progress;

/// The name the store holds log space under ([`Store::holder_spec`]).
pub const STORE_HOLDER: &str = "store";

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no volume with id {0}")]
    NoVolume(u32),
    #[error("range {offset}+{len} is outside the volume ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("volume image: {0}")]
    Io(#[from] io::Error),
    #[error("progress file: {0}")]
    Progress(io::Error),
    #[error("log: {0}")]
    Log(#[from] LogError),
    #[error("the store has failed and is read-only: {0}")]
    Failed(String),
}

impl StoreError {
    /// Whether the file system had no room (ENOSPC, or EDQUOT: the same to a volume): the
    /// record stays in the log and can be applied again once there is room.
    pub fn is_no_space(&self) -> bool {
        matches!(self, StoreError::Io(e) | StoreError::Progress(e)
            if matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded))
    }
}

/// The applier waits for space: it could not store a record of `volume` (or sync its image),
/// or, with `volume` `None`, persist its own watermark.
#[derive(Debug, Clone)]
struct OutOfSpace {
    volume: Option<u32>,
    reason: String,
}

/// How a byte range of a volume is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    Data,
    /// Not allocated; reads as zeros.
    Hole,
    /// Known to read as zeros (a trim or write-zeroes not yet applied).
    Zero,
}

/// Where the watermark is persisted, when not in [`StoreConfig::progress_path`]: a
/// simulation keeps it in memory ([`Store::simulated`]). `save` must replace the watermark
/// atomically and durably, as [`Progress::store`] does.
pub trait ProgressFile: Send + Sync {
    fn save(&self, p: &Progress) -> io::Result<()>;
}

/// Tunables.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where the watermark is persisted.
    pub progress_path: PathBuf,
    /// Sync the images and release log space at least this often.
    pub sync_interval_ms: u64,
    /// ... or after this many bytes applied.
    pub sync_bytes: u64,
    /// Payload bytes kept in memory for the applier.
    pub payload_budget_bytes: u64,
    /// Apply once the writers have paused this long (0: apply at once, never defer).
    pub apply_idle_ms: u64,
    /// ... or once the oldest unapplied record has waited this long.
    pub apply_max_delay_ms: u64,
    /// ... or once the records not yet synced to the images hold this many bytes of the log:
    /// what a restart after a crash replays (read at the device's speed before the volumes
    /// are served), so it bounds the restart's time.
    pub apply_max_held_bytes: u64,
}

/// What the store reports.
#[derive(Debug, Default)]
pub struct StoreStats {
    pub applied_seq: AtomicU64,
    pub applied_records: AtomicU64,
    pub applied_bytes: AtomicU64,
    pub synced_seq: AtomicU64,
    pub syncs: AtomicU64,
    pub queued_records: AtomicU64,
    pub queued_payload_bytes: AtomicU64,
    pub overlay_extents: AtomicU64,
    pub log_reads: AtomicU64,
    /// Reads served by [`Store::read_cached`] (memory and page cache only).
    pub cached_reads: AtomicU64,
}

struct Image {
    disk: Arc<dyn Disk>,
    size: AtomicU64,
    overlay: Mutex<ExtentMap>,
}

struct Item {
    header: RecordHeader,
    addr: LogAddr,
    payload: Option<Bytes>,
    accepted: Instant,
}

#[derive(Default)]
struct Queue {
    items: BTreeMap<u64, Item>,
    shutdown: bool,
    /// When the last durable record arrived.
    last_accept: Option<Instant>,
    /// The applier waits for a record to arrive (not for the writers to pause): new records
    /// must wake it.
    applier_waiting: bool,
    /// Jobs waiting for the images at rest ([`Store::at_rest`]).
    rest: Vec<apply::RestJob>,
}

/// The store. Create it, open the log with it as the sink, then [`Store::start`] it.
pub struct Store {
    cfg: StoreConfig,
    images: RwLock<HashMap<u32, Arc<Image>>>,
    queue: Mutex<Queue>,
    wake: Condvar,
    log: OnceLock<Log>,
    /// The store's hold on log space ([`STORE_HOLDER`]): released as the images are synced.
    holder: OnceLock<Holder>,
    progress: Mutex<Progress>,
    stats: StoreStats,
    failed: Mutex<Option<String>>,
    out_of_space: Mutex<Option<OutOfSpace>>,
    /// Whether `out_of_space` is set: every write checks it, so the common case (room) costs
    /// a load instead of a lock all connections share.
    short_of_space: AtomicBool,
    paused: AtomicBool,
    /// Whether `Queue::rest` holds a job: the applier looks at it after every round without
    /// taking the queue's lock, which the log's completion path takes for every record.
    rest_queued: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The only time the store reads: the system's, or a simulation's virtual clock.
    clock: Arc<dyn Clock>,
    /// The applier's position when a simulation runs it a round at a time
    /// ([`Store::start_stepped`]) instead of on its thread.
    stepped: Mutex<Option<apply::Cursor>>,
    /// Where the watermark goes instead of `cfg.progress_path` (a simulation's memory).
    progress_file: Option<Arc<dyn ProgressFile>>,
}

impl Store {
    /// A store whose images are durable up to `progress` (see [`Progress::load`]).
    pub fn new(cfg: StoreConfig, progress: Progress) -> Arc<Self> {
        Self::build(cfg, progress, Arc::new(SystemClock), None)
    }

    /// [`Store::new`] for a deterministic simulation: the time comes from `clock` (virtual),
    /// the watermark goes to `file` (memory); run it with [`Store::start_stepped`].
    pub fn simulated(
        cfg: StoreConfig,
        progress: Progress,
        clock: Arc<dyn Clock>,
        file: Arc<dyn ProgressFile>,
    ) -> Arc<Self> {
        Self::build(cfg, progress, clock, Some(file))
    }

    fn build(
        cfg: StoreConfig,
        progress: Progress,
        clock: Arc<dyn Clock>,
        progress_file: Option<Arc<dyn ProgressFile>>,
    ) -> Arc<Self> {
        let stats = StoreStats::default();
        stats.applied_seq.store(progress.applied_seq, Relaxed);
        stats.synced_seq.store(progress.applied_seq, Relaxed);
        Arc::new(Self {
            cfg,
            images: RwLock::new(HashMap::new()),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            log: OnceLock::new(),
            holder: OnceLock::new(),
            progress: Mutex::new(progress),
            stats,
            failed: Mutex::new(None),
            out_of_space: Mutex::new(None),
            short_of_space: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            rest_queued: AtomicBool::new(false),
            thread: Mutex::new(None),
            clock,
            stepped: Mutex::new(None),
            progress_file,
        })
    }

    /// Registers a volume image.
    pub fn add_volume(&self, id: u32, disk: Arc<dyn Disk>, size: u64) {
        let image = Arc::new(Image {
            disk,
            size: AtomicU64::new(size),
            overlay: Mutex::default(),
        });
        if let Ok(mut m) = self.images.write() {
            m.insert(id, image);
        }
    }

    /// Forgets a volume; records for it still in the log are skipped.
    pub fn remove_volume(&self, id: u32) {
        if let Ok(mut m) = self.images.write() {
            m.remove(&id);
        }
    }

    /// Grows a volume's image.
    pub fn grow_volume(&self, id: u32, size: u64) -> Result<(), StoreError> {
        let image = self.image(id)?;
        image.disk.set_len(size)?;
        image.disk.sync()?;
        image.size.store(size, Relaxed);
        Ok(())
    }

    fn image(&self, id: u32) -> Result<Arc<Image>, StoreError> {
        let m = self
            .images
            .read()
            .map_err(|_| StoreError::Failed("lock poisoned".into()))?;
        m.get(&id).cloned().ok_or(StoreError::NoVolume(id))
    }

    /// Attaches the log, queues what recovery found above the watermark, and starts the
    /// applier.
    pub fn start(self: &Arc<Self>, log: Log, recovered: &Recovery) -> io::Result<()> {
        self.attach(log, recovered).map_err(io::Error::other)?;
        let me = Arc::clone(self);
        let h = std::thread::Builder::new()
            .name("store-apply".into())
            .spawn(move || me.run())?;
        if let Ok(mut t) = self.thread.lock() {
            *t = Some(h);
        }
        Ok(())
    }

    /// [`Store::start`] without the applier thread, for a deterministic simulation: it runs
    /// the applier one round at a time with [`Store::step`].
    pub fn start_stepped(&self, log: Log, recovered: &Recovery) -> Result<(), StoreError> {
        self.attach(log, recovered)?;
        if let Ok(mut c) = self.stepped.lock() {
            *c = Some(self.cursor());
        }
        Ok(())
    }

    /// One round of the applier, without waiting: takes what is ready (if write-back is due
    /// by the clock), applies it, syncs and releases the log if a sync is due. Returns whether
    /// the applier can go on (false once the store failed). Only after
    /// [`Store::start_stepped`].
    pub fn step(&self) -> bool {
        let Ok(mut g) = self.stepped.lock() else {
            return false;
        };
        let Some(c) = g.as_mut() else {
            return false;
        };
        self.failure().is_none() && self.round(c, false) == apply::Round::Again
    }

    /// When the applier next has something to do by the clock alone (write-back falls due,
    /// a sync falls due, or out of space, a retry), if it has anything queued or unsynced.
    /// Only after [`Store::start_stepped`].
    pub fn next_deadline(&self) -> Option<Instant> {
        let g = self.stepped.lock().ok()?;
        self.deadline(g.as_ref()?)
    }

    /// Attaches the log and queues what recovery found above the watermark, and the
    /// numbers it voided as gaps to pass over: their void records may not be durable yet (a
    /// full log writes them only once this store releases space), and applying must not wait
    /// for them. The log must have been opened with the store's holder
    /// ([`Store::holder_spec`]).
    fn attach(&self, log: Log, recovered: &Recovery) -> Result<(), StoreError> {
        let _ = self.holder.set(log.holder(STORE_HOLDER)?);
        let _ = self.log.set(log);
        let voids = recovered.voided.iter().map(|&seq| Durable {
            header: RecordHeader {
                kind: RecordKind::Void,
                volume: 0,
                length: 0,
                seq,
                timestamp_ns: 0,
                offset: 0,
                generation: 0,
                back: LogAddr::NONE,
                span: 0,
                payload_len: 0,
                payload_crc: 0,
                volume_seq: 0,
            },
            addr: LogAddr::NONE,
            payload: Bytes::new(),
        });
        let durable: Vec<Durable> = recovered
            .records
            .iter()
            .map(|f| Durable {
                header: f.header,
                addr: f.addr,
                payload: Bytes::new(),
            })
            .chain(voids)
            .collect();
        self.accept(&durable, false);
        Ok(())
    }

    /// Stops the applier after a final sync of what it applied.
    pub fn shutdown(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.shutdown = true;
        }
        self.wake.notify_all();
        let h = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Stops applying (records still become durable and readable). A test hook for recovery
    /// measurements with a full log.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Relaxed);
        self.wake.notify_all();
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Why the store failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|g| g.clone())
    }

    /// Why writes to volume `id` cannot be stored, if they cannot: the applier waits for
    /// space to apply one of the volume's records (or to persist its watermark, which holds
    /// up every volume). `None` again once what it applied after the wait is synced.
    pub fn out_of_space(&self, id: u32) -> Option<String> {
        if !self
            .short_of_space
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return None;
        }
        let g = self.out_of_space.lock().ok()?;
        let o = g.as_ref()?;
        o.volume.is_none_or(|v| v == id).then(|| o.reason.clone())
    }

    /// The store as a holder of log space, to open the log with: it must hold every record
    /// until it has applied it (the only copy of an unapplied write is in the log), and holds
    /// nothing at or below its persisted watermark.
    pub fn holder_spec(&self) -> HolderSpec {
        let p = self.progress();
        HolderSpec::must_hold(STORE_HOLDER, p.applied_seq, p.applied_ts)
            .with_volume_seqs(p.volume_seqs)
    }

    /// The persisted watermark.
    pub fn progress(&self) -> Progress {
        self.progress.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// The persisted watermark's sequence number (without copying the rest).
    pub fn applied_seq(&self) -> u64 {
        self.progress.lock().map(|p| p.applied_seq).unwrap_or(0)
    }

    fn accept(&self, records: &[Durable], keep_payload: bool) {
        let mut items = Vec::with_capacity(records.len());
        let now = self.clock.now();
        for d in records {
            let keep = keep_payload && self.reserve_payload(d.payload.len() as u64);
            let payload = keep.then(|| d.payload.clone());
            self.map_overlay(d, payload.clone());
            items.push((
                d.header.seq,
                Item {
                    header: d.header,
                    addr: d.addr,
                    payload,
                    accepted: now,
                },
            ));
        }
        let mut wake = true;
        if let Ok(mut q) = self.queue.lock() {
            q.last_accept = Some(now);
            wake = q.applier_waiting || q.shutdown;
            for (seq, item) in items {
                q.items.insert(seq, item);
            }
            self.stats
                .queued_records
                .store(q.items.len() as u64, Relaxed);
        }
        if wake {
            self.wake.notify_all();
        }
    }

    /// Takes `len` bytes of the payload budget, atomically: several log devices hand records
    /// over concurrently, and the applier gives bytes back as it applies.
    fn reserve_payload(&self, len: u64) -> bool {
        let budget = self.cfg.payload_budget_bytes;
        self.stats
            .queued_payload_bytes
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(len).filter(|&n| n <= budget)
            })
            .is_ok()
    }

    /// Maps a durable record in its volume's overlay; `payload`: its payload when the store
    /// keeps it in memory (within the payload budget), shared with the apply queue.
    fn map_overlay(&self, d: &Durable, payload: Option<Bytes>) {
        let h = &d.header;
        let src = match h.kind {
            RecordKind::Write => Source::Log {
                addr: d.addr,
                base: h.offset,
                payload,
            },
            RecordKind::Trim | RecordKind::WriteZeroes => Source::Zero,
            RecordKind::Void
            | RecordKind::VolumeCreated
            | RecordKind::VolumeResized
            | RecordKind::VolumeDeleted
            | RecordKind::HistoryGap => return,
        };
        let Ok(image) = self.image(h.volume) else {
            return;
        };
        if let Ok(mut o) = image.overlay.lock() {
            o.insert(h.offset, h.offset + u64::from(h.length), h.seq, src);
            self.stats.overlay_extents.store(o.len() as u64, Relaxed);
        };
    }

    fn check_range(image: &Image, offset: u64, len: u64) -> Result<(), StoreError> {
        let size = image.size.load(Relaxed);
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(StoreError::OutOfRange { offset, len, size });
        }
        Ok(())
    }
}

impl DurableSink for Store {
    fn durable(&self, records: &[Durable]) {
        self.accept(records, true);
    }
}
