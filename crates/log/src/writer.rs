//! The dispatcher thread and one I/O thread per log device.
//!
//! The dispatcher owns the placement policy (mariner-placement). It stamps each appended record
//! with the next sequence number and a strictly rising timestamp, lets the policy decide which
//! device writes it and when, lays the batch out (headers, payloads, padding) and hands it to
//! the device's thread, which writes it and makes it durable (`O_DSYNC`, or write + fdatasync).
//! When a batch is durable the dispatcher tells the consumer sink, then acknowledges each
//! waiter. After an I/O error the log fails: nothing is retried, every waiter and every later
//! append gets [`LogError::Failed`].
//!
//! The dispatcher's *decisions* live in [`Dispatch`], which reads no clock and touches no disk:
//! the thread calls it with the current time and executes what it returns. The same struct can
//! therefore be driven with simulated time and simulated completions (crates/sim's
//! `tests/writer_vs_sim.rs` checks it makes the simulator's dispatch decisions, issue 5).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mariner_disk::{AlignedBuf, Disk};
use mariner_placement::{Action, DeviceModel, LinearModel, Nanos, Policy, PolicyError, Write};
use tokio::sync::oneshot;

use crate::format::{LogAddr, RecordHeader, RECORD_HEADER_LEN};
use crate::stats::LogStats;
use crate::{Appended, Durable, DurableSink, Entry, LogError};

pub(crate) type Reply = oneshot::Sender<Result<Appended, LogError>>;

pub(crate) enum Msg {
    Append {
        entry: Entry,
        seq: Option<u64>,
        reply: Reply,
        arrived: Instant,
    },
    /// A device finished a write. On success the device thread already acknowledged the
    /// batch; on failure the batch comes back to be failed.
    Done {
        dev: usize,
        result: std::io::Result<()>,
        batch: Vec<Pending>,
    },
    Release(u64),
    Shutdown,
}

pub(crate) struct Pending {
    entry: Entry,
    header: RecordHeader,
    addr: LogAddr,
    reply: Reply,
    arrived: Instant,
}

struct DevJob {
    buf: AlignedBuf,
    offset: u64,
    batch: Vec<Pending>,
}

/// What a device thread needs to acknowledge its batches itself, saving a thread hop on the
/// path of every write.
struct DeviceCtx {
    dev: usize,
    disk: Arc<dyn Disk>,
    sync_each_write: bool,
    sink: Arc<dyn DurableSink>,
    stats: Arc<LogStats>,
}

/// The dispatcher's clock-free core: the placement policy plus the log's segment bookkeeping.
///
/// Refactor note (issue 5): these calls used to sit inline in `Writer`, which read
/// `Instant::now()` itself. They moved here unchanged except that every call takes `now`; the
/// dispatcher thread passes its clock (nanoseconds since the writer started), a simulation
/// passes virtual time. What stays in `Writer` is I/O and acknowledgement: record headers,
/// buffers, device threads, waiters, stats. Use it as the thread does: [`Dispatch::submit`] per
/// appended record, [`Dispatch::completed`] per finished device write, [`Dispatch::poll`] at
/// [`Dispatch::next_deadline`], [`Dispatch::release`] when consumers release; pass every
/// returned [`Action`] to [`Dispatch::account`] before executing it.
#[derive(Debug)]
pub struct Dispatch<M> {
    policy: Policy<M>,
    /// Per device: segments holding records not yet released (segment, highest seq written
    /// into it), oldest first; the back is current.
    in_use: Vec<VecDeque<(u64, u64)>>,
    released: u64,
}

impl<M: DeviceModel> Dispatch<M> {
    /// `in_use` per device as recovery found it; `released` the consumers' watermark.
    pub fn new(policy: Policy<M>, in_use: Vec<VecDeque<(u64, u64)>>, released: u64) -> Self {
        Self {
            policy,
            in_use,
            released,
        }
    }

    pub fn policy(&self) -> &Policy<M> {
        &self.policy
    }

    /// Segments per device still holding unreleased records, oldest first.
    pub fn in_use(&self) -> &[VecDeque<(u64, u64)>] {
        &self.in_use
    }

    /// When [`Dispatch::poll`] must next be called.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.policy.next_deadline()
    }

    /// The `T_wait` deadline passed (the thread's receive timed out).
    pub fn poll(&mut self, now: Nanos) -> Vec<Action> {
        self.policy.poll(now)
    }

    /// Record `seq`, `bytes` long with its header, was appended at `now`.
    pub fn submit(&mut self, seq: u64, bytes: u64, now: Nanos) -> Result<Vec<Action>, PolicyError> {
        self.policy.submit(seq, bytes, now)
    }

    /// Device `dev` reported its write durable at `now`.
    pub fn completed(&mut self, dev: usize, now: Nanos) -> Vec<Action> {
        self.policy.completed(dev, now).unwrap_or_default()
    }

    /// Consumers are durable up to `seq`: frees every segment (but a device's current one)
    /// whose records are all at or below it. Returns the policy's actions and the number of
    /// segments freed.
    pub fn release(&mut self, seq: u64, now: Nanos) -> (Vec<Action>, u64) {
        self.released = self.released.max(seq);
        let mut actions = Vec::new();
        let mut freed = 0;
        for dev in 0..self.in_use.len() {
            // A segment is freed once every record in it is released — and no sealed batch is
            // still queued to be written into it (its records are not accounted yet).
            while self.in_use[dev].len() > 1
                && self.in_use[dev].front().is_some_and(|s| {
                    s.1 <= self.released && !self.policy.has_queued_write(dev, s.0)
                })
            {
                self.in_use[dev].pop_front();
                freed += 1;
                actions.extend(self.policy.segment_released(dev, now).unwrap_or_default());
            }
        }
        (actions, freed)
    }

    /// The consumers' watermark.
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Segment bookkeeping for an action about to be executed: a segment switch opens a new
    /// in-use segment; a write raises its segment's highest sequence number.
    ///
    /// A write is not always into the current segment: a batch sealed because the next
    /// request did not fit is queued behind the busy device and starts only after the policy
    /// has switched the device on. Its sequence numbers therefore go to the entry of its own
    /// segment (the back is only the fallback), or that segment could be freed too early.
    pub fn account(&mut self, action: &Action) {
        match action {
            Action::Write(w) => {
                let segments = &mut self.in_use[w.dev];
                let own = segments.iter().rposition(|s| s.0 == w.segment);
                let entry = match own {
                    Some(i) => segments.get_mut(i),
                    None => segments.back_mut(),
                };
                if let Some(entry) = entry {
                    let max = w.reqs.iter().map(|r| r.0).max().unwrap_or(0);
                    entry.1 = entry.1.max(max);
                }
            }
            Action::SwitchSegment { dev, segment, .. } => {
                self.in_use[*dev].push_back((*segment, 0));
            }
        }
    }
}

pub(crate) struct Writer {
    pub log_id: u128,
    pub core: Dispatch<LinearModel>,
    pub stats: Arc<LogStats>,
    pub failed: Arc<Mutex<Option<String>>>,
    pub next_seq: u64,
    pub last_ts: u64,
    pub align: usize,
    pub epoch: Instant,
    pending: HashMap<u64, Pending>,
    last_addr: Vec<LogAddr>,
    jobs: Vec<Sender<DevJob>>,
}

/// Starts the device threads and returns the dispatcher state.
pub(crate) struct WriterParts {
    pub log_id: u128,
    pub policy: Policy<LinearModel>,
    pub sink: Arc<dyn DurableSink>,
    pub stats: Arc<LogStats>,
    pub failed: Arc<Mutex<Option<String>>>,
    pub next_seq: u64,
    pub last_ts: u64,
    pub align: usize,
    pub in_use: Vec<VecDeque<(u64, u64)>>,
    pub released: u64,
    pub sync_each_write: bool,
}

pub(crate) fn spawn(
    parts: WriterParts,
    devices: &[Arc<dyn Disk>],
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let mut handles = Vec::new();
    let mut jobs = Vec::new();
    for (dev, disk) in devices.iter().enumerate() {
        let (jtx, jrx) = std::sync::mpsc::channel::<DevJob>();
        let ctx = DeviceCtx {
            dev,
            disk: Arc::clone(disk),
            sync_each_write: parts.sync_each_write,
            sink: Arc::clone(&parts.sink),
            stats: Arc::clone(&parts.stats),
        };
        let done = tx.clone();
        let h = std::thread::Builder::new()
            .name(format!("log-dev{dev}"))
            .spawn(move || device_loop(&ctx, &jrx, &done))?;
        handles.push(h);
        jobs.push(jtx);
    }
    let n = devices.len();
    let w = Writer {
        log_id: parts.log_id,
        core: Dispatch::new(parts.policy, parts.in_use, parts.released),
        stats: parts.stats,
        failed: parts.failed,
        next_seq: parts.next_seq,
        last_ts: parts.last_ts,
        align: parts.align,
        epoch: Instant::now(),
        pending: HashMap::new(),
        last_addr: vec![LogAddr::NONE; n],
        jobs,
    };
    let h = std::thread::Builder::new()
        .name("log-dispatch".into())
        .spawn(move || w.run(&rx))?;
    handles.push(h);
    Ok(handles)
}

fn device_loop(ctx: &DeviceCtx, jobs: &Receiver<DevJob>, done: &Sender<Msg>) {
    while let Ok(job) = jobs.recv() {
        let start = Instant::now();
        let mut result = ctx.disk.write_at(&job.buf, job.offset);
        if result.is_ok() && ctx.sync_each_write {
            result = ctx.disk.sync();
        }
        ctx.stats
            .device_write_us
            .record(start.elapsed().as_micros() as u64);
        let batch = match result {
            Ok(()) => {
                acknowledge(ctx, job.batch);
                Vec::new()
            }
            Err(_) => job.batch,
        };
        if done
            .send(Msg::Done {
                dev: ctx.dev,
                result,
                batch,
            })
            .is_err()
        {
            return;
        }
    }
}

/// The batch is durable: consumers first (so reads see it), then each waiter.
fn acknowledge(ctx: &DeviceCtx, batch: Vec<Pending>) {
    let durable: Vec<Durable> = batch
        .iter()
        .map(|p| Durable {
            header: p.header,
            addr: p.addr,
            payload: p.entry.payload.clone(),
        })
        .collect();
    ctx.sink.durable(&durable);
    for p in batch {
        ctx.stats.durable_seq.fetch_max(p.header.seq, Relaxed);
        ctx.stats.records.fetch_add(1, Relaxed);
        ctx.stats
            .ack_latency_us
            .record(p.arrived.elapsed().as_micros() as u64);
        let appended = Appended {
            seq: p.header.seq,
            timestamp_ns: p.header.timestamp_ns,
            addr: p.addr,
        };
        let _ = p.reply.send(Ok(appended));
    }
}

impl Writer {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn run(mut self, rx: &Receiver<Msg>) {
        loop {
            let msg = match self.core.next_deadline() {
                Some(deadline) => {
                    let wait = deadline.saturating_sub(self.now());
                    match rx.recv_timeout(Duration::from_nanos(wait)) {
                        Ok(m) => Some(m),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => return,
                },
            };
            let actions = match msg {
                None => self.core.poll(self.now()),
                Some(Msg::Shutdown) => return self.fail_all("the log is shut down"),
                Some(m) => self.handle(m),
            };
            self.execute(actions);
        }
    }

    fn handle(&mut self, msg: Msg) -> Vec<Action> {
        match msg {
            Msg::Append {
                entry,
                seq,
                reply,
                arrived,
            } => self.append(entry, seq, reply, arrived),
            Msg::Done { dev, result, batch } => self.done(dev, result, batch),
            Msg::Release(seq) => self.release(seq),
            Msg::Shutdown => Vec::new(),
        }
    }

    fn failed(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|g| g.clone())
    }

    fn append(
        &mut self,
        entry: Entry,
        seq: Option<u64>,
        reply: Reply,
        arrived: Instant,
    ) -> Vec<Action> {
        if let Some(why) = self.failed() {
            let _ = reply.send(Err(LogError::Failed(why)));
            return Vec::new();
        }
        let seq = seq.unwrap_or_else(|| {
            let s = self.next_seq;
            self.next_seq += 1;
            s
        });
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let wall = u64::try_from(wall).unwrap_or(u64::MAX);
        self.last_ts = wall.max(self.last_ts + 1);
        let payload_len = entry.payload_len();
        let header = RecordHeader {
            kind: entry.kind,
            volume: entry.volume,
            length: entry.length,
            seq,
            timestamp_ns: self.last_ts,
            offset: entry.offset,
            generation: 0,
            back: LogAddr::NONE,
            span: 0,
            payload_len,
            payload_crc: crc32c::crc32c(&entry.payload),
        };
        let bytes = RECORD_HEADER_LEN as u64 + u64::from(payload_len);
        let addr = LogAddr::NONE;
        self.pending.insert(
            seq,
            Pending {
                entry,
                header,
                addr,
                reply,
                arrived,
            },
        );
        match self.core.submit(seq, bytes, self.now()) {
            Ok(actions) => {
                self.stats
                    .stalled
                    .store(self.core.policy().stalled() as u64, Relaxed);
                actions
            }
            Err(e) => {
                if let Some(p) = self.pending.remove(&seq) {
                    let _ = p.reply.send(Err(LogError::Config(e.to_string())));
                }
                Vec::new()
            }
        }
    }

    fn execute(&mut self, actions: Vec<Action>) {
        for a in actions {
            self.core.account(&a);
            match a {
                Action::Write(w) => self.start_write(w),
                Action::SwitchSegment { .. } => {
                    self.stats.segments_used.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// Lays out one batch: each record's header (with generation, back pointer and span), its
    /// payload, and zero padding after the last.
    fn start_write(&mut self, w: Write) {
        let mut buf = match AlignedBuf::new(w.padded_bytes as usize, self.align) {
            Ok(b) => b,
            Err(e) => return self.fail(format!("batch buffer: {e}")),
        };
        let mut pos = 0usize;
        let mut batch = Vec::with_capacity(w.reqs.len());
        let last = w.reqs.len().saturating_sub(1);
        for (i, &(seq, bytes)) in w.reqs.iter().enumerate() {
            let Some(mut p) = self.pending.remove(&seq) else {
                continue;
            };
            let addr = LogAddr::new(w.dev as u8, w.offset + pos as u64);
            let span = if i == last {
                w.padded_bytes as usize - pos
            } else {
                bytes as usize
            };
            p.addr = addr;
            p.header.generation = w.generation;
            p.header.back = self.last_addr[w.dev];
            p.header.span = span as u32;
            let mut hb = [0u8; RECORD_HEADER_LEN];
            p.header.encode(self.log_id, &mut hb);
            buf[pos..pos + RECORD_HEADER_LEN].copy_from_slice(&hb);
            let body = pos + RECORD_HEADER_LEN;
            buf[body..body + p.entry.payload.len()].copy_from_slice(&p.entry.payload);
            self.last_addr[w.dev] = addr;
            pos += span;
            batch.push(p);
        }
        self.stats.batches.fetch_add(1, Relaxed);
        self.stats.batch_records.record(batch.len() as u64);
        self.stats.bytes_written.fetch_add(w.padded_bytes, Relaxed);
        let job = DevJob {
            buf,
            offset: w.offset,
            batch,
        };
        if let Err(e) = self.jobs[w.dev].send(job) {
            for p in e.0.batch {
                let _ = p
                    .reply
                    .send(Err(LogError::Failed("log device thread is gone".into())));
            }
            self.fail(format!("log device {} thread is gone", w.dev));
        }
    }

    fn done(
        &mut self,
        dev: usize,
        result: std::io::Result<()>,
        batch: Vec<Pending>,
    ) -> Vec<Action> {
        if let Err(e) = result {
            let why = format!("log device {dev}: {e}");
            tracing::error!(%why, "log write failed; the log is now read-only");
            self.fail(why.clone());
            for p in batch {
                let _ = p.reply.send(Err(LogError::Failed(why.clone())));
            }
            return Vec::new();
        }
        self.core.completed(dev, self.now())
    }

    fn release(&mut self, seq: u64) -> Vec<Action> {
        let (actions, freed) = self.core.release(seq, self.now());
        self.stats.released_seq.store(self.core.released(), Relaxed);
        self.stats.segments_used.fetch_sub(freed, Relaxed);
        self.stats
            .stalled
            .store(self.core.policy().stalled() as u64, Relaxed);
        actions
    }

    fn fail(&mut self, why: String) {
        if let Ok(mut g) = self.failed.lock() {
            g.get_or_insert(why.clone());
        }
        self.fail_all(&why);
    }

    fn fail_all(&mut self, why: &str) {
        for (_, p) in self.pending.drain() {
            let _ = p.reply.send(Err(LogError::Failed(why.to_string())));
        }
    }
}
