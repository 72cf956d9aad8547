//! The history engine: takes durable records off the log's sink, indexes them in batches
//! behind the write path, keeps the state and the log holder, and rolls the base images
//! forward as records leave the window (`retention`).
//!
//! Order of what it writes, and why a crash loses nothing (docs/ARCHITECTURE.md "History"):
//! 1. a batch's digests are appended and synced, then its index entries are inserted (durable
//!    in the index's own log when `insert` returns), then the records leave the tail;
//! 2. the state (indexed sequence number, piece levels) is saved after both, now and then;
//! 3. the log holder is released only up to what the saved state covers and the base images
//!    hold: at open, the records above the saved indexed sequence number are still in the
//!    log and are indexed again (digests skip what they have; index inserts are idempotent).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mariner_bosc::WriteGap;
use mariner_cpuclass::CpuClass;
use mariner_disk::Disk;
use mariner_log::clock::{Clock, SystemClock};
use mariner_log::{DeviceBusy, HoldKind, Holder, HolderSpec, Log, RecordKind, Recovery};

use crate::sink::{entry_of, note_in_view, void_entry};

use crate::digest::Digests;
use crate::files::{FileUse, Files};
use crate::index::{IndexConfig, LtIndex};
use crate::state::{State, VolumeState, FLAG_BROKEN};
use crate::tail::Tail;
use crate::{DigestEntry, HistoryError};

/// The name history holds log space under.
pub const HOLDER: &str = "history";
const STATE: &str = "state";
/// What the digest files' names start with, beside the state, index and base files.
const DIGEST_PREFIX: &str = "digest-";

/// Tunables.
#[derive(Debug, Clone)]
pub struct HistoryConfig {
    /// The protection window: every write this recent stays readable.
    pub window: Duration,
    /// Under a must-hold kind (throttle), history does not shrink below this; under a
    /// shrinkable one, falling below it is logged as an alert.
    pub min_window: Duration,
    pub index: IndexConfig,
    /// Most records indexed in one batch.
    pub batch_records: usize,
    /// Records wait at most about this long before they are indexed.
    pub batch_interval: Duration,
    /// The state is saved at most this often (the holder is released behind it).
    pub state_interval: Duration,
    /// `Some`: an indexer thread runs; `None`: only [`History::step`] indexes (tests).
    pub background: bool,
    /// Writers never wait for history (`Shrinkable`, the default), or wait for it
    /// (`MustHold`: the `throttle` policy, once the window is down to its floor).
    pub kind: HoldKind,
    /// A rollback saves its cursor after this many bytes written (`rollback.rs`).
    pub rollback_save_bytes: u64,
    /// Most digest entries read at once: one round of a prune, one chunk of a roll-forward
    /// round's scan, which passes at most 16 of them (they are in memory meanwhile;
    /// `retention.rs`).
    pub round_records: u64,
    /// Most distinct ranges one roll-forward round writes (`round.rs`).
    pub round_pieces: usize,
    /// No roll-forward until the log has cut history once (tests of what follows a cut;
    /// `[test] history_rolls_stalled_until_cut`).
    pub rolls_stalled_until_cut: bool,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(7 * 24 * 3600),
            min_window: Duration::from_secs(3600),
            index: IndexConfig::default(),
            batch_records: 16_384,
            batch_interval: Duration::from_millis(200),
            state_interval: Duration::from_secs(1),
            background: true,
            kind: HoldKind::Shrinkable,
            rollback_save_bytes: 4 << 20,
            round_records: crate::retention::ROUND_RECORDS,
            round_pieces: crate::retention::ROUND_PIECES,
            rolls_stalled_until_cut: false,
        }
    }
}

/// Counters, all monotonic but `tail_records`.
#[derive(Debug, Default)]
pub struct HistoryStats {
    pub records_indexed: AtomicU64,
    pub keys_inserted: AtomicU64,
    /// Index keys removed as their versions left the window.
    pub keys_removed: AtomicU64,
    pub batches: AtomicU64,
    pub indexed_seq: AtomicU64,
    pub saved_seq: AtomicU64,
    pub tail_records: AtomicU64,
    pub rolled_records: AtomicU64,
    pub rolled_bytes: AtomicU64,
    pub roll_forwards: AtomicU64,
    /// Roll-forwards made early because the log was filling: the window shrank.
    pub shrinks: AtomicU64,
    /// Times the log cut history before the base had what it cut.
    pub cuts: AtomicU64,
    pub reads: AtomicU64,
    /// Reads that took some sectors from a base image.
    pub base_reads: AtomicU64,
    /// Roll-forwards a crash interrupted, finished at open.
    pub resumed_rolls: AtomicU64,
    /// Base images copied from a current image.
    pub seeds: AtomicU64,
    /// Declared gaps (`RecordKind::HistoryGap`) that broke a volume's history.
    pub gaps: AtomicU64,
    /// Opens that found the LT index damaged (a leaf torn by a crash) and rebuilt it from
    /// the digests.
    pub index_rebuilds: AtomicU64,
}

/// What readers see of a volume: which instants can be read, and where the base stands.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct View {
    pub state: VolumeState,
    /// The newest record history has of the volume (tail included).
    pub last_vseq: u64,
    pub last_ts: u64,
    /// The newest declared gap of the volume history has (tail included): above the base,
    /// the history is broken from the moment the record is durable, before the indexer marks
    /// it ([`View::broken`]).
    pub gap_seq: u64,
}

pub(crate) struct Inner {
    pub cfg: HistoryConfig,
    pub files: Arc<dyn Files>,
    pub clock: Arc<dyn Clock>,
    state_disk: Arc<dyn Disk>,
    /// The state as saved (plus what is being built for the next save).
    pub state: Mutex<State>,
    pub index: LtIndex,
    pub digests: Mutex<Digests>,
    pub tail: RwLock<Tail>,
    pub views: RwLock<BTreeMap<u32, View>>,
    pub bases: Mutex<BTreeMap<u32, Arc<dyn Disk>>>,
    pub(crate) incoming: Mutex<Vec<DigestEntry>>,
    pub(crate) wake: Condvar,
    indexer: Mutex<Indexer>,
    pub log: OnceLock<Log>,
    /// The log's device writes in flight, once started: what the index's commits wait for a
    /// gap in.
    pub(crate) log_busy: Arc<OnceLock<Arc<DeviceBusy>>>,
    pub holder: OnceLock<Holder>,
    pub stats: HistoryStats,
    pub(crate) stop: AtomicBool,
    pub(crate) failed: Mutex<Option<String>>,
    /// Held by a round of the roller, and by the indexer while it applies a batch's
    /// lifecycle records (`workers.rs`).
    pub(crate) rounds: Mutex<()>,
    /// Taken for each of history's writes to the device — a batch's digests and index
    /// insert, a state save, a piece of a base's write-out, a base's sync, a prune's index
    /// removal — so that the indexer and the roller never queue writes on the device at once,
    /// as when they ran on one thread: a log write then waits behind one of them at most.
    /// Held for one piece (32 KiB) of a round at a time, never a whole round; and a round
    /// lets a waiting batch or save go first ([`Inner::turn_first`], [`Inner::turn_after`]):
    /// a plain mutex let the roller take it back piece after piece while the indexer waited
    /// (index lag p99 3.2 s).
    pub(crate) io_turn: Mutex<()>,
    /// Batches and saves waiting for the turn.
    pub(crate) turn_waiting: AtomicU64,
    /// Where the roller waits between looks, woken at stop.
    pub(crate) roller_idle: Mutex<()>,
    pub(crate) roller_wake: Condvar,
    /// When history last warned that it shrank (warnings at most once a minute).
    pub last_warning: Mutex<Option<Instant>>,
    pub roll_due: Mutex<crate::retention::RollDue>,
    /// Volumes whose window is not the configured one: their own, or `None` for history off.
    pub windows: Mutex<BTreeMap<u32, Option<Duration>>>,
    pub pins: Mutex<crate::pins::Pins>,
    pub rollbacks: Mutex<crate::rollback::Rollbacks>,
    /// Volumes being seeded while history runs, each with the point its base will be as of:
    /// history holds the log and its digests from there ([`Inner::holds`]).
    pub seeding: Mutex<BTreeMap<u32, u64>>,
    /// The CPU class of history's thread and its index's (`mariner_cpuclass`): idle while
    /// history keeps pace with the log, normal while it must catch up
    /// ([`Inner::keep_pace`]).
    pub cpu: Arc<CpuClass>,
}

/// The indexer's own state.
#[derive(Default)]
struct Indexer {
    /// Records received, by sequence number, not yet indexed.
    pending: BTreeMap<u64, DigestEntry>,
    /// The next sequence number to index.
    next_seq: u64,
    last_save: Option<Instant>,
}

/// The history engine. Cheap to clone.
#[derive(Clone)]
pub struct History {
    pub(crate) inner: Arc<Inner>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn io_err(files: &dyn Files, name: &str) -> impl Fn(std::io::Error) -> HistoryError {
    let path = files.path(name);
    move |source| HistoryError::Io {
        path: path.clone(),
        source,
    }
}

pub(crate) fn base_name(volume: u32) -> String {
    format!("base-{volume:08x}.img")
}

impl History {
    /// Opens history in `files` (creating it when new) with the system clock.
    pub fn open(files: Arc<dyn Files>, cfg: HistoryConfig) -> Result<Self, HistoryError> {
        Self::open_with_clock(files, cfg, Arc::new(SystemClock))
    }

    /// [`Self::open`] with the clock retention reads (tests inject one).
    pub fn open_with_clock(
        files: Arc<dyn Files>,
        cfg: HistoryConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, HistoryError> {
        let state_disk = files
            .open(STATE, FileUse::Random)
            .map_err(io_err(files.as_ref(), STATE))?;
        let loaded = State::load(state_disk.as_ref()).map_err(|why| HistoryError::Corrupt {
            path: files.path(STATE),
            at: 0,
            why,
        })?;
        let state = match loaded {
            Some(s) => s,
            None => {
                // New (or its creation was cut short before the first save): make the index,
                // then save the state, which is what says history exists.
                LtIndex::create(files.as_ref(), &cfg.index)?;
                let mut s = State::default();
                s.save(state_disk.as_ref())
                    .map_err(|why| HistoryError::Config(format!("saving history state: {why}")))?;
                s
            }
        };
        let levels: BTreeMap<u32, u8> = state
            .volumes
            .iter()
            .filter(|(_, v)| v.levels != 0)
            .map(|(&id, v)| (id, v.levels))
            .collect();
        // Only a background indexer moves between classes: tests stepping history by hand
        // run it on their own thread.
        let cpu = Arc::new(if cfg.background {
            CpuClass::new()
        } else {
            CpuClass::normal_only()
        });
        // The index's commits write between the log's writes while history keeps pace (the
        // log's device count is known once history starts).
        let log_busy: Arc<OnceLock<Arc<DeviceBusy>>> = Arc::default();
        let write_gap = {
            let (busy, cpu) = (Arc::clone(&log_busy), Arc::clone(&cpu));
            WriteGap(Arc::new(move || {
                if let Some(b) = busy.get().filter(|_| cpu.is_background()) {
                    b.wait_idle(crate::roll::YIELD_MAX);
                }
            }))
        };
        let index_cfg = IndexConfig {
            cpu_class: Some(Arc::clone(&cpu)),
            write_gap: Some(write_gap),
            ..cfg.index.clone()
        };
        let (digests, opened) = Digests::open(Arc::clone(&files), DIGEST_PREFIX)?;
        if let Some(why) = &opened.truncated {
            tracing::warn!(why = %why, "history digests: a torn tail was cut");
        }
        let stats = HistoryStats::default();
        let index = match LtIndex::open(files.as_ref(), &index_cfg, levels.clone()) {
            Ok(index) => index,
            // The index is made from the digests, which hold every entry it does (they are
            // synced first): a leaf a crash tore is rebuilt from them, not lost.
            Err(e) if LtIndex::damaged(&e) => {
                tracing::warn!(error = %e, "history index damaged; rebuilding it from the digests");
                LtIndex::create(files.as_ref(), &index_cfg)?;
                let index = LtIndex::open(files.as_ref(), &index_cfg, levels)?;
                let keys = index.rebuild(&digests, &state.volumes, state.indexed_seq)?;
                tracing::warn!(keys, "history index rebuilt");
                stats.index_rebuilds.fetch_add(1, Relaxed);
                index
            }
            Err(e) => return Err(e),
        };
        let mut bases = BTreeMap::new();
        let mut views = BTreeMap::new();
        for (&id, v) in &state.volumes {
            let name = base_name(id);
            let disk = files
                .open(&name, FileUse::Random)
                .map_err(io_err(files.as_ref(), &name))?;
            bases.insert(id, disk);
            views.insert(
                id,
                View {
                    state: *v,
                    last_vseq: v.base_vseq,
                    last_ts: v.base_ts,
                    gap_seq: 0,
                },
            );
        }
        let next_seq = state.indexed_seq + 1;
        let inner = Inner {
            cfg,
            files,
            clock,
            state_disk,
            state: Mutex::new(state),
            index,
            digests: Mutex::new(digests),
            tail: RwLock::new(Tail::default()),
            views: RwLock::new(views),
            bases: Mutex::new(bases),
            incoming: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            indexer: Mutex::new(Indexer {
                next_seq,
                ..Indexer::default()
            }),
            log: OnceLock::new(),
            log_busy,
            holder: OnceLock::new(),
            stats,
            stop: AtomicBool::new(false),
            failed: Mutex::new(None),
            rounds: Mutex::new(()),
            io_turn: Mutex::new(()),
            turn_waiting: AtomicU64::new(0),
            roller_idle: Mutex::new(()),
            roller_wake: Condvar::new(),
            last_warning: Mutex::new(None),
            roll_due: Mutex::default(),
            cpu,
            windows: Mutex::default(),
            pins: Mutex::default(),
            rollbacks: Mutex::default(),
            seeding: Mutex::default(),
        };
        let h = Self {
            inner: Arc::new(inner),
            threads: Arc::new(Mutex::new(Vec::new())),
        };
        // Rollbacks a stop interrupted: their pins are taken again before anything rolls.
        h.load_rollbacks()?;
        Ok(h)
    }

    /// What the log must be opened with for history: its watermark is the lowest of what
    /// the saved state covers and what the base images hold.
    pub fn holder_spec(&self) -> HolderSpec {
        let s = lock(&self.inner.state);
        HolderSpec::new(HOLDER, self.inner.cfg.kind, s.holds(), s.indexed_ts)
    }

    /// Starts consuming: finishes a roll-forward a crash interrupted, indexes again the
    /// records above the saved watermark (read back from the log), then indexes in the
    /// background (or on [`Self::step`]).
    pub fn start(&self, log: Log, recovery: &Recovery) -> Result<(), HistoryError> {
        let inner = &self.inner;
        let holder = log.holder(HOLDER)?;
        let indexed = lock(&inner.state).indexed_seq;
        let plan = recovery.replay.after(indexed).ok_or_else(|| {
            HistoryError::Config(format!(
                "the log was opened keeping records above {}, history needs those above {indexed}",
                recovery.replay.after_seq()
            ))
        })?;
        let _ = inner.log_busy.set(Arc::clone(&log.stats().busy));
        let _ = inner.log.set(log.clone());
        let _ = inner.holder.set(holder);
        if let Some(cut) = inner.cut_before_start(&recovery.first_kept, indexed)? {
            inner.note_cut(cut);
        }
        inner.finish_roll_forward()?;
        inner.prune()?;
        let mut replayed = Vec::new();
        log.replay::<HistoryError>(&plan, |found, _payload| {
            replayed.push(entry_of(&found.header, found.addr));
            Ok(())
        })?;
        // The records history needs start right above what it indexed. If the log let go of
        // some (it cut history while history was down or failed), the bases cannot have them:
        // those volumes are broken until seeded again, and indexing goes on from what is there.
        // The lowest, not the first: replay goes in log order, and the void records recovery
        // wrote for an earlier crash's gaps lie after newer records.
        let first = replayed
            .iter()
            .map(|e| e.seq)
            .min()
            .into_iter()
            .chain(recovery.voided.iter().copied())
            .min();
        let lost_through = match first {
            Some(f) if f > indexed + 1 => Some(f - 1),
            None if recovery.last_seq > indexed => Some(recovery.last_seq),
            _ => None,
        };
        if let Some(lost) = lost_through {
            inner.lost(indexed, lost);
        }
        {
            let mut tail = inner.tail.write().unwrap_or_else(PoisonError::into_inner);
            for e in &replayed {
                tail.push(*e);
            }
        }
        {
            let mut ix = lock(&inner.indexer);
            for e in replayed {
                ix.pending.insert(e.seq, e);
            }
        }
        // Every sequence number at or below the log's newest is durable or void by now:
        // records the log found void have no record to index.
        for &seq in &recovery.voided {
            lock(&inner.indexer).pending.insert(seq, void_entry(seq));
        }
        inner.note_views();
        inner.note_newest()?;
        inner.note_tail_newest();
        if inner.cfg.background {
            type Loop = fn(Arc<Inner>);
            let loops: [(&str, Loop); 2] = [
                ("history", Inner::run_indexer),
                ("history-roll", Inner::run_roller),
            ];
            for (name, body) in loops {
                let me = Arc::clone(&self.inner);
                let t = std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || body(me))
                    .map_err(|source| HistoryError::Io {
                        path: format!("{name} thread").into(),
                        source,
                    })?;
                lock(&self.threads).push(t);
            }
        }
        Ok(())
    }

    /// One round of what the background threads do (`workers.rs`), on the caller's thread:
    /// indexes the records received so far, saves the state when due, rolls the base
    /// forward when due. Returns whether it indexed anything.
    pub fn step(&self) -> Result<bool, HistoryError> {
        self.inner.step(true)
    }

    /// Indexes everything received, saves the state and releases the log behind it.
    pub fn flush(&self) -> Result<(), HistoryError> {
        while self.inner.step(false)? {}
        self.inner.save(true)
    }

    /// Stops the indexer thread (after a last flush when `flush`).
    pub fn shutdown(&self, flush: bool) -> Result<(), HistoryError> {
        self.inner.stop.store(true, Relaxed);
        self.inner.wake_all();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        let flushed = if flush {
            // A clean stop leaves the index's own log empty: every queued change committed.
            self.flush().and_then(|()| {
                self.inner
                    .index
                    .tree()
                    .bosc()
                    .commit_all()
                    .map_err(HistoryError::from)
            })
        } else {
            Ok(())
        };
        // The index's engine stops now (its background commits and its own log), not when
        // the last handle goes: a node reopened in the same process must not find it running.
        self.inner.index.tree().bosc().close();
        flushed
    }

    pub fn stats(&self) -> &HistoryStats {
        &self.inner.stats
    }

    /// Why history stopped, if it did.
    pub fn failure(&self) -> Option<String> {
        lock(&self.inner.failed).clone()
    }

    pub fn index(&self) -> &LtIndex {
        &self.inner.index
    }

    /// How far indexing is behind: records waiting in the tail, and the age of the oldest
    /// of them by `now_ns` (0 when none waits).
    pub fn lag(&self, now_ns: u64) -> (u64, u64) {
        let tail = self
            .inner
            .tail
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let age = tail.oldest_ts().map_or(0, |t| now_ns.saturating_sub(t));
        (tail.len() as u64, age)
    }

    /// The CPU class of history's threads (idle while it keeps pace with the log).
    pub fn cpu_class(&self) -> &CpuClass {
        &self.inner.cpu
    }

    /// The index engine's counters (modifications queued, blocks written, forced commits).
    pub fn index_engine_stats(&self) -> &mariner_bosc::BoscStats {
        self.inner.index.tree().bosc().stats()
    }

    /// Bytes of index leaves in use.
    pub fn index_bytes(&self) -> u64 {
        let tree = self.inner.index.tree();
        tree.leaf_count() as u64 * u64::from(self.inner.cfg.index.block_bytes)
    }

    /// The window asked for.
    pub fn configured_window(&self) -> Duration {
        self.inner.cfg.window
    }

    /// The window asked for `volume` (its own, else the configured one).
    pub fn window_of(&self, volume: u32) -> Duration {
        self.inner.window_of(volume)
    }
}

impl State {
    /// What history still needs of the log: the records above this.
    pub fn holds(&self) -> u64 {
        self.volumes
            .values()
            .filter(|v| v.flags & FLAG_BROKEN == 0)
            .map(|v| v.base_seq)
            .fold(self.indexed_seq, u64::min)
    }
}

impl Inner {
    /// One round on the caller's thread: indexes what arrived; `maintain`: then also saves
    /// the state when due and rolls forward when due (what the two background threads do
    /// apart, `workers.rs`).
    fn step(&self, maintain: bool) -> Result<bool, HistoryError> {
        let did = self.index_arrived()?;
        if maintain {
            self.save(false)?;
            self.maintain()?;
        }
        Ok(did)
    }

    /// Indexes the records received so far, in sequence order up to the first missing one,
    /// a batch at most. Returns whether it indexed any.
    pub(crate) fn index_arrived(&self) -> Result<bool, HistoryError> {
        let arrived = std::mem::take(&mut *lock(&self.incoming));
        let mut ix = lock(&self.indexer);
        for e in arrived {
            if e.seq >= ix.next_seq {
                ix.pending.insert(e.seq, e);
            }
        }
        let mut batch = Vec::new();
        while batch.len() < self.cfg.batch_records {
            let next = ix.next_seq;
            match ix.pending.remove(&next) {
                Some(e) => {
                    batch.push(e);
                    ix.next_seq += 1;
                }
                None => break,
            }
        }
        drop(ix);
        let did = !batch.is_empty();
        if did {
            self.index_batch(&batch)?;
        }
        Ok(did)
    }

    /// Digests, index, state of the volumes the batch creates, resizes or deletes.
    fn index_batch(&self, batch: &[DigestEntry]) -> Result<(), HistoryError> {
        let mut kept = Vec::with_capacity(batch.len());
        {
            // Volumes created, resized, deleted or broken change the bases: not while a
            // round applies to them.
            let _round = batch
                .iter()
                .any(|e| !e.kind.changes_data() && e.kind != RecordKind::Void)
                .then(|| lock(&self.rounds));
            let mut st = lock(&self.state);
            for e in batch {
                self.apply_lifecycle(&mut st, e)?;
                if e.kind == RecordKind::Void || !st.volumes.contains_key(&e.volume) {
                    continue;
                }
                kept.push(*e);
            }
        }
        let new: Vec<DigestEntry> = {
            let d = lock(&self.digests);
            let last = d.last_seq();
            kept.iter().filter(|e| e.seq > last).copied().collect()
        };
        let keys = {
            let _turn = self.turn_first();
            if !new.is_empty() {
                let mut d = lock(&self.digests);
                d.append(&new)?;
                d.sync()?;
            }
            self.index.insert(&kept)?
        };
        {
            let mut tail = self.tail.write().unwrap_or_else(PoisonError::into_inner);
            for e in batch {
                tail.remove(e);
            }
            self.stats.tail_records.store(tail.len() as u64, Relaxed);
        }
        let last = batch.last().map_or(0, |e| e.seq);
        let last_ts = batch.iter().map(|e| e.timestamp_ns).max().unwrap_or(0);
        {
            let mut st = lock(&self.state);
            st.indexed_seq = st.indexed_seq.max(last);
            st.indexed_ts = st.indexed_ts.max(last_ts);
        }
        self.stats.indexed_seq.fetch_max(last, Relaxed);
        self.stats
            .records_indexed
            .fetch_add(kept.len() as u64, Relaxed);
        self.stats.keys_inserted.fetch_add(keys as u64, Relaxed);
        self.stats.batches.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Saves the state when due (or now when `force`), then releases the log behind it.
    pub(crate) fn save(&self, force: bool) -> Result<(), HistoryError> {
        {
            let ix = lock(&self.indexer);
            if !force
                && ix
                    .last_save
                    .is_some_and(|t| t.elapsed() < self.cfg.state_interval)
            {
                return Ok(());
            }
        }
        let levels = self.index.levels();
        {
            let mut st = lock(&self.state);
            for (id, v) in st.volumes.iter_mut() {
                v.levels = levels.get(id).copied().unwrap_or(0);
            }
            let turn = self.turn_first();
            let saved = st.save(self.state_disk.as_ref());
            drop(turn);
            saved.map_err(|why| HistoryError::Config(format!("saving history state: {why}")))?;
            self.stats.saved_seq.store(st.indexed_seq, Relaxed);
            // Released under the state's lock: a seed that sets its floor under it then
            // sees every release made without the floor (`History::seed`).
            if let Some(h) = self.holder.get() {
                h.release(self.holds(&st));
            }
        }
        lock(&self.indexer).last_save = Some(Instant::now());
        Ok(())
    }

    /// What history needs of the log and its digests: the records above this — the state's
    /// ([`State::holds`]), and no further than a base being seeded is as of.
    pub(crate) fn holds(&self, st: &State) -> u64 {
        lock(&self.seeding)
            .values()
            .fold(st.holds(), |h, &s| h.min(s))
    }

    /// Copies the state's volumes into the readers' views.
    pub(crate) fn note_views(&self) {
        let st = lock(&self.state);
        let mut views = self.views.write().unwrap_or_else(PoisonError::into_inner);
        for (&id, v) in &st.volumes {
            let w = views.entry(id).or_default();
            w.state = *v;
            if w.last_vseq < v.base_vseq {
                w.last_vseq = v.base_vseq;
                w.last_ts = v.base_ts;
            }
        }
    }
}

impl Inner {
    /// Records `(indexed, lost]` are gone from the log: every volume whose base lacks any of
    /// them is broken, and indexing continues above them.
    fn lost(&self, indexed: u64, lost: u64) {
        let mut st = lock(&self.state);
        let mut broke = Vec::new();
        for (&id, v) in st.volumes.iter_mut() {
            if v.base_seq < lost && v.flags & FLAG_BROKEN == 0 {
                v.flags |= FLAG_BROKEN;
                broke.push(id);
            }
        }
        st.indexed_seq = st.indexed_seq.max(lost);
        drop(st);
        lock(&self.indexer).next_seq = lost + 1;
        self.stats.cuts.fetch_add(1, Relaxed);
        tracing::warn!(
            from = indexed + 1,
            through = lost,
            volumes = ?broke,
            "history: the log no longer holds records history had not kept (it was cut while \
             history was down or failed): those volumes' history starts again from their \
             current images"
        );
    }

    /// Each volume's newest record among those replayed into the tail at start.
    fn note_tail_newest(&self) {
        let ix = lock(&self.indexer);
        let mut views = self.views.write().unwrap_or_else(PoisonError::into_inner);
        let windows = lock(&self.windows);
        for e in ix.pending.values() {
            note_in_view(&mut views, &windows, e);
        }
    }

    /// Where indexing continues (a new history starting at the store's watermark).
    pub(crate) fn set_next_seq(&self, seq: u64) {
        lock(&self.indexer).next_seq = seq;
    }

    /// Each volume's newest record as the digests have it (at open: the views start at the
    /// bases).
    fn note_newest(&self) -> Result<(), HistoryError> {
        let ids: Vec<u32> = self
            .views
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect();
        for id in ids {
            let newest = lock(&self.digests).newest_at_or_before(id, u64::MAX)?;
            if let Some(e) = newest {
                let mut views = self.views.write().unwrap_or_else(PoisonError::into_inner);
                if let Some(w) = views.get_mut(&id) {
                    if e.volume_seq > w.last_vseq {
                        w.last_vseq = e.volume_seq;
                        w.last_ts = e.timestamp_ns;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<History>();
    let _ = Duration::ZERO;
}
