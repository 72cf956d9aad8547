//! The queues' memory: what the engine holds between commits ([`State`]: per-group queues,
//! cached block images, the hot copies kept for the application) and how it is counted
//! against the budget, and the forced commit that brings it back under the budget.
//!
//! Apart from the rest because every other part changes this state, and the budget's
//! accounting (`State::with_group`, the footprints) must stay exact whoever changes it:
//! `tests.rs` checks it against a recount.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::pending::{alloc_bytes, group_of, Group};
use super::{lock, BlockApp, Inner};
use crate::Error;

/// A cached block image.
pub(super) struct Cached {
    /// The whole block with every pending modification applied; header not yet sealed.
    pub(super) image: Vec<u8>,
    /// The last modification applied to it.
    pub(super) lsn: u64,
}

/// A map entry's memory with its share of the map's nodes, for `kv` bytes of key and value:
/// 1.47 × kv + 4 bytes measured for `BTreeMap<u64, _>` under random inserts and sweeping
/// removals (nodes about two-thirds full; internal nodes included).
pub(crate) const fn map_entry_bytes(kv: usize) -> usize {
    (kv * 3 + 8) / 2
}

/// A group's memory besides its arena: its entry in `State::groups`, and its entry in
/// `State::firsts` (filled in ascending order, so its nodes are half full: 20 B measured).
pub(super) const GROUP_OVERHEAD: usize =
    map_entry_bytes(std::mem::size_of::<u64>() + std::mem::size_of::<Group>()) + 20;
/// A cached image's entry in `State::images`.
pub(super) const IMAGE_OVERHEAD: usize =
    map_entry_bytes(std::mem::size_of::<u64>() + std::mem::size_of::<Cached>());

impl Group {
    /// The memory the group holds, as the budget counts it.
    pub(super) fn footprint(&self) -> usize {
        if self.is_empty() {
            0
        } else {
            GROUP_OVERHEAD + self.heap_bytes()
        }
    }
}

impl Cached {
    pub(super) fn footprint(&self) -> usize {
        IMAGE_OVERHEAD + alloc_bytes(self.image.capacity())
    }
}

#[derive(Default)]
pub(super) struct State {
    /// Pending modifications by group of blocks ([`group_of`]).
    pub(super) groups: BTreeMap<u64, Group>,
    /// Every group's lowest pending sequence number, with how many groups have it (the
    /// modifications of one batch record share its number, so several groups can), for the
    /// global frontier.
    pub(super) firsts: BTreeMap<u64, u32>,
    /// Pending modifications, all groups.
    pub(super) pending: usize,
    /// Cached block images, with pending modifications or clean.
    pub(super) images: BTreeMap<u64, Cached>,
    /// The cached images without pending modifications, which a forced commit evicts first
    /// (kept, not found by a walk of every image: under a B+tree's many new leaves that walk
    /// was 5 % of its writer's CPU).
    pub(super) clean: BTreeSet<u64>,
    /// Their footprint (part of `memory_bytes`).
    pub(super) clean_bytes: usize,
    /// Copies of blocks the commit cycle merged and the application called hot
    /// ([`BlockApp::hot`]), not yet taken by [`Bosc::take_hot`]; each with the last
    /// sequence number merged into it.
    pub(super) hot: BTreeMap<u64, Cached>,
    /// Their footprint (part of `memory_bytes`).
    pub(super) hot_bytes: usize,
    /// Own-log bursts queued but not yet known durable, by first sequence number
    /// ([`Submitted`]). A commit writes no block in place before every modification merged
    /// into it is durable ([`State::durable_through`]): the write-ahead rule.
    pub(super) undurable: BTreeSet<u64>,
    /// Bytes of the own log those bursts take (see [`Inner::make_log_room`]).
    pub(super) logging_bytes: u64,
    pub(super) max_seen: u64,
    pub(super) memory_bytes: usize,
    pub(super) cursor: u64,
    pub(super) ckpt_counter: u64,
    pub(super) durable_ckpt: u64,
    pub(super) failed: Option<String>,
    pub(super) shutdown: bool,
}

impl State {
    /// Runs `f` on the block's group (created if absent) with the block's offset in it, then
    /// accounts what it changed: memory, pending count, the group's entry in `firsts`; an
    /// emptied group is removed.
    pub(super) fn with_group<R>(&mut self, block: u64, f: impl FnOnce(&mut Group, u32) -> R) -> R {
        let (key, offset) = group_of(block);
        let g = self.groups.entry(key).or_default();
        let (bytes, len, min) = (g.footprint(), g.len(), g.min_seq());
        let r = f(g, offset);
        let (bytes_after, len_after, min_after) = (g.footprint(), g.len(), g.min_seq());
        if g.is_empty() {
            self.groups.remove(&key);
        }
        self.memory_bytes = self.memory_bytes - bytes + bytes_after;
        self.pending = self.pending - len + len_after;
        if min != min_after {
            if let Some(s) = min {
                if let std::collections::btree_map::Entry::Occupied(mut e) = self.firsts.entry(s) {
                    *e.get_mut() -= 1;
                    if *e.get() == 0 {
                        e.remove();
                    }
                }
            }
            if let Some(s) = min_after {
                *self.firsts.entry(s).or_insert(0) += 1;
            }
        }
        r
    }

    pub(super) fn group(&self, block: u64) -> Option<(&Group, u32)> {
        let (key, offset) = group_of(block);
        self.groups.get(&key).map(|g| (g, offset))
    }

    pub(super) fn has_pending(&self, block: u64) -> bool {
        self.group(block).is_some_and(|(g, o)| g.has(o))
    }

    pub(super) fn cache_image(&mut self, block: u64, image: Vec<u8>, lsn: u64) {
        let c = Cached { image, lsn };
        self.unmark_clean(block);
        self.memory_bytes += c.footprint();
        if let Some(old) = self.images.insert(block, c) {
            self.memory_bytes -= old.footprint();
        }
        self.note_clean(block);
    }

    /// Keeps `clean` true of `block` after its image or queue changed.
    pub(super) fn note_clean(&mut self, block: u64) {
        match self.images.get(&block) {
            Some(c) if !self.has_pending(block) => {
                if self.clean.insert(block) {
                    self.clean_bytes += c.footprint();
                }
            }
            _ => self.unmark_clean(block),
        }
    }

    /// `block` is no longer among the clean images (it has pending modifications, or its
    /// image goes).
    pub(super) fn unmark_clean(&mut self, block: u64) {
        if self.clean.remove(&block) {
            if let Some(c) = self.images.get(&block) {
                self.clean_bytes -= c.footprint();
            }
        }
    }

    /// What the queues hold beyond the clean images, which cost only a read to bring back:
    /// the memory a commit frees.
    pub(super) fn pending_bytes(&self) -> usize {
        self.queue_bytes() - self.clean_bytes
    }

    pub(super) fn keep_hot(&mut self, block: u64, image: Vec<u8>, lsn: u64) {
        self.drop_hot(block);
        let c = Cached { image, lsn };
        self.memory_bytes += c.footprint();
        self.hot_bytes += c.footprint();
        self.hot.insert(block, c);
    }

    /// The memory that forced commits keep within the budget: all but the hot copies, which
    /// commits make (so counting them would make a forced commit feed itself) and the
    /// application takes at its next call.
    pub(super) fn queue_bytes(&self) -> usize {
        self.memory_bytes - self.hot_bytes
    }

    /// Whether the hot copies may take another: they hold at most a sixteenth of `budget`.
    pub(super) fn hot_has_room(&self, budget: usize) -> bool {
        self.hot_bytes < budget / 16
    }

    pub(super) fn drop_hot(&mut self, block: u64) -> Option<Cached> {
        let c = self.hot.remove(&block)?;
        self.memory_bytes -= c.footprint();
        self.hot_bytes -= c.footprint();
        Some(c)
    }

    pub(super) fn evict_image(&mut self, block: u64) {
        self.unmark_clean(block);
        if let Some(c) = self.images.remove(&block) {
            self.memory_bytes -= c.footprint();
        }
    }

    /// Exclusive: every sequence number below it is committed. (A modification is queued in
    /// the same critical section that hands it to the log, so every sequence number taken
    /// and not committed is in a queue.)
    pub(super) fn global_frontier(&self) -> u64 {
        let mut gf = self.max_seen + 1;
        if let Some((&s, _)) = self.firsts.first_key_value() {
            gf = gf.min(s);
        }
        gf
    }

    /// Every modification at or below it is durable in the log.
    pub(super) fn durable_through(&self) -> u64 {
        self.undurable.first().map_or(self.max_seen, |&f| f - 1)
    }

    /// Inclusive: every modification of `block` at or below it is committed. For a block
    /// with pending modifications, its group's lowest pending sequence number minus one: a
    /// lower bound, found without walking the group's entries for the block's first (the
    /// walk was a seventh of the B+tree writer's CPU). The blocks of a group mostly commit
    /// together, so it is seldom much lower; recovery then requeues a few committed
    /// modifications more, which commit skips by the block's LSN.
    pub(super) fn local_frontier(&self, block: u64) -> u64 {
        let mut lf = self.max_seen;
        if let Some(s) = self
            .group(block)
            .filter(|(g, o)| g.has(*o))
            .and_then(|(g, _)| g.min_seq())
        {
            lf = lf.min(s - 1);
        }
        lf
    }
}

/// Memory the commits freed goes back to the system once they have freed this share of the
/// budget since it last went...
const TRIM_SHARE: usize = 16;
/// ...and no more often than this.
const TRIM_INTERVAL: Duration = Duration::from_millis(100);

/// What commits freed since the heap was last trimmed ([`Inner::return_freed`]).
#[derive(Default)]
pub(super) struct Trim {
    freed: usize,
    last: Option<Instant>,
}

impl<A: BlockApp> Inner<A> {
    /// Gives the system back the memory commits freed, `freed` bytes more this time.
    ///
    /// The queues' thousands of arenas and images are freed in bulk by commits, in the middle
    /// of the allocator's heap, and glibc keeps such memory resident (it returns only the
    /// heap's top): under the index benchmark the process held 40–60 MiB more than its 64 MiB
    /// budget, freed but resident, enough to be OOM-killed in a cgroup of twice the budget.
    /// Trimming returns every whole free page; a trim of a 100 MiB heap took 2–4 ms there,
    /// and the pages come back as the queues grow again.
    pub(super) fn return_freed(&self, freed: usize) {
        let floor = (self.budget.load(Ordering::Relaxed) / TRIM_SHARE).max(1 << 20);
        let mut t = lock(&self.trim);
        t.freed = t.freed.saturating_add(freed);
        if t.freed < floor || t.last.is_some_and(|l| l.elapsed() < TRIM_INTERVAL) {
            return;
        }
        let started = Instant::now();
        mariner_heap::trim();
        t.freed = 0;
        t.last = Some(started);
        self.stats.heap_trims.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.heap_trim_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Forced commit: when the budget is exhausted the caller first drops clean cached images
    /// and then runs commit cycles itself until the queues fit again. The time spent is
    /// counted in `forced_wait_ns`.
    pub(super) fn make_room(&self) -> Result<(), Error> {
        let budget = self.budget.load(Ordering::Relaxed);
        if lock(&self.state).queue_bytes() <= budget {
            return Ok(());
        }
        self.evict_clean(budget);
        let started = Instant::now();
        let mut forced = false;
        while lock(&self.state).queue_bytes() > budget {
            forced = true;
            // Blocks whose image waits in memory first: each frees a block's worth per block
            // written, where a block with queued modifications frees a few dozen bytes.
            if self.commit_images()? == 0 && self.commit_cycle()? == 0 {
                break;
            }
            self.evict_clean(budget);
        }
        if forced {
            self.note_forced(started);
        }
        Ok(())
    }

    /// Counts a forced commit (for memory or for the own log's room) and the time it took.
    pub(super) fn note_forced(&self, started: Instant) {
        self.stats.forced_commits.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.forced_wait_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Whether the cached images hold more than their share of the budget
    /// ([`crate::BoscConfig::image_share`]); never under the default share.
    pub(super) fn images_over_share(&self, st: &State) -> bool {
        if self.cfg.image_share >= 1.0 {
            return false;
        }
        let cap = self.budget.load(Ordering::Relaxed) as f64 * self.cfg.image_share;
        let each = self.geo.block_bytes as usize + IMAGE_OVERHEAD;
        (st.images.len() * each) as f64 > cap
    }

    pub(super) fn evict_clean(&self, budget: usize) {
        let mut st = lock(&self.state);
        while st.queue_bytes() > budget {
            let Some(&b) = st.clean.first() else { break };
            st.evict_image(b);
        }
    }
}
