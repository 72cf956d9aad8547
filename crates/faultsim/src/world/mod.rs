//! One simulated node: the log on one or two fault-injecting log devices, the store with one or
//! two volume images on fault-injecting disks (which can also fill up), a virtual clock, and
//! the records the simulation appended, checked against [`crate::model`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Weak};

use mariner_disk::{CrashMode, Disk, Faults, FaultyDisk, FullDisk};
use mariner_log::clock::{Clock, VirtualClock};
use mariner_log::{AppendFuture, Durable, DurableSink, Log, RecordKind, SimDevices, DATA_OFFSET};
use mariner_store::{Progress, ProgressFile, Store, StoreConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod checks;
mod history;
mod setup;

pub use setup::{Setup, StoreParams};

use crate::model::{Rec, Volume, SECTOR};
use crate::{Failure, Summary};

const LOG_ID: u128 = 0x5eed;

/// The store's watermark "file": replaced atomically and durably by each save, so a crash
/// leaves the last one saved. It can fill up like the images' file system.
#[derive(Default)]
struct MemProgress {
    saved: std::sync::Mutex<Progress>,
    full: std::sync::atomic::AtomicBool,
}

impl ProgressFile for MemProgress {
    fn save(&self, p: &Progress) -> std::io::Result<()> {
        if self.full.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::ErrorKind::StorageFull.into());
        }
        if let Ok(mut g) = self.saved.lock() {
            *g = p.clone();
        }
        Ok(())
    }
}

/// The log's consumer, held weakly: the store holds the log, the log holds its sink, and a
/// strong reference both ways would keep every crashed node's disks alive.
struct WeakSink(Weak<Store>);

impl DurableSink for WeakSink {
    fn durable(&self, records: &[Durable]) {
        if let Some(s) = self.0.upgrade() {
            s.durable(records);
        }
    }
}

struct Node {
    log: Log,
    store: Arc<Store>,
    sim: SimDevices,
}

struct Waiter {
    seq: u64,
    void: bool,
    fut: AppendFuture,
}

/// A record the simulation appended and the log has not yet given up, by sequence number.
struct Known {
    rec: Rec,
    /// Acknowledged, or found by recovery after a crash: it must survive every later crash.
    durable: bool,
    ts: Option<u64>,
}

/// An image disk and the handles to fault it.
struct Image {
    size: u64,
    disk: Arc<FullDisk<FaultyDisk>>,
    faults: Faults,
}

pub(crate) struct World {
    seed: u64,
    rng: SmallRng,
    pub(crate) setup: Setup,
    clock: Arc<VirtualClock>,
    log_faults: Vec<Faults>,
    log_devs: Vec<Arc<dyn Disk>>,
    images: Vec<Image>,
    progress: Arc<MemProgress>,
    node: Option<Node>,
    waiting: Vec<Waiter>,
    known: BTreeMap<u64, Known>,
    /// Per volume, every acknowledged record's sequence number and volume sequence number,
    /// across crashes: the volume's numbering must rise with the log's.
    volume_seqs: BTreeMap<u32, BTreeMap<u64, u64>>,
    /// A holder of log space beside the store, in half the seeds ([`history`]).
    second: Option<history::SecondHolder>,
    model: Vec<Volume>,
    trace: VecDeque<String>,
    verbose: bool,
    pub(crate) summary: Summary,
}

/// Events kept for the failure report.
const TRACE: usize = 48;

impl World {
    pub(crate) fn new(seed: u64, verbose: bool) -> Result<Self, Failure> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let setup = Setup::draw(&mut rng);
        let second = history::SecondHolder::draw(seed, setup.log.segment_bytes);
        let dev_len = DATA_OFFSET + setup.segments * setup.log.segment_bytes;
        let mut log_faults = Vec::new();
        let mut log_devs: Vec<Arc<dyn Disk>> = Vec::new();
        for _ in 0..setup.devices {
            let d = FaultyDisk::new(dev_len as usize, rng.random());
            log_faults.push(d.faults());
            log_devs.push(Arc::new(d));
        }
        let images = setup
            .volumes
            .iter()
            .map(|&size| {
                let d = FaultyDisk::new(size as usize, rng.random());
                Image {
                    size,
                    faults: d.faults(),
                    disk: Arc::new(FullDisk::new(d)),
                }
            })
            .collect();
        let model = setup.volumes.iter().map(|&s| Volume::new(s)).collect();
        let mut w = Self {
            seed,
            rng,
            setup,
            clock: Arc::new(VirtualClock::new(1_700_000_000_000_000_000)),
            log_faults,
            log_devs,
            images,
            progress: Arc::default(),
            node: None,
            waiting: Vec::new(),
            known: BTreeMap::new(),
            volume_seqs: BTreeMap::new(),
            second,
            model,
            trace: VecDeque::new(),
            verbose,
            summary: Summary::default(),
        };
        w.note(format!("setup {:?}", w.setup));
        Log::format(&w.log_devs, &w.setup.log, LOG_ID)
            .map_err(|e| w.fail(format!("format: {e}")))?;
        Ok(w)
    }

    pub(crate) fn fail(&self, message: String) -> Failure {
        let mut f = Failure::new(self.seed, message);
        f.trace = self.trace.iter().cloned().collect();
        f
    }

    fn note(&mut self, event: String) {
        if self.verbose {
            eprintln!("[{:>12} ns] {event}", self.clock.elapsed_ns());
        }
        if self.trace.len() == TRACE {
            self.trace.pop_front();
        }
        self.trace.push_back(event);
    }

    fn node(&self) -> Result<&Node, Failure> {
        self.node
            .as_ref()
            .ok_or_else(|| self.fail("no node is open".into()))
    }

    /// Opens the node on the disks as they are (formatted, or as a crash left them), checks
    /// what recovery found against the records appended, and checks every volume reads as
    /// the model says.
    pub(crate) fn open(&mut self) -> Result<(), Failure> {
        let progress = self
            .progress
            .saved
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default();
        let p = self.setup.store;
        let cfg = StoreConfig {
            progress_path: "unused: the watermark is kept in memory".into(),
            sync_interval_ms: p.sync_interval_ms,
            sync_bytes: p.sync_bytes,
            payload_budget_bytes: p.payload_budget_bytes,
            apply_idle_ms: p.apply_idle_ms,
            apply_max_delay_ms: p.apply_max_delay_ms,
            apply_max_held_bytes: u64::MAX,
        };
        let clock: Arc<dyn Clock> = self.clock.clone();
        let file: Arc<dyn ProgressFile> = self.progress.clone();
        let store = Store::simulated(cfg, progress.clone(), Arc::clone(&clock), file);
        for (i, img) in self.images.iter().enumerate() {
            store.add_volume(vol_id(i), img.disk.clone(), img.size);
        }
        let sink = Arc::new(WeakSink(Arc::downgrade(&store)));
        let mut holders = vec![store.holder_spec()];
        holders.extend(self.second.as_ref().map(|s| s.spec()));
        let opened = Log::open_simulated(
            self.log_devs.clone(),
            self.setup.log.clone(),
            LOG_ID,
            &holders,
            sink,
            clock,
        );
        let (log, rec, sim, voids) =
            opened.map_err(|e| self.fail(format!("the log does not open after a crash: {e}")))?;
        self.note(format!(
            "open: watermark {} recovered {} voided {:?} last {} torn tails {}",
            progress.applied_seq,
            rec.records.len(),
            rec.voided,
            rec.last_seq,
            rec.torn_tails
        ));
        self.check_recovery(&progress, &rec)?;
        store
            .start_stepped(log.clone(), &rec)
            .map_err(|e| self.fail(format!("the store does not start: {e}")))?;
        for (&seq, fut) in rec.voided.iter().zip(voids) {
            self.waiting.push(Waiter {
                seq,
                void: true,
                fut,
            });
        }
        for f in &rec.records {
            self.second_holder_durable(f.header.seq, f.addr);
        }
        self.node = Some(Node { log, store, sim });
        self.attach_second_holder()?;
        self.check_first_kept(&rec)?;
        for v in 0..self.images.len() {
            self.check_read(v, 0, self.images[v].size, "after recovery")?;
        }
        Ok(())
    }

    /// Appends a burst of one to three random records.
    pub(crate) fn append(&mut self) -> Result<(), Failure> {
        let mut recs = Vec::new();
        for _ in 0..self.rng.random_range(1..=3) {
            recs.push(self.random_record());
        }
        let entries = recs.iter().map(entry).collect();
        let Ok(burst) = self.node()?.log.append_many(entries) else {
            return Ok(()); // the log failed: refused
        };
        let Some(first) = burst.first_seq else {
            return Ok(());
        };
        self.summary.appended += recs.len() as u64;
        let stalled = self
            .node()?
            .log
            .stats()
            .stalled
            .load(std::sync::atomic::Ordering::Relaxed);
        if stalled > 0 {
            self.summary.log_full += 1;
        }
        for (i, (mut r, fut)) in recs.into_iter().zip(burst.futures).enumerate() {
            let seq = first + i as u64;
            r.seq = seq;
            self.note(format!(
                "append {seq}: {:?} vol {} {}+{}",
                r.kind, r.volume, r.offset, r.length
            ));
            if self.known.contains_key(&seq) {
                return Err(self.fail(format!("sequence number {seq} handed out twice")));
            }
            self.known.insert(
                seq,
                Known {
                    rec: r,
                    durable: false,
                    ts: None,
                },
            );
            self.waiting.push(Waiter {
                seq,
                void: false,
                fut,
            });
        }
        Ok(())
    }

    fn random_record(&mut self) -> Rec {
        let v = self.rng.random_range(0..self.images.len());
        let sectors_in_volume = self.images[v].size / SECTOR;
        let sectors = self.rng.random_range(1..=self.setup.max_sectors);
        let first = self.rng.random_range(0..=sectors_in_volume - sectors);
        let kind = match self.rng.random_range(0..20) {
            0 | 1 => RecordKind::Trim,
            2 => RecordKind::WriteZeroes,
            _ => RecordKind::Write,
        };
        let length = (sectors * SECTOR) as u32;
        let payload = if kind == RecordKind::Write {
            let mut p = vec![0u8; length as usize];
            self.rng.fill(&mut p[..]);
            bytes::Bytes::from(p)
        } else {
            bytes::Bytes::new()
        };
        Rec {
            seq: 0,
            kind,
            volume: vol_id(v),
            offset: first * SECTOR,
            length,
            payload,
        }
    }

    /// Takes the answers of the appends that have one. An acknowledged record joins the model.
    pub(crate) fn collect(&mut self) -> Result<(), Failure> {
        let mut i = 0;
        while i < self.waiting.len() {
            use tokio::sync::oneshot::error::TryRecvError;
            match self.waiting[i].fut.try_recv() {
                Err(TryRecvError::Empty) => i += 1,
                Err(TryRecvError::Closed) | Ok(Err(_)) => {
                    let w = self.waiting.swap_remove(i);
                    self.note(format!("append {} failed", w.seq));
                }
                Ok(Ok(a)) => {
                    let w = self.waiting.swap_remove(i);
                    if a.seq != w.seq {
                        return Err(self.fail(format!(
                            "record {} acknowledged as sequence number {}",
                            w.seq, a.seq
                        )));
                    }
                    if !w.void {
                        self.second_holder_durable(a.seq, a.addr);
                        self.acknowledged(a.seq, a.timestamp_ns)?;
                        self.check_volume_seq(a.seq, a.volume_seq)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The acknowledged record `seq` got volume sequence number `vseq`: above that of every
    /// earlier acknowledged record of its volume and below every later one's, before and after
    /// crashes (a restart continues the numbering from what recovery and the store's watermark
    /// say, even when the volume's records were released and overwritten).
    fn check_volume_seq(&mut self, seq: u64, vseq: u64) -> Result<(), Failure> {
        let Some(volume) = self.known.get(&seq).map(|k| k.rec.volume) else {
            return Err(self.fail(format!("acknowledged record {seq} was never appended")));
        };
        let seqs = self.volume_seqs.entry(volume).or_default();
        let before = seqs.range(..seq).next_back().map(|(_, &v)| v);
        let after = seqs.range(seq + 1..).next().map(|(_, &v)| v);
        seqs.insert(seq, vseq);
        if vseq == 0 || before.is_some_and(|b| b >= vseq) || after.is_some_and(|a| a <= vseq) {
            return Err(self.fail(format!(
                "record {seq} of volume {volume} has volume sequence number {vseq}, out of order \
                 ({before:?}, {after:?})"
            )));
        }
        Ok(())
    }

    fn acknowledged(&mut self, seq: u64, ts: u64) -> Result<(), Failure> {
        self.summary.acked += 1;
        let before = self.known.range(..seq).rev().find_map(|(_, k)| k.ts);
        let after = self.known.range(seq + 1..).find_map(|(_, k)| k.ts);
        if before.is_some_and(|b| b >= ts) || after.is_some_and(|a| a <= ts) {
            return Err(self.fail(format!(
                "record {seq}'s timestamp {ts} is out of sequence order ({before:?}, {after:?})"
            )));
        }
        let Some(k) = self.known.get_mut(&seq) else {
            return Err(self.fail(format!("acknowledged record {seq} was never appended")));
        };
        if k.durable {
            return Err(self.fail(format!("record {seq} acknowledged twice")));
        }
        k.durable = true;
        k.ts = Some(ts);
        let r = k.rec.clone();
        self.note(format!("ack {seq}"));
        self.model[vol_index(r.volume)].apply(&r);
        Ok(())
    }

    /// Completes one of the batches in flight, chosen at random: devices finish in any order.
    pub(crate) fn complete_one(&mut self) -> Result<bool, Failure> {
        let node = self.node()?;
        let flying = node.sim.in_flight();
        if flying.is_empty() {
            return Ok(false);
        }
        let depth = self.setup.log.device_depth as usize;
        for dev in 0..self.setup.devices {
            let n = flying.iter().filter(|f| f.dev == dev).count();
            if n > depth {
                return Err(self.fail(format!(
                    "device {dev} has {n} batches in flight, depth {depth}"
                )));
            }
        }
        let i = self.rng.random_range(0..flying.len());
        let f = flying[i];
        self.node()?.sim.complete(i);
        self.summary.batches += 1;
        self.note(format!(
            "complete dev {} ticket {} at {}+{}",
            f.dev, f.ticket, f.offset, f.len
        ));
        Ok(true)
    }

    pub(crate) fn fire_timer(&mut self) -> Result<bool, Failure> {
        let fired = self.node()?.sim.fire_timer();
        if fired {
            self.note("T_wait fired".into());
        }
        Ok(fired)
    }

    pub(crate) fn store_step(&mut self) -> Result<(), Failure> {
        let node = self.node()?;
        let before = node
            .store
            .stats()
            .applied_seq
            .load(std::sync::atomic::Ordering::Relaxed);
        node.store.step();
        let short = (0..self.images.len()).any(|v| node.store.out_of_space(vol_id(v)).is_some());
        let after = node
            .store
            .stats()
            .applied_seq
            .load(std::sync::atomic::Ordering::Relaxed);
        if short {
            self.summary.no_space += 1;
        }
        if after != before {
            self.note(format!("store applied {before} -> {after}"));
        }
        Ok(())
    }

    /// The earliest moment the log or the store waits for.
    pub(crate) fn next_deadline_ns(&self) -> Result<Option<u64>, Failure> {
        let node = self.node()?;
        let now = self.clock.now();
        let d = [node.sim.next_deadline(), node.store.next_deadline()]
            .into_iter()
            .flatten()
            .min();
        Ok(d.map(|d| {
            let ahead = d.saturating_duration_since(now);
            self.clock.elapsed_ns() + u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX)
        }))
    }

    /// Moves the clock: to the next deadline, or by a short or a long random step.
    pub(crate) fn advance(&mut self) -> Result<(), Failure> {
        let now = self.clock.elapsed_ns();
        let by = match self.rng.random_range(0..4) {
            0 | 1 => self
                .next_deadline_ns()?
                .map_or(0, |d| d.saturating_sub(now)),
            2 => self.rng.random_range(1..100_000),
            _ => self.rng.random_range(1_000_000..20_000_000),
        };
        self.clock.advance(by);
        Ok(())
    }

    /// Reads a random range of a random volume and compares it with the model.
    pub(crate) fn random_read(&mut self) -> Result<(), Failure> {
        let v = self.rng.random_range(0..self.images.len());
        let sectors = self.images[v].size / SECTOR;
        let n = self.rng.random_range(1..=32.min(sectors));
        let first = self.rng.random_range(0..=sectors - n);
        self.check_read(v, first * SECTOR, n * SECTOR, "while running")
    }

    /// Injects one fault: a log device's next I/O fails (the log fails for good), an image
    /// disk's syncs fail (the store fails for good), or an image's file system fills up (the
    /// store waits for room).
    pub(crate) fn inject_fault(&mut self) -> Result<(), Failure> {
        self.summary.faults += 1;
        match self.rng.random_range(0..3) {
            0 => {
                let dev = self.rng.random_range(0..self.log_faults.len());
                let after = self.rng.random_range(0..4);
                self.note(format!("fault: log device {dev} fails after {after} I/Os"));
                self.log_faults[dev].fail_after(after);
            }
            1 => {
                let v = self.rng.random_range(0..self.images.len());
                self.note(format!("fault: image {v}'s syncs fail"));
                self.images[v].faults.set_sync_fails(true);
            }
            _ => {
                // The images and the watermark share a file system.
                let v = self.rng.random_range(0..self.images.len());
                self.note(format!("fault: the file system of image {v} is full"));
                self.images[v].disk.set_full(true);
                if self.rng.random_bool(0.5) {
                    self.progress
                        .full
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// Room again on every image (what a user does after an ENOSPC).
    pub(crate) fn make_room(&mut self) {
        for img in &self.images {
            img.disk.set_full(false);
        }
        self.progress
            .full
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Cuts the power: some batches in flight were under way and reach their device
    /// unsynced, then every disk keeps what it had synced plus, at random, some of what it had
    /// not (whole, torn or not at all).
    pub(crate) fn crash(&mut self) -> Result<(), Failure> {
        self.summary.crashes += 1;
        if let Some(node) = &self.node {
            let n = node.sim.in_flight().len();
            for i in (0..n).rev() {
                if self.rng.random_bool(0.5) {
                    node.sim.land(i);
                }
            }
        }
        self.collect()?;
        self.node = None;
        self.collect()?;
        self.waiting.clear();
        let mode = match self.rng.random_range(0..10) {
            0 => CrashMode::LoseUnsynced,
            1 => CrashMode::KeepUnsynced,
            _ => CrashMode::Random,
        };
        self.note(format!("crash ({mode:?})"));
        for (dev, f) in self.log_faults.iter_mut().enumerate() {
            let d = f.crash_with(mode);
            *f = d.faults();
            self.log_devs[dev] = Arc::new(d);
        }
        for img in &mut self.images {
            let d = img.faults.crash_with(mode);
            img.faults = d.faults();
            img.disk = Arc::new(FullDisk::new(d));
        }
        Ok(())
    }

    /// After a fault: runs without new appends until every append is answered, durable or
    /// failed. A node that failed must say so to its writers, not leave them waiting for log
    /// space that a failed store will never release. Full file systems are made roomy first
    /// (waiting for room is what the node should do while they are full).
    pub(crate) fn settle(&mut self) -> Result<(), Failure> {
        self.make_room();
        for _ in 0..20_000 {
            self.collect()?;
            if self.waiting.is_empty() {
                return Ok(());
            }
            if self.complete_one()? || self.fire_timer()? {
                continue;
            }
            self.store_step()?;
            let now = self.clock.elapsed_ns();
            let next = self.next_deadline_ns()?.unwrap_or(now + 1_000_000);
            self.clock
                .advance(next.saturating_sub(now).clamp(1, 10_000_000));
        }
        let state = self.state()?;
        Err(self.fail(format!(
            "{} appends never answered after a fault: {state}",
            self.waiting.len()
        )))
    }

    /// What the node is doing, for a report.
    fn state(&self) -> Result<String, Failure> {
        use std::sync::atomic::Ordering::Relaxed;
        let node = self.node()?;
        let stats = node.log.stats();
        Ok(format!(
            "{} batches in flight, log failed: {:?}, store failed: {:?}, store synced to {}, \
             log {} of {} segments in use, {} appends stalled",
            node.sim.in_flight().len(),
            node.log.failure(),
            node.store.failure(),
            node.store.progress().applied_seq,
            stats.segments_used.load(Relaxed),
            stats.segments_total.load(Relaxed),
            stats.stalled.load(Relaxed),
        ))
    }

    /// Runs without new appends until every append is answered and the store has applied
    /// and synced all of it, then checks the images on disk — what survives the next crash
    /// with nothing in flight — against the model. Fails if the node stops making progress.
    pub(crate) fn drain(&mut self) -> Result<(), Failure> {
        self.make_room();
        let last = self.known.keys().next_back().copied().unwrap_or(0);
        for _ in 0..200_000 {
            self.collect()?;
            let node = self.node()?;
            if let Some(why) = node.log.failure().or_else(|| node.store.failure()) {
                return Err(self.fail(format!("failed while draining without faults: {why}")));
            }
            let synced = node.store.progress().applied_seq;
            let flying = node.sim.in_flight().len();
            if self.waiting.is_empty() && flying == 0 && synced >= last {
                return self.check_images_on_disk();
            }
            if flying > 0 {
                self.complete_one()?;
                continue;
            }
            if self.fire_timer()? {
                continue;
            }
            self.store_step()?;
            let now = self.clock.elapsed_ns();
            let next = self.next_deadline_ns()?.unwrap_or(now + 1_000_000);
            self.clock.advance(next.saturating_sub(now).max(1));
        }
        let state = self.state()?;
        Err(self.fail(format!(
            "no progress while draining: {} appends unanswered, last record {last}: {state}",
            self.waiting.len()
        )))
    }

    pub(crate) fn random(&mut self, n: u32) -> u32 {
        self.rng.random_range(0..n)
    }
}

fn entry(r: &Rec) -> mariner_log::Entry {
    match r.kind {
        RecordKind::Write => mariner_log::Entry::write(r.volume, r.offset, r.payload.clone()),
        kind => mariner_log::Entry::extent(kind, r.volume, r.offset, r.length),
    }
}

fn vol_id(index: usize) -> u32 {
    index as u32 + 1
}

fn vol_index(id: u32) -> usize {
    (id - 1) as usize
}
