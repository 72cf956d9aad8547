#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Rollback: writes only what changed since the instant, in block-aligned chunks, leaves the
//! volume as it was then, and is undone by rolling back to its `from`; a rollback cut short
//! resumes after a reopen (its pins taken again) and ends in the same bytes.

mod rig;

use std::cell::Cell;
use std::time::Duration;

use mariner_history::{At, HistoryError, RollbackWrite};
use rig::{Rig, HOUR, SIZE, VOL};

const DAY: Duration = Duration::from_secs(24 * 3600);

#[test]
fn a_rollback_writes_only_changed_blocks_and_is_undone_by_rolling_back_to_its_from() {
    let mut rig = Rig::new(32 << 20);
    let (log, h) = rig.open(DAY, |_| {});
    rig.create_blocks(&log, 4096);
    let to = rig.write_mixed(&log, 7, 150);
    rig.write_mixed(&log, 8, 120);
    h.step().unwrap();
    let newest = rig.write_mixed(&log, 9, 30);
    let to_point = h.resolve(VOL, At::Seq(to)).unwrap();
    let status = h.begin_rollback(VOL, to_point).unwrap();
    assert_eq!(status.from.volume_seq, newest);
    assert_eq!((status.done_bytes, status.finished), (0, false));
    assert!(status.total_bytes > 0 && status.total_bytes <= SIZE);
    assert!(matches!(
        h.begin_rollback(VOL, to_point),
        Err(HistoryError::RollbackRunning(VOL))
    ));
    assert_eq!(h.pending_rollbacks(), vec![status.clone()]);
    assert_eq!(h.pins().len(), 2, "to and from pinned");

    // What changed after `to`, rounded out to blocks: the rollback writes exactly that.
    let changed = h.changes(VOL, to, newest).unwrap();
    let mut blocks = vec![false; (SIZE / 4096) as usize];
    for x in &changed.extents {
        blocks[(x.offset / 4096) as usize..(x.offset + x.length).div_ceil(4096) as usize]
            .fill(true);
    }
    let mut written = vec![false; blocks.len()];
    let mut last_end = 0;
    let mut progress_calls = 0;
    let fin = h
        .run_rollback(
            VOL,
            10_000,
            &mut |w| {
                let (off, len) = match w {
                    RollbackWrite::Data { offset, data } => (offset, data.len() as u64),
                    RollbackWrite::Zero { offset, length } => (offset, length),
                };
                assert!(
                    off % 4096 == 0 && len % 4096 == 0 && len <= 8192,
                    "{off}+{len}"
                );
                assert!(off >= last_end, "ascending offsets");
                last_end = off + len;
                written[(off / 4096) as usize..((off + len) / 4096) as usize].fill(true);
                rig.apply(&log, w);
                Ok(())
            },
            &mut |s| {
                progress_calls += 1;
                assert!(s.done_bytes <= s.total_bytes);
            },
        )
        .unwrap();
    assert!(fin.finished);
    assert_eq!(fin.done_bytes, fin.total_bytes);
    assert_eq!(written, blocks, "exactly the changed blocks are written");
    assert!(progress_calls > 0);
    assert!(
        rig.image == rig.after[&to],
        "the volume is as of @{to} again"
    );
    let latest = h.resolve(VOL, At::Latest).unwrap().volume_seq;
    rig.reads(&h, latest).unwrap();
    assert!(h.pending_rollbacks().is_empty());
    assert!(h.pins().is_empty());

    // Undo: back to the rollback's `from`.
    let undo = h.begin_rollback(VOL, fin.from).unwrap();
    let done = h
        .run_rollback(
            VOL,
            32 << 10,
            &mut |w| {
                rig.apply(&log, w);
                Ok(())
            },
            &mut |_| {},
        )
        .unwrap();
    assert!(done.finished && undo.from.volume_seq == latest);
    assert!(rig.image == rig.after[&newest], "undone: as of @{newest}");
    log.shutdown();
}

#[test]
fn a_rollback_cut_short_resumes_after_a_reopen_and_its_pins_hold() {
    let mut rig = Rig::new(32 << 20);
    let window = Duration::from_secs(600);
    let (log, h) = rig.open(window, |_| {});
    rig.create_blocks(&log, 4096);
    let to = rig.write_mixed(&log, 21, 100);
    // Enough changed after `to` for several saved cursors (every 64 KiB in the rig).
    for i in 0..6 {
        rig.write(&log, 30, 4096 * (i + 1));
        rig.write_mixed(&log, 22 + i, 40);
    }
    let newest = *rig.after.keys().last().unwrap();
    h.flush().unwrap();
    let to_point = h.resolve(VOL, At::Seq(to)).unwrap();
    let status = h.begin_rollback(VOL, to_point).unwrap();
    assert!(status.total_bytes >= 256 << 10);
    let n = Cell::new(0);
    let r = h.run_rollback(
        VOL,
        8192,
        &mut |w| {
            n.set(n.get() + 1);
            if n.get() > 20 {
                return Err("the node went down".into());
            }
            rig.apply(&log, w);
            Ok(())
        },
        &mut |_| {},
    );
    assert!(matches!(
        r,
        Err(HistoryError::RollbackWrite { volume: VOL, .. })
    ));
    h.shutdown(false).unwrap();
    log.shutdown();
    drop((log, h));

    // Reopened an hour later: every instant is older than the window, but the rollback's
    // pins were taken again at open and hold `to` and `from`.
    rig.clock.advance(HOUR);
    let (log, h) = rig.open(window, |h| {
        assert_eq!(h.pins().len(), 2);
    });
    h.step().unwrap();
    let pending = h.pending_rollbacks();
    assert_eq!(pending.len(), 1);
    assert!(pending[0].done_bytes >= 64 << 10, "a cursor was saved");
    assert!(pending[0].done_bytes < status.total_bytes);
    assert_eq!(h.window(VOL).unwrap().oldest.volume_seq, to);
    let fin = h
        .run_rollback(
            VOL,
            8192,
            &mut |w| {
                rig.apply(&log, w);
                Ok(())
            },
            &mut |_| {},
        )
        .unwrap();
    assert!(fin.finished && fin.done_bytes == fin.total_bytes);
    assert!(rig.image == rig.after[&to], "resumed: as of @{to}");
    assert_eq!(fin.from.volume_seq, newest);
    assert!(h.pending_rollbacks().is_empty() && h.pins().is_empty());
    // And nothing is pending after another reopen.
    h.shutdown(true).unwrap();
    log.shutdown();
    drop((log, h));
    let (log, h) = rig.open(window, |_| {});
    assert!(h.pending_rollbacks().is_empty());
    assert!(matches!(
        h.run_rollback(VOL, 8192, &mut |_| Ok(()), &mut |_| {}),
        Err(HistoryError::NoRollback(VOL))
    ));
    log.shutdown();
}
