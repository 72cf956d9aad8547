//! The model test's rollback steps: roll back to a random readable instant (or undo the last
//! rollback by rolling back to its `from`) through `begin_rollback`/`run_rollback`, writing
//! real log records like the test's other writes; some runs are cut short — the write
//! function fails after k chunks, or history's file I/O fails on its budget — and are resumed
//! after a crash and reopen from `pending_rollbacks`.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use mariner_history::{At, HistoryError, RollbackStatus, RollbackWrite};
use mariner_log::{Entry, RecordKind};

use super::{Case, Counters, Version, VOL};

/// How a run is to be cut short, if at all.
#[derive(Debug, Clone, Copy)]
enum Cut {
    None,
    /// The write function fails after this many chunks.
    Writes(u64),
    /// History's files fail after this many operations.
    Budget(i64),
}

impl Case {
    /// One rollback step: resume a pending one, or begin one (an undo when the last one
    /// finished and a coin says so) and run it, perhaps cut short and then resumed.
    pub(crate) fn rollback(&mut self, c: &mut Counters) {
        if !self.h().pending_rollbacks().is_empty() {
            self.resume(c);
            return;
        }
        let h = self.h().clone();
        let Ok(w) = h.window(VOL) else {
            return;
        };
        let undo = self.undo.take().filter(|_| self.rng.below(2) == 0);
        let to = match undo {
            Some(from) => from,
            None => {
                let readable: Vec<u64> = self
                    .versions
                    .iter()
                    .map(|v| v.vseq)
                    .filter(|&s| s >= w.oldest.volume_seq)
                    .collect();
                readable[self.rng.below(readable.len() as u64) as usize]
            }
        };
        let point = match h.resolve(VOL, At::Seq(to)) {
            Ok(p) => p,
            Err(HistoryError::Expired { .. } | HistoryError::Broken(_)) => return,
            Err(e) => panic!("seed {}: resolve @{to}: {e}", self.seed),
        };
        match h.begin_rollback(VOL, point) {
            Ok(s) => assert_eq!(s.from.volume_seq, self.versions.last().unwrap().vseq),
            Err(HistoryError::Expired { .. } | HistoryError::Broken(_)) => return,
            Err(e) => panic!("seed {}: begin rollback to @{to}: {e}", self.seed),
        }
        self.undoing = undo.is_some();
        let cut = match self.rng.below(4) {
            0 => Cut::Writes(self.rng.below(6)),
            1 => Cut::Budget(self.rng.below(3) as i64),
            _ => Cut::None,
        };
        if !self.run(c, cut) {
            // Cut short: the machine goes down, and the rollback resumes after the reopen.
            self.crash(c);
            self.resume(c);
        }
    }

    /// Resumes the pending rollback found at open (crashing again now and then).
    fn resume(&mut self, c: &mut Counters) {
        if self.h().pending_rollbacks().is_empty() {
            // A begin the crash cut short (its first save was never synced): nothing to do.
            return;
        }
        c.resumed_rollbacks += 1;
        let cut = if self.rng.below(4) == 0 {
            Cut::Writes(self.rng.below(4))
        } else {
            Cut::None
        };
        if !self.run(c, cut) {
            self.crash(c);
            self.resume(c);
        }
    }

    /// Runs the pending rollback; false when it was cut short (or ran on a short budget): the
    /// machine must go down, and a rollback still pending resumes after the reopen.
    fn run(&mut self, c: &mut Counters, cut: Cut) -> bool {
        let h = self.h().clone();
        let log = self.log.clone().unwrap();
        let chunk = 512 * (1 + self.rng.below(32));
        let seed = self.seed;
        if let Cut::Budget(n) = cut {
            self.m.budget.store(n, Relaxed);
        }
        let limit = match cut {
            Cut::Writes(k) => Some(k),
            _ => None,
        };
        let (image, versions, appended) = (
            &mut self.image,
            &mut self.versions,
            &mut self.appended_bytes,
        );
        let mut n = 0u64;
        let mut last_done = 0;
        let r = h.run_rollback(
            VOL,
            chunk,
            &mut |w| {
                if limit.is_some_and(|k| n >= k) {
                    return Err("injected: the node went down".into());
                }
                n += 1;
                let (e, range, data) = match w {
                    RollbackWrite::Data { offset, data } => {
                        let r = offset as usize..offset as usize + data.len();
                        let e = Entry::write(VOL, offset, Bytes::copy_from_slice(data));
                        (e, r, Some(data))
                    }
                    RollbackWrite::Zero { offset, length } => {
                        let r = offset as usize..(offset + length) as usize;
                        let e = Entry::extent(RecordKind::WriteZeroes, VOL, offset, length as u32);
                        (e, r, None)
                    }
                };
                assert!(range.len() as u64 <= chunk, "seed {seed}: chunk too long");
                *appended += range.len() as u64 + 128;
                let a = log
                    .append(e)
                    .map_err(|e| e.to_string())?
                    .blocking_recv()
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                super::applied(&log);
                // Acknowledged: the oracle follows.
                match data {
                    Some(d) => image[range].copy_from_slice(d),
                    None => image[range].fill(0),
                }
                versions.push(Version {
                    vseq: a.volume_seq,
                    ts: a.timestamp_ns,
                    image: std::sync::Arc::new(image.clone()),
                });
                // History keeps indexing and rolling forward meanwhile (the pins hold `to`).
                if n.is_multiple_of(3) {
                    h.step().map_err(|e| e.to_string())?;
                }
                Ok(())
            },
            &mut |s: &RollbackStatus| {
                assert!(s.done_bytes > last_done && s.done_bytes <= s.total_bytes);
                last_done = s.done_bytes;
            },
        );
        self.m.budget.store(i64::MAX, Relaxed);
        match r {
            Ok(fin) => {
                assert!(fin.finished && fin.done_bytes == fin.total_bytes);
                let want = self
                    .versions
                    .iter()
                    .find(|v| v.vseq == fin.to.volume_seq)
                    .unwrap();
                assert!(
                    self.image == *want.image,
                    "seed {}: after rolling back to @{} the volume differs from it",
                    self.seed,
                    fin.to.volume_seq
                );
                assert!(self.h().pins().is_empty() && self.h().pending_rollbacks().is_empty());
                if std::mem::take(&mut self.undoing) {
                    c.undos_finished += 1;
                } else {
                    c.rollbacks_finished += 1;
                    self.undo = Some(fin.from.volume_seq);
                }
                // A short budget may have failed the index's background commits meanwhile:
                // the machine goes down either way.
                !matches!(cut, Cut::Budget(_))
            }
            // Shrinking passed `to`, or the log cut history: it can never finish.
            Err(HistoryError::Expired { .. } | HistoryError::Broken(_)) => {
                self.gave_way = true;
                self.h().cancel_rollback(VOL).unwrap();
                c.rollbacks_cancelled += 1;
                true
            }
            Err(HistoryError::RollbackWrite { .. }) => false,
            // Any failure of history's files (the cursor's save, the index, the state) while
            // the budget was short.
            Err(_) if matches!(cut, Cut::Budget(_)) => false,
            Err(e) => panic!("seed {}: rollback: {e}", self.seed),
        }
    }
}
