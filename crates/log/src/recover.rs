//! Recovery: superblocks, scan, merge by sequence number, gaps, where each device resumes.
//!
//! Decision table (trail-paper.md §2.2, adapted to several devices that finish out of order):
//!
//! | found while scanning                              | decision                                   |
//! |---------------------------------------------------|--------------------------------------------|
//! | record fails header or payload checksum           | end of that segment (a torn, unacked write) |
//! | record of an older generation after newer ones    | end of that segment (stale, earlier pass)  |
//! | record with seq <= the replay watermark           | already applied; only its seq/ts count     |
//! | seq missing between watermark and the highest seq | never durable, never acked: voided         |
//! | same seq found twice                              | impossible by construction; first kept     |
//! | segment followed (by generation) by a segment whose first record is not a void and is at or below the replay watermark + 1 | not read whole: nothing to replay in it (`scan_device`) |
//!
//! Each device resumes in a fresh segment after its newest one, so nothing is ever appended after
//! a torn tail.
//!
//! A gap is a void only above a must-hold watermark: the log never lets go of records a
//! must-hold holder keeps, so what it cut from a shrinkable holder (history) lies at or below
//! that watermark. With no must-hold holder the replay watermark is the shrinkable holder's,
//! and records cut from it after its last release would be taken for gaps and voided (the
//! history model test once lost index entries that way); the node always opens the log with
//! the store's must-hold holder.
//!
//! Two watermarks (crate::holders): the segments that still hold records above the lowest
//! holder's watermark (history's, say) stay in use; the records above the lowest must-hold
//! watermark (the store's) are what recovery hands over for replay, and where it looks for
//! gaps. A restart therefore neither frees what history holds nor loads it into the store.
//!
//! Memory: the scan streams. Recovery keeps the records above the replay watermark and the
//! segments in use; of everything else (released segments, records at or below the watermark)
//! only the highest seq/ts, the newest segment and counts, so a long log of applied records
//! costs one segment buffer per device, not a header per record.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mariner_disk::Disk;
use mariner_placement::DeviceStart;

use crate::format::RecordKind;
use crate::format::Superblock;
use crate::holders::OpenMarks;
use crate::readahead::ReadAhead;
use crate::replay::ReplayPlan;
use crate::scan::{first_headers, scan_image, Found, SegmentSummary, Stop, Visit};
use crate::LogError;

/// What recovery found and decided.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Records above the replay watermark (the lowest must-hold holder's), in sequence order:
    /// what the store lacks.
    pub records: Vec<Found>,
    /// Sequence numbers above the watermark that never became durable; recovery wrote a void
    /// record for each.
    pub voided: Vec<u64>,
    /// Per volume, the highest volume sequence number seen (records scanned, and the floors
    /// the holders passed): where the volume's numbering continues.
    pub volume_seqs: BTreeMap<u32, u64>,
    /// Highest sequence number and timestamp seen anywhere (including the watermarks).
    pub last_seq: u64,
    pub last_ts: u64,
    pub segments_scanned: u64,
    pub bytes_scanned: u64,
    /// Segments whose parse stopped at a damaged record (torn tails).
    pub torn_tails: u64,
    pub elapsed: Duration,
    /// Where the records above the watermark lie, for [`crate::Log::replay`].
    pub replay: ReplayPlan,
    /// Per device, the lowest sequence number of a record in the segments kept in use, voids
    /// aside (`None`: they hold none). Every record of the device from this number on, voids
    /// aside, is still there, and a record of the device below it may be gone: a holder that persisted a watermark below a record of the device it still needs
    /// under this number was cut before the crash, and the log cannot say so itself (see
    /// [`crate::Holder::cut_to`]; history checks this at start against what it indexed).
    pub first_kept: Vec<Option<u64>>,
}

pub(crate) struct Resume {
    pub starts: Vec<DeviceStart>,
    pub in_use: Vec<VecDeque<(u64, u64)>>,
}

/// Scans every device (in parallel) and merges what it finds. `keep_records`: the records
/// above the replay watermark go to [`Recovery::records`]; otherwise only their sequence
/// numbers are kept (for the gaps) and the caller replays them with [`crate::Log::replay`].
pub(crate) fn recover(
    devices: &[Arc<dyn Disk>],
    sbs: &[Superblock],
    marks: OpenMarks,
    keep_records: bool,
) -> Result<(Recovery, Resume), LogError> {
    let start = Instant::now();
    let after_seq = marks.replay_after;
    let scans = scan_all(devices, sbs, marks, keep_records)?;
    let mut rec = Recovery {
        last_seq: marks.seq_floor.max(after_seq),
        last_ts: marks.ts_floor,
        ..Recovery::default()
    };
    let mut resume = Resume {
        starts: Vec::new(),
        in_use: Vec::new(),
    };
    let mut seqs = Vec::new();
    rec.replay.after_seq = after_seq;
    rec.replay.kept_after = marks.keep_after;
    for (mut scan, sb) in scans.into_iter().zip(sbs) {
        let (start, in_use) = scan.resume(sb);
        // Replay reads the segments holding records above the watermark, not the holes.
        rec.replay.segments.push(
            in_use
                .iter()
                .filter(|&&(_, max_seq)| max_seq > after_seq)
                .map(|&(segment, _)| segment)
                .collect(),
        );
        rec.replay.in_use.push(in_use.iter().copied().collect());
        // The segments kept hold every record of the device from their lowest one on, voids
        // aside (numbered at an open below records of earlier segments, they say nothing of
        // what was let go).
        // (Holes in the run, highest sequence number 0, show older data: not kept.)
        rec.first_kept.push(
            in_use
                .iter()
                .filter(|&&(_, max_seq)| max_seq > 0)
                .filter_map(|(segment, _)| scan.first_real.get(segment).copied().flatten())
                .min(),
        );
        resume.starts.push(start);
        resume.in_use.push(in_use);
        seqs.append(&mut scan.above_seqs);
        absorb(&mut rec, scan);
    }
    // Devices are scanned in order and each in address order, so among equal sequence numbers
    // the lowest address is the first found: the one kept, as a stable sort would, without
    // the stable sort's buffer.
    rec.records.sort_unstable_by_key(|f| (f.header.seq, f.addr));
    rec.records.dedup_by_key(|f| f.header.seq);
    if keep_records {
        rec.voided = gaps(
            rec.records.iter().map(|f| f.header.seq),
            after_seq,
            rec.last_seq,
        );
    } else {
        seqs.sort_unstable();
        seqs.dedup();
        rec.voided = gaps(seqs.into_iter(), after_seq, rec.last_seq);
    }
    rec.elapsed = start.elapsed();
    Ok((rec, resume))
}

fn scan_all(
    devices: &[Arc<dyn Disk>],
    sbs: &[Superblock],
    marks: OpenMarks,
    keep_records: bool,
) -> Result<Vec<DeviceScan>, LogError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .zip(sbs)
            .enumerate()
            .map(|(dev, (disk, sb))| {
                s.spawn(move || {
                    let mut scan = DeviceScan::new(marks, keep_records);
                    scan_device(disk.as_ref(), dev as u8, sb, &mut scan).map(|()| scan)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(dev, h)| match h.join() {
                Ok(r) => r.map_err(|source| LogError::Io { dev, source }),
                Err(_) => Err(LogError::Failed(format!("scan of device {dev} panicked"))),
            })
            .collect()
    })
}

/// Scans one device, reading whole only the segments that may hold a record above the replay
/// watermark, and each segment's first block otherwise.
///
/// On one device, records other than voids are written in sequence order, segment after
/// segment in generation order; void records are written only when the log opens, first, with
/// numbers below every record appended after them. So every record of a segment is below the
/// first record of the segment written after it (the next generation on the device), unless
/// that one is a void. A segment whose bound is at or below the replay watermark is not read:
/// it holds nothing to replay and no gap; the bound stands in for its highest sequence number
/// (which only ever keeps it in use a little longer), and its first record's timestamp and the
/// next one's sequence number count for the log's last ones. The newest segment, any segment
/// followed by a void, and any whose next generation is missing (a segment a cut let go of
/// was invalidated: `Dispatch::take_cut_segments`) are read whole.
fn scan_device(
    disk: &dyn Disk,
    dev: u8,
    sb: &Superblock,
    scan: &mut DeviceScan,
) -> std::io::Result<()> {
    let firsts = first_headers(disk, sb)?;
    let mut order: Vec<(u64, u64)> = firsts
        .iter()
        .zip(0u64..)
        .filter_map(|(h, segment)| h.map(|h| (h.generation, segment)))
        .collect();
    order.sort_unstable();
    // Per segment in generation order: skipped (the bound standing in for its highest
    // sequence number), or read whole — those are read one ahead of their parse.
    let mut skips = Vec::with_capacity(order.len());
    let mut reads = Vec::new();
    for (i, &(generation, segment)) in order.iter().enumerate() {
        // Records after the first are in sequence order, so a first record that is not a void
        // is the segment's lowest; a segment that starts with voids is read whole for it.
        let starts_void = firsts[segment as usize].is_some_and(|h| h.kind == RecordKind::Void);
        if let Some(first) = firsts[segment as usize].filter(|_| !starts_void) {
            scan.first_real.insert(segment, Some(first.seq));
        }
        // Only the segment written right after this one bounds it: a generation between
        // them (a segment a cut let go of and invalidated, not yet written again) may have
        // held records in between, and this one is then read whole.
        let next = order
            .get(i + 1)
            .filter(|&&(g, _)| g == generation + 1)
            .and_then(|&(_, s)| firsts[s as usize]);
        let bound = next
            .filter(|h| h.kind != RecordKind::Void)
            .map(|h| h.seq.saturating_sub(1));
        let skip = match (bound, firsts[segment as usize]) {
            (Some(bound), Some(first)) if bound <= scan.after_seq && !starts_void => {
                Some((bound, first))
            }
            _ => None,
        };
        if skip.is_none() {
            reads.push(segment);
        }
        skips.push(skip);
    }
    std::thread::scope(|scope| {
        let ahead = ReadAhead::start(scope, disk, sb, &reads)?;
        for (&(generation, segment), skip) in order.iter().zip(skips) {
            match skip {
                Some((bound, first)) => scan.skipped(&SegmentSummary {
                    segment,
                    generation: Some(generation),
                    stop: Stop::End,
                    used_bytes: 0,
                    record_count: 0,
                    max_seq: bound.max(first.seq),
                    max_ts: first.timestamp_ns,
                }),
                None => {
                    let (read, image) = ahead
                        .next()
                        .ok_or_else(|| std::io::Error::other("the read-ahead stopped early"))?;
                    debug_assert_eq!(read, segment);
                    let image = image?;
                    scan_image(dev, sb, segment, &image, scan);
                    ahead.recycle(image);
                }
            }
        }
        Ok(())
    })
}

/// What recovery keeps of one device's scan: the records above the replay watermark, the
/// segments in use, the newest segment and counts. Records at or below the replay watermark
/// leave only their seq/ts behind, so this grows with what the store lacks, not the log.
#[derive(Default)]
struct DeviceScan {
    /// Segments with a record above this stay in use.
    keep_after: u64,
    /// Records above this are kept for replay.
    after_seq: u64,
    keep_records: bool,
    /// Records above the replay watermark, in device order (when kept).
    above: Vec<Found>,
    /// Their sequence numbers only (when the records are not kept).
    above_seqs: Vec<u64>,
    /// Written segments holding a record above `keep_after`: (generation, segment, max_seq).
    in_use: Vec<(u64, u64, u64)>,
    /// The written segment of the highest generation: (generation, segment).
    newest: Option<(u64, u64)>,
    /// Each written segment's lowest record that is not a void (`None`: only voids).
    first_real: BTreeMap<u64, Option<u64>>,
    /// That of the segment being parsed, so far.
    parsing_first_real: Option<u64>,
    last_seq: u64,
    last_ts: u64,
    volume_seqs: BTreeMap<u32, u64>,
    segments_scanned: u64,
    bytes_scanned: u64,
    torn_tails: u64,
}

impl DeviceScan {
    fn new(marks: OpenMarks, keep_records: bool) -> Self {
        Self {
            keep_after: marks.keep_after.min(marks.replay_after),
            after_seq: marks.replay_after,
            keep_records,
            ..Self::default()
        }
    }

    /// Where the device resumes and which of its segments stay in use, oldest first.
    ///
    /// The placement policy moves through the segments as a ring (the next segment after the
    /// current one, while it has free ones), so what stays in use must be one run of the ring:
    /// from the oldest segment holding a record above `keep_after` to the newest segment.
    /// A segment inside that run without such a record — its first batch was lost in the
    /// crash while later ones landed, so it shows older data or none — is kept in the run as
    /// a hole (highest sequence number 0, freed as soon as it is the oldest); counted as free
    /// instead, it let the writer switch into the run's oldest segment and overwrite records
    /// not yet applied (found by crates/faultsim, seed 6792).
    ///
    /// The run starts at the in-use segment farthest back from the newest one around the
    /// ring, not at the oldest generation: the two differ when such a hole shows older data
    /// that a holder still counts as needed. That happens once the log has cut a holder (it
    /// let go of segments above the watermark the holder persisted): starting at the hole's
    /// old generation, the walk reached the newest segment before a segment of the run and
    /// left it out, and the writer overwrote records the store had not applied (faultsim seed
    /// 217790: history at 271, store at 292, a hole showing generation 20 between
    /// generations 22 and 24).
    fn resume(&mut self, sb: &Superblock) -> (DeviceStart, VecDeque<(u64, u64)>) {
        self.in_use.sort_unstable();
        let mut in_use = VecDeque::new();
        if let Some((_, newest)) = self.newest.filter(|_| !self.in_use.is_empty()) {
            let count = sb.segment_count.max(1);
            let back = |s: u64| (newest + count - s % count) % count;
            let oldest = self
                .in_use
                .iter()
                .map(|&(_, s, _)| s)
                .max_by_key(|&s| back(s))
                .unwrap_or(newest);
            let mut segment = oldest;
            loop {
                let max_seq = self
                    .in_use
                    .iter()
                    .find(|&&(_, s, _)| s == segment)
                    .map_or(0, |&(_, _, m)| m);
                in_use.push_back((segment, max_seq));
                if segment == newest || in_use.len() as u64 >= count {
                    break;
                }
                segment = (segment + 1) % count;
            }
        }
        let start = match self.newest {
            Some((generation, segment)) => DeviceStart {
                segment,
                generation,
                free_segments: sb.segment_count - in_use.len() as u64,
            },
            None => DeviceStart {
                segment: sb.segment_count - 1,
                generation: 0,
                free_segments: sb.segment_count,
            },
        };
        (start, in_use)
    }
}

impl Visit for DeviceScan {
    fn record(&mut self, found: &Found) {
        let h = &found.header;
        if h.kind != RecordKind::Void {
            self.parsing_first_real = Some(self.parsing_first_real.map_or(h.seq, |f| f.min(h.seq)));
        }
        if h.volume_seq > 0 {
            let last = self.volume_seqs.entry(h.volume).or_insert(0);
            *last = (*last).max(h.volume_seq);
        }
        if found.header.seq <= self.after_seq {
            return;
        }
        if self.keep_records {
            self.above.push(*found);
        } else {
            self.above_seqs.push(found.header.seq);
        }
    }

    fn segment(&mut self, s: &SegmentSummary) {
        let first_real = self.parsing_first_real.take();
        if s.generation.is_some() {
            self.first_real.insert(s.segment, first_real);
        }
        self.segments_scanned += 1;
        self.bytes_scanned += s.used_bytes;
        if matches!(s.stop, Stop::BadHeader | Stop::BadPayload) {
            self.torn_tails += 1;
        }
        self.skipped(s);
    }
}

impl DeviceScan {
    /// A segment recovery did not read whole (or did: [`Visit::segment`]); `s.max_seq` may be
    /// a bound rather than the exact highest sequence number.
    fn skipped(&mut self, s: &SegmentSummary) {
        self.last_seq = self.last_seq.max(s.max_seq);
        self.last_ts = self.last_ts.max(s.max_ts);
        if let Some(generation) = s.generation {
            self.newest = self.newest.max(Some((generation, s.segment)));
            if s.max_seq > self.keep_after {
                self.in_use.push((generation, s.segment, s.max_seq));
            }
        }
    }
}

fn absorb(rec: &mut Recovery, mut scan: DeviceScan) {
    rec.segments_scanned += scan.segments_scanned;
    rec.bytes_scanned += scan.bytes_scanned;
    rec.torn_tails += scan.torn_tails;
    rec.last_seq = rec.last_seq.max(scan.last_seq);
    rec.last_ts = rec.last_ts.max(scan.last_ts);
    for (volume, seq) in scan.volume_seqs {
        let last = rec.volume_seqs.entry(volume).or_insert(0);
        *last = (*last).max(seq);
    }
    if rec.records.is_empty() {
        rec.records = scan.above;
    } else {
        rec.records.append(&mut scan.above);
    }
}

/// The sequence numbers between the watermark and `last_seq` missing from `seqs` (sorted,
/// distinct).
fn gaps(seqs: impl Iterator<Item = u64>, after_seq: u64, last_seq: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut expect = after_seq + 1;
    for seq in seqs {
        out.extend(expect..seq);
        expect = seq + 1;
    }
    out.extend(expect..=last_seq);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header-only record of `kind` numbered `seq`, nowhere in particular.
    fn found(kind: RecordKind, seq: u64) -> Found {
        Found {
            header: crate::format::RecordHeader {
                kind,
                volume: 0,
                length: 0,
                seq,
                timestamp_ns: seq,
                offset: 0,
                generation: 1,
                back: crate::LogAddr::NONE,
                span: 80,
                payload_len: 0,
                payload_crc: 0,
                volume_seq: 0,
            },
            addr: crate::LogAddr::NONE,
        }
    }

    /// One device of `segment_count` 64 KiB segments.
    fn superblock(segment_count: u64) -> Superblock {
        Superblock {
            log_id: 1,
            device_index: 0,
            device_count: 1,
            device_bytes: 0,
            segment_bytes: 65536,
            segment_count,
            data_offset: crate::DATA_OFFSET,
            align_bytes: 512,
            created_ns: 0,
        }
    }

    #[test]
    fn gaps_between_and_after() {
        let found = [found(RecordKind::Void, 11), found(RecordKind::Void, 13)];
        assert_eq!(
            gaps(found.iter().map(|f| f.header.seq), 10, 15),
            vec![12, 14, 15]
        );
        assert_eq!(gaps(std::iter::empty(), 10, 10), Vec::<u64>::new());
    }

    fn marks(keep_after: u64, replay_after: u64) -> OpenMarks {
        OpenMarks {
            keep_after,
            replay_after,
            seq_floor: replay_after,
            ts_floor: 0,
        }
    }

    /// A holder below the store (history at 5, the store at 10): the segments with records
    /// above 5 stay in use, but only the records above 10 are kept for replay.
    #[test]
    fn the_lowest_holder_keeps_segments_and_the_store_decides_replay() {
        let mut scan = DeviceScan::new(marks(5, 10), true);
        scan.segment(&summary(0, Some(1), 4, Stop::End));
        scan.segment(&summary(1, Some(2), 8, Stop::End));
        scan.segment(&summary(2, Some(3), 12, Stop::End));
        for seq in [7, 8, 11, 12] {
            scan.record(&found(RecordKind::Write, seq));
        }
        let sb = superblock(4);
        let seqs: Vec<u64> = scan.above.iter().map(|f| f.header.seq).collect();
        assert_eq!(seqs, vec![11, 12]);
        let (start, in_use) = scan.resume(&sb);
        assert_eq!(Vec::from(in_use), vec![(1, 8), (2, 12)]);
        assert_eq!((start.segment, start.free_segments), (2, 2));
    }

    /// A hole showing an older generation's records that a holder still counts as needed
    /// (it was cut past them): the run still starts at the farthest-back segment around the
    /// ring, so the segment between the hole and the newest stays in use (faultsim seed
    /// 217790).
    #[test]
    fn a_hole_of_an_older_generation_does_not_cut_the_run_short() {
        let mut scan = DeviceScan::new(marks(271, 292), true);
        scan.segment(&summary(0, Some(24), 341, Stop::End));
        scan.segment(&summary(1, Some(22), 325, Stop::End));
        scan.segment(&summary(2, Some(20), 292, Stop::End));
        let (start, in_use) = scan.resume(&superblock(3));
        assert_eq!(Vec::from(in_use), vec![(1, 325), (2, 292), (0, 341)]);
        assert_eq!((start.segment, start.free_segments), (0, 0));
    }

    fn summary(segment: u64, generation: Option<u64>, max_seq: u64, stop: Stop) -> SegmentSummary {
        SegmentSummary {
            segment,
            generation,
            stop,
            used_bytes: 512,
            record_count: u64::from(generation.is_some()),
            max_seq,
            max_ts: max_seq * 10,
        }
    }

    /// A wrapped ring: segment 1 is the newest, 3 and 0 the older ones still holding records
    /// above the watermark (10), 2 all at or below it, 4 shows nothing valid.
    #[test]
    fn a_device_resumes_after_its_newest_segment_keeping_those_above_the_watermark() {
        let mut scan = DeviceScan::new(marks(10, 10), true);
        scan.segment(&summary(0, Some(7), 14, Stop::NoRecord));
        scan.segment(&summary(1, Some(8), 18, Stop::BadPayload));
        scan.segment(&summary(2, Some(5), 9, Stop::End));
        scan.segment(&summary(3, Some(6), 12, Stop::BadHeader));
        scan.segment(&summary(4, None, 0, Stop::NoRecord));
        let sb = superblock(5);
        let (start, in_use) = scan.resume(&sb);
        // 4 lies between 3 and 0 in the ring: the writer went through it, so it stays in
        // the run (a hole) and 2 is the one free segment.
        assert_eq!(
            (start.segment, start.generation, start.free_segments),
            (1, 8, 1)
        );
        assert_eq!(Vec::from(in_use), vec![(3, 12), (4, 0), (0, 14), (1, 18)]);
        assert_eq!((scan.last_seq, scan.last_ts, scan.torn_tails), (18, 180, 2));
        assert_eq!((scan.segments_scanned, scan.bytes_scanned), (5, 5 * 512));

        // Segment 2's first batch was lost in the crash (it shows nothing valid) while 3 and
        // 4 landed: the run from 1 (oldest above the watermark) to 4 (newest) stays in use,
        // 2 as a hole, so the writer's next segment is 0, not 1.
        let mut scan = DeviceScan::new(marks(10, 10), true);
        scan.segment(&summary(0, Some(5), 9, Stop::End));
        scan.segment(&summary(1, Some(6), 12, Stop::End));
        scan.segment(&summary(2, None, 0, Stop::NoRecord));
        scan.segment(&summary(3, Some(8), 16, Stop::End));
        scan.segment(&summary(4, Some(9), 18, Stop::BadHeader));
        let (start, in_use) = scan.resume(&sb);
        assert_eq!(
            (start.segment, start.generation, start.free_segments),
            (4, 9, 1)
        );
        assert_eq!(Vec::from(in_use), vec![(1, 12), (2, 0), (3, 16), (4, 18)]);

        let (start, in_use) = DeviceScan::new(marks(0, 0), true).resume(&sb);
        assert_eq!(
            (start.segment, start.generation, start.free_segments),
            (4, 0, 5)
        );
        assert!(in_use.is_empty());
    }
}
