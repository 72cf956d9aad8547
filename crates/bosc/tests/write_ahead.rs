#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Own-log mode queues a modification when it hands it to the log, before the log's write
//! is durable (so a caller can prepare its next changes meanwhile). The write-ahead rule
//! must still hold: no commit writes a block in place before every modification merged into
//! it is durable in the log, and a modification the log fails to make durable never reaches
//! the data disk. Tested with a log device whose writes wait while it is held.

#[path = "support/faulty.rs"]
mod faulty;

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use faulty::{engine_cfg, Disks};
use mariner_bosc::{BlockApp, Bosc, BoscConfig, Change};
use mariner_disk::Disk;

const LOG_ID: u128 = 0xA4EAD;

/// Adds the modification's byte to payload[0].
struct Add;
impl BlockApp for Add {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        payload[0] = payload[0].wrapping_add(m[0]);
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Hold {
    Open,
    Held,
    /// Held writes, and every later one, fail.
    Fail,
}

/// A disk whose writes and syncs wait while it is held.
#[derive(Debug)]
struct HeldDisk {
    inner: Arc<dyn Disk>,
    state: Mutex<Hold>,
    changed: Condvar,
}

impl HeldDisk {
    fn new(inner: Arc<dyn Disk>) -> Self {
        Self {
            inner,
            state: Mutex::new(Hold::Open),
            changed: Condvar::new(),
        }
    }

    fn set(&self, h: Hold) {
        *self.state.lock().unwrap() = h;
        self.changed.notify_all();
    }

    fn pass(&self) -> io::Result<()> {
        let mut st = self.state.lock().unwrap();
        while *st == Hold::Held {
            st = self.changed.wait(st).unwrap();
        }
        match *st {
            Hold::Fail => Err(io::Error::other("held write failed")),
            _ => Ok(()),
        }
    }
}

impl Disk for HeldDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.pass()?;
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.pass()?;
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

/// Lets held writes go when dropped, so a failed assertion ends the test instead of leaving
/// the writer waiting for ever.
struct Release<'a>(&'a HeldDisk);
impl Drop for Release<'_> {
    fn drop(&mut self) {
        let mut st = self
            .0
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *st == Hold::Held {
            *st = Hold::Open;
        }
        self.0.changed.notify_all();
    }
}

fn open(disks: &Disks, log: Arc<dyn Disk>, c: &BoscConfig) -> Bosc<Add> {
    disks.open_own_log(log, c, Add, LOG_ID, 3).0
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs the scenario: block 0 modified and committed, then block 1 modified while the log
/// is held and a commit cycle started; the log is then released as `release`. Returns the
/// value block 1 holds after a crash of both disks and a reopen.
fn held_then(release: Hold) -> u8 {
    let c = engine_cfg(16, 1 << 20);
    let disks = Disks::new::<Add>(7, &c, 1 << 20, LOG_ID);
    let held = Arc::new(HeldDisk::new(Arc::clone(&disks.log_disk)));
    let b = open(&disks, Arc::clone(&held) as Arc<dyn Disk>, &c);
    b.modify(0, &[5]).unwrap();
    b.commit_all().unwrap();
    let before = disks.data.writes();

    held.set(Hold::Held);
    std::thread::scope(|s| {
        let _release = Release(&held);
        let writer = s.spawn(|| b.modify_batch(vec![Change::modify(1, vec![9])]));
        // Queued at once, visible to queries, not yet durable.
        wait_until("the held change is queued", || {
            b.pending_modifications() == 1
        });
        assert_eq!(b.read(1).unwrap()[0], 9);
        let commit = s.spawn(|| b.commit_all());
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !writer.is_finished(),
            "modify_batch returns only once the log has made the change durable"
        );
        assert!(!commit.is_finished(), "the commit waits for the log");
        assert_eq!(
            disks.data.writes(),
            before,
            "nothing reaches the data disk before the log has it"
        );
        held.set(release);
        let logged = writer.join().unwrap();
        let committed = commit.join().unwrap();
        if release == Hold::Fail {
            assert!(logged.is_err(), "the caller hears of the lost change");
            assert!(committed.is_err(), "the engine failed");
            assert_eq!(
                disks.data.writes(),
                before,
                "the lost change was not written"
            );
        } else {
            assert_eq!(logged.unwrap().len(), 1);
            committed.unwrap();
            assert!(disks.data.writes() > before, "the commit wrote block 1");
        }
    });
    drop(b);
    held.set(Hold::Open);
    let disks = disks.crash();
    let log = Arc::clone(&disks.log_disk);
    let b = open(&disks, log, &c);
    assert_eq!(b.read(0).unwrap()[0], 5, "the acknowledged change survives");
    b.read(1).unwrap()[0]
}

#[test]
fn commits_wait_for_the_log() {
    assert_eq!(held_then(Hold::Open), 9);
}

#[test]
fn a_change_the_log_lost_never_reaches_the_data_disk() {
    assert_eq!(held_then(Hold::Fail), 0);
}
