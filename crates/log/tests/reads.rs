#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Reading records back: a run of them with one read, several near each other, parts of one.

mod support;

use std::sync::Arc;

use mariner_disk::{Disk, MemDisk};
use mariner_log::{Entry, Log, LogError};
use support::*;

/// Parts of records, as history reads old versions: a small record whole (its header and
/// payload in one read), the start and the middle of a large one, and the refusals — another
/// record's numbers are `Gone`, a part the record does not cover (before it, across its end,
/// longer than it, also where the joint read took more than the record) is `Corrupt`.
#[test]
fn parts_of_records_come_back_and_wrong_ones_are_refused() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(1 << 20))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let small = append_sync(&log, Entry::write(3, 8192, payload(1, 4096))).unwrap();
    let big = append_sync(&log, Entry::write(3, 1 << 20, payload(2, 48 * 1024))).unwrap();
    let want_big = payload(2, 48 * 1024);
    let mut out = vec![0u8; 4096];
    log.read_part(small.addr, 3, small.volume_seq, 8192, &mut out)
        .unwrap();
    assert_eq!(out, payload(1, 4096).to_vec());
    // The first 512 bytes of the small record, and its last 512 (not its payload's start).
    let mut part = vec![0u8; 512];
    log.read_part(small.addr, 3, small.volume_seq, 8192, &mut part)
        .unwrap();
    assert_eq!(part, payload(1, 4096)[..512].to_vec());
    log.read_part(small.addr, 3, small.volume_seq, 8192 + 3584, &mut part)
        .unwrap();
    assert_eq!(part, payload(1, 4096)[3584..].to_vec());
    // The large record's start (one read with its header), its middle and its end.
    for (at, len) in [
        (0usize, 4096usize),
        (0, 48 * 1024),
        (20_480, 8192),
        (45_056, 4096),
    ] {
        let mut got = vec![0u8; len];
        log.read_part(big.addr, 3, big.volume_seq, (1 << 20) + at as u64, &mut got)
            .unwrap();
        assert_eq!(
            got,
            want_big[at..at + len].to_vec(),
            "part at {at}, {len} bytes"
        );
    }
    // Another volume, another record's number: the record is not the one asked for. Parts
    // the record does not cover, before it, across its end, longer than it: corrupt.
    type Refused = fn(&Result<(), LogError>) -> bool;
    let gone: Refused = |r| matches!(r, Err(LogError::Gone { .. }));
    let corrupt: Refused = |r| matches!(r, Err(LogError::Corrupt { .. }));
    let refusals = [
        (small.addr, 4, small.volume_seq, 8192, 4096, gone),
        (small.addr, 3, big.volume_seq, 8192, 4096, gone),
        (small.addr, 3, small.volume_seq, 4096, 4096, corrupt),
        (small.addr, 3, small.volume_seq, 8704, 4096, corrupt),
        (small.addr, 3, small.volume_seq, 8192, 8192, corrupt),
        (big.addr, 3, big.volume_seq, 1 << 20, 60 << 10, corrupt),
    ];
    for (addr, volume, seq, at, len, refused) in refusals {
        let read = log.read_part(addr, volume, seq, at, &mut vec![0; len]);
        assert!(
            refused(&read),
            "volume {volume}, #{seq}, part at {at}, {len} bytes: {read:?}"
        );
    }
}

/// Records appended one after another lie back to back (each span leads to the next): one
/// read brings them all back, verified; a wrong sequence number says the space was reused and
/// a damaged payload is reported as corrupt.
#[test]
fn records_that_follow_each_other_come_back_with_one_read() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(1 << 20))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let sizes = [4096usize, 512, 8192, 1024];
    let acked: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| append_sync(&log, Entry::write(1, 0, payload(i as u64, len))).unwrap())
        .collect();
    let last = acked.last().unwrap();
    let len = last.addr.offset() - acked[0].addr.offset()
        + mariner_log::RECORD_HEADER_LEN as u64
        + *sizes.last().unwrap() as u64;
    let seqs: Vec<u64> = acked.iter().map(|a| a.seq).collect();
    let mut buf = Vec::new();
    let got = log
        .read_following(acked[0].addr, &seqs, len, &mut buf)
        .unwrap();
    assert_eq!(got.len(), sizes.len());
    for (i, ((header, range), a)) in got.iter().zip(&acked).enumerate() {
        assert_eq!(header.seq, a.seq);
        assert_eq!(&buf[range.clone()], &payload(i as u64, sizes[i])[..]);
    }
    let mut wrong = seqs.clone();
    wrong[2] += 100;
    assert!(matches!(
        log.read_following(acked[0].addr, &wrong, len, &mut buf),
        Err(LogError::Gone { .. })
    ));
    // A length that stops inside the third payload is caught.
    assert!(matches!(
        log.read_following(acked[0].addr, &seqs[..3], len - 9000, &mut buf),
        Err(LogError::Corrupt { .. })
    ));
    // Flip a payload byte of the third record on the device.
    let at = acked[2].addr.offset() + mariner_log::RECORD_HEADER_LEN as u64 + 10;
    let mut b = [0u8; 1];
    devs[0].read_at(&mut b, at).unwrap();
    b[0] ^= 0xff;
    devs[0].write_at(&b, at).unwrap();
    assert!(matches!(
        log.read_following(acked[0].addr, &seqs, len, &mut buf),
        Err(LogError::Corrupt { .. })
    ));
}

/// Records read together by their addresses, skipping what lies between: each comes back
/// verified on its own, a reused or damaged one with its own error beside the good ones, and
/// a list out of order or wider than one read is refused.
#[test]
fn nearby_records_come_back_with_one_read_each_verified_alone() {
    let devs: Vec<Arc<dyn Disk>> = vec![Arc::new(MemDisk::new(1 << 20))];
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    let (log, _) = open(&devs, 0).unwrap();
    let sizes = [4096usize, 512, 8192, 1024, 2048];
    let acked: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| append_sync(&log, Entry::write(1, 0, payload(i as u64, len))).unwrap())
        .collect();
    // The first, third and fifth, not what lies between.
    let pick = [0usize, 2, 4];
    let mut asked: Vec<_> = pick
        .iter()
        .map(|&i| (acked[i].addr, acked[i].seq, sizes[i] as u32))
        .collect();
    let mut buf = Vec::new();
    let got = log.read_near(&asked, &mut buf).unwrap();
    assert_eq!(got.len(), pick.len());
    for (r, &i) in got.iter().zip(&pick) {
        let (header, range) = r.as_ref().unwrap();
        assert_eq!(header.seq, acked[i].seq);
        assert_eq!(&buf[range.clone()], &payload(i as u64, sizes[i])[..]);
    }
    // A wrong sequence number (the space reused) and a wrong length fail that record only.
    asked[1].1 += 100;
    asked[2].2 += 1;
    let got = log.read_near(&asked, &mut buf).unwrap();
    assert!(got[0].is_ok());
    assert!(matches!(got[1], Err(LogError::Gone { .. })));
    assert!(matches!(got[2], Err(LogError::Corrupt { .. })));
    asked[1].1 -= 100;
    asked[2].2 -= 1;
    // A damaged payload, likewise.
    let at = acked[2].addr.offset() + mariner_log::RECORD_HEADER_LEN as u64 + 10;
    let mut b = [0u8; 1];
    devs[0].read_at(&mut b, at).unwrap();
    b[0] ^= 0xff;
    devs[0].write_at(&b, at).unwrap();
    let got = log.read_near(&asked, &mut buf).unwrap();
    assert!(got[0].is_ok() && got[2].is_ok());
    assert!(matches!(got[1], Err(LogError::Corrupt { .. })));
    // Out of order, or more than one read takes: refused whole.
    asked.swap(0, 1);
    assert!(log.read_near(&asked, &mut buf).is_err());
    assert!(log.read_near(&[], &mut buf).unwrap().is_empty());
    let huge = [(acked[0].addr, acked[0].seq, u32::MAX)];
    assert!(matches!(
        log.read_near(&huge, &mut buf),
        Err(LogError::TooLarge { .. })
    ));
}
