//! The dispatcher: I/O threads per log device (its depth, plus one), a timer thread, and the
//! state they share.
//!
//! The dispatcher owns the placement policy (mariner-placement). It stamps each appended record
//! with the next sequence number and a strictly rising timestamp, lets the policy decide which
//! device writes it and when, lays the batch out (headers, payloads, padding) and hands it to
//! the device's thread, which writes it and makes it durable (`O_DSYNC`, or write + fdatasync).
//! When a batch is durable the device thread first lets the policy place the next batch (a
//! spare thread of the device writes it), then tells the consumer sink and acknowledges each
//! waiter. After an I/O error the log fails: nothing is retried, every waiter and every later
//! append gets [`LogError::Failed`].
//!
//! The dispatcher is not a thread of its own: its state ([`Shared`]) sits behind one mutex,
//! and whoever has news takes the lock, feeds the policy and executes what it returns — the
//! appending thread for a new record, a device thread for a finished write, the consumers for
//! a release, the timer thread for a `T_wait` deadline. An append therefore costs no thread
//! hop and no wakeup; only a dispatched batch wakes a device thread. (It used to be a thread
//! fed by a channel: on two cores the wakeup per append cost more CPU than the policy.)
//!
//! The dispatcher's *decisions* live in [`Dispatch`], which reads no clock and touches no disk:
//! the callers pass it the current time and execute what it returns. The same struct can
//! therefore be driven with simulated time and simulated completions (crates/sim's
//! `tests/writer_vs_sim.rs` checks it makes the simulator's dispatch decisions, issue 5).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mariner_disk::{AlignedBuf, Disk};
use mariner_placement::{Action, LinearModel, Nanos, Policy, PolicyError, Write};
use tokio::sync::oneshot;

use crate::clock::Clock;

mod device;

use crate::dispatch::Dispatch;
use crate::format::{LogAddr, RecordHeader, RecordKind, RECORD_HEADER_LEN};
use crate::holders::{Hold, HolderStats};
use crate::stats::LogStats;
use crate::{Appended, DurableSink, Entry, LogError};
use device::{device_loop, AckOrder};
pub(crate) use device::{finish_job, write_job, DeviceCtx};

pub(crate) type Reply = oneshot::Sender<Result<Appended, LogError>>;

/// The dispatcher's state and the timer thread's alarm clock (see the module docs).
pub(crate) struct Shared {
    state: Mutex<Writer>,
    /// Wakes the timer thread: a deadline earlier than the one it sleeps towards, or shutdown.
    tick: Condvar,
}

impl Shared {
    pub(crate) fn lock(&self) -> Option<MutexGuard<'_, Writer>> {
        self.state.lock().ok()
    }

    /// Appends a record; `reply` learns when it is durable. After shutdown the reply is
    /// dropped, which its receiver reports as the log shut down.
    pub(crate) fn append(&self, entry: Entry, seq: Option<u64>, reply: Reply, arrived: Instant) {
        let Some(mut w) = self.lock() else { return };
        if w.shut {
            return;
        }
        let actions = w.append(entry, seq, reply, arrived);
        self.execute(&mut w, actions);
    }

    /// Appends records that arrived together, as one burst; returns the first one's sequence
    /// number (the rest follow it), or `None` if none was entered (the log failed or is shut).
    pub(crate) fn append_many(
        &self,
        entries: Vec<(Entry, Reply)>,
        arrived: Instant,
    ) -> Option<u64> {
        let mut w = self.lock()?;
        if w.shut {
            return None;
        }
        let (actions, first) = w.append_many(entries, arrived);
        self.execute(&mut w, actions);
        first
    }

    /// Holder `holder` no longer needs the records at or below `seq`.
    pub(crate) fn release(&self, holder: usize, seq: u64) {
        let Some(mut w) = self.lock() else { return };
        let actions = w.release(holder, seq);
        self.execute(&mut w, actions);
    }

    /// Fails the log for good: every record not yet handed to a device fails, and every
    /// later append. Batches already being written finish and are acknowledged if durable.
    pub(crate) fn fail(&self, why: String) {
        if let Some(mut w) = self.lock() {
            w.fail(why);
        }
    }

    /// Fails every waiter, refuses later appends and ends the device and timer threads.
    pub(crate) fn shutdown(&self) {
        if let Some(mut w) = self.lock() {
            w.shut = true;
            w.fail_all("the log is shut down");
            // The device threads end once their job queues close; queued batches' waiters
            // learn of the shutdown as their replies drop.
            match &mut w.jobs {
                Jobs::Threads(senders) => senders.clear(),
                Jobs::Queued(queue) => queue.clear(),
            }
        }
        self.tick.notify_all();
    }

    /// Executes the policy's actions and wakes the timer thread if the policy now has a
    /// deadline earlier than the one the timer sleeps towards.
    pub(crate) fn execute(&self, w: &mut Writer, actions: Vec<Action>) {
        w.execute(actions);
        let sooner = w
            .core
            .next_deadline()
            .is_some_and(|d| w.timer_sleeps_until.is_some_and(|t| d < t));
        if sooner {
            self.tick.notify_one();
        }
    }
}

pub(crate) struct Pending {
    entry: Entry,
    header: RecordHeader,
    addr: LogAddr,
    reply: Reply,
    arrived: Instant,
}

pub(crate) struct DevJob {
    /// The device's batches in the order the policy placed them: 0, 1, 2, …
    pub(crate) ticket: u64,
    pub(crate) dev: usize,
    pub(crate) buf: AlignedBuf,
    pub(crate) offset: u64,
    pub(crate) batch: Vec<Pending>,
}

/// Where laid-out batches go: to the device threads, or into a queue that a deterministic
/// simulation completes in an order of its choosing ([`crate::SimDevices`]).
pub(crate) enum Jobs {
    Threads(Vec<Sender<DevJob>>),
    Queued(Vec<DevJob>),
}

pub(crate) struct Writer {
    pub log_id: u128,
    pub core: Dispatch<LinearModel>,
    /// Each holder's handle stats, in the order of `core`'s holds.
    holders: Vec<Arc<HolderStats>>,
    /// Each volume's last volume sequence number given out.
    volume_seqs: HashMap<u32, u64>,
    pub stats: Arc<LogStats>,
    pub failed: Arc<Mutex<Option<String>>>,
    pub next_seq: u64,
    pub last_ts: u64,
    pub align: usize,
    pub epoch: Instant,
    pub clock: Arc<dyn Clock>,
    pending: HashMap<u64, Pending>,
    last_addr: Vec<LogAddr>,
    pub(crate) jobs: Jobs,
    /// Per device, the ticket of its next batch.
    tickets: Vec<u64>,
    /// Batch buffers back from the devices, for the next batches: allocating and freeing one
    /// per batch cost page faults and `mprotect` calls as glibc grew and trimmed its arenas.
    spare: Vec<AlignedBuf>,
    /// The deadline the timer thread sleeps towards (`Nanos::MAX`: none); `None` while it
    /// is awake, when it looks at the policy's deadline itself before sleeping again.
    timer_sleeps_until: Option<Nanos>,
    shut: bool,
    /// The devices, for [`Self::invalidate`] (batches go through the device threads).
    devices: Vec<Arc<dyn Disk>>,
    /// Where segments lie on a device: (data offset, segment bytes).
    segments: (u64, u64),
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
    /// The holders' watermarks as opened, and their handles' stats in the same order.
    pub holds: Vec<Hold>,
    pub holders: Vec<Arc<HolderStats>>,
    /// Each volume's last volume sequence number, as recovery found it.
    pub volume_seqs: BTreeMap<u32, u64>,
    pub sync_each_write: bool,
    /// Threads writing each device's batches (the policy's device depth), at least 1.
    pub device_depth: u32,
    pub clock: Arc<dyn Clock>,
    /// Where segments lie on a device: (data offset, segment bytes).
    pub segments: (u64, u64),
}

/// The dispatcher state and one acknowledgement context per device, before any thread runs.
fn assemble(
    parts: WriterParts,
    devices: &[Arc<dyn Disk>],
    jobs: Jobs,
) -> (Arc<Shared>, Vec<Arc<DeviceCtx>>) {
    let n = devices.len();
    let ctxs = devices
        .iter()
        .enumerate()
        .map(|(dev, disk)| {
            Arc::new(DeviceCtx {
                dev,
                clock: Arc::clone(&parts.clock),
                disk: Arc::clone(disk),
                sync_each_write: parts.sync_each_write,
                sink: Arc::clone(&parts.sink),
                stats: Arc::clone(&parts.stats),
                acks: Mutex::new(AckOrder::default()),
            })
        })
        .collect();
    let w = Writer {
        log_id: parts.log_id,
        core: Dispatch::new(parts.policy, parts.in_use, parts.holds),
        holders: parts.holders,
        volume_seqs: parts.volume_seqs.into_iter().collect(),
        stats: Arc::clone(&parts.stats),
        failed: parts.failed,
        next_seq: parts.next_seq,
        last_ts: parts.last_ts,
        align: parts.align,
        epoch: parts.clock.now(),
        clock: parts.clock,
        pending: HashMap::new(),
        last_addr: vec![LogAddr::NONE; n],
        jobs,
        tickets: vec![0; n],
        spare: Vec::new(),
        timer_sleeps_until: None,
        shut: false,
        devices: devices.to_vec(),
        segments: parts.segments,
    };
    w.store_holds();
    let shared = Arc::new(Shared {
        state: Mutex::new(w),
        tick: Condvar::new(),
    });
    (shared, ctxs)
}

/// The dispatcher without threads: batches wait in a queue for a simulation to complete them
/// ([`crate::SimDevices`]), and it calls [`fire_timer`] for the `T_wait` deadlines.
pub(crate) fn simulated(
    parts: WriterParts,
    devices: &[Arc<dyn Disk>],
) -> (Arc<Shared>, Vec<Arc<DeviceCtx>>) {
    assemble(parts, devices, Jobs::Queued(Vec::new()))
}

/// Starts the device threads and the timer thread; returns the dispatcher state.
pub(crate) fn spawn(
    parts: WriterParts,
    devices: &[Arc<dyn Disk>],
) -> std::io::Result<(Arc<Shared>, Vec<std::thread::JoinHandle<()>>)> {
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in devices {
        let (jtx, jrx) = std::sync::mpsc::channel::<DevJob>();
        senders.push(jtx);
        receivers.push(jrx);
    }
    let depth = parts.device_depth;
    let (shared, ctxs) = assemble(parts, devices, Jobs::Threads(senders));
    let mut handles = Vec::new();
    for (dev, (ctx, jrx)) in ctxs.into_iter().zip(receivers).enumerate() {
        // The device's threads take its jobs in turn from one queue.
        let jrx = Arc::new(Mutex::new(jrx));
        // One thread more than the device's depth: a thread that finished a batch
        // acknowledges it while another writes the next (see `finish_job`).
        for lane in 0..=depth.max(1) {
            let (ctx, jrx, sh) = (Arc::clone(&ctx), Arc::clone(&jrx), Arc::clone(&shared));
            let name = format!("log-dev{dev}.{lane}");
            let spawned = std::thread::Builder::new()
                .name(name)
                .spawn(move || device_loop(&ctx, &jrx, &sh));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    shared.shutdown();
                    return Err(e);
                }
            }
        }
    }
    let sh = Arc::clone(&shared);
    match std::thread::Builder::new()
        .name("log-timer".into())
        .spawn(move || timer_loop(&sh))
    {
        Ok(h) => handles.push(h),
        Err(e) => {
            shared.shutdown();
            return Err(e);
        }
    }
    Ok((shared, handles))
}

/// Runs the `T_wait` deadline if it has passed; returns whether it had.
pub(crate) fn fire_timer(shared: &Shared) -> bool {
    let Some(mut w) = shared.lock() else {
        return false;
    };
    if w.shut {
        return false;
    }
    let now = w.now();
    let Some(d) = w.core.next_deadline().filter(|&d| d <= now) else {
        return false;
    };
    let actions = w.core.poll(d.max(now));
    shared.execute(&mut w, actions);
    true
}

/// Runs the policy's `T_wait` deadlines; sleeps while there are none.
fn timer_loop(shared: &Shared) {
    let Some(mut w) = shared.lock() else { return };
    loop {
        if w.shut {
            return;
        }
        let now = w.now();
        let deadline = w.core.next_deadline();
        if let Some(d) = deadline.filter(|&d| d <= now) {
            let actions = w.core.poll(d.max(now));
            w.execute(actions);
            continue;
        }
        let until = deadline.unwrap_or(Nanos::MAX);
        w.timer_sleeps_until = Some(until);
        let wait = Duration::from_nanos(until - now);
        w = match shared.tick.wait_timeout(w, wait) {
            Ok((g, _)) => g,
            Err(_) => return,
        };
        w.timer_sleeps_until = None;
    }
}

impl Writer {
    fn now(&self) -> u64 {
        let elapsed = self.clock.now().saturating_duration_since(self.epoch);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
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
        let failed = self.failed();
        let wall = self.clock.wall_ns();
        let Some((seq, bytes)) = self.enter(entry, seq, reply, arrived, wall, failed.as_deref())
        else {
            return Vec::new();
        };
        let now = self.now();
        let submitted = self.core.submit(seq, bytes, now);
        self.submitted(submitted, &[(seq, bytes)])
    }

    /// Appends records that arrived together: the policy places them as one burst
    /// ([`Policy::submit_burst`]), so the first does not leave alone ahead of the rest.
    fn append_many(
        &mut self,
        entries: Vec<(Entry, Reply)>,
        arrived: Instant,
    ) -> (Vec<Action>, Option<u64>) {
        // Not `filter_map(..).collect()`: collected in place, the pairs would land in the
        // entries' allocation and be moved again to shrink it (a realloc of the whole batch).
        let mut reqs = Vec::with_capacity(entries.len());
        let wall = self.clock.wall_ns();
        // Read once per burst: the lock is shared with the device threads, and taking it per
        // record was a contended cache line on every append.
        let failed = self.failed();
        for (entry, reply) in entries {
            reqs.extend(self.enter(entry, None, reply, arrived, wall, failed.as_deref()));
        }
        let Some(&(first, _)) = reqs.first() else {
            return (Vec::new(), None);
        };
        let now = self.now();
        let submitted = self.core.submit_burst(&reqs, now);
        (self.submitted(submitted, &reqs), Some(first))
    }

    /// Gives the record its sequence number, timestamp and header and keeps it pending;
    /// returns (seq, bytes) for the policy, or `None` when the log has failed (the waiter is
    /// told).
    /// `wall`: the time now ([`Clock::wall_ns`]), read once per burst; the record's timestamp is
    /// the later of it and one past the previous record's. `failed`: [`Writer::failed`], read
    /// once per burst by the caller.
    fn enter(
        &mut self,
        entry: Entry,
        seq: Option<u64>,
        reply: Reply,
        arrived: Instant,
        wall: u64,
        failed: Option<&str>,
    ) -> Option<(u64, u64)> {
        if let Some(why) = failed {
            let _ = reply.send(Err(LogError::Failed(why.to_owned())));
            return None;
        }
        let seq = seq.unwrap_or_else(|| {
            let s = self.next_seq;
            self.next_seq += 1;
            s
        });
        self.last_ts = wall.max(self.last_ts + 1);
        // Void records stand for nothing that happened to a volume: not stamped.
        let volume_seq = if entry.kind == RecordKind::Void {
            0
        } else {
            let last = self.volume_seqs.entry(entry.volume).or_insert(0);
            *last += 1;
            *last
        };
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
            volume_seq,
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
        Some((seq, bytes))
    }

    /// The policy's answer to a submission of `reqs`: its actions, or every request failed.
    fn submitted(
        &mut self,
        r: Result<(Vec<Action>, u64), PolicyError>,
        reqs: &[(u64, u64)],
    ) -> Vec<Action> {
        match r {
            Ok((actions, freed)) => {
                if freed > 0 {
                    self.freed(freed);
                } else {
                    self.stats
                        .stalled
                        .store(self.core.policy().stalled() as u64, Relaxed);
                }
                actions
            }
            Err(e) => {
                for (seq, _) in reqs {
                    if let Some(p) = self.pending.remove(seq) {
                        let _ = p.reply.send(Err(LogError::Config(e.to_string())));
                    }
                }
                Vec::new()
            }
        }
    }

    fn execute(&mut self, actions: Vec<Action>) {
        // After shutdown a finishing device may still free the policy's queued batches; their
        // waiters were failed already and the job queues are gone.
        if self.shut {
            return;
        }
        let cut = self.core.take_cut_segments();
        if !cut.is_empty() {
            if let Err(e) = self.invalidate(&cut) {
                return self.fail(format!("invalidating segments a cut let go of: {e}"));
            }
        }
        for a in actions {
            self.core.account(&a);
            match a {
                Action::Write(w) => self.start_write(w),
                Action::SwitchSegment { .. } => {
                    self.stats.segments_used.fetch_add(1, Relaxed);
                    self.store_holds();
                }
            }
        }
    }

    /// Lays out one batch: each record's header (with generation, back pointer and span), its
    /// payload, and zero padding after the last.
    /// Keeps a written batch's buffer for a later batch (a few, none over a segment's size).
    fn recycle(&mut self, buf: AlignedBuf) {
        const KEEP: usize = 4;
        const LARGEST: usize = 1 << 20;
        if self.spare.len() < KEEP && buf.capacity() <= LARGEST && buf.align() == self.align {
            self.spare.push(buf);
        }
    }

    /// A zeroed buffer of `len` bytes: a spare one if one is large enough.
    fn batch_buffer(&mut self, len: usize) -> std::io::Result<AlignedBuf> {
        if let Some(i) = self.spare.iter().position(|b| b.capacity() >= len) {
            let mut buf = self.spare.swap_remove(i);
            if buf.reset(len) {
                return Ok(buf);
            }
        }
        // Rounded up so that the buffer serves a range of later batch sizes too.
        let mut buf = AlignedBuf::new(len.next_multiple_of(64 << 10), self.align)?;
        buf.reset(len);
        Ok(buf)
    }

    fn start_write(&mut self, w: Write) {
        let mut buf = match self.batch_buffer(w.padded_bytes as usize) {
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
        let ticket = self.tickets[w.dev];
        self.tickets[w.dev] += 1;
        let job = DevJob {
            ticket,
            dev: w.dev,
            buf,
            offset: w.offset,
            batch,
        };
        let sent = match &mut self.jobs {
            Jobs::Threads(senders) => match senders.get(w.dev) {
                Some(jobs) => jobs.send(job).map_err(|e| e.0),
                None => Err(job),
            },
            Jobs::Queued(queue) => {
                queue.push(job);
                Ok(())
            }
        };
        if let Err(job) = sent {
            for p in job.batch {
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

    fn release(&mut self, holder: usize, seq: u64) -> Vec<Action> {
        let (actions, freed) = self.core.release(holder, seq, self.now());
        self.freed(freed);
        actions
    }

    /// Space changed: `freed` segments were freed, holders may have released or been cut.
    fn freed(&mut self, freed: u64) {
        self.stats.released_seq.store(self.core.released(), Relaxed);
        self.stats.segments_used.fetch_sub(freed, Relaxed);
        self.stats
            .stalled
            .store(self.core.policy().stalled() as u64, Relaxed);
        self.store_holds();
    }

    /// Copies each holder's watermark, cut and held segments to its handle's stats.
    fn store_holds(&self) {
        for (hold, stats) in self.core.holds().iter().zip(&self.holders) {
            stats.store(hold, self.core.segments_above(hold.released));
        }
    }

    /// Writes zeros over the first block of each of `segments` (device, segment) and syncs
    /// their devices ([`Dispatch::take_cut_segments`]). On the dispatcher's thread, under its
    /// lock: only after a cut, while writers wait for space anyway.
    fn invalidate(&mut self, segments: &[(usize, u64)]) -> std::io::Result<()> {
        let mut synced = Vec::new();
        for &(dev, segment) in segments {
            let Some(disk) = self.devices.get(dev) else {
                continue;
            };
            let align = self.align.max(disk.alignment()).max(512);
            let zeros = AlignedBuf::new(align, align)?;
            disk.write_at(&zeros, self.segments.0 + segment * self.segments.1)?;
            if !synced.contains(&dev) {
                synced.push(dev);
            }
        }
        for dev in synced {
            self.devices[dev].sync()?;
        }
        Ok(())
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
