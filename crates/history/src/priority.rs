//! History's threads run in the CPU's background class: indexing, the index's commits and
//! roll-forward are batched behind the write path, and must not delay it.
//!
//! Measured with a depth-1 writer for 60 s after 40 s at depth 32 (4 GiB log, 7-day window,
//! 1 MiB index budget; 2 cores shared with fio): p99 553–635 µs with history against 232–285
//! µs without, with the same device I/O; 436–440 µs once the history thread and the index's
//! commit thread were `SCHED_IDLE` (what this does); 297–342 µs with the index's leaf readers
//! and the process's other unnamed threads idle too, set by hand. Nice 10 or 19 instead gave
//! 428–457 µs: a woken thread of normal weight still waited for a niced one's slice.
//!
//! A background thread runs only when the write path leaves a core idle, so under a load that
//! takes every core history falls behind instead — which the index lag and the log's pressure
//! (history shrinks) show and bound — never the other way round.

/// Puts the calling thread (and the threads it starts later) in the `SCHED_IDLE` class. A
/// system that refuses it (a seccomp filter, say) keeps the thread where it was.
pub(crate) fn background_class() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads the parameter struct for the duration of the call and
    // pid 0 is the calling thread; no memory is shared with the kernel past it.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "history: could not lower this thread to the background CPU class"
        );
    }
}
