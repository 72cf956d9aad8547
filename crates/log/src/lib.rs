//! The Trail log: every write is made durable here, in a fast sequential log on one or more
//! log devices, before it is acknowledged (trail-paper.md §2, mariner-paper.md §4).
//!
//! - [`format`]: the superblock and record layouts (pure; docs/FORMATS.md).
//! - [`scan`]: parsing segments back, stopping at torn or stale records.
//! - `recover`: merging devices by sequence number, voiding gaps, deciding where to resume.
//! - `writer`: the dispatcher running the placement policy (mariner-placement) and the I/O
//!   threads of each device; its decisions are in the clock-free [`Dispatch`].
//!
//! Consumers (the current-image store now; history and replicas later) learn of durable records
//! through a [`DurableSink`]. Each is a named [`Holder`] of log space with a kind (`holders`):
//! it tells the log how far it is durable with [`Holder::release`], and log space is reused
//! only behind every holder's watermark, or past a shrinkable or bounded one as its kind
//! allows.

pub mod busy;
pub mod clock;
pub mod format;
pub mod fuzzing;
pub mod holders;
pub mod scan;
pub mod stats;

mod dispatch;
mod error;
mod grow;
mod prefetch;
mod read;
mod readahead;
mod recover;
mod replay;
mod simulated;
mod superblocks;
mod writer;

use std::sync::{Arc, Mutex};

use clock::{Clock, SystemClock};
use superblocks::{
    check_config, check_superblocks, max_payload, new_superblock, raise_generation_floor,
    write_new_superblock,
};

use bytes::Bytes;
use mariner_disk::Disk;
use mariner_placement::{Policy, PolicyConfig};
use tokio::sync::oneshot;

pub use busy::DeviceBusy;
pub use dispatch::Dispatch;
pub use error::{FormatError, LogError};
pub use format::{LogAddr, RecordHeader, RecordKind, Superblock, DATA_OFFSET, RECORD_HEADER_LEN};
pub use grow::Grown;
pub use holders::{Hold, HoldKind, Holder, HolderSpec};
pub use mariner_placement::LinearModel;
pub use recover::Recovery;
pub use replay::ReplayPlan;
pub use scan::Found;
pub use simulated::{InFlight, SimDevices};
pub use stats::{Histogram, LogStats};
pub use superblocks::read_superblock;

use holders::{open_marks, HolderStats};
use writer::Shared;

/// How the log is laid out and batches.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Segment (track) size. A record never spans segments, so this bounds the largest write.
    pub segment_bytes: u64,
    /// Batches start on multiples of this (512, or 4096 for `O_DIRECT`).
    pub align_bytes: u32,
    /// mariner-paper.md §4 `T_wait`, in nanoseconds.
    pub t_wait_ns: u64,
    /// mariner-paper.md eq. 2 `T_switch`; infinity disables early track switches.
    pub t_switch: f64,
    /// Send a gathering batch as soon as its device is idle.
    pub dispatch_on_idle: bool,
    /// Call `sync` after each write. False only when the devices were opened with `O_DSYNC`.
    pub sync_each_write: bool,
    /// Batches each device may have in flight at once (mariner-placement's
    /// `PolicyConfig::device_depth`); each device's batches are acknowledged in the order
    /// they were placed, so recovery never finds an acknowledged batch behind a hole.
    pub device_depth: u32,
    /// Cost model of the devices for choosing the next active device.
    pub model: LinearModel,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 4 << 20,
            align_bytes: 512,
            t_wait_ns: 50_000,
            t_switch: f64::INFINITY,
            dispatch_on_idle: true,
            sync_each_write: true,
            device_depth: 1,
            model: LinearModel::default(),
        }
    }
}

/// One record to append.
#[derive(Debug, Clone)]
pub struct Entry {
    pub kind: RecordKind,
    pub volume: u32,
    /// Volume byte offset.
    pub offset: u64,
    /// Bytes covered; equals `payload.len()` for writes.
    pub length: u32,
    /// Data for writes; empty otherwise.
    pub payload: Bytes,
}

impl Entry {
    pub fn write(volume: u32, offset: u64, payload: Bytes) -> Self {
        let length = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        Self {
            kind: RecordKind::Write,
            volume,
            offset,
            length,
            payload,
        }
    }
    pub fn extent(kind: RecordKind, volume: u32, offset: u64, length: u32) -> Self {
        Self {
            kind,
            volume,
            offset,
            length,
            payload: Bytes::new(),
        }
    }
    fn payload_len(&self) -> u32 {
        if self.kind.has_payload() {
            self.length
        } else {
            0
        }
    }
}

/// A record is durable: what the log says to its waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Appended {
    pub seq: u64,
    pub timestamp_ns: u64,
    pub addr: LogAddr,
    /// The volume's own sequence number ([`RecordHeader::volume_seq`]).
    pub volume_seq: u64,
}

/// A durable record as handed to consumers.
#[derive(Debug, Clone)]
pub struct Durable {
    pub header: RecordHeader,
    pub addr: LogAddr,
    pub payload: Bytes,
}

/// Consumers of durable records. Called on the dispatcher thread, in completion order (not
/// sequence order: devices finish out of order), before the writers are acknowledged. Must be
/// quick and must not call back into the log.
pub trait DurableSink: Send + Sync {
    fn durable(&self, records: &[Durable]);
}

/// The future an append resolves through.
pub type AppendFuture = oneshot::Receiver<Result<Appended, LogError>>;

/// Records appended together ([`Log::append_many`]).
#[derive(Debug)]
pub struct Burst {
    /// The first record's sequence number; the others follow it, one apart, in order.
    /// `None` when the log took none (it failed or was shut down; the futures say which).
    pub first_seq: Option<u64>,
    /// One per record, in order: resolves once the record is durable.
    pub futures: Vec<AppendFuture>,
}

/// A handle on an open log. Cheap to clone.
#[derive(Clone)]
pub struct Log {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    devices: Vec<Arc<dyn Disk>>,
    sb: Superblock,
    stats: Arc<LogStats>,
    failed: Arc<Mutex<Option<String>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    max_payload: u32,
    clock: Arc<dyn Clock>,
    /// The holders it was opened with, in order: (name, kind, their handles' stats).
    holders: Vec<(Arc<str>, HoldKind, Arc<HolderStats>)>,
    /// Which chunks [`Log::read_part`] read from lately, to fetch a dense neighbourhood whole.
    prefetch: prefetch::ChunkPrefetch,
}

/// The last handle gone without [`Log::shutdown`]: the threads must still end (they hold the
/// dispatcher state, whose job queues keep the device threads waiting).
impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.shutdown();
    }
}

/// Who runs the dispatcher's I/O: threads, or a simulation ([`Log::open_simulated`]).
enum Runtime {
    /// Device and timer threads, reading this clock.
    Threads(Arc<dyn Clock>),
    Simulated(Arc<dyn Clock>),
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("superblock", &self.inner.sb)
            .finish()
    }
}

impl Log {
    /// Writes a superblock to every device, making them one new log with id `log_id`. Refuses
    /// a device that already holds a valid Mariner superblock.
    pub fn format(
        devices: &[Arc<dyn Disk>],
        cfg: &LogConfig,
        log_id: u128,
    ) -> Result<(), LogError> {
        check_config(cfg)?;
        let count = u16::try_from(devices.len())
            .ok()
            .filter(|&c| c > 0 && c <= 64)
            .ok_or_else(|| LogError::Config("between 1 and 64 log devices".into()))?;
        let mut sbs = Vec::with_capacity(devices.len());
        for (dev, disk) in devices.iter().enumerate() {
            if read_superblock(disk.as_ref(), dev).is_ok() {
                return Err(LogError::AlreadyFormatted { dev });
            }
            sbs.push(new_superblock(disk.as_ref(), dev, count, cfg, log_id)?);
        }
        // Every device gets the same number of segments: the smallest device decides.
        let segments = sbs.iter().map(|s| s.segment_count).min().unwrap_or(0);
        for (dev, (disk, mut sb)) in devices.iter().zip(sbs).enumerate() {
            sb.segment_count = segments;
            write_new_superblock(disk.as_ref(), dev, &sb)?;
        }
        Ok(())
    }

    /// Opens a formatted log: checks every superblock against `log_id` and the device order,
    /// runs recovery, writes void records for sequence numbers that never became durable, and
    /// starts the writer. `holders`: who holds log space, with the watermarks they persisted
    /// (at least one; [`Log::holder`] hands out their handles). Segments above the lowest
    /// watermark stay in use; the records above the lowest must-hold watermark are recovered
    /// for replay ([`Recovery::records`]).
    pub fn open(
        devices: Vec<Arc<dyn Disk>>,
        cfg: LogConfig,
        log_id: u128,
        holders: &[HolderSpec],
        sink: Arc<dyn DurableSink>,
    ) -> Result<(Self, Recovery), LogError> {
        Self::open_threaded(
            devices,
            cfg,
            log_id,
            holders,
            sink,
            true,
            Arc::new(SystemClock),
        )
    }

    /// [`Log::open`] with the clock records are stamped by (tests of history's window inject
    /// one). The dispatcher's `T_wait` is also measured on it, so a clock that does not move
    /// by itself wants `t_wait_ns = 0`.
    pub fn open_with_clock(
        devices: Vec<Arc<dyn Disk>>,
        cfg: LogConfig,
        log_id: u128,
        holders: &[HolderSpec],
        sink: Arc<dyn DurableSink>,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, Recovery), LogError> {
        Self::open_threaded(devices, cfg, log_id, holders, sink, true, clock)
    }

    /// Opens with the device and timer threads and writes the voids.
    fn open_threaded(
        devices: Vec<Arc<dyn Disk>>,
        cfg: LogConfig,
        log_id: u128,
        holders: &[HolderSpec],
        sink: Arc<dyn DurableSink>,
        keep_records: bool,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, Recovery), LogError> {
        let (log, recovery, _) = Self::open_with(
            devices,
            cfg,
            log_id,
            holders,
            sink,
            keep_records,
            Runtime::Threads(clock),
        )?;
        log.write_voids(&recovery.voided)?;
        Ok((log, recovery))
    }

    /// [`Log::open`] for a deterministic simulation: no thread runs; `clock` is the only
    /// time the log reads, and the returned [`SimDevices`] decides when batches are written
    /// and complete. The void records for the gaps recovery found are appended but not yet
    /// durable: their futures come last, and nothing else is durable until the simulation
    /// completes batches.
    #[allow(clippy::type_complexity)]
    pub fn open_simulated(
        devices: Vec<Arc<dyn Disk>>,
        cfg: LogConfig,
        log_id: u128,
        holders: &[HolderSpec],
        sink: Arc<dyn DurableSink>,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, Recovery, SimDevices, Vec<AppendFuture>), LogError> {
        let (log, recovery, sim) = Self::open_with(
            devices,
            cfg,
            log_id,
            holders,
            sink,
            true,
            Runtime::Simulated(clock),
        )?;
        let voids = recovery
            .voided
            .iter()
            .map(|&seq| log.submit(Entry::extent(RecordKind::Void, 0, 0, 0), Some(seq)))
            .collect();
        let sim = sim.ok_or_else(|| LogError::Config("no simulated devices".into()))?;
        Ok((log, recovery, sim, voids))
    }

    /// [`Log::open`] for a consumer with many records above its watermark: recovery keeps
    /// only their sequence numbers ([`Recovery::records`] is empty) and the consumer reads
    /// them, in sequence order and with their payloads, with [`Log::replay`] before it
    /// releases anything.
    pub fn open_streaming(
        devices: Vec<Arc<dyn Disk>>,
        cfg: LogConfig,
        log_id: u128,
        holders: &[HolderSpec],
        sink: Arc<dyn DurableSink>,
    ) -> Result<(Self, Recovery), LogError> {
        Self::open_threaded(
            devices,
            cfg,
            log_id,
            holders,
            sink,
            false,
            Arc::new(SystemClock),
        )
    }

    /// Hands every record above the watermark that recovery found (those of `plan`,
    /// [`Recovery::replay`]) to `f` in sequence order, with its checked payload; returns how
    /// many. Reads one segment per device at a time. Call it before [`Log::release`] lets
    /// their segments be reused.
    pub fn replay<E: From<LogError>>(
        &self,
        plan: &ReplayPlan,
        f: impl FnMut(&Found, &[u8]) -> Result<(), E>,
    ) -> Result<u64, E> {
        replay::replay(&self.inner.devices, &self.inner.sb, plan, f)
    }

    fn open_with(
        devices: Vec<Arc<dyn Disk>>,
        cfg: LogConfig,
        log_id: u128,
        holders: &[HolderSpec],
        sink: Arc<dyn DurableSink>,
        keep_records: bool,
        runtime: Runtime,
    ) -> Result<(Self, Recovery, Option<SimDevices>), LogError> {
        check_config(&cfg)?;
        let marks = open_marks(holders)?;
        let sbs = check_superblocks(&devices, log_id)?;
        let sb = sbs[0];
        if u64::from(cfg.align_bytes) != u64::from(sb.align_bytes) {
            return Err(LogError::Config(format!(
                "log was formatted with {}-byte alignment, configured {}",
                sb.align_bytes, cfg.align_bytes
            )));
        }
        let (mut recovery, mut resume) = recover::recover(&devices, &sbs, marks, keep_records)?;
        for (&volume, &seq) in holders.iter().flat_map(|h| &h.volume_seqs) {
            let last = recovery.volume_seqs.entry(volume).or_insert(0);
            *last = (*last).max(seq);
        }
        for (dev, (disk, start)) in devices.iter().zip(resume.starts.iter_mut()).enumerate() {
            start.generation = raise_generation_floor(disk.as_ref(), dev, start.generation)?;
        }
        let stats = Arc::new(LogStats::default());
        let total = sb.segment_count * devices.len() as u64;
        stats
            .segments_total
            .store(total, std::sync::atomic::Ordering::Relaxed);
        let used: u64 = resume.in_use.iter().map(|d| d.len() as u64).sum();
        stats
            .segments_used
            .store(used, std::sync::atomic::Ordering::Relaxed);
        let policy_cfg = PolicyConfig {
            t_wait_ns: cfg.t_wait_ns,
            t_switch: cfg.t_switch,
            dispatch_on_idle: cfg.dispatch_on_idle,
            queue_when_busy: false,
            device_depth: cfg.device_depth,
            align_bytes: u64::from(sb.align_bytes),
            segment_bytes: sb.segment_bytes,
            segment_count: sb.segment_count,
            data_offset: sb.data_offset,
        };
        let failed = Arc::new(Mutex::new(None));
        let clock: Arc<dyn Clock> = match &runtime {
            Runtime::Threads(c) | Runtime::Simulated(c) => Arc::clone(c),
        };
        let handles: Vec<(Arc<str>, HoldKind, Arc<HolderStats>)> = holders
            .iter()
            .map(|h| (Arc::from(h.name.as_str()), h.kind, Arc::default()))
            .collect();
        let parts = writer::WriterParts {
            log_id,
            policy: Policy::new(policy_cfg, cfg.model, &resume.starts),
            sink,
            stats: Arc::clone(&stats),
            failed: Arc::clone(&failed),
            next_seq: recovery.last_seq + 1,
            last_ts: recovery.last_ts,
            align: (sb.align_bytes as usize).max(devices[0].alignment()),
            in_use: resume.in_use,
            holds: holders.iter().map(|h| Hold::new(h.kind, h.seq)).collect(),
            volume_seqs: recovery.volume_seqs.clone(),
            holders: handles.iter().map(|h| Arc::clone(&h.2)).collect(),
            sync_each_write: cfg.sync_each_write,
            device_depth: cfg.device_depth,
            clock: Arc::clone(&clock),
            segments: (sb.data_offset, sb.segment_bytes),
        };
        let (shared, threads, sim) = match runtime {
            Runtime::Threads(_) => {
                let (shared, threads) = writer::spawn(parts, &devices)
                    .map_err(|source| LogError::Io { dev: 0, source })?;
                (shared, threads, None)
            }
            Runtime::Simulated(_) => {
                let (shared, ctxs) = writer::simulated(parts, &devices);
                let sim = SimDevices {
                    shared: Arc::clone(&shared),
                    ctxs,
                };
                (shared, Vec::new(), Some(sim))
            }
        };
        let max_payload = max_payload(&sb);
        let inner = Inner {
            shared,
            devices,
            sb,
            stats,
            failed,
            threads: Mutex::new(threads),
            max_payload,
            clock,
            holders: handles,
            prefetch: prefetch::ChunkPrefetch::default(),
        };
        let log = Self {
            inner: Arc::new(inner),
        };
        Ok((log, recovery, sim))
    }

    /// Appends a void record for each of `seqs` and waits until they are durable — unless
    /// the log is full: then they wait for space that only the consumers can release, after
    /// they have replayed what recovery found, so waiting here would never end. The consumers
    /// treat the voided numbers as gaps either way (`Store::start`), and a crash before the
    /// voids are durable finds the same gaps again.
    fn write_voids(&self, seqs: &[u64]) -> Result<(), LogError> {
        let waits: Vec<_> = seqs
            .iter()
            .map(|&seq| self.submit(Entry::extent(RecordKind::Void, 0, 0, 0), Some(seq)))
            .collect();
        if self
            .inner
            .stats
            .stalled
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
        {
            tracing::warn!(
                voids = seqs.len(),
                "the log is full at start-up: void records are written once space is released"
            );
            return Ok(());
        }
        for w in waits {
            w.blocking_recv().map_err(|_| LogError::Shutdown)??;
        }
        Ok(())
    }

    fn submit(&self, entry: Entry, seq: Option<u64>) -> AppendFuture {
        let (reply, rx) = oneshot::channel();
        let arrived = self.inner.clock.now();
        self.inner.shared.append(entry, seq, reply, arrived);
        rx
    }

    /// Appends a record; the future resolves once it is durable (or the log failed).
    pub fn append(&self, entry: Entry) -> Result<AppendFuture, LogError> {
        self.admit(std::slice::from_ref(&entry))?;
        Ok(self.submit(entry, None))
    }

    /// Appends records that arrived together; each future resolves once its record is
    /// durable. The placement policy sees them as one burst, so they leave in as few batches
    /// as the segments allow, where appends one by one would send the first alone to an idle
    /// device and the rest in the batches after it. Nothing is appended if any entry is
    /// refused. The records take consecutive sequence numbers, known at once
    /// ([`Burst::first_seq`]), so a caller can act on them while the write is in flight.
    pub fn append_many(&self, entries: Vec<Entry>) -> Result<Burst, LogError> {
        self.admit(&entries)?;
        let (with_replies, futures): (Vec<_>, Vec<_>) = entries
            .into_iter()
            .map(|e| {
                let (reply, rx) = oneshot::channel();
                ((e, reply), rx)
            })
            .unzip();
        let arrived = self.inner.clock.now();
        let first_seq = self.inner.shared.append_many(with_replies, arrived);
        Ok(Burst { first_seq, futures })
    }

    /// Refuses the appends of `entries` if any is malformed or too large, or the log failed.
    fn admit(&self, entries: &[Entry]) -> Result<(), LogError> {
        for e in entries {
            self.check_entry(e)?;
        }
        match self.failure() {
            Some(why) => Err(LogError::Failed(why)),
            None => Ok(()),
        }
    }

    fn check_entry(&self, entry: &Entry) -> Result<(), LogError> {
        if entry.kind == RecordKind::Write && entry.payload.len() != entry.length as usize {
            return Err(LogError::Config(
                "write payload length differs from its length".into(),
            ));
        }
        if entry.payload.len() > self.inner.max_payload as usize {
            let max = u64::from(self.inner.max_payload);
            return Err(LogError::TooLarge {
                bytes: entry.payload.len() as u64,
                max,
            });
        }
        Ok(())
    }

    /// The handle of the holder opened as `name`, through which it releases log space.
    pub fn holder(&self, name: &str) -> Result<Holder, LogError> {
        let index = self
            .inner
            .holders
            .iter()
            .position(|h| &*h.0 == name)
            .ok_or_else(|| LogError::Config(format!("no log holder {name:?}")))?;
        Ok(self.holder_at(index))
    }

    /// Every holder's handle, in the order the log was opened with (for reports).
    pub fn holders(&self) -> Vec<Holder> {
        (0..self.inner.holders.len())
            .map(|i| self.holder_at(i))
            .collect()
    }

    fn holder_at(&self, index: usize) -> Holder {
        let (name, kind, stats) = &self.inner.holders[index];
        Holder {
            shared: Arc::clone(&self.inner.shared),
            index,
            name: Arc::clone(name),
            kind: *kind,
            stats: Arc::clone(stats),
        }
    }

    pub fn stats(&self) -> &LogStats {
        &self.inner.stats
    }

    pub fn superblock(&self) -> &Superblock {
        &self.inner.sb
    }

    /// The largest write payload one record can hold.
    pub fn max_payload(&self) -> u32 {
        self.inner.max_payload
    }

    /// Why the log failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.inner.failed.lock().ok().and_then(|g| g.clone())
    }

    /// A consumer that must keep records until it has them (the store) failed for good and
    /// will never release space again: records waiting for space would wait forever. Fails
    /// the log with `why` — every record not yet being written and every later append get
    /// [`LogError::Failed`]; batches being written finish. The log stays readable, and a
    /// restart recovers everything durable in it.
    pub fn fail(&self, why: &str) {
        self.inner.shared.fail(why.to_string());
    }

    /// Stops the writer; waiters still pending get [`LogError::Failed`]. Idempotent.
    pub fn shutdown(&self) {
        self.inner.shared.shutdown();
        let handles = self
            .inner
            .threads
            .lock()
            .map(|mut t| std::mem::take(&mut *t));
        for h in handles.unwrap_or_default() {
            let _ = h.join();
        }
    }
}
