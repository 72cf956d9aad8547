#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Pins: a pinned instant outlives its window (taken before or after `start`), unpinning lets
//! it expire at the next roll-forward, and shrinking passes a pin (reads then fail Expired).

mod rig;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use mariner_history::HistoryError;
use rig::{Rig, HOUR, SEGMENT, VOL};

#[test]
fn a_pinned_instant_outlives_its_window_until_unpinned() {
    let mut rig = Rig::new(16 << 20);
    let (log, h) = rig.open(Duration::from_secs(60), |_| {});
    rig.create(&log);
    let pinned = rig.write(&log, 20, 4096);
    let last = rig.write(&log, 20, 4096);
    h.flush().unwrap();
    let pin = h.pin(VOL, pinned).unwrap();
    // An hour later every write is older than the window; the base stops at the pin.
    rig.clock.advance(HOUR);
    h.step().unwrap();
    assert!(h.stats().roll_forwards.load(Relaxed) > 0);
    let w = h.window(VOL).unwrap();
    assert_eq!(
        w.oldest.volume_seq, pinned,
        "the base stops exactly at the pin"
    );
    rig.reads(&h, pinned).unwrap();
    rig.reads(&h, last).unwrap();
    assert!(matches!(
        rig.reads(&h, pinned - 1),
        Err(HistoryError::Expired { .. })
    ));
    // An instant already gone cannot be pinned.
    assert!(matches!(
        h.pin(VOL, pinned - 1),
        Err(HistoryError::Expired { .. })
    ));
    // Rounds while pinned leave it be.
    rig.clock.advance(HOUR);
    h.step().unwrap();
    rig.reads(&h, pinned).unwrap();
    // Unpinned: the next roll takes the base past it.
    h.unpin(pin);
    rig.clock.advance(2_000_000_000);
    h.step().unwrap();
    assert_eq!(h.window(VOL).unwrap().oldest.volume_seq, last);
    assert!(matches!(
        rig.reads(&h, pinned),
        Err(HistoryError::Expired { .. })
    ));
    rig.reads(&h, last).unwrap();
    log.shutdown();
}

#[test]
fn a_pin_taken_before_start_holds_from_the_first_roll_forward() {
    let mut rig = Rig::new(16 << 20);
    let (log, h) = rig.open(Duration::from_secs(60), |_| {});
    rig.create(&log);
    let pinned = rig.write(&log, 10, 4096);
    let last = rig.write(&log, 10, 4096);
    h.flush().unwrap();
    h.shutdown(true).unwrap();
    log.shutdown();
    drop((log, h));
    rig.clock.advance(HOUR);
    // Re-pinned between open and start, as the node does for its snapshot exports: the
    // window is not known yet, and the pin is taken.
    let (log, h) = rig.open(Duration::from_secs(60), |h| {
        h.pin(VOL, pinned).unwrap();
    });
    h.step().unwrap();
    assert_eq!(h.window(VOL).unwrap().oldest.volume_seq, pinned);
    rig.reads(&h, pinned).unwrap();
    rig.reads(&h, last).unwrap();
    assert_eq!(h.pins().len(), 1);
    log.shutdown();
}

#[test]
fn shrinking_passes_a_pin_and_reads_as_of_it_fail_expired() {
    // A 2 MiB log and a week's window: history must shrink to keep the log writable.
    let mut rig = Rig::new(32 * SEGMENT + (1 << 16));
    let (log, h) = rig.open(Duration::from_secs(7 * 24 * 3600), |_| {});
    rig.create(&log);
    let pinned = rig.write(&log, 4, 16 << 10);
    h.flush().unwrap();
    h.pin(VOL, pinned).unwrap();
    rig.reads(&h, pinned).unwrap();
    let mut last = pinned;
    for _ in 0..40 {
        last = rig.write(&log, 4, 16 << 10);
        h.step().unwrap();
    }
    h.flush().unwrap();
    assert!(h.stats().shrinks.load(Relaxed) > 0, "history shrank");
    let w = h.window(VOL).unwrap();
    assert!(w.oldest.volume_seq > pinned, "the shrink passed the pin");
    assert!(matches!(
        rig.reads(&h, pinned),
        Err(HistoryError::Expired { .. })
    ));
    rig.reads(&h, last).unwrap();
    log.shutdown();
}
