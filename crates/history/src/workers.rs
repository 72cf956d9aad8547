//! History's two background threads, so that indexing never waits for a roll-forward:
//! - the **indexer** ("history") takes the durable records the sink queued, in batches of
//!   `batch_records` or of one `batch_interval`, indexes them (`Inner::index_arrived`) and
//!   saves the state when due, which releases the log behind it;
//! - the **roller** ("history-roll") looks for cuts and rolls the base images forward
//!   (`retention.rs`): for expiry every few seconds, for a shrink whenever the log is
//!   pressed. A round takes seconds (it reads a round's payloads back from the log and
//!   writes and syncs the bases); on one thread with the indexer, every record that came
//!   meanwhile waited for it, and the index lag (the age of the oldest record not indexed)
//!   reached 4.8–5.4 s under bench/history-overhead.sh (target 2 s; docs/benchmarks.md).
//!
//! What they share is under locks already taken in one order (state, digests, index, views);
//! a round and a batch's lifecycle records (volumes created, resized or deleted, gaps) are
//! kept apart by `Inner::rounds`, since those change the bases a round is applying to. A
//! round reads only what is indexed (`State::indexed_seq`, set after the digests and the
//! index have a batch), and removes from the index only versions at or below the bases,
//! which new entries never are. [`crate::History::step`] does both in turn on the caller's
//! thread (tests that step history by hand).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::engine::{lock, Inner};
use crate::HistoryError;

impl Inner {
    /// The indexer's loop.
    pub(crate) fn run_indexer(self: Arc<Self>) {
        let _class = self.cpu.join();
        while !self.stop.load(Relaxed) {
            {
                // A batch is a full one or what came in one interval (`batch_wait`, asked
                // again at every wake-up): each costs syncs.
                let started = Instant::now();
                let mut q = lock(&self.incoming);
                while q.len() < self.cfg.batch_records && !self.stop.load(Relaxed) {
                    let Some(left) = self.batch_wait().checked_sub(started.elapsed()) else {
                        break;
                    };
                    q = self
                        .wake
                        .wait_timeout(q, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
            let stepped = self.index_arrived().and_then(|_| self.save(false));
            self.keep_pace();
            if let Err(e) = stepped {
                self.stopped_by(&e);
                return;
            }
        }
    }

    /// The roller's loop: a look every batch wait (a few milliseconds while the log is
    /// pressed, else the batch interval); `roll_forward_if_due` decides whether a round is due.
    pub(crate) fn run_roller(self: Arc<Self>) {
        let _class = self.cpu.join();
        while !self.stop.load(Relaxed) {
            {
                let idle = lock(&self.roller_idle);
                if !self.stop.load(Relaxed) {
                    let _ = self
                        .roller_wake
                        .wait_timeout(idle, self.batch_wait())
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
            if self.stop.load(Relaxed) {
                return;
            }
            if let Err(e) = self.maintain() {
                self.stopped_by(&e);
                return;
            }
        }
    }

    /// What the roller does at each look: notes a cut, rolls forward when due.
    pub(crate) fn maintain(&self) -> Result<(), HistoryError> {
        let _round = lock(&self.rounds);
        self.check_cut();
        self.roll_forward_if_due()
    }

    /// Wakes both threads (at stop, and when the log is pressed).
    pub(crate) fn wake_all(&self) {
        self.wake.notify_all();
        let _idle = lock(&self.roller_idle);
        self.roller_wake.notify_all();
    }

    /// A thread failed: history stops (both threads), writes go on.
    fn stopped_by(&self, e: &HistoryError) {
        tracing::error!(
            error = %e,
            "history stopped: writes go on, but history is not kept until a restart"
        );
        lock(&self.failed).get_or_insert_with(|| e.to_string());
        self.stop.store(true, Relaxed);
        self.wake_all();
        // Writers must not wait for a history that will not release again (under the
        // throttle policy it holds like the store): let the log have it all. The next start
        // finds the records it lacks gone and seeds again.
        if let (Some(log), Some(h)) = (self.log.get(), self.holder.get()) {
            h.release(log.stats().durable_seq.load(Relaxed));
        }
    }

    /// The I/O turn for a batch or a save: ahead of any round's next piece.
    pub(crate) fn turn_first(&self) -> MutexGuard<'_, ()> {
        self.turn_waiting.fetch_add(1, Relaxed);
        let turn = lock(&self.io_turn);
        self.turn_waiting.fetch_sub(1, Relaxed);
        turn
    }

    /// The I/O turn for a round's piece: after every batch or save waiting for it.
    pub(crate) fn turn_after(&self) -> MutexGuard<'_, ()> {
        while self.turn_waiting.load(Relaxed) > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        lock(&self.io_turn)
    }
}
