//! A hash table on BOSC (lu-dissertation §3.4.4) and the same table over plain read/write,
//! the baseline of the benchmark. u64 key → u64 value (the seed's 16-byte records), one page
//! per block, linear probing between pages.
//!
//! Page payload (little-endian): record count u32, magic `b"HSHP"`, then unsorted records of
//! key u64 + value u64. An all-zero page is empty; any other page without the magic is refused
//! when it is read ([`check_page`]), so a block of another application is not misparsed.
//!
//! Two-part commit (§3.3): part one ([`HashApp`]) inserts or replaces the record in the page;
//! part two runs when the put is queued: the table keeps an upper bound of each page's count
//! (a blind put may be an update) and while the home page has room the put is a blind BOSC
//! modification — no I/O. When the bound says full, the put reads pages along the probe
//! sequence and goes to the first that holds the key or has room (the seed re-queues it there).
//!
//! Why a blind put is correct: without deletes, pages only fill up, so a key lives in the
//! first page of its probe sequence that had room when it was first put; if the home page has
//! room now, it had room then, and the key is there or nowhere. A get stops at the first page
//! that holds the key or is not full. Deletes would break that invariant (they need
//! tombstones) and are not offered.
//!
//! Both tables rebuild their counts at open by reading every page. [`layout_pages`] builds
//! either table's pages from distinct records without putting them one by one (bulk load).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use mariner_disk::Disk;

use crate::{BlockApp, Bosc, Change, Error};

pub const PAGE_HEADER_LEN: usize = 8;
pub const PAGE_MAGIC: [u8; 4] = *b"HSHP";
pub const RECORD_LEN: usize = 16;

/// A page read from a disk is a hash page: all zero (empty) or magic at 4 and a count within
/// the capacity.
pub fn check_page(p: &[u8]) -> bool {
    if p.len() < PAGE_HEADER_LEN {
        return false;
    }
    let empty = p.iter().all(|&b| b == 0);
    empty || (p[4..8] == PAGE_MAGIC && page_count(p) <= page_capacity(p.len()))
}

fn not_a_page(page: u64) -> Error {
    Error::Index(format!("block {page} is not a hash page"))
}

pub fn page_capacity(payload_bytes: usize) -> usize {
    payload_bytes.saturating_sub(PAGE_HEADER_LEN) / RECORD_LEN
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub fn page_count(p: &[u8]) -> usize {
    let mut a = [0u8; 4];
    a.copy_from_slice(&p[0..4]);
    u32::from_le_bytes(a) as usize
}

fn page_slot(p: &[u8], key: u64) -> Option<usize> {
    (0..page_count(p)).find(|&i| u64_at(p, PAGE_HEADER_LEN + i * RECORD_LEN) == key)
}

pub fn page_get(p: &[u8], key: u64) -> Option<u64> {
    page_slot(p, key).map(|i| u64_at(p, PAGE_HEADER_LEN + i * RECORD_LEN + 8))
}

/// Inserts or replaces; `false` if the key is absent and the page is full.
pub fn page_put(p: &mut [u8], key: u64, value: u64) -> bool {
    let n = page_count(p);
    let i = match page_slot(p, key) {
        Some(i) => i,
        None if n < page_capacity(p.len()) => {
            p[0..4].copy_from_slice(&(n as u32 + 1).to_le_bytes());
            p[4..8].copy_from_slice(&PAGE_MAGIC);
            n
        }
        None => return false,
    };
    let at = PAGE_HEADER_LEN + i * RECORD_LEN;
    p[at..at + 8].copy_from_slice(&key.to_le_bytes());
    p[at + 8..at + 16].copy_from_slice(&value.to_le_bytes());
    true
}

/// Writes `records` (distinct keys, at most the capacity) as the whole contents of a page.
fn page_fill(p: &mut [u8], records: &[(u64, u64)]) {
    p.fill(0);
    p[0..4].copy_from_slice(&(records.len() as u32).to_le_bytes());
    p[4..8].copy_from_slice(&PAGE_MAGIC);
    for (i, (k, v)) in records.iter().enumerate() {
        let at = PAGE_HEADER_LEN + i * RECORD_LEN;
        p[at..at + 8].copy_from_slice(&k.to_le_bytes());
        p[at + 8..at + 16].copy_from_slice(&v.to_le_bytes());
    }
}

/// What [`layout_pages`] built.
#[derive(Debug, Default)]
pub struct Layout {
    /// Records per page.
    pub counts: Vec<usize>,
    /// Records that overflowed the last page: probing wraps to page 0, so the caller puts
    /// them one by one.
    pub leftover: Vec<(u64, u64)>,
}

/// Bulk load: lays out records with distinct keys as the table would hold them after putting
/// each once — every page takes what overflowed the page before it, then its home records, and
/// what does not fit moves on, so a key sits beyond its home page only past full pages, the
/// invariant `get` and the blind put rely on. `records` is called once per chunk of
/// `chunk_pages` pages (only that chunk's records are held in memory) and must yield the
/// same records each time; `emit(first_page, payloads)` receives each chunk's payloads of
/// `payload_bytes` each, in page order.
pub fn layout_pages<I, E>(
    pages: u64,
    payload_bytes: usize,
    chunk_pages: u64,
    records: impl Fn() -> I,
    mut emit: E,
) -> Result<Layout, Error>
where
    I: Iterator<Item = (u64, u64)>,
    E: FnMut(u64, &[u8]) -> Result<(), Error>,
{
    let capacity = page_capacity(payload_bytes);
    if capacity == 0 || pages == 0 {
        return Err(Error::Config("hash pages too small or none".into()));
    }
    let chunk_pages = chunk_pages.clamp(1, pages);
    let mut layout = Layout {
        counts: Vec::with_capacity(pages as usize),
        leftover: Vec::new(),
    };
    let mut carry: Vec<(u64, u64)> = Vec::new();
    let mut buf = Vec::new();
    let mut first = 0;
    while first < pages {
        let end = (first + chunk_pages).min(pages);
        let mut homed: Vec<(u64, u64, u64)> = records()
            .map(|(k, v)| (hash(k) % pages, k, v))
            .filter(|(h, _, _)| (first..end).contains(h))
            .collect();
        homed.sort_unstable_by_key(|r| r.0);
        buf.clear();
        buf.resize((end - first) as usize * payload_bytes, 0);
        let mut next = homed.into_iter().peekable();
        for (page, p) in (first..end).zip(buf.chunks_mut(payload_bytes)) {
            while let Some((_, k, v)) = next.next_if(|r| r.0 == page) {
                carry.push((k, v));
            }
            let take = carry.len().min(capacity);
            page_fill(p, &carry[..take]);
            carry.drain(..take);
            layout.counts.push(take);
        }
        emit(first, &buf)?;
        first = end;
    }
    layout.leftover = carry;
    Ok(layout)
}

/// splitmix64: spreads sequential keys over the pages.
pub fn hash(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn encode_put(key: u64, value: u64) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[0..8].copy_from_slice(&key.to_le_bytes());
    m[8..16].copy_from_slice(&value.to_le_bytes());
    m
}

/// The page's commit function (part one).
pub struct HashApp;

impl BlockApp for HashApp {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let ok = m.len() == 16 && page_put(payload, u64_at(m, 0), u64_at(m, 8));
        // Part two only queues a put where it fits; anything else is a bug, not data to drop.
        assert!(ok, "hash page overflow or malformed modification");
    }
}

/// Counters.
#[derive(Debug, Default)]
pub struct HashStats {
    /// Puts queued without reading anything.
    pub blind_puts: AtomicU64,
    /// Puts that had to read pages along the probe sequence.
    pub probed_puts: AtomicU64,
}

/// The hash table on BOSC (own-log mode).
pub struct BoscHash {
    bosc: Bosc<HashApp>,
    /// Upper bound of each page's record count.
    counts: Mutex<Vec<usize>>,
    capacity: usize,
    stats: HashStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl BoscHash {
    /// Takes an opened (recovered) engine and reads every page's count.
    pub fn open(bosc: Bosc<HashApp>) -> Result<Self, Error> {
        let capacity = page_capacity(bosc.payload_bytes());
        let mut counts = Vec::with_capacity(bosc.block_count() as usize);
        bosc.scan(0, bosc.block_count(), |page, p| {
            if !check_page(p) {
                return Err(not_a_page(page));
            }
            counts.push(page_count(p));
            Ok(())
        })?;
        Ok(Self {
            bosc,
            counts: Mutex::new(counts),
            capacity,
            stats: HashStats::default(),
        })
    }

    fn home(&self, key: u64) -> u64 {
        hash(key) % self.bosc.block_count()
    }

    /// Bulk load onto a freshly formatted, never modified engine with
    /// [`layout_pages`] and [`Bosc::load`] (no log, no queues); records that wrapped past the
    /// last page are then put one by one. A crash during it leaves a disk to format again.
    pub fn bulk_load<I>(
        bosc: Bosc<HashApp>,
        chunk_pages: u64,
        records: impl Fn() -> I,
    ) -> Result<Self, Error>
    where
        I: Iterator<Item = (u64, u64)>,
    {
        let (pages, pb) = (bosc.block_count(), bosc.payload_bytes());
        let layout = layout_pages(pages, pb, chunk_pages, records, |first, payloads| {
            bosc.load(first, payloads)
        })?;
        let table = Self {
            capacity: page_capacity(pb),
            counts: Mutex::new(layout.counts),
            stats: HashStats::default(),
            bosc,
        };
        table.put_batch(&layout.leftover)?;
        Ok(table)
    }

    pub fn put(&self, key: u64, value: u64) -> Result<(), Error> {
        self.put_batch(&[(key, value)])
    }

    /// Puts many records with one group commit of the log: all are durable when it returns.
    /// A put whose home page is full probes, which reads pages, so the batch so far is made
    /// durable and queued first.
    pub fn put_batch(&self, records: &[(u64, u64)]) -> Result<(), Error> {
        let mut counts = lock(&self.counts);
        let mut staged = Vec::new();
        for &(key, value) in records {
            let home = self.home(key);
            if counts[home as usize] < self.capacity {
                staged.push(Change::modify(home, encode_put(key, value).to_vec()));
                counts[home as usize] += 1;
                self.stats.blind_puts.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.bosc.modify_batch(std::mem::take(&mut staged))?;
            self.probe_put(&mut counts, home, key, value)?;
        }
        self.bosc.modify_batch(staged)?;
        Ok(())
    }

    fn probe_put(
        &self,
        counts: &mut [usize],
        home: u64,
        key: u64,
        value: u64,
    ) -> Result<(), Error> {
        self.stats.probed_puts.fetch_add(1, Ordering::Relaxed);
        let n = self.bosc.block_count();
        for i in 0..n {
            let page = (home + i) % n;
            let (has, count) = self
                .bosc
                .query(page, |p| (page_slot(p, key).is_some(), page_count(p)))?;
            counts[page as usize] = count;
            if has || count < self.capacity {
                self.bosc.modify(page, &encode_put(key, value))?;
                counts[page as usize] += usize::from(!has);
                return Ok(());
            }
        }
        Err(Error::Index("hash table is full".into()))
    }

    pub fn get(&self, key: u64) -> Result<Option<u64>, Error> {
        let _counts = lock(&self.counts);
        let n = self.bosc.block_count();
        let home = self.home(key);
        for i in 0..n {
            let (v, count) = self
                .bosc
                .query((home + i) % n, |p| (page_get(p, key), page_count(p)))?;
            if v.is_some() || count < self.capacity {
                return Ok(v);
            }
        }
        Ok(None)
    }

    pub fn bosc(&self) -> &Bosc<HashApp> {
        &self.bosc
    }

    pub fn stats(&self) -> &HashStats {
        &self.stats
    }

    /// Heap bytes the table keeps besides the engine's queues: the page counts.
    pub fn counts_bytes(&self) -> usize {
        lock(&self.counts).capacity() * std::mem::size_of::<usize>()
    }
}

/// The same table over plain read/write: a write-through page cache of `cache_pages` pages
/// (FIFO eviction) and a sync every `sync_every` puts. No checksums, no crash atomicity
/// beyond the disk's sector writes: it is the benchmark's vanilla baseline, not a product.
pub struct PlainHash {
    disk: Arc<dyn Disk>,
    page_bytes: usize,
    pages: u64,
    cache_pages: usize,
    sync_every: u64,
    state: Mutex<PlainState>,
}

#[derive(Default)]
struct PlainState {
    cache: BTreeMap<u64, Vec<u8>>,
    order: VecDeque<u64>,
    unsynced: u64,
    reads: u64,
    writes: u64,
}

impl PlainHash {
    /// Uses `disk` as `pages` pages of `page_bytes` (zero = empty), growing it if needed.
    pub fn open(
        disk: Arc<dyn Disk>,
        page_bytes: usize,
        pages: u64,
        cache_pages: usize,
        sync_every: u64,
    ) -> Result<Self, Error> {
        if page_capacity(page_bytes) == 0 || pages == 0 {
            return Err(Error::Config("hash pages too small or none".into()));
        }
        let bytes = pages * page_bytes as u64;
        if disk.len()? < bytes {
            disk.set_len(bytes)?;
        }
        Ok(Self {
            disk,
            page_bytes,
            pages,
            cache_pages: cache_pages.max(1),
            sync_every: sync_every.max(1),
            state: Mutex::new(PlainState::default()),
        })
    }

    /// Bulk load onto a zeroed disk with [`layout_pages`] (whole pages written in place, then
    /// a sync); records that wrapped past the last page are then put one by one.
    pub fn bulk_load<I>(
        disk: Arc<dyn Disk>,
        page_bytes: usize,
        pages: u64,
        cache_pages: usize,
        sync_every: u64,
        chunk_pages: u64,
        records: impl Fn() -> I,
    ) -> Result<Self, Error>
    where
        I: Iterator<Item = (u64, u64)>,
    {
        let table = Self::open(disk, page_bytes, pages, cache_pages, sync_every)?;
        let layout = layout_pages(
            pages,
            page_bytes,
            chunk_pages,
            records,
            |first, payloads| Ok(table.disk.write_at(payloads, first * page_bytes as u64)?),
        )?;
        table.disk.sync()?;
        for (k, v) in layout.leftover {
            table.put(k, v)?;
        }
        table.sync()?;
        Ok(table)
    }

    fn page<'a>(&self, st: &'a mut PlainState, page: u64) -> Result<&'a mut Vec<u8>, Error> {
        if !st.cache.contains_key(&page) {
            let mut buf = vec![0u8; self.page_bytes];
            self.disk.read_at(&mut buf, page * self.page_bytes as u64)?;
            st.reads += 1;
            if !check_page(&buf) {
                return Err(not_a_page(page));
            }
            while st.cache.len() >= self.cache_pages {
                let Some(old) = st.order.pop_front() else {
                    break;
                };
                st.cache.remove(&old);
            }
            st.order.push_back(page);
            st.cache.insert(page, buf);
        }
        st.cache
            .get_mut(&page)
            .ok_or_else(|| Error::Index("page cache lost a page".into()))
    }

    pub fn put(&self, key: u64, value: u64) -> Result<(), Error> {
        let mut st = lock(&self.state);
        let home = hash(key) % self.pages;
        for i in 0..self.pages {
            let page = (home + i) % self.pages;
            let p = self.page(&mut st, page)?;
            if page_put(p, key, value) {
                self.disk.write_at(p, page * self.page_bytes as u64)?;
                st.writes += 1;
                st.unsynced += 1;
                if st.unsynced >= self.sync_every {
                    self.disk.sync()?;
                    st.unsynced = 0;
                }
                return Ok(());
            }
        }
        Err(Error::Index("hash table is full".into()))
    }

    pub fn get(&self, key: u64) -> Result<Option<u64>, Error> {
        let mut st = lock(&self.state);
        let home = hash(key) % self.pages;
        for i in 0..self.pages {
            let p = self.page(&mut st, (home + i) % self.pages)?;
            let v = page_get(p, key);
            if v.is_some() || page_count(p) < page_capacity(p.len()) {
                return Ok(v);
            }
        }
        Ok(None)
    }

    pub fn sync(&self) -> Result<(), Error> {
        let mut st = lock(&self.state);
        self.disk.sync()?;
        st.unsynced = 0;
        Ok(())
    }

    /// (page reads, page writes) so far.
    pub fn io_counts(&self) -> (u64, u64) {
        let st = lock(&self.state);
        (st.reads, st.writes)
    }
}
