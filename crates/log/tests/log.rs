#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The log against memory and fault-injecting devices: durability of acknowledged records,
//! torn tails, stale generations, gaps across devices, refusal of foreign devices, full logs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mariner_disk::{CrashMode, Disk, Faults, FaultyDisk, MemDisk};
use mariner_log::{
    Durable, DurableSink, Entry, HolderSpec, Log, LogConfig, LogError, RecordKind, Recovery,
};

mod support;

use support::*;

fn faulty(n: usize, bytes: usize, seed: u64) -> (Vec<Arc<dyn Disk>>, Vec<Faults>) {
    let disks: Vec<FaultyDisk> = (0..n)
        .map(|i| FaultyDisk::new(bytes, seed + i as u64))
        .collect();
    let faults = disks.iter().map(|d| d.faults()).collect();
    let slow = |d| Arc::new(SlowSync(d)) as Arc<dyn Disk>;
    (disks.into_iter().map(slow).collect(), faults)
}

/// A sync that takes a while, like a real device's: a crash then often finds a write that
/// reached the device but was not yet synced.
#[derive(Debug)]
struct SlowSync(FaultyDisk);

impl Disk for SlowSync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        // Writes reach the device after a varying delay, as requests in a device queue do:
        // of two batches written in parallel the later one is often durable first.
        let jitter = (offset / 512).wrapping_mul(0x9E37_79B9) % 5;
        std::thread::sleep(Duration::from_micros(100 * jitter));
        self.0.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        std::thread::sleep(Duration::from_micros(300));
        self.0.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
}

#[test]
fn acknowledged_records_come_back_after_reopen() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(1 << 20))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, rec) = open(&devs, 0).unwrap();
    assert!(rec.records.is_empty());
    let mut acked = Vec::new();
    for i in 0..20u64 {
        let a = append_sync(&log, Entry::write(1, i * 4096, payload(i, 4096))).unwrap();
        acked.push(a);
    }
    append_sync(&log, Entry::extent(RecordKind::Trim, 1, 0, 8192)).unwrap();
    log.shutdown();
    let (log2, rec) = open(&devs, 0).unwrap();
    assert_eq!(rec.records.len(), 21);
    assert!(rec.voided.is_empty());
    for (a, f) in acked.iter().zip(&rec.records) {
        assert_eq!(f.header.seq, a.seq);
        assert_eq!(f.addr, a.addr);
        let (_, data) = log2.read(f.addr, f.header.seq).unwrap();
        assert_eq!(data, payload(a.seq - 1, 4096).to_vec());
    }
    assert_eq!(rec.records[20].header.kind, RecordKind::Trim);
    // Sequence numbers and timestamps keep rising after the restart.
    let next = append_sync(&log2, Entry::write(1, 0, payload(0, 512))).unwrap();
    assert_eq!(next.seq, 22);
    assert!(next.timestamp_ns > rec.last_ts);
}

/// Records appended together leave in one batch (one device write) where appends one by
/// one send the first alone; they get consecutive sequence numbers in order and come back
/// after a reopen.
#[test]
fn records_appended_together_leave_together() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(1 << 20))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let entries = (0..50u64)
        .map(|i| Entry::write(1, i * 512, payload(i, 512)))
        .collect();
    let burst = log.append_many(entries).unwrap();
    let first = burst.first_seq.unwrap();
    let acked: Vec<u64> = burst
        .futures
        .into_iter()
        .map(|rx| rx.blocking_recv().unwrap().unwrap().seq)
        .collect();
    assert_eq!(acked, (1..=50).collect::<Vec<_>>());
    assert_eq!(
        first, 1,
        "the burst's sequence numbers are known when it is handed over"
    );
    let batches = log
        .stats()
        .batches
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(batches, 1, "one device write for the burst");
    // An entry the log refuses refuses the whole call.
    let bad = vec![
        Entry::write(1, 0, payload(0, 512)),
        Entry::write(1, 0, payload(0, 64 * 1024)),
    ];
    assert!(matches!(
        log.append_many(bad),
        Err(LogError::TooLarge { .. })
    ));
    log.shutdown();
    let (_, rec) = open(&devs, 0).unwrap();
    assert_eq!(rec.records.len(), 50);
    assert!(rec.voided.is_empty());
}

#[test]
fn records_at_or_below_the_watermark_are_not_replayed() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(1 << 20))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    for i in 0..10u64 {
        append_sync(&log, Entry::write(1, 0, payload(i, 1000))).unwrap();
    }
    log.shutdown();
    let (_, rec) = open(&devs, 7).unwrap();
    let seqs: Vec<u64> = rec.records.iter().map(|f| f.header.seq).collect();
    assert_eq!(seqs, vec![8, 9, 10]);
    assert_eq!(rec.last_seq, 10);
}

#[test]
fn foreign_missing_and_reformatted_devices_are_refused() {
    let a: Arc<dyn Disk> = Arc::new(MemDisk::new(1 << 20));
    let b: Arc<dyn Disk> = Arc::new(MemDisk::new(1 << 20));
    Log::format(&[a.clone(), b.clone()], &cfg(), LOG_ID).unwrap();
    assert!(matches!(
        Log::format(std::slice::from_ref(&a), &cfg(), LOG_ID),
        Err(LogError::AlreadyFormatted { dev: 0 })
    ));
    let sink = || Arc::new(Collect::default());
    let r = Log::open(
        vec![a.clone(), b.clone()],
        cfg(),
        LOG_ID + 1,
        &consumer(0),
        sink(),
    );
    assert!(matches!(r, Err(LogError::ForeignDevice { .. })));
    let r = Log::open(vec![a.clone()], cfg(), LOG_ID, &consumer(0), sink());
    assert!(matches!(r, Err(LogError::WrongPosition { .. })));
    let r = Log::open(
        vec![b.clone(), a.clone()],
        cfg(),
        LOG_ID,
        &consumer(0),
        sink(),
    );
    assert!(matches!(r, Err(LogError::WrongPosition { .. })));
    let blank: Arc<dyn Disk> = Arc::new(MemDisk::new(1 << 20));
    let r = Log::open(vec![a, blank], cfg(), LOG_ID, &consumer(0), sink());
    assert!(matches!(r, Err(LogError::NotFormatted { dev: 1, .. })));
}

#[test]
fn a_full_log_makes_writers_wait_until_release() {
    // 4 segments of 64 KiB: about 56 records of 4 KiB fit.
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(64 * 1024 + 4 * SEG as usize))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let mut last = 0;
    for i in 0..48u64 {
        last = append_sync(&log, Entry::write(1, 0, payload(i, 4096)))
            .unwrap()
            .seq;
    }
    let mut waiting: Vec<_> = (0..40u64)
        .map(|i| log.append(Entry::write(1, 0, payload(i, 4096))).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut still_waiting = Vec::new();
    for mut w in waiting.drain(..) {
        match w.try_recv() {
            Ok(r) => {
                r.unwrap();
            }
            Err(_) => still_waiting.push(w),
        }
    }
    assert!(
        !still_waiting.is_empty(),
        "some writers must be waiting for space"
    );
    assert!(
        log.stats()
            .stalled
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    log.holder(CONSUMER).unwrap().release(last);
    for w in still_waiting {
        w.blocking_recv().unwrap().unwrap();
    }
}

#[test]
fn wrapping_the_log_leaves_stale_records_invisible() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(64 * 1024 + 3 * SEG as usize))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let mut last = 0;
    for i in 0..200u64 {
        last = append_sync(&log, Entry::write(1, i, payload(i, 3000)))
            .unwrap()
            .seq;
        log.holder(CONSUMER)
            .unwrap()
            .release(last.saturating_sub(5));
    }
    log.shutdown();
    let (_, rec) = open(&devs, last - 5).unwrap();
    let seqs: Vec<u64> = rec.records.iter().map(|f| f.header.seq).collect();
    assert_eq!(seqs, (last - 4..=last).collect::<Vec<_>>());
    assert_eq!(rec.last_seq, last);
    assert!(rec.voided.is_empty());
}

/// The records above the watermark span segments that wrapped around the ring (address order
/// is not generation order): the streaming replay still yields them in sequence order, the
/// same as `Log::open` lists them.
#[test]
fn streaming_replay_follows_generations_around_the_ring() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(64 * 1024 + 4 * SEG as usize))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let mut last = 0;
    for i in 0..110u64 {
        last = append_sync(&log, Entry::write(1, i, payload(i, 3000)))
            .unwrap()
            .seq;
        log.holder(CONSUMER)
            .unwrap()
            .release(last.saturating_sub(45));
    }
    log.shutdown();
    let after = last - 45;
    let (listed, rec) = open(&devs, after).unwrap();
    let want: Vec<(u64, Vec<u8>)> = rec
        .records
        .iter()
        .map(|f| (f.header.seq, listed.read(f.addr, f.header.seq).unwrap().1))
        .collect();
    listed.shutdown();
    let (streamed, srec) = Log::open_streaming(
        devs.clone(),
        cfg(),
        LOG_ID,
        &consumer(after),
        Arc::new(Collect::default()),
    )
    .unwrap();
    let ring: Vec<u64> = srec.replay.segments().iter().flatten().copied().collect();
    assert!(
        ring.windows(2).any(|w| w[1] < w[0]),
        "the window wraps the ring: {ring:?}"
    );
    let mut got = Vec::new();
    streamed
        .replay(&srec.replay, |f, p| {
            got.push((f.header.seq, p.to_vec()));
            Ok::<(), LogError>(())
        })
        .unwrap();
    assert_eq!(got.len(), 45);
    assert_eq!(got, want);
}

#[test]
fn a_failed_sync_fails_the_log_for_good() {
    let (devs, faults) = faulty(1, 1 << 20, 1);
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    append_sync(&log, Entry::write(1, 0, payload(0, 512))).unwrap();
    faults[0].fail_after(1); // the write succeeds, its sync fails
    assert!(matches!(
        append_sync(&log, Entry::write(1, 0, payload(1, 512))),
        Err(LogError::Failed(_))
    ));
    faults[0].cancel_fail_after();
    assert!(log.failure().is_some());
    assert!(matches!(
        log.append(Entry::write(1, 0, payload(2, 512))),
        Err(LogError::Failed(_))
    ));
}

/// Several writers on two faulty devices; the devices crash at a random moment, losing or
/// tearing what was not synced. After recovery every acknowledged record is there with its
/// payload, missing sequence numbers are voided, and nothing else appears.
///
/// With `depth` > 1 each device writes several batches at once; a batch that became durable
/// before an earlier one of its device must not be acknowledged first (recovery stops at the
/// earlier one's hole), which the rounds catch when a crash falls between the two.
fn crash_round(seed: u64, devices: usize, depth: u32) -> (usize, u64, usize) {
    let (devs, faults) = faulty(devices, 64 * 1024 + 16 * SEG as usize, seed * 7);
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let deep = LogConfig {
        device_depth: depth,
        ..cfg()
    };
    let (log, _) = open_with(&devs, 0, deep).unwrap();
    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let (log, acked, stop) = (log.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 60 {
                    let len = 512 * (1 + ((w * 13 + i * 7) % 8) as usize);
                    let tag = w * 1000 + i;
                    match append_sync(&log, Entry::write(w as u32, tag, payload(tag, len))) {
                        Ok(a) => {
                            acked.lock().unwrap().insert(a.seq, (tag, len));
                        }
                        Err(_) => return,
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_micros(200 + (seed % 7) * 900));
    // Crash: snapshot what reached the media while the writers are still running.
    let unsynced: usize = faults.iter().map(Faults::pending).sum();
    let crashed: Vec<FaultyDisk> = faults
        .iter()
        .map(|f| f.crash_with(CrashMode::Random))
        .collect();
    // The same crashed devices once more, for the streaming open.
    let twins: Vec<Arc<dyn Disk>> = crashed
        .iter()
        .map(|d| Arc::new(FaultyDisk::from_image(d.faults().live_image(), seed)) as Arc<dyn Disk>)
        .collect();
    let crashed: Vec<Arc<dyn Disk>> = crashed
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Disk>)
        .collect();
    let acked_at_crash: BTreeMap<u64, (u64, usize)> = acked.lock().unwrap().clone();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        let _ = w.join();
    }
    log.shutdown();
    let (log2, rec) = open(&crashed, 0).unwrap();
    // Consumers apply the records as listed: out of order, an older write would win.
    let seqs: Vec<u64> = rec.records.iter().map(|f| f.header.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seed {seed}: records not in sequence order: {seqs:?}"
    );
    let found: BTreeMap<u64, _> = rec.records.iter().map(|f| (f.header.seq, *f)).collect();
    for (seq, (tag, len)) in &acked_at_crash {
        let f = found
            .get(seq)
            .unwrap_or_else(|| panic!("seed {seed}: acked seq {seq} lost"));
        assert_eq!(f.header.offset, *tag);
        let (_, data) = log2.read(f.addr, *seq).unwrap();
        assert_eq!(
            data,
            payload(*tag, *len).to_vec(),
            "seed {seed}: seq {seq} payload"
        );
    }
    let mut all: Vec<u64> = found
        .keys()
        .copied()
        .chain(rec.voided.iter().copied())
        .collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (1..=rec.last_seq).collect::<Vec<_>>(),
        "seed {seed}: no holes, no extras"
    );
    streaming_open_replays_the_same_records(&twins, &rec, &log2, seed);
    // Reopen once more: the voids written by the first recovery leave no gaps.
    log2.shutdown();
    let (_, rec2) = open(&crashed, 0).unwrap();
    assert!(
        rec2.voided.is_empty(),
        "seed {seed}: voids were made durable"
    );
    let last_void = rec.voided.last().copied().unwrap_or(0);
    assert!(rec2.last_seq >= rec.last_seq.max(last_void));
    (rec.voided.len(), rec.torn_tails, unsynced)
}

/// `Log::open_streaming` on a copy of the same devices decides the same (voids, last seq) and
/// its replay yields exactly the records, in the order and with the payloads, that `Log::open`
/// listed.
fn streaming_open_replays_the_same_records(
    twins: &[Arc<dyn Disk>],
    rec: &Recovery,
    log: &Log,
    seed: u64,
) {
    let (streamed, srec) = Log::open_streaming(
        twins.to_vec(),
        cfg(),
        LOG_ID,
        &consumer(0),
        Arc::new(Collect::default()),
    )
    .unwrap();
    assert!(srec.records.is_empty());
    assert_eq!(srec.voided, rec.voided, "seed {seed}");
    assert_eq!(srec.last_seq, rec.last_seq, "seed {seed}");
    let mut got = Vec::new();
    let n = streamed
        .replay(&srec.replay, |f, payload| {
            got.push((*f, payload.to_vec()));
            Ok::<(), LogError>(())
        })
        .unwrap();
    assert_eq!(n as usize, got.len());
    assert_eq!(got.len(), rec.records.len(), "seed {seed}");
    for ((f, payload), want) in got.iter().zip(&rec.records) {
        assert_eq!(f, want, "seed {seed}");
        assert_eq!(payload, &log.read(want.addr, want.header.seq).unwrap().1);
    }
    streamed.shutdown();
}

#[test]
fn crashes_lose_no_acknowledged_record_one_device() {
    crash_rounds(0, 1, 1);
}

#[test]
fn crashes_lose_no_acknowledged_record_one_device_four_batches_in_flight() {
    crash_rounds_at_least(300, 1, 4, 150);
}

/// Runs crash rounds until at least a dozen ran and three crashed with writes in flight (not
/// yet synced), so the rounds cannot all miss the interesting moment.
fn crash_rounds(first_seed: u64, devices: usize, depth: u32) {
    crash_rounds_at_least(first_seed, devices, depth, 12);
}

fn crash_rounds_at_least(first_seed: u64, devices: usize, depth: u32, rounds: usize) {
    let mut interesting = 0;
    for (i, seed) in (first_seed..first_seed + 200 + rounds as u64).enumerate() {
        let (_, _, unsynced) = crash_round(seed, devices, depth);
        interesting += usize::from(unsynced > 0);
        if i + 1 >= rounds && interesting >= 3 {
            return;
        }
    }
    panic!("only {interesting} crashes hit a write in flight");
}

#[test]
fn crashes_lose_no_acknowledged_record_two_devices() {
    crash_rounds(100, 2, 1);
}

#[test]
fn crashes_lose_no_acknowledged_record_two_devices_four_batches_in_flight() {
    crash_rounds_at_least(500, 2, 4, 60);
}

#[test]
fn two_devices_share_the_load() {
    let (devs, faults) = faulty(2, 1 << 20, 9);
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let waits: Vec<_> = (0..64u64)
        .map(|i| log.append(Entry::write(1, 0, payload(i, 2048))).unwrap())
        .collect();
    for w in waits {
        w.blocking_recv().unwrap().unwrap();
    }
    assert!(
        faults[0].writes() > 1 && faults[1].writes() > 1,
        "both devices written"
    );
}

/// A sink that holds up the first delivery until the gate opens.
#[derive(Default)]
struct Gated {
    open: Mutex<bool>,
    opened: std::sync::Condvar,
    seen: Mutex<Vec<u64>>,
}

impl DurableSink for Gated {
    fn durable(&self, records: &[Durable]) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        drop(open);
        let mut seen = self.seen.lock().unwrap();
        seen.extend(records.iter().map(|r| r.header.seq));
    }
}

/// While a finished batch is being acknowledged (its consumers and waiters woken), the device
/// already writes the next one; the acknowledgements stay in order all the same.
#[test]
fn the_next_batch_is_written_while_the_last_one_is_acknowledged() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(1 << 20))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let sink = Arc::new(Gated::default());
    let (log, _) = Log::open(devs, cfg(), LOG_ID, &consumer(0), sink.clone()).unwrap();
    let first = log.append(Entry::write(1, 0, payload(1, 512))).unwrap();
    let writes = |log: &Log| log.stats().device_write_us.snapshot().2;
    let waited = |want: u64| {
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while writes(&log) < want && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        writes(&log)
    };
    assert_eq!(waited(1), 1, "the first batch is written");
    // Its acknowledgement now waits at the gate; the next record is written regardless.
    let mut second = log.append(Entry::write(1, 512, payload(2, 512))).unwrap();
    assert_eq!(
        waited(2),
        2,
        "the second batch is written while the first waits"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        second.try_recv().is_err(),
        "the second record is not acknowledged before the first"
    );
    assert!(sink.seen.lock().unwrap().is_empty());
    *sink.open.lock().unwrap() = true;
    sink.opened.notify_all();
    assert_eq!(first.blocking_recv().unwrap().unwrap().seq, 1);
    assert_eq!(second.blocking_recv().unwrap().unwrap().seq, 2);
    assert_eq!(*sink.seen.lock().unwrap(), vec![1, 2]);
    log.shutdown();
}

/// Every record of a volume gets the next of the volume's own sequence numbers, in log order;
/// the numbering continues after a restart, from the records recovery finds or, for a volume
/// whose records were all released and overwritten, from the floor the holder passes.
#[test]
fn volume_sequence_numbers_count_each_volume_and_continue_after_a_restart() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(64 * 1024 + 4 * SEG as usize))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let vseq = |log: &Log, volume: u32| {
        append_sync(log, Entry::write(volume, 0, payload(1, 512)))
            .unwrap()
            .volume_seq
    };
    let got: Vec<u64> = [1, 2, 1, 1, 2].iter().map(|&v| vseq(&log, v)).collect();
    assert_eq!(got, [1, 1, 2, 3, 2]);
    let trim = append_sync(&log, Entry::extent(RecordKind::Trim, 2, 0, 4096)).unwrap();
    assert_eq!(trim.volume_seq, 3, "every kind of record counts");
    log.shutdown();

    let (log, rec) = open(&devs, 0).unwrap();
    assert_eq!(
        rec.records.iter().map(|f| f.header.volume_seq).max(),
        Some(3)
    );
    assert_eq!((vseq(&log, 1), vseq(&log, 2)), (4, 4));
    // Volume 2 alone wraps the log; volume 1's records are released and overwritten.
    let holder = log.holder(CONSUMER).unwrap();
    let mut last = Default::default();
    for i in 0..200u64 {
        last = append_sync(&log, Entry::write(2, i * 4096, payload(i, 3000))).unwrap();
        holder.release(last.seq);
    }
    assert_eq!(last.volume_seq, 204);
    log.shutdown();

    let floors = [(1, 4), (2, last.volume_seq)].into_iter().collect();
    let spec =
        [HolderSpec::must_hold(CONSUMER, last.seq, last.timestamp_ns).with_volume_seqs(floors)];
    let (log, rec) = Log::open(
        devs.clone(),
        cfg(),
        LOG_ID,
        &spec,
        Arc::new(Collect::default()),
    )
    .unwrap();
    assert!(rec.records.is_empty());
    assert_eq!((vseq(&log, 1), vseq(&log, 2), vseq(&log, 3)), (5, 205, 1));
}
