//! The log's device writes in flight, and a wait for a moment with none, for background
//! writers that share the log's device (history's base images).
//!
//! A depth-1 writer's record spends most of its time in the log's device write; between two
//! of them the device is idle for the round trip to the client. A background piece handed to
//! the device right after a log write finished lands in that gap; one handed at a random
//! moment lands in front of the next log write about as often as the device is busy with the
//! log, and that write waits for it. The device threads count their writes here (two atomic
//! operations a write, and a wake-up only while someone waits); [`DeviceBusy::wait_idle`]
//! waits for the count to reach zero.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Device writes of the log in flight (see the module docs).
#[derive(Debug, Default)]
pub struct DeviceBusy {
    in_flight: AtomicU64,
    waiters: AtomicU64,
    lock: Mutex<()>,
    idle: Condvar,
}

impl DeviceBusy {
    /// The most a background writer hands the device per gap: 16 KiB (four random 4 KiB
    /// writes) fits between two of a depth-1 writer's log writes. History's base write-out
    /// and BOSC's index commits both go in pieces of it.
    pub const PIECE: u64 = 16 << 10;

    /// A device write (and its sync) begins.
    pub(crate) fn started(&self) {
        self.in_flight.fetch_add(1, SeqCst);
    }

    /// A device write (and its sync) ended, successfully or not.
    pub(crate) fn finished(&self) {
        // SeqCst on both sides: a waiter that registered after this load sees the count at
        // zero when it looks under the lock; one registered before is woken.
        let before = self.in_flight.fetch_sub(1, SeqCst);
        debug_assert!(before > 0, "a device write finished that never started");
        if before == 1 && self.waiters.load(SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.idle.notify_all();
        }
    }

    /// Device writes in flight now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(SeqCst)
    }

    /// Waits until no device write of the log is in flight, or `max` passed; returns whether
    /// the devices were idle.
    pub fn wait_idle(&self, max: Duration) -> bool {
        if self.in_flight() == 0 {
            return true;
        }
        let deadline = Instant::now() + max;
        self.waiters.fetch_add(1, SeqCst);
        let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let idle = loop {
            if self.in_flight() == 0 {
                break true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break false;
            };
            g = self
                .idle
                .wait_timeout(g, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        drop(g);
        self.waiters.fetch_sub(1, SeqCst);
        idle
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn idle_at_once_without_writes() {
        let b = DeviceBusy::default();
        assert!(b.wait_idle(Duration::ZERO));
        b.started();
        assert_eq!(b.in_flight(), 1);
        assert!(!b.wait_idle(Duration::from_millis(5)));
        b.finished();
        assert!(b.wait_idle(Duration::ZERO));
    }

    #[test]
    fn a_waiter_wakes_when_the_last_write_ends() {
        let b = Arc::new(DeviceBusy::default());
        b.started();
        b.started();
        let w = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                let t = Instant::now();
                (b.wait_idle(Duration::from_secs(30)), t.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        b.finished();
        std::thread::sleep(Duration::from_millis(20));
        b.finished();
        let (idle, took) = w.join().unwrap();
        assert!(idle);
        assert!(
            took >= Duration::from_millis(40),
            "woke before the last write ended"
        );
        assert!(took < Duration::from_secs(30), "not woken");
    }
}
