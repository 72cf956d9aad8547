#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Diff and activity against a brute-force oracle: random writes, trims and write-zeroes
//! (some indexed, some still on the unindexed tail), then for random pairs of instants the
//! changed extents must be exactly the sectors the oracle saw written, the counts its counts,
//! and the query must read digests only — a small share of the bytes written.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mariner_disk::{Disk, MemDisk};
use mariner_history::files::{Files, MemFiles};
use mariner_history::{Extent, History, HistoryConfig, HistoryError, IndexConfig, Point};
use mariner_log::clock::{Clock, VirtualClock};
use mariner_log::{Entry, Log, LogConfig, RecordKind};

const LOG_ID: u128 = 0xD1FF_0001;
const VOL: u32 = 9;
const OTHER: u32 = 10;
const SECTORS: u64 = 4096;
const SIZE: u64 = SECTORS * 512;

/// One record as the oracle saw it.
#[derive(Debug, Clone, Copy)]
struct Rec {
    vseq: u64,
    ts: u64,
    kind: RecordKind,
    offset: u64,
    length: u64,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn open() -> (Log, History, Arc<VirtualClock>) {
    let dev: Arc<dyn Disk> = Arc::new(MemDisk::new(256 << 20));
    let log_cfg = LogConfig {
        segment_bytes: 1 << 20,
        t_wait_ns: 0,
        ..LogConfig::default()
    };
    Log::format(std::slice::from_ref(&dev), &log_cfg, LOG_ID).unwrap();
    let files: Arc<dyn Files> = Arc::new(MemFiles::new(BTreeMap::new(), |_| {
        Arc::new(MemDisk::new(0)) as Arc<dyn Disk>
    }));
    let clock = Arc::new(VirtualClock::new(1_800_000_000_000_000_000));
    let cfg = HistoryConfig {
        window: Duration::from_secs(30 * 24 * 3600),
        index: IndexConfig {
            block_count: 16384,
            block_bytes: 4096,
            memory_budget_bytes: 8 << 20,
            log_bytes: 16 << 20,
            log_segment_bytes: 256 << 10,
            background: None,
            cpu_class: None,
            write_gap: None,
        },
        batch_records: 256,
        background: false,
        state_interval: Duration::ZERO,
        ..HistoryConfig::default()
    };
    let h = History::open_with_clock(files, cfg, clock.clone()).unwrap();
    let (log, rec) = Log::open_with_clock(
        vec![dev],
        log_cfg,
        LOG_ID,
        &[h.holder_spec()],
        h.sink(),
        clock.clone(),
    )
    .unwrap();
    h.start(log.clone(), &rec).unwrap();
    (log, h, clock)
}

fn append(log: &Log, e: Entry) -> mariner_log::Appended {
    log.append(e).unwrap().blocking_recv().unwrap().unwrap()
}

/// `n` random records of `VOL` (and a few of `OTHER`, which must not show), the clock moving
/// between them. Returns the payload bytes written.
fn write(log: &Log, clock: &VirtualClock, rng: &mut Rng, n: usize, out: &mut Vec<Rec>) -> u64 {
    let mut payload = 0;
    for _ in 0..n {
        clock.advance(rng.next() % 3_000_000_000);
        let start = rng.next() % SECTORS;
        let len = (1 + rng.next() % 48).min(SECTORS - start);
        let (off, bytes) = (start * 512, len * 512);
        let vol = if rng.next().is_multiple_of(8) {
            OTHER
        } else {
            VOL
        };
        let (kind, a) = match rng.next() % 6 {
            0 => (
                RecordKind::Trim,
                append(log, Entry::extent(RecordKind::Trim, vol, off, bytes as u32)),
            ),
            1 => (
                RecordKind::WriteZeroes,
                append(
                    log,
                    Entry::extent(RecordKind::WriteZeroes, vol, off, bytes as u32),
                ),
            ),
            _ => {
                payload += bytes;
                let data = Bytes::from(vec![(rng.next() % 255) as u8 + 1; bytes as usize]);
                (RecordKind::Write, append(log, Entry::write(vol, off, data)))
            }
        };
        if vol == VOL {
            out.push(Rec {
                vseq: a.volume_seq,
                ts: a.timestamp_ns,
                kind,
                offset: off,
                length: bytes,
            });
        }
    }
    payload
}

/// The oracle's answer: changed sectors merged into extents, and the counts.
fn expected(recs: &[Rec], from: u64, to: u64) -> (Vec<Extent>, [u64; 4]) {
    let mut changed = vec![false; SECTORS as usize];
    let mut c = [0u64; 4];
    for r in recs.iter().filter(|r| r.vseq > from && r.vseq <= to) {
        changed[(r.offset / 512) as usize..((r.offset + r.length) / 512) as usize].fill(true);
        let i = if r.kind == RecordKind::Write { 0 } else { 2 };
        c[i] += 1;
        c[i + 1] += r.length;
    }
    let mut out = Vec::new();
    let mut s = 0usize;
    while s < changed.len() {
        if !changed[s] {
            s += 1;
            continue;
        }
        let e = (s..changed.len())
            .find(|&i| !changed[i])
            .unwrap_or(changed.len());
        out.push(Extent {
            offset: s as u64 * 512,
            length: (e - s) as u64 * 512,
        });
        s = e;
    }
    (out, c)
}

#[test]
fn changes_and_activity_equal_a_brute_force_oracle_and_read_only_digests() {
    let (log, h, clock) = open();
    let created = append(
        &log,
        Entry::extent(RecordKind::VolumeCreated, VOL, SIZE, 512),
    );
    append(
        &log,
        Entry::extent(RecordKind::VolumeCreated, OTHER, SIZE, 512),
    );
    let mut rng = Rng(0x5EED_1234);
    let mut recs = Vec::new();
    let mut payload = write(&log, &clock, &mut rng, 3000, &mut recs);
    h.flush().unwrap();
    // A resize changes no data and must not show.
    append(&log, Entry::extent(RecordKind::VolumeResized, VOL, SIZE, 0));
    // These stay on the unindexed tail.
    payload += write(&log, &clock, &mut rng, 200, &mut recs);
    let (tail, _) = h.lag(clock.wall_ns());
    assert!(tail >= 150, "records left on the tail: {tail}");
    let newest = h.window(VOL).unwrap().newest.volume_seq;
    assert_eq!(newest, recs.last().unwrap().vseq);

    // The whole window: every record, tail included, read from the digests alone.
    let all = h.changes(VOL, created.volume_seq, newest).unwrap();
    let (want, c) = expected(&recs, created.volume_seq, newest);
    assert_eq!(all.extents, want);
    assert_eq!(
        [all.writes, all.write_bytes, all.zeroings, all.zeroed_bytes],
        c
    );
    assert_eq!(all.writes + all.zeroings, recs.len() as u64);
    assert!(all.digest_bytes_read > 0);
    eprintln!(
        "whole-window diff: {} records, {} digest bytes read, {payload} payload bytes written",
        recs.len(),
        all.digest_bytes_read
    );
    assert!(
        all.digest_bytes_read * 20 <= payload,
        "a whole-window diff read {} digest bytes for {payload} payload bytes written",
        all.digest_bytes_read
    );

    // Random ranges, some reaching into the tail.
    let vseqs: Vec<u64> = std::iter::once(created.volume_seq)
        .chain(recs.iter().map(|r| r.vseq))
        .collect();
    for _ in 0..200 {
        let a = vseqs[(rng.next() % vseqs.len() as u64) as usize];
        let b = vseqs[(rng.next() % vseqs.len() as u64) as usize];
        let (from, to) = (a.min(b), a.max(b));
        let got = h.changes(VOL, from, to).unwrap();
        let (want, c) = expected(&recs, from, to);
        assert_eq!(got.extents, want, "changes(@{from}, @{to})");
        assert_eq!(
            [got.writes, got.write_bytes, got.zeroings, got.zeroed_bytes],
            c,
            "counts of changes(@{from}, @{to})"
        );
        assert!(got.digest_bytes_read <= all.digest_bytes_read + 64 * 1024);
    }
    assert_eq!(h.changes(VOL, newest, newest).unwrap().extents, vec![]);
    assert!(matches!(
        h.changes(VOL, created.volume_seq, newest + 1),
        Err(HistoryError::Expired { .. })
    ));

    // Activity: each record in the bucket of its timestamp.
    let from = Point {
        volume_seq: created.volume_seq,
        timestamp_ns: created.timestamp_ns,
    };
    let to = h.resolve(VOL, mariner_history::At::Latest).unwrap();
    for buckets in [1u32, 7, 60] {
        let got = h.activity(VOL, from, to, buckets).unwrap();
        assert_eq!(got.len(), buckets as usize);
        assert_eq!(got[0].start_ns, from.timestamp_ns);
        assert_eq!(got.last().unwrap().end_ns, to.timestamp_ns + 1);
        let mut want = got.clone();
        for b in &mut want {
            (b.writes, b.write_bytes, b.zeroings, b.zeroed_bytes) = (0, 0, 0, 0);
        }
        for r in &recs {
            let b = want
                .iter_mut()
                .find(|b| (b.start_ns..b.end_ns).contains(&r.ts))
                .unwrap();
            if r.kind == RecordKind::Write {
                b.writes += 1;
                b.write_bytes += r.length;
            } else {
                b.zeroings += 1;
                b.zeroed_bytes += r.length;
            }
        }
        assert_eq!(got, want, "{buckets} buckets");
    }
    log.shutdown();
}
