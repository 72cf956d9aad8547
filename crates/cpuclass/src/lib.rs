//! The CPU class of background threads: `SCHED_IDLE` while the work they do can wait, the
//! normal class again as soon as it cannot.
//!
//! History's indexer, the index's commit cycle and its leaf readers are batched behind the
//! write path and must not delay it. On two cores shared with a depth-1 writer, their bursts
//! (a batch's sort and routing, a commit's merge and seal of a few thousand leaves) kept the
//! write path's threads waiting for a core: p99 589–668 µs against 232–285 µs with history
//! off; with them in `SCHED_IDLE`, 289–342 µs (docs/benchmarks.md). Nice 10 or 19 did not do
//! it (428–457 µs): a woken thread of normal weight still waits out a niced one's slice.
//!
//! But a thread in `SCHED_IDLE` runs only on a core nobody else wants. Under a writer that
//! takes every core, history would fall behind until the log cuts it. So the owner of the
//! work puts its threads back in the normal class whenever the work must keep pace
//! ([`CpuClass::set_background`], called from a thread that is not starved: history calls
//! it from the log's completion path). Leaving `SCHED_IDLE` needs a privilege (root,
//! `CAP_SYS_NICE` or an `RLIMIT_NICE` of 20): a process without it never enters the idle
//! class at all ([`CpuClass::available`]), since it could not come back.
//!
//! Threads join with [`CpuClass::join`]; a transition sets every member's class from the
//! caller's thread, under the lock that a leaving member takes to deregister, so a thread id
//! is never touched after its thread is gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// A group of threads sharing one CPU class.
#[derive(Debug)]
pub struct CpuClass {
    available: bool,
    /// The class wanted, readable without the lock.
    background: AtomicBool,
    /// Moves between the classes so far.
    changes: AtomicU64,
    members: Mutex<Vec<libc::pid_t>>,
}

impl Default for CpuClass {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuClass {
    /// A group in the normal class; [`Self::available`] says whether it can be moved.
    pub fn new() -> Self {
        Self {
            available: idle_class_reversible(),
            background: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            members: Mutex::new(Vec::new()),
        }
    }

    /// A group that never leaves the normal class (tests that must not depend on the
    /// machine's privileges).
    pub fn normal_only() -> Self {
        Self {
            available: false,
            ..Self::new()
        }
    }

    /// Whether this process may put threads in the idle class and take them out again.
    pub fn available(&self) -> bool {
        self.available
    }

    /// Whether the group is in the idle class now.
    pub fn is_background(&self) -> bool {
        self.background.load(Ordering::Relaxed)
    }

    /// How many times the group moved between the classes.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Adds the calling thread to the group, in the group's class, until the guard drops.
    pub fn join(self: &Arc<Self>) -> Member {
        let tid = gettid();
        let mut members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_background() {
            set_class(tid, true);
        }
        members.push(tid);
        Member {
            class: Arc::clone(self),
            tid,
        }
    }

    /// Puts every member in the idle class (`true`) or the normal class (`false`); a no-op
    /// when the group is there already or the idle class is not [`Self::available`].
    pub fn set_background(&self, on: bool) {
        if !self.available || self.is_background() == on {
            return;
        }
        let members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        if self.background.swap(on, Ordering::Relaxed) == on {
            return;
        }
        self.changes.fetch_add(1, Ordering::Relaxed);
        for &tid in members.iter() {
            set_class(tid, on);
        }
        tracing::debug!(
            background = on,
            threads = members.len(),
            "background threads' CPU class"
        );
    }
}

/// A thread's membership of a [`CpuClass`]; dropping it (on the thread, before it ends)
/// takes the thread out of the group and back to the normal class.
#[derive(Debug)]
pub struct Member {
    class: Arc<CpuClass>,
    tid: libc::pid_t,
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut members = self
            .class
            .members
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = members.iter().position(|&t| t == self.tid) {
            members.swap_remove(i);
        }
        if self.class.is_background() {
            set_class(self.tid, false);
        }
    }
}

fn gettid() -> libc::pid_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Sets thread `tid`'s scheduling policy; a refusal is logged and leaves it where it was.
fn set_class(tid: libc::pid_t, idle: bool) -> bool {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param` for the duration of the call only; `tid` is a
    // thread of this process that is still running (members deregister before they end).
    let r = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    if r != 0 {
        tracing::debug!(
            tid,
            idle,
            error = %std::io::Error::last_os_error(),
            "could not change a background thread's CPU class"
        );
    }
    r == 0
}

/// Whether a thread of this process can enter `SCHED_IDLE` and leave it again, tried once on
/// a thread of its own.
fn idle_class_reversible() -> bool {
    static REVERSIBLE: OnceLock<bool> = OnceLock::new();
    *REVERSIBLE.get_or_init(|| {
        std::thread::Builder::new()
            .name("cpuclass-probe".into())
            .spawn(|| {
                let tid = gettid();
                set_class(tid, true) && set_class(tid, false)
            })
            .ok()
            .and_then(|t| t.join().ok())
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: pid 0 is the calling thread; the call reads nothing of ours.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn members_follow_the_group_and_leave_it_normal() {
        let class = Arc::new(CpuClass::new());
        if !class.available() {
            // Without the privilege the group must never move.
            class.set_background(true);
            assert!(!class.is_background());
            return;
        }
        let c = Arc::clone(&class);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (back, seen) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let m = c.join();
            for () in rx {
                back.send(policy()).unwrap();
            }
            drop(m);
            policy()
        });
        tx.send(()).unwrap();
        assert_eq!(seen.recv().unwrap(), libc::SCHED_OTHER);
        class.set_background(true);
        tx.send(()).unwrap();
        assert_eq!(seen.recv().unwrap(), libc::SCHED_IDLE);
        class.set_background(false);
        class.set_background(false);
        assert_eq!(
            class.changes(),
            2,
            "a move to where the group is changes nothing"
        );
        tx.send(()).unwrap();
        assert_eq!(seen.recv().unwrap(), libc::SCHED_OTHER);
        class.set_background(true);
        tx.send(()).unwrap();
        assert_eq!(seen.recv().unwrap(), libc::SCHED_IDLE);
        drop(tx);
        // Leaving the group puts the thread back in the normal class.
        assert_eq!(t.join().unwrap(), libc::SCHED_OTHER);
        assert!(class.members.lock().unwrap().is_empty());
        // A thread joining an idle group starts idle.
        let c = Arc::clone(&class);
        let p = std::thread::spawn(move || {
            let _m = c.join();
            policy()
        })
        .join()
        .unwrap();
        assert_eq!(p, libc::SCHED_IDLE);
    }

    #[test]
    fn a_group_without_the_privilege_stays_normal() {
        let class = Arc::new(CpuClass::normal_only());
        let _m = class.join();
        class.set_background(true);
        assert!(!class.is_background());
        assert_eq!(policy(), libc::SCHED_OTHER);
    }
}
