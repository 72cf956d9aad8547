use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::cdb::Cdb;
use crate::lun::{data_out_len, Lun};
use crate::memory::MemoryBackend;
use crate::pr::Access;
use crate::sense::Status;

const BS: u32 = 512;
const BLOCKS: u64 = 256;

fn unit() -> MemoryBackend {
    MemoryBackend::new("XCOPY1", BS, BLOCKS)
}

fn nexus(name: &str) -> Nexus {
    Nexus::iscsi(name, [1, 2, 3, 4, 5, 6])
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// An identification CSCD descriptor naming the unit of `g` as a block device.
fn cscd(g: &Geometry) -> [u8; 32] {
    let mut d = [0u8; 32];
    d[0] = CSCD_IDENTIFICATION;
    d[4] = 0x01; // binary
    d[5] = 0x03; // LU association, NAA
    d[7] = 16;
    d[8..24].copy_from_slice(&crate::inquiry::naa_designator(g));
    put_be(&mut d[29..32], u64::from(g.block_size));
    d
}

fn segment(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> [u8; 28] {
    let mut d = [0u8; 28];
    d[0] = SEGMENT_BLOCK_TO_BLOCK;
    put_be(&mut d[2..4], 0x18);
    put_be(&mut d[4..6], u64::from(src));
    put_be(&mut d[6..8], u64::from(dst));
    put_be(&mut d[10..12], u64::from(blocks));
    put_be(&mut d[12..20], src_lba);
    put_be(&mut d[20..28], dst_lba);
    d
}

/// A parameter list: `usage` is the LIST ID USAGE code (0, 2 or 3).
fn list(id: u8, usage: u8, cscds: &[[u8; 32]], segments: &[[u8; 28]]) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    out[0] = id;
    out[1] = usage << 3;
    put_be(&mut out[2..4], (cscds.len() * 32) as u64);
    put_be(&mut out[8..12], (segments.len() * 28) as u64);
    for c in cscds {
        out.extend_from_slice(c);
    }
    for s in segments {
        out.extend_from_slice(s);
    }
    out
}

/// Fills block `i` with the byte `i` (wrapping).
fn fill(b: &MemoryBackend) {
    let data: Vec<u8> = (0..BLOCKS)
        .flat_map(|i| vec![i as u8; BS as usize])
        .collect();
    block_on(b.write(0, bytes::Bytes::from(data.clone()))).unwrap();
}

fn block(b: &MemoryBackend, lba: u64) -> u8 {
    let data = block_on(b.read(lba, 1)).unwrap();
    assert!(data.iter().all(|x| *x == data[0]), "block {lba} is uniform");
    data[0]
}

fn copy(m: &CopyManager, b: &MemoryBackend, n: &Nexus, params: &[u8]) -> Result<(), Sense> {
    block_on(m.extended_copy(b, &b.geometry(), n, params))
}

fn run(b: &MemoryBackend, params: &[u8]) -> Result<(), Sense> {
    copy(&CopyManager::new(), b, &nexus("i"), params)
}

fn parse_err(params: &[u8]) -> Sense {
    CopyList::parse(params, &unit().geometry()).unwrap_err()
}

fn field(s: &Sense) -> u16 {
    s.field.expect("a field pointer").byte
}

#[test]
fn copies_blocks_within_the_unit() {
    let b = unit();
    fill(&b);
    let g = b.geometry();
    let params = list(1, 2, &[cscd(&g)], &[segment(0, 0, 8, 0, 100)]);
    run(&b, &params).unwrap();
    for i in 0..8 {
        assert_eq!(block(&b, 100 + i), i as u8);
    }
    assert_eq!(block(&b, 99), 99);
    assert_eq!(block(&b, 108), 108);
    assert_eq!(block(&b, 0), 0, "the source is unchanged");
}

#[test]
fn segments_run_in_order_between_two_descriptors_of_the_unit() {
    let b = unit();
    fill(&b);
    let g = b.geometry();
    let segments = [segment(0, 1, 4, 0, 50), segment(1, 0, 4, 50, 60)];
    run(&b, &list(0, 3, &[cscd(&g), cscd(&g)], &segments)).unwrap();
    for i in 0..4 {
        assert_eq!(block(&b, 50 + i), i as u8);
        assert_eq!(
            block(&b, 60 + i),
            i as u8,
            "the second segment saw the first's data"
        );
    }
}

#[test]
fn overlapping_ranges_copy_as_if_read_first() {
    for (src, dst) in [(10u64, 15u64), (20, 12), (30, 30)] {
        let b = unit();
        fill(&b);
        let g = b.geometry();
        run(&b, &list(0, 3, &[cscd(&g)], &[segment(0, 0, 20, src, dst)])).unwrap();
        for i in 0..20 {
            assert_eq!(
                block(&b, dst + i),
                (src + i) as u8,
                "{src}->{dst} block {i}"
            );
        }
    }
}

#[test]
fn chunks_are_bounded_by_the_transfer_limit_and_overlap_stays_correct() {
    let b = unit();
    fill(&b);
    let mut g = b.geometry();
    g.max_transfer_blocks = 3;
    assert_eq!(chunk_blocks(&g), 3);
    let params = list(0, 3, &[cscd(&g)], &[segment(0, 0, 50, 5, 7)]);
    let parsed = CopyList::parse(&params, &g).unwrap();
    let mut chunks = Vec::new();
    let s = parsed.segments[0];
    block_on(copy_segment(&b, &g, &parsed, &s, |n| chunks.push(n))).unwrap();
    assert_eq!(chunks.len(), 17);
    assert!(chunks.iter().all(|n| *n <= 3 * u64::from(BS)));
    assert_eq!(chunks.iter().sum::<u64>(), 50 * u64::from(BS));
    for i in 0..50 {
        assert_eq!(block(&b, 7 + i), (5 + i) as u8);
    }
    g.max_transfer_blocks = u32::MAX;
    assert_eq!(chunk_blocks(&g), u64::from(CHUNK_BYTES / BS));
}

#[test]
fn empty_lists_and_lists_without_segments_copy_nothing() {
    let b = unit();
    run(&b, &[]).unwrap();
    run(&b, &list(0, 3, &[cscd(&b.geometry())], &[])).unwrap();
    run(&b, &list(0, 3, &[], &[])).unwrap();
    // Zero blocks: nothing moves, but the target and range are still checked.
    fill(&b);
    run(
        &b,
        &list(0, 3, &[cscd(&b.geometry())], &[segment(0, 0, 0, 1, 2)]),
    )
    .unwrap();
    assert_eq!(block(&b, 2), 2);
}

#[test]
fn truncated_lists_are_parameter_list_length_errors() {
    let g = unit().geometry();
    let full = list(1, 0, &[cscd(&g)], &[segment(0, 0, 1, 0, 1)]);
    for len in [1, 15, 16 + 31, full.len() - 1] {
        let e = parse_err(&full[..len]);
        assert_eq!(
            (e.key, e.asc),
            (SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR)
        );
    }
    assert!(CopyList::parse(&full, &g).is_ok());
    // Padding after the lists is ignored.
    let mut padded = full.clone();
    padded.extend_from_slice(&[0; 4]);
    assert!(CopyList::parse(&padded, &g).is_ok());
}

#[test]
fn descriptor_lists_longer_than_the_maximum_are_length_errors() {
    let g = unit().geometry();
    let segments = vec![segment(0, 0, 1, 0, 1); 146];
    let params = list(1, 0, &[cscd(&g)], &segments);
    assert!(32 + 146 * 28 > MAX_DESCRIPTOR_LIST_LENGTH as usize);
    assert_eq!(parse_err(&params).asc, Asc::PARAMETER_LIST_LENGTH_ERROR);
    let mut huge = list(1, 0, &[], &[]);
    put_be(&mut huge[8..12], u64::from(u32::MAX));
    assert_eq!(parse_err(&huge).asc, Asc::PARAMETER_LIST_LENGTH_ERROR);
}

#[test]
fn descriptor_count_limits() {
    let g = unit().geometry();
    let most = usize::from(MAX_CSCD_DESCRIPTORS);
    let at_limit = list(1, 0, &vec![cscd(&g); most], &[segment(0, 0, 1, 0, 1)]);
    assert!(CopyList::parse(&at_limit, &g).is_ok());
    let over = list(1, 0, &vec![cscd(&g); most + 1], &[segment(0, 0, 1, 0, 1)]);
    let e = parse_err(&over);
    assert_eq!(
        (e.key, e.asc),
        (SenseKey::IllegalRequest, Asc::TOO_MANY_TARGET_DESCRIPTORS)
    );
    let most = usize::from(MAX_SEGMENT_DESCRIPTORS);
    let at_limit = list(1, 0, &[cscd(&g)], &vec![segment(0, 0, 1, 0, 1); most]);
    assert_eq!(
        CopyList::parse(&at_limit, &g).unwrap().segment_count(),
        most
    );
    let over = list(1, 0, &[cscd(&g)], &vec![segment(0, 0, 1, 0, 1); most + 1]);
    assert_eq!(parse_err(&over).asc, Asc::TOO_MANY_SEGMENT_DESCRIPTORS);
}

#[test]
fn unsupported_descriptor_types() {
    let g = unit().geometry();
    let mut fc = cscd(&g);
    fc[0] = 0xe0;
    let e = parse_err(&list(1, 0, &[cscd(&g), fc], &[segment(0, 0, 1, 0, 1)]));
    assert_eq!(
        (e.key, e.asc),
        (
            SenseKey::IllegalRequest,
            Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE
        )
    );
    assert_eq!(field(&e), 48);
    // A stream-to-stream segment (type 0x03, 20 bytes).
    let mut params = list(1, 0, &[cscd(&g)], &[]);
    put_be(&mut params[8..12], 20);
    let mut s = [0u8; 20];
    s[0] = 0x03;
    s[3] = 16;
    params.extend_from_slice(&s);
    let e = parse_err(&params);
    assert_eq!(e.asc, Asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE);
    assert_eq!(field(&e), 48);
}

#[test]
fn malformed_fields_point_at_themselves() {
    let g = unit().geometry();
    let ok = segment(0, 0, 1, 0, 1);
    let e = parse_err(&list(1, 1, &[cscd(&g)], &[ok]));
    assert_eq!(
        (e.asc, field(&e)),
        (Asc::INVALID_FIELD_IN_PARAMETER_LIST, 1)
    );
    let e = parse_err(&list(1, 3, &[cscd(&g)], &[ok]));
    assert_eq!(
        (e.asc, field(&e)),
        (Asc::INVALID_FIELD_IN_PARAMETER_LIST, 0)
    );
    let mut odd = list(1, 0, &[cscd(&g)], &[ok]);
    put_be(&mut odd[2..4], 31);
    assert_eq!(field(&parse_err(&odd)), 2);
    let mut inline = list(1, 0, &[cscd(&g)], &[ok]);
    put_be(&mut inline[12..16], 4);
    inline.extend_from_slice(&[0; 4]);
    let e = parse_err(&inline);
    assert_eq!((e.asc, field(&e)), (Asc::INLINE_DATA_LENGTH_EXCEEDED, 12));
    let mut long = cscd(&g);
    long[7] = 17;
    assert_eq!(field(&parse_err(&list(1, 0, &[long], &[ok]))), 16 + 7);
    let mut block_len = cscd(&g);
    put_be(&mut block_len[29..32], 4096);
    assert_eq!(field(&parse_err(&list(1, 0, &[block_len], &[ok]))), 16 + 29);
    let mut seg_len = ok;
    seg_len[3] = 0x14;
    assert_eq!(
        field(&parse_err(&list(1, 0, &[cscd(&g)], &[seg_len]))),
        48 + 2
    );
    assert_eq!(
        field(&parse_err(&list(
            1,
            0,
            &[cscd(&g)],
            &[segment(0x800, 0, 1, 0, 1)]
        ))),
        52
    );
    assert_eq!(
        field(&parse_err(&list(
            1,
            0,
            &[cscd(&g)],
            &[segment(0, 0xffff, 1, 0, 1)]
        ))),
        54
    );
    // A descriptor running past SEGMENT DESCRIPTOR LIST LENGTH.
    let mut short = list(1, 0, &[cscd(&g)], &[ok]);
    put_be(&mut short[8..12], 27);
    assert_eq!(field(&parse_err(&short)), 8);
}

#[test]
fn lu_id_type_and_nul_are_ignored() {
    let b = unit();
    fill(&b);
    let mut d = cscd(&b.geometry());
    d[1] = 0x80 | 0x20; // LU ID TYPE 10b (reserved), NUL
    run(&b, &list(1, 0, &[d], &[segment(0, 0, 2, 3, 40)])).unwrap();
    assert_eq!(block(&b, 41), 4);
}

#[test]
fn unreachable_targets_abort_the_copy() {
    let b = unit();
    let g = b.geometry();
    let seg = segment(0, 1, 1, 0, 1);
    let e = run(&b, &list(1, 0, &[cscd(&g)], &[seg])).unwrap_err();
    assert_eq!(
        (e.key, e.asc),
        (SenseKey::CopyAborted, Asc::COPY_TARGET_DEVICE_NOT_REACHABLE)
    );
    assert_eq!(field(&e), 48 + 6);
    // Another unit's designator (another volume of the node, say).
    let other = cscd(&MemoryBackend::new("OTHER", BS, BLOCKS).geometry());
    let e = run(&b, &list(1, 0, &[cscd(&g), other], &[seg])).unwrap_err();
    assert_eq!(e.asc, Asc::COPY_TARGET_DEVICE_NOT_REACHABLE);
    let mut t10 = cscd(&g);
    t10[5] = 0x01; // a T10 vendor ID designator is not matched
    let e = run(&b, &list(1, 0, &[cscd(&g), t10], &[seg])).unwrap_err();
    assert_eq!(e.asc, Asc::COPY_TARGET_DEVICE_NOT_REACHABLE);
    let mut tape = cscd(&g);
    tape[1] = 0x01;
    let e = run(&b, &list(1, 0, &[cscd(&g), tape], &[seg])).unwrap_err();
    assert_eq!(
        (e.key, e.asc),
        (
            SenseKey::CopyAborted,
            Asc::INCORRECT_COPY_TARGET_DEVICE_TYPE
        )
    );
}

#[test]
fn ranges_beyond_the_capacity_abort_the_copy_after_earlier_segments() {
    let b = unit();
    fill(&b);
    let g = b.geometry();
    let m = CopyManager::new();
    let n = nexus("i");
    let segments = [
        segment(0, 0, 2, 0, 200),
        segment(0, 0, 2, 0, BLOCKS - 1),
        segment(0, 0, 1, 0, 210),
    ];
    let e = copy(&m, &b, &n, &list(7, 0, &[cscd(&g)], &segments)).unwrap_err();
    assert_eq!(
        (e.key, e.asc),
        (SenseKey::CopyAborted, Asc::NO_ADDITIONAL_SENSE)
    );
    assert_eq!(field(&e), 16 + 32 + 28 + 20);
    assert_eq!(block(&b, 201), 1, "the first segment was copied");
    assert_eq!(block(&b, 210), 210, "the third was not");
    let status = m.receive(&g, &n, SA_COPY_STATUS, 7).unwrap();
    assert_eq!(status[4], STATUS_FAILED);
    assert_eq!(be16(&status[5..7]), 1);
    assert_eq!(be32(&status[8..12]), 2 * BS);
    let e = run(
        &b,
        &list(1, 0, &[cscd(&g)], &[segment(0, 0, 1, u64::MAX, 0)]),
    )
    .unwrap_err();
    assert_eq!(field(&e), 48 + 12);
}

#[test]
fn read_only_units_refuse_copies_with_segments() {
    let b = unit().read_only();
    let g = b.geometry();
    assert_eq!(
        run(&b, &list(1, 0, &[cscd(&g)], &[segment(0, 0, 1, 0, 1)])),
        Err(Sense::write_protected())
    );
    assert!(run(&b, &list(1, 0, &[cscd(&g)], &[])).is_ok());
}

#[test]
fn copy_status_is_per_nexus_and_reported_once() {
    let b = unit();
    let g = b.geometry();
    let m = CopyManager::new();
    let (a, other) = (nexus("a"), nexus("b"));
    let e = m.receive(&g, &a, SA_COPY_STATUS, 1).unwrap_err();
    assert_eq!((e.asc, field(&e)), (Asc::INVALID_FIELD_IN_CDB, 2));
    copy(
        &m,
        &b,
        &a,
        &list(1, 0, &[cscd(&g)], &[segment(0, 0, 4, 0, 8)]),
    )
    .unwrap();
    assert!(
        m.receive(&g, &other, SA_COPY_STATUS, 1).is_err(),
        "another nexus"
    );
    let status = m.receive(&g, &a, SA_COPY_STATUS, 1).unwrap();
    assert_eq!(status.len(), 12);
    assert_eq!(be32(&status[0..4]), 8);
    assert_eq!(status[4], STATUS_COMPLETED);
    assert_eq!(be16(&status[5..7]), 1);
    assert_eq!(status[7], 0, "bytes");
    assert_eq!(be32(&status[8..12]), 4 * BS);
    assert!(
        m.receive(&g, &a, SA_COPY_STATUS, 1).is_err(),
        "reported once"
    );
    // LIST ID USAGE 10b is tracked too; 11b is not.
    copy(
        &m,
        &b,
        &a,
        &list(2, 2, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]),
    )
    .unwrap();
    assert!(m.receive(&g, &a, SA_COPY_STATUS, 2).is_ok());
    copy(
        &m,
        &b,
        &a,
        &list(0, 3, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]),
    )
    .unwrap();
    assert!(m.receive(&g, &a, SA_COPY_STATUS, 0).is_err());
    assert!(
        m.receive(&g, &a, 0x01, 0).is_err(),
        "RECEIVE DATA is not served"
    );
}

#[test]
fn running_list_identifiers_are_unique_per_nexus() {
    let b = unit();
    let g = b.geometry();
    let m = CopyManager::new();
    let (a, other) = (nexus("a"), nexus("b"));
    let params = list(5, 0, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]);
    let running = CopyList::parse(&params, &g).unwrap();
    m.begin(&a, &running).unwrap();
    let e = copy(&m, &b, &a, &params).unwrap_err();
    assert_eq!(
        (e.key, e.asc),
        (SenseKey::IllegalRequest, Asc::OPERATION_IN_PROGRESS)
    );
    copy(&m, &b, &other, &params).unwrap();
    let status = m.receive(&g, &a, SA_COPY_STATUS, 5).unwrap();
    assert_eq!(status[4], STATUS_IN_PROGRESS);
    assert!(
        m.receive(&g, &a, SA_COPY_STATUS, 5).is_ok(),
        "a running copy stays"
    );
}

#[test]
fn the_status_table_is_bounded() {
    let b = unit();
    let g = b.geometry();
    let m = CopyManager::new();
    let a = nexus("a");
    for id in 0..(MAX_TRACKED_LISTS as u8 + 4) {
        copy(
            &m,
            &b,
            &a,
            &list(id, 0, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]),
        )
        .unwrap();
    }
    assert_eq!(m.lists().entries.len(), MAX_TRACKED_LISTS);
    assert!(
        m.receive(&g, &a, SA_COPY_STATUS, 3).is_err(),
        "the oldest were dropped"
    );
    assert!(m.receive(&g, &a, SA_COPY_STATUS, 4).is_ok());
    // Every slot running: a new tracked copy cannot be accepted.
    let m = CopyManager::new();
    for id in 0..MAX_TRACKED_LISTS as u8 {
        let params = list(id, 0, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]);
        m.begin(&a, &CopyList::parse(&params, &g).unwrap()).unwrap();
    }
    let params = list(200, 0, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]);
    assert_eq!(
        copy(&m, &b, &a, &params).unwrap_err().asc,
        Asc::INSUFFICIENT_RESOURCES
    );
    // Untracked copies still run.
    copy(
        &m,
        &b,
        &a,
        &list(0, 3, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]),
    )
    .unwrap();
}

#[test]
fn forget_drops_finished_copies() {
    let b = unit();
    let g = b.geometry();
    let m = CopyManager::new();
    let (a, other) = (nexus("a"), nexus("b"));
    for n in [&a, &other] {
        copy(
            &m,
            &b,
            n,
            &list(1, 0, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]),
        )
        .unwrap();
    }
    m.forget(Some(&a));
    assert!(m.receive(&g, &a, SA_COPY_STATUS, 1).is_err());
    copy(
        &m,
        &b,
        &a,
        &list(1, 0, &[cscd(&g)], &[segment(0, 0, 1, 0, 8)]),
    )
    .unwrap();
    m.forget(None);
    assert!(m.receive(&g, &a, SA_COPY_STATUS, 1).is_err());
    assert!(m.receive(&g, &other, SA_COPY_STATUS, 1).is_err());
}

#[test]
fn large_transfer_counts_use_larger_units() {
    let p = Progress {
        segments: 3,
        bytes: 5 << 30,
    };
    let d = copy_status_data(State::Completed, p);
    assert_eq!(d[7], 1, "kibibytes");
    assert_eq!(be32(&d[8..12]), 5 << 20);
    let d = copy_status_data(
        State::Completed,
        Progress {
            segments: 0,
            bytes: u64::MAX,
        },
    );
    assert_eq!(d[7], 4, "tebibytes");
    assert_eq!(u64::from(be32(&d[8..12])), u64::MAX >> 40);
}

#[test]
fn operating_parameters_report_the_parser_limits() {
    let g = unit().geometry();
    let d = operating_parameters(&g);
    assert_eq!(be32(&d[0..4]) as usize, d.len() - 4);
    assert_eq!(d[4] & 1, 1, "SNLID");
    assert_eq!(be16(&d[8..10]), MAX_CSCD_DESCRIPTORS);
    assert_eq!(be16(&d[10..12]), MAX_SEGMENT_DESCRIPTORS);
    assert_eq!(be32(&d[12..16]), MAX_DESCRIPTOR_LIST_LENGTH);
    assert_eq!(be32(&d[16..20]), MAX_SEGMENT_BLOCKS * BS);
    assert_eq!(be32(&d[20..24]), MAX_INLINE_DATA_LENGTH);
    assert_eq!(usize::from(be16(&d[34..36])), MAX_TRACKED_LISTS);
    assert_eq!(1u32 << d[37], BS, "data segment granularity");
    assert_eq!(usize::from(d[43]), IMPLEMENTED_DESCRIPTORS.len());
    assert_eq!(&d[44..], &IMPLEMENTED_DESCRIPTORS);
}

/// Walks the VPD page 0x8F descriptors into (type, body) pairs.
fn tpc_descriptors(body: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < body.len() {
        let len = usize::from(be16(&body[pos + 2..pos + 4]));
        assert_eq!(len % 4, 0);
        out.push((
            be16(&body[pos..pos + 2]),
            body[pos + 4..pos + 4 + len].to_vec(),
        ));
        pos += 4 + len;
    }
    assert_eq!(pos, body.len());
    out
}

#[test]
fn third_party_copy_vpd_page_matches_the_operating_parameters() {
    let g = unit().geometry();
    let page = crate::inquiry::inquiry(&g, true, 0x8f).unwrap();
    assert_eq!(page[1], 0x8f);
    assert_eq!(usize::from(be16(&page[2..4])), page.len() - 4);
    let descriptors = tpc_descriptors(&page[4..]);
    let types: Vec<u16> = descriptors.iter().map(|(t, _)| *t).collect();
    assert_eq!(types, [0x0001, 0x0004, 0x0008, 0x8001]);
    let commands = &descriptors[0].1;
    assert_eq!(
        &commands[1..1 + usize::from(commands[0])],
        &[0x83, 1, 0, 0x84, 2, 0, 3]
    );
    let params = &descriptors[1].1;
    assert_eq!(params.len(), 28);
    assert_eq!(be16(&params[4..6]), MAX_CSCD_DESCRIPTORS);
    assert_eq!(be16(&params[6..8]), MAX_SEGMENT_DESCRIPTORS);
    assert_eq!(be32(&params[8..12]), MAX_DESCRIPTOR_LIST_LENGTH);
    assert_eq!(be32(&params[12..16]), MAX_INLINE_DATA_LENGTH);
    let supported = &descriptors[2].1;
    assert_eq!(
        &supported[1..1 + usize::from(supported[0])],
        &IMPLEMENTED_DESCRIPTORS
    );
    let general = &descriptors[3].1;
    assert_eq!(general.len(), 32);
    assert_eq!(be32(&general[8..12]), MAX_SEGMENT_BLOCKS * BS);
    let standard = crate::inquiry::inquiry(&g, false, 0).unwrap();
    assert_eq!(standard[5] & 0x08, 0x08, "3PC");
    assert!(crate::inquiry::VPD_PAGES.contains(&0x8f));
}

fn cdb(opcode: u8, service_action: u8, list_id: u8, len: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[1] = service_action;
    c[2] = list_id;
    put_be(&mut c[10..14], u64::from(len));
    c
}

#[test]
fn commands_decode_and_run_through_the_lun() {
    let backend = Arc::new(unit());
    fill(&backend);
    let g = backend.geometry();
    let lun = Lun::new(backend.clone());
    let params = list(9, 0, &[cscd(&g)], &[segment(0, 0, 3, 1, 70)]);
    let xcopy = cdb(0x83, 0, 0, params.len() as u32);
    assert_eq!(data_out_len(&xcopy, BS), Some(params.len() as u64));
    assert_eq!(Access::of(&Cdb::parse(&xcopy).unwrap()), Access::Write);
    let r = block_on(lun.execute(&xcopy, &params));
    assert_eq!(r.status, Status::Good, "{r:?}");
    assert_eq!(block(&backend, 72), 3);
    let status = cdb(0x84, 0, 9, 8);
    assert_eq!(Access::of(&Cdb::parse(&status).unwrap()), Access::Read);
    let r = block_on(lun.execute(&status, &[]));
    assert_eq!(r.data.len(), 8, "clipped to the allocation length");
    assert_eq!(r.data[4], STATUS_COMPLETED);
    let r = block_on(lun.execute(&cdb(0x84, 3, 0, 1024), &[]));
    assert_eq!(r.data, operating_parameters(&g));
    // The parameter list shorter than PARAMETER LIST LENGTH says.
    let r = block_on(lun.execute(&xcopy, &params[..20]));
    assert_eq!(r.sense.unwrap().asc, Asc::PARAMETER_LIST_LENGTH_ERROR);
    for (opcode, sa) in [
        (0x83, 0x01),
        (0x83, 0x1c),
        (0x84, 0x01),
        (0x84, 0x04),
        (0x84, 0x05),
    ] {
        let e = Cdb::parse(&cdb(opcode, sa, 0, 0)).unwrap_err();
        assert_eq!(
            (e.asc, field(&e)),
            (Asc::INVALID_FIELD_IN_CDB, 1),
            "{opcode:#x}/{sa:#x}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// Arbitrary lists behind a plausible header never panic and never copy outside the unit.
    #[test]
    fn arbitrary_lists_never_panic(
        id in any::<u8>(),
        flags in any::<u8>(),
        cscd_len in 0u16..200,
        segment_len in 0u32..300,
        body in proptest::collection::vec(any::<u8>(), 0..600),
        valid_cscd in any::<bool>(),
    ) {
        let b = MemoryBackend::new("P", BS, 64);
        let mut params = vec![0u8; 16];
        params[0] = id;
        params[1] = flags;
        put_be(&mut params[2..4], u64::from(cscd_len));
        put_be(&mut params[8..12], u64::from(segment_len));
        if valid_cscd {
            params.extend_from_slice(&cscd(&b.geometry()));
        }
        params.extend_from_slice(&body);
        let _ = run(&b, &params);
    }
}

/// What a list of (src, dst, blocks, src_lba, dst_lba) segments does to `blocks`, given
/// `targets` CSCDs that all name the unit: segments in order, stopping at the first one that
/// names a missing descriptor or leaves the unit.
fn model(blocks: &mut [u8], targets: u16, segments: &[(u16, u16, u16, u64, u64)]) -> bool {
    for &(src, dst, n, from, to) in segments {
        let n = u64::from(n);
        let len = blocks.len() as u64;
        if src >= targets || dst >= targets || from + n > len || to + n > len {
            return false;
        }
        let (from, to, n) = (from as usize, to as usize, n as usize);
        blocks.copy_within(from..from + n, to);
    }
    true
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    /// Copies agree with a model of overlapping block moves, whatever the chunk size.
    #[test]
    fn copies_match_a_model(
        targets in 1u16..3,
        segments in proptest::collection::vec(
            (0u16..3, 0u16..3, 0u16..40, 0u64..60, 0u64..60), 0..6),
        max_transfer in 1u32..9,
    ) {
        let b = MemoryBackend::new("M", BS, 64);
        let data: Vec<u8> = (0..64u64).flat_map(|i| vec![i as u8; BS as usize]).collect();
        block_on(b.write(0, bytes::Bytes::from(data.clone()))).unwrap();
        let mut g = b.geometry();
        g.max_transfer_blocks = max_transfer;
        let descriptors: Vec<[u8; 28]> = segments
            .iter()
            .map(|&(s, d, n, from, to)| segment(s, d, n, from, to))
            .collect();
        let params = list(0, 3, &vec![cscd(&g); usize::from(targets)], &descriptors);
        let result = block_on(CopyManager::new().extended_copy(&b, &g, &nexus("m"), &params));
        let mut expected: Vec<u8> = (0..64u8).collect();
        let ok = model(&mut expected, targets, &segments);
        prop_assert_eq!(result.is_ok(), ok);
        if let Err(e) = result {
            prop_assert_eq!(e.key, SenseKey::CopyAborted);
        }
        let actual: Vec<u8> = (0..64).map(|lba| block(&b, lba)).collect();
        prop_assert_eq!(actual, expected);
    }
}

/// The EXTENDED COPY seeds of the scsi_cdb fuzz corpus reach the copy (they name the fuzz
/// target's memory unit) rather than stopping at the first check.
#[test]
fn fuzz_corpus_seeds_reach_the_copy_manager() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/scsi_cdb");
    let expected = [
        ("xcopy_simple", None),
        ("xcopy_overlap_two_segments", None),
        ("receive_copy_results_op_params", None),
        (
            "xcopy_unreachable_target",
            Some(Asc::COPY_TARGET_DEVICE_NOT_REACHABLE),
        ),
        (
            "xcopy_unsupported_cscd",
            Some(Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE),
        ),
        ("xcopy_beyond_capacity", Some(Asc::NO_ADDITIONAL_SENSE)),
        (
            "receive_copy_results_status",
            Some(Asc::INVALID_FIELD_IN_CDB),
        ),
    ];
    for (name, asc) in expected {
        let data = std::fs::read(dir.join(name)).unwrap();
        let (cdb, data_out) = data.split_at(16);
        let lun = Lun::new(Arc::new(MemoryBackend::new("fuzz", 512, 64)));
        let r = block_on(lun.execute(cdb, data_out));
        assert_eq!(r.sense.map(|s| s.asc), asc, "{name}");
    }
}

#[test]
fn report_supported_operation_codes_lists_the_copy_commands() {
    let one = |opcode: u8, sa: u16| {
        let cdb = Cdb::ReportSupportedOpcodes {
            rctd: false,
            options: 2,
            opcode,
            service_action: sa,
            alloc: 64,
        };
        crate::opcodes::report(&cdb).unwrap()
    };
    for (opcode, sa) in [(0x83, 0x00), (0x84, 0x00), (0x84, 0x03)] {
        let d = one(opcode, sa);
        assert_eq!(d[1] & 0x07, 3, "{opcode:#x}/{sa:#x} supported");
        assert_eq!((d[4], u16::from(d[5])), (opcode, sa));
    }
    for (opcode, sa) in [(0x83, 0x01), (0x84, 0x01), (0x84, 0x04)] {
        assert_eq!(
            one(opcode, sa)[1] & 0x07,
            1,
            "{opcode:#x}/{sa:#x} not supported"
        );
    }
}

#[test]
fn a_list_without_segments_still_reports_its_status() {
    let b = unit();
    let g = b.geometry();
    let m = CopyManager::new();
    let a = nexus("a");
    copy(&m, &b, &a, &list(3, 0, &[cscd(&g)], &[])).unwrap();
    let status = m.receive(&g, &a, SA_COPY_STATUS, 3).unwrap();
    assert_eq!((status[4], be16(&status[5..7])), (STATUS_COMPLETED, 0));
}
