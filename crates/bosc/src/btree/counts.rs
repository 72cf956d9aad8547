//! The count refresher: after an open from a router image, a background thread reads every
//! leaf in block order, as the full scan would, and gives each leaf still unread its exact
//! record count; and it checks that every leaf it finds is where the router routes its fence.
//!
//! Why: an image carries no counts (see [`super::image`]), so a leaf known from it is read at
//! its first put. Under a workload that touches every leaf, those reads are random and
//! together cost more than the sequential scan the open skipped (bench/router-reopen.sh,
//! 172,270 leaves: 100,000 inserts right after the open took 5.25 s with only those reads,
//! 3.30 s with the refresher, 2.31 s after a full-scan open). The refresher moves that scan
//! off the open path and keeps it sequential; a put that comes first still reads its leaf
//! itself. It takes the router lock only when free (or when it holds many counts), since a
//! batch holds it for its whole length. The check is the
//! safety net of a trusted image: a leaf the router does not know, or routes elsewhere,
//! fails the tree (every later operation errs) rather than leave it answering wrong.
//!
//! Apart because it is a thread of its own, stopped and joined when the tree is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use super::leaf::{Key, LeafApp, LeafView};
use super::router::{Fence, Router};
use super::{lock, TreeStats};
use crate::{Bosc, Error};

/// Blocks read per scan call.
const CHUNK: u64 = 256;

/// The refresher thread, if one runs.
#[derive(Default)]
pub(super) struct Refresher {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Refresher {
    /// Starts reading every leaf of `bosc` for `router`.
    pub(super) fn start(
        &self,
        bosc: &Arc<Bosc<LeafApp>>,
        router: &Arc<Mutex<Router>>,
        stats: &Arc<TreeStats>,
    ) -> Result<(), Error> {
        let (bosc, router, stats) = (Arc::clone(bosc), Arc::clone(router), Arc::clone(stats));
        let stop = Arc::clone(&self.stop);
        let spawned = std::thread::Builder::new()
            .name("btree-counts".into())
            .spawn(move || {
                if let Err(why) = refresh(&bosc, &router, &stats, &stop) {
                    let mut r = lock(&router);
                    r.failed.get_or_insert(why);
                }
            })
            .map_err(|e| Error::Failed(format!("count refresher: {e}")))?;
        *self.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(spawned);
        Ok(())
    }

    /// Waits until the refresher has read every leaf (tests, measurements).
    pub(super) fn wait(&self) {
        let t = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.wait();
    }
}

/// Found leaves held before the router lock is waited for: a batch holds the lock for its
/// whole length, so waiting at every chunk would pace the refresher at one chunk per batch.
const PENDING_MAX: usize = 1 << 16;

/// Reads every block in chunks; `Err` with what failed the tree.
fn refresh(
    bosc: &Bosc<LeafApp>,
    router: &Mutex<Router>,
    stats: &TreeStats,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut found: Vec<(u64, Key, usize)> = Vec::new();
    let mut at = 0;
    while at < bosc.block_count() {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let n = CHUNK.min(bosc.block_count() - at);
        let scanned = bosc.scan(at, n, |block, p| {
            let v = LeafView(p);
            if v.is_leaf() {
                found.push((block, v.fence(), v.count()));
            }
            Ok(())
        });
        if let Err(e) = scanned {
            // The engine failed or the tree's disk did: the operations that need them will
            // say so; the counts stay to be read at each leaf's first put.
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            return Err(format!("count refresher: {e}"));
        }
        at += n;
        let last = at >= bosc.block_count();
        let r = match router.try_lock() {
            Ok(r) => Some(r),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if last || found.len() >= PENDING_MAX => {
                Some(lock(router))
            }
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(mut r) = r {
            if r.failed.is_some() {
                return Ok(());
            }
            apply(&mut r, &found, stats)?;
            found.clear();
        }
    }
    Ok(())
}

/// Gives the unread leaves among `found` their counts; `Err` if one is not where the router
/// routes its fence.
fn apply(r: &mut Router, found: &[(u64, Key, usize)], stats: &TreeStats) -> Result<(), String> {
    for &(block, fence, count) in found {
        match r.get_mut(fence) {
            Some(l) if l.block() == block => {
                // Unread means no put or delete reached it since open (each reads an unread
                // leaf first), so the count read before the lock is still exact.
                if l.is_unread() {
                    l.set_records_max(count);
                    stats
                        .counts_refreshed_in_background
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                return Err(format!(
                    "the router image did not match the leaves: block {block} holds the leaf \
                     with fence {:?}, which the router routes elsewhere",
                    Fence::from(fence).key()
                ))
            }
        }
    }
    Ok(())
}
