#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Recovery's memory is bounded by what lies above the consumers' watermark, not by the log:
//! reopening a log full of records at or below it (many of them in released segments) keeps no
//! per-record state. A counting allocator measures the peak of `Log::open`; it sees every
//! thread of the process, so this binary holds this one test only.

#[path = "../../../tests/support/counting_alloc.rs"]
mod counting_alloc;

use std::sync::Arc;

use mariner_disk::{Disk, MemDisk};
use mariner_log::{
    Durable, DurableSink, Entry, Found, HolderSpec, Log, LogConfig, RecordKind, Recovery,
};

const LOG_ID: u128 = 0x3e3;

/// The one holder of log space these tests open the log with.
const CONSUMER: &str = "consumer";

fn consumer(after: u64) -> [HolderSpec; 1] {
    [HolderSpec::must_hold(CONSUMER, after, 0)]
}
const SEG: u64 = 64 * 1024;
const SEGMENTS: usize = 64;

struct Ignore;
impl DurableSink for Ignore {
    fn durable(&self, _: &[Durable]) {}
}

fn cfg() -> LogConfig {
    LogConfig {
        segment_bytes: SEG,
        t_wait_ns: 20_000,
        ..LogConfig::default()
    }
}

/// Opens the log and returns what recovery found and the bytes its opening allocated at its
/// peak, beyond what was live before.
fn open_measured(devs: &[Arc<dyn Disk>], after: u64) -> (Log, Recovery, usize) {
    let ((log, rec), peak) = counting_alloc::peak_of(|| {
        Log::open(
            devs.to_vec(),
            cfg(),
            LOG_ID,
            &consumer(after),
            Arc::new(Ignore),
        )
        .unwrap()
    });
    (log, rec, peak)
}

/// Appends `n` header-only records without waiting for each; returns the last sequence number.
fn append_many(log: &Log, n: u64) -> u64 {
    let waits: Vec<_> = (0..n)
        .map(|i| {
            log.append(Entry::extent(RecordKind::Trim, 1, i * 4096, 4096))
                .unwrap()
        })
        .collect();
    waits
        .into_iter()
        .map(|w| w.blocking_recv().unwrap().unwrap().seq)
        .max()
        .unwrap()
}

#[test]
fn recovery_memory_is_bounded_by_what_lies_above_the_watermark() {
    let devs: Vec<Arc<dyn Disk>> =
        vec![Arc::new(MemDisk::new(64 * 1024 + SEGMENTS * SEG as usize))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = Log::open(devs.clone(), cfg(), LOG_ID, &consumer(0), Arc::new(Ignore)).unwrap();
    // About 1.5 passes through the log, released as it goes: every segment ends up holding
    // 80-byte records (batches pad to 512 bytes), all at or below the watermark.
    let round = 5000;
    let mut last = 0;
    for _ in 0..15 {
        last = append_many(&log, round);
        log.holder(CONSUMER).unwrap().release(last);
    }
    log.shutdown();
    let per_record = std::mem::size_of::<Found>();

    // Everything at or below the watermark: nothing per record, whatever the log holds.
    let (log, rec, peak) = open_measured(&devs, last);
    log.shutdown();
    assert!(rec.records.is_empty() && rec.voided.is_empty());
    assert_eq!(rec.last_seq, last);
    // Only the newest segment is read whole: the others hold nothing above the watermark, as
    // the first record of the segment after each shows (recover.rs, `scan_device`).
    assert_eq!(rec.segments_scanned, 1);
    assert!(rec.bytes_scanned <= SEG);
    // Every segment was written, at most 512 bytes per record: the log holds more records
    // than the bound has room for.
    let on_disk = SEGMENTS * SEG as usize / 512;
    let fixed = 256 * 1024;
    assert!(on_disk * per_record > 2 * fixed, "{on_disk} records");
    assert!(
        peak < fixed,
        "open allocated {peak} B at its peak for a log of {on_disk}+ records below the watermark"
    );

    // The last round above the watermark: those records, and little more, are what recovery
    // holds.
    let above = round;
    let (log, rec, peak) = open_measured(&devs, last - above);
    log.shutdown();
    assert_eq!(rec.records.len(), above as usize);
    assert_eq!(rec.records[0].header.seq, last - above + 1);
    assert!(rec.voided.is_empty());
    let held = above as usize * per_record;
    assert!(
        peak >= held,
        "the counter sees the returned records: {peak} < {held}"
    );
    // A growing Vec briefly holds its old and its doubled buffer: up to three times its records.
    assert!(
        peak < fixed + 3 * held,
        "open allocated {peak} B for {above} records above the watermark"
    );
}
