//! Recovery: superblocks, scan, merge by sequence number, gaps, where each device resumes.
//!
//! Decision table (trail-paper.md §2.2, adapted to several devices that finish out of order):
//!
//! | found while scanning                              | decision                                   |
//! |---------------------------------------------------|--------------------------------------------|
//! | record fails header or payload checksum           | end of that segment (a torn, unacked write) |
//! | record of an older generation after newer ones    | end of that segment (stale, earlier pass)  |
//! | record with seq <= the consumers' watermark       | already applied; only its seq/ts count     |
//! | seq missing between watermark and the highest seq | never durable, never acked: voided         |
//! | same seq found twice                              | impossible by construction; first kept     |
//!
//! Each device resumes in a fresh segment after its newest one, so nothing is ever appended after
//! a torn tail. The segments that still hold records above the watermark stay in use.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mariner_disk::Disk;
use mariner_placement::DeviceStart;

use crate::format::Superblock;
use crate::scan::{scan_device, Found, SegmentScan, Stop};
use crate::LogError;

/// What recovery found and decided.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Records above the watermark, in sequence order: what the consumers lack.
    pub records: Vec<Found>,
    /// Sequence numbers above the watermark that never became durable; recovery wrote a void
    /// record for each.
    pub voided: Vec<u64>,
    /// Highest sequence number and timestamp seen anywhere (including the watermark).
    pub last_seq: u64,
    pub last_ts: u64,
    pub segments_scanned: u64,
    pub bytes_scanned: u64,
    /// Segments whose parse stopped at a damaged record (torn tails).
    pub torn_tails: u64,
    pub elapsed: Duration,
}

pub(crate) struct Resume {
    pub starts: Vec<DeviceStart>,
    pub in_use: Vec<VecDeque<(u64, u64)>>,
}

/// Scans every device (in parallel) and merges what it finds.
pub(crate) fn recover(
    devices: &[Arc<dyn Disk>],
    sbs: &[Superblock],
    after_seq: u64,
    after_ts: u64,
) -> Result<(Recovery, Resume), LogError> {
    let start = Instant::now();
    let scans = scan_all(devices, sbs)?;
    let mut rec = Recovery {
        last_seq: after_seq,
        last_ts: after_ts,
        ..Recovery::default()
    };
    let mut resume = Resume {
        starts: Vec::new(),
        in_use: Vec::new(),
    };
    for (scan, sb) in scans.iter().zip(sbs) {
        absorb(&mut rec, scan, after_seq);
        let (start, in_use) = device_resume(scan, sb, after_seq);
        resume.starts.push(start);
        resume.in_use.push(in_use);
    }
    rec.records.sort_by_key(|f| f.header.seq);
    rec.records.dedup_by_key(|f| f.header.seq);
    rec.voided = gaps(&rec.records, after_seq, rec.last_seq);
    rec.elapsed = start.elapsed();
    Ok((rec, resume))
}

fn scan_all(
    devices: &[Arc<dyn Disk>],
    sbs: &[Superblock],
) -> Result<Vec<Vec<SegmentScan>>, LogError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .zip(sbs)
            .enumerate()
            .map(|(dev, (disk, sb))| s.spawn(move || scan_device(disk.as_ref(), dev as u8, sb)))
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

fn absorb(rec: &mut Recovery, scan: &[SegmentScan], after_seq: u64) {
    for seg in scan {
        rec.segments_scanned += 1;
        rec.bytes_scanned += seg.used_bytes;
        if matches!(seg.stop, Stop::BadHeader | Stop::BadPayload) {
            rec.torn_tails += 1;
        }
        for f in &seg.records {
            rec.last_seq = rec.last_seq.max(f.header.seq);
            rec.last_ts = rec.last_ts.max(f.header.timestamp_ns);
            if f.header.seq > after_seq {
                rec.records.push(*f);
            }
        }
    }
}

/// Where a device resumes and which of its segments stay in use, oldest first.
fn device_resume(
    scan: &[SegmentScan],
    sb: &Superblock,
    after_seq: u64,
) -> (DeviceStart, VecDeque<(u64, u64)>) {
    let mut written: Vec<(u64, u64, u64)> = scan
        .iter()
        .filter_map(|s| {
            let max_seq = s.records.iter().map(|f| f.header.seq).max().unwrap_or(0);
            s.generation.map(|g| (g, s.segment, max_seq))
        })
        .collect();
    written.sort_unstable();
    let in_use: VecDeque<(u64, u64)> = written
        .iter()
        .filter(|(_, _, max_seq)| *max_seq > after_seq)
        .map(|&(_, segment, max_seq)| (segment, max_seq))
        .collect();
    let start = match written.last() {
        Some(&(generation, segment, _)) => DeviceStart {
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

fn gaps(records: &[Found], after_seq: u64, last_seq: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut expect = after_seq + 1;
    for f in records {
        out.extend(expect..f.header.seq);
        expect = f.header.seq + 1;
    }
    out.extend(expect..=last_seq);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_between_and_after() {
        let f = |seq| Found {
            header: crate::format::RecordHeader {
                kind: crate::RecordKind::Void,
                volume: 0,
                length: 0,
                seq,
                timestamp_ns: 0,
                offset: 0,
                generation: 1,
                back: crate::LogAddr::NONE,
                span: 80,
                payload_len: 0,
                payload_crc: 0,
            },
            addr: crate::LogAddr::NONE,
        };
        assert_eq!(gaps(&[f(11), f(13)], 10, 15), vec![12, 14, 15]);
        assert_eq!(gaps(&[], 10, 10), Vec::<u64>::new());
    }
}
