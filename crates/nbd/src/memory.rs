//! An in-memory [`Export`] for tests, fuzzing and the example server: a byte vector with a
//! per-4-KiB allocation bitmap. Trimming (or zeroing with `may_trim`) whole chunks turns them
//! back into holes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::backend::{Allocation, Export, ExportError, ExportInfo, Exports};

/// Allocation granularity of [`MemoryExport`].
pub const CHUNK_BYTES: u64 = 4096;

/// The image: data plus which chunks are allocated.
#[derive(Debug)]
struct Image {
    data: Vec<u8>,
    allocated: Vec<bool>,
}

/// A RAM-backed export.
#[derive(Debug)]
pub struct MemoryExport {
    info: ExportInfo,
    image: Mutex<Image>,
    write_delay: Option<Duration>,
    failing: AtomicBool,
    panicking: AtomicBool,
    flushes: AtomicU64,
    writes_completed: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryExport {
    /// An all-hole export of `size_bytes` with Mariner's usual sizes: 512-byte blocks, 4 KiB
    /// preferred, 32 MiB payloads, trim, write-zeroes and multi-conn supported.
    pub fn new(name: &str, size_bytes: usize) -> Self {
        let info = ExportInfo {
            name: name.to_owned(),
            description: format!("in-memory export {name}"),
            size_bytes: u64::try_from(size_bytes).unwrap_or(u64::MAX),
            block_size_min: 512,
            block_size_preferred: 4096,
            max_payload_bytes: 32 << 20,
            read_only: false,
            can_trim: true,
            can_write_zeroes: true,
            can_multi_conn: true,
        };
        Self::with_info(info, size_bytes)
    }

    /// An export described by `info`, holding `size_bytes` of memory.
    pub fn with_info(info: ExportInfo, size_bytes: usize) -> Self {
        let chunks = size_bytes.div_ceil(4096);
        let image = Image {
            data: vec![0; size_bytes],
            allocated: vec![false; chunks],
        };
        Self {
            info,
            image: Mutex::new(image),
            write_delay: None,
            failing: AtomicBool::new(false),
            panicking: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
            writes_completed: AtomicU64::new(0),
        }
    }

    /// Makes every write sleep for `delay` before it applies (to test in-flight handling).
    pub fn with_write_delay(mut self, delay: Duration) -> Self {
        self.write_delay = Some(delay);
        self
    }

    /// While set, every write panics (a bug in an export must cost its request, not the
    /// connection or the server).
    pub fn set_panicking(&self, panicking: bool) {
        self.panicking.store(panicking, Ordering::SeqCst);
    }

    /// While set, every operation fails with [`ExportError::Io`].
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Copy of `len` bytes at `offset` (test helper; panics on out-of-range like slicing).
    pub fn contents(&self, offset: usize, len: usize) -> Vec<u8> {
        lock(&self.image).data[offset..offset + len].to_vec()
    }

    /// Whether the chunk containing `offset` is allocated.
    pub fn is_allocated(&self, offset: u64) -> bool {
        let chunk = usize::try_from(offset / CHUNK_BYTES).unwrap_or(usize::MAX);
        lock(&self.image)
            .allocated
            .get(chunk)
            .copied()
            .unwrap_or(false)
    }

    /// Number of flushes served.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    /// Number of writes that have been applied.
    pub fn writes_completed(&self) -> u64 {
        self.writes_completed.load(Ordering::SeqCst)
    }

    fn check(&self) -> Result<(), ExportError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(ExportError::Io("injected failure".into()));
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), ExportError> {
        self.check()?;
        if self.info.read_only {
            return Err(ExportError::ReadOnly);
        }
        Ok(())
    }

    /// Applies `f` to the image range `[offset, offset + len)` after bounds checks.
    fn with_range<T>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&mut Image, usize, usize) -> T,
    ) -> Result<T, ExportError> {
        let start = usize::try_from(offset).map_err(|_| ExportError::OutOfRange)?;
        let len = usize::try_from(len).map_err(|_| ExportError::OutOfRange)?;
        let end = start.checked_add(len).ok_or(ExportError::OutOfRange)?;
        let mut image = lock(&self.image);
        if end > image.data.len() {
            return Err(ExportError::OutOfRange);
        }
        Ok(f(&mut image, start, end))
    }
}

/// Marks the chunks touched by `[start, end)` allocated.
fn allocate(image: &mut Image, start: usize, end: usize) {
    let chunk = usize::try_from(CHUNK_BYTES).unwrap_or(4096);
    for c in start / chunk..end.div_ceil(chunk) {
        image.allocated[c] = true;
    }
}

/// Zeroes `[start, end)` and turns the chunks it fully covers (a short last chunk counts as
/// covered when the range reaches the end of the image) into holes.
fn punch(image: &mut Image, start: usize, end: usize) {
    image.data[start..end].fill(0);
    let chunk = usize::try_from(CHUNK_BYTES).unwrap_or(4096);
    let size = image.data.len();
    for c in start.div_ceil(chunk)..end.div_ceil(chunk) {
        if ((c + 1) * chunk).min(size) <= end {
            image.allocated[c] = false;
        }
    }
}

/// The state of the chunk at index `c`.
fn chunk_state(image: &Image, c: usize) -> Allocation {
    if !image.allocated[c] {
        return Allocation::Hole;
    }
    let chunk = usize::try_from(CHUNK_BYTES).unwrap_or(4096);
    let end = ((c + 1) * chunk).min(image.data.len());
    if image.data[c * chunk..end].iter().all(|b| *b == 0) {
        Allocation::Zero
    } else {
        Allocation::Data
    }
}

/// Merged extents of `[start, end)`.
fn extents(image: &Image, start: usize, end: usize) -> Vec<(u32, Allocation)> {
    let chunk = usize::try_from(CHUNK_BYTES).unwrap_or(4096);
    let mut out: Vec<(u32, Allocation)> = Vec::new();
    let mut pos = start;
    while pos < end {
        let next = ((pos / chunk + 1) * chunk).min(end);
        let state = chunk_state(image, pos / chunk);
        let len = u32::try_from(next - pos).unwrap_or(u32::MAX);
        match out.last_mut() {
            Some((run, last)) if *last == state => *run += len,
            _ => out.push((len, state)),
        }
        pos = next;
    }
    out
}

#[async_trait]
impl Export for MemoryExport {
    fn info(&self) -> ExportInfo {
        self.info.clone()
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ExportError> {
        self.check()?;
        self.with_range(offset, len.into(), |image, start, end| {
            Bytes::copy_from_slice(&image.data[start..end])
        })
    }

    async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Result<(), ExportError> {
        self.check_writable()?;
        assert!(
            !self.panicking.load(Ordering::SeqCst),
            "injected panic in a write"
        );
        if let Some(delay) = self.write_delay {
            tokio::time::sleep(delay).await;
        }
        let len = u64::try_from(data.len()).map_err(|_| ExportError::OutOfRange)?;
        self.with_range(offset, len, |image, start, end| {
            image.data[start..end].copy_from_slice(&data);
            allocate(image, start, end);
        })?;
        self.writes_completed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn flush(&self) -> Result<(), ExportError> {
        self.check()?;
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn trim(&self, offset: u64, len: u32, _fua: bool) -> Result<(), ExportError> {
        self.check_writable()?;
        self.with_range(offset, len.into(), punch)
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _fua: bool,
        may_trim: bool,
    ) -> Result<(), ExportError> {
        self.check_writable()?;
        self.with_range(offset, len.into(), |image, start, end| {
            if may_trim {
                punch(image, start, end);
            } else {
                image.data[start..end].fill(0);
                allocate(image, start, end);
            }
        })
    }

    async fn block_status(
        &self,
        offset: u64,
        len: u32,
    ) -> Result<Vec<(u32, Allocation)>, ExportError> {
        self.check()?;
        self.with_range(offset, len.into(), |image, start, end| {
            extents(image, start, end)
        })
    }
}

/// A set of [`MemoryExport`]s that counts open connections per export.
#[derive(Debug, Default)]
pub struct MemoryExports {
    exports: Mutex<BTreeMap<String, Arc<MemoryExport>>>,
    default: Mutex<Option<String>>,
    connections: Mutex<HashMap<String, i64>>,
}

impl MemoryExports {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) an export; the first one added becomes the default.
    pub fn add(&self, export: Arc<MemoryExport>) {
        let name = export.info.name.clone();
        lock(&self.default).get_or_insert_with(|| name.clone());
        lock(&self.exports).insert(name, export);
    }

    /// Changes the default export (`None`: an empty name selects nothing).
    pub fn set_default(&self, name: Option<String>) {
        *lock(&self.default) = name;
    }

    /// The export called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<MemoryExport>> {
        lock(&self.exports).get(name).cloned()
    }

    /// Open connections to `name` (opened minus closed).
    pub fn connections(&self, name: &str) -> i64 {
        lock(&self.connections).get(name).copied().unwrap_or(0)
    }
}

impl Exports for MemoryExports {
    fn list(&self) -> Vec<ExportInfo> {
        lock(&self.exports).values().map(|e| e.info()).collect()
    }

    fn default_name(&self) -> Option<String> {
        lock(&self.default).clone()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        let export: Arc<dyn Export> = self.get(name)?;
        Some(export)
    }

    fn connection_opened(&self, name: &str) {
        *lock(&self.connections).entry(name.to_owned()).or_insert(0) += 1;
    }

    fn connection_closed(&self, name: &str) {
        *lock(&self.connections).entry(name.to_owned()).or_insert(0) -= 1;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn write_read_and_allocation() {
        run(async {
            let e = MemoryExport::new("m", 64 * 1024);
            assert_eq!(
                e.block_status(0, 65536).await.unwrap(),
                vec![(65536, Allocation::Hole)]
            );
            e.write(4096, Bytes::from(vec![7u8; 512]), false)
                .await
                .unwrap();
            assert_eq!(&e.read(4096, 512).await.unwrap()[..], &[7u8; 512][..]);
            assert!(e.is_allocated(4096) && !e.is_allocated(0));
            let ext = e.block_status(0, 65536).await.unwrap();
            assert_eq!(
                ext,
                vec![
                    (4096, Allocation::Hole),
                    (4096, Allocation::Data),
                    (57344, Allocation::Hole)
                ]
            );
            // A query starting mid-chunk is clipped to the request.
            let ext = e.block_status(4608, 4096).await.unwrap();
            assert_eq!(ext, vec![(3584, Allocation::Data), (512, Allocation::Hole)]);
        });
    }

    #[test]
    fn trim_punches_whole_chunks_only() {
        run(async {
            let e = MemoryExport::new("m", 16384);
            e.write(0, Bytes::from(vec![1u8; 16384]), false)
                .await
                .unwrap();
            e.trim(2048, 8192, false).await.unwrap();
            // Chunk 0 partially trimmed stays allocated; chunk 1 fully covered is a hole;
            // chunk 2 partially trimmed stays allocated.
            assert!(e.is_allocated(0) && !e.is_allocated(4096) && e.is_allocated(8192));
            assert_eq!(e.contents(2048, 8192), vec![0u8; 8192]);
            assert_eq!(e.contents(10240, 10), vec![1u8; 10]);
            e.trim(0, 16384, false).await.unwrap();
            assert_eq!(
                e.block_status(0, 16384).await.unwrap(),
                vec![(16384, Allocation::Hole)]
            );
        });
    }

    #[test]
    fn write_zeroes_and_zero_state() {
        run(async {
            let e = MemoryExport::new("m", 8192);
            e.write_zeroes(0, 4096, false, false).await.unwrap();
            assert_eq!(
                e.block_status(0, 8192).await.unwrap(),
                vec![(4096, Allocation::Zero), (4096, Allocation::Hole)]
            );
            e.write_zeroes(0, 4096, false, true).await.unwrap();
            assert_eq!(
                e.block_status(0, 8192).await.unwrap(),
                vec![(8192, Allocation::Hole)]
            );
        });
    }

    #[test]
    fn unaligned_tail_chunk_can_be_trimmed() {
        run(async {
            let e = MemoryExport::new("m", 4096 + 512);
            e.write(4096, Bytes::from(vec![1u8; 512]), false)
                .await
                .unwrap();
            e.trim(4096, 512, false).await.unwrap();
            assert!(!e.is_allocated(4096));
        });
    }

    #[test]
    fn out_of_range_and_failures() {
        run(async {
            let e = MemoryExport::new("m", 4096);
            assert_eq!(e.read(4096, 1).await, Err(ExportError::OutOfRange));
            assert_eq!(e.read(u64::MAX, 1).await, Err(ExportError::OutOfRange));
            e.set_failing(true);
            assert!(matches!(e.flush().await, Err(ExportError::Io(_))));
        });
    }

    #[test]
    fn exports_count_connections() {
        let set = MemoryExports::new();
        set.add(Arc::new(MemoryExport::new("a", 4096)));
        set.add(Arc::new(MemoryExport::new("b", 4096)));
        assert_eq!(set.default_name().as_deref(), Some("a"));
        assert!(set.open("b").is_some() && set.open("c").is_none());
        assert_eq!(set.list().len(), 2);
        set.connection_opened("a");
        assert_eq!(set.connections("a"), 1);
        set.connection_closed("a");
        assert_eq!(set.connections("a"), 0);
    }
}
