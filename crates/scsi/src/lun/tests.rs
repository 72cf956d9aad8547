use super::*;
use crate::memory::MemoryBackend;

const BS: usize = 512;
const BLOCKS: u64 = 128;

fn lun() -> Lun {
    Lun::new(Arc::new(MemoryBackend::new("T1", BS as u32, BLOCKS)))
}

fn cdb10(opcode: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = opcode;
    crate::wire::put_be(&mut c[2..6], u64::from(lba));
    crate::wire::put_be(&mut c[7..9], u64::from(blocks));
    c
}

fn cdb16(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    crate::wire::put_be(&mut c[2..10], lba);
    crate::wire::put_be(&mut c[10..14], u64::from(blocks));
    c
}

fn run(l: &Lun, cdb: &[u8], data: &[u8]) -> Response {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(l.execute(cdb, data))
}

fn asc(r: &Response) -> Asc {
    assert_eq!(r.status, Status::CheckCondition, "{r:?}");
    r.sense.unwrap().asc
}

#[test]
fn write_then_read_10_and_16() {
    let l = lun();
    let data = vec![0xab; 2 * BS];
    assert_eq!(run(&l, &cdb10(0x2a, 4, 2), &data).status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 4, 2), &[]).data, data);
    assert_eq!(run(&l, &cdb16(0x88, 4, 2), &[]).data, data);
    assert_eq!(run(&l, &cdb10(0x28, 0, 0), &[]).data.len(), 0);
}

#[test]
fn out_of_range_is_lba_out_of_range() {
    let l = lun();
    assert_eq!(
        asc(&run(&l, &cdb10(0x28, 127, 2), &[])),
        Asc::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        asc(&run(&l, &cdb16(0x8a, u64::MAX, 1), &[0; BS])),
        Asc::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        asc(&run(&l, &cdb16(0x91, 200, 1), &[])),
        Asc::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        asc(&run(&l, &cdb10(0x34, 128, 1), &[])),
        Asc::LBA_OUT_OF_RANGE
    );
}

#[test]
fn short_data_out_is_a_length_error() {
    let l = lun();
    assert_eq!(
        asc(&run(&l, &cdb10(0x2a, 0, 2), &[0; BS])),
        Asc::PARAMETER_LIST_LENGTH_ERROR
    );
}

#[test]
fn read_only_refuses_writes() {
    let l = Lun::new(Arc::new(MemoryBackend::new("ro", 512, 16).read_only()));
    let r = run(&l, &cdb10(0x2a, 0, 1), &[0; BS]);
    assert_eq!(r.sense.unwrap().key, SenseKey::DataProtect);
    assert_eq!(asc(&r), Asc::WRITE_PROTECTED);
}

#[test]
fn unknown_opcode_is_invalid_opcode() {
    let r = run(&lun(), &[0x04, 0, 0, 0, 0, 0], &[]);
    assert_eq!(asc(&r), Asc::INVALID_COMMAND_OPERATION_CODE);
}

#[test]
fn read_capacity() {
    let l = lun();
    let d = run(&l, &cdb10(0x25, 0, 0), &[]).data;
    assert_eq!(d, [0, 0, 0, 127, 0, 0, 2, 0]);
    let mut c = cdb16(0x9e, 0, 32);
    c[1] = 0x10;
    let d = run(&l, &c, &[]).data;
    assert_eq!(d.len(), 32);
    assert_eq!(d[7], 127);
    assert_eq!(d[14] & 0xc0, 0xc0);
    assert_eq!(
        asc(&run(&l, &cdb10(0x25, 5, 0), &[])),
        Asc::INVALID_FIELD_IN_CDB
    );
}

#[test]
fn verify_compares_when_asked() {
    let l = lun();
    run(&l, &cdb10(0x2a, 0, 1), &[7; BS]);
    let mut c = cdb10(0x2f, 0, 1);
    assert_eq!(run(&l, &c, &[]).status, Status::Good);
    c[1] = 0x02;
    assert_eq!(run(&l, &c, &[7; BS]).status, Status::Good);
    let mut other = [7u8; BS];
    other[9] = 0;
    let r = run(&l, &c, &other);
    assert_eq!(r.sense.unwrap().key, SenseKey::Miscompare);
    assert_eq!(r.sense.unwrap().information, Some(9));
}

#[test]
fn compare_and_write() {
    let l = lun();
    let mut c = cdb16(0x89, 3, 0);
    c[13] = 1;
    let mut buf = vec![0u8; BS];
    buf.extend(vec![5u8; BS]);
    assert_eq!(run(&l, &c, &buf).status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 3, 1), &[]).data, vec![5; BS]);
    let r = run(&l, &c, &buf);
    assert_eq!(r.sense.unwrap().key, SenseKey::Miscompare);
    assert_eq!(r.sense.unwrap().information, Some(0));
    c[13] = 200;
    assert_eq!(asc(&run(&l, &c, &[])), Asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn unmap_and_lba_status() {
    let l = lun();
    run(&l, &cdb10(0x2a, 0, 4), &[1; 4 * BS]);
    let mut params = vec![0, 22, 0, 16, 0, 0, 0, 0];
    params.extend([0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0]);
    let mut c = [0u8; 10];
    c[0] = 0x42;
    c[8] = params.len() as u8;
    assert_eq!(run(&l, &c, &params).status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 1, 1), &[]).data, vec![0; BS]);
    let mut g = cdb16(0x9e, 1, 0);
    g[1] = 0x12;
    g[13] = 24;
    let d = run(&l, &g, &[]).data;
    assert_eq!(d[20], 1, "deallocated");
    assert_eq!(d[19], 2);
    params[15] = 200;
    assert_eq!(asc(&run(&l, &c, &params)), Asc::LBA_OUT_OF_RANGE);
    g[2..10].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 200]);
    assert_eq!(asc(&run(&l, &g, &[])), Asc::LBA_OUT_OF_RANGE);
}

#[test]
fn write_same_writes_or_unmaps() {
    let l = lun();
    let c = cdb16(0x93, 10, 3);
    assert_eq!(run(&l, &c, &[9; BS]).status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 10, 3), &[]).data, vec![9; 3 * BS]);
    let mut u = c;
    u[1] = 0x08;
    assert_eq!(run(&l, &u, &[0; BS]).status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 10, 3), &[]).data, vec![0; 3 * BS]);
    // With UNMAP set the blocks are unmapped whatever the data-out holds (SBC-3 5.43).
    run(&l, &c, &[9; BS]);
    assert_eq!(run(&l, &u, &[0xff; BS]).status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 10, 3), &[]).data, vec![0; 3 * BS]);
    let mut status = cdb16(0x9e, 10, 24);
    status[1] = 0x12;
    let d = run(&l, &status, &[]).data;
    let run_blocks = crate::wire::be32(&d[16..20]);
    assert_eq!(
        (run_blocks, d[20]),
        (118, 1),
        "deallocated from 10 to the end"
    );
}

#[test]
fn write_same_of_zero_blocks_runs_to_the_end() {
    let l = lun();
    assert_eq!(run(&l, &cdb10(0x41, 120, 0), &[4; BS]).status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 119, 9), &[]).data[..BS], [0; BS]);
    assert_eq!(run(&l, &cdb10(0x28, 120, 8), &[]).data, vec![4; 8 * BS]);
    let mut unmap = cdb16(0x93, 124, 0);
    unmap[1] = 0x08;
    assert_eq!(run(&l, &unmap, &[0; BS]).status, Status::Good);
    assert_eq!(
        run(&l, &cdb10(0x28, 120, 8), &[]).data[4 * BS..],
        [0; 4 * BS]
    );
    assert_eq!(run(&l, &cdb10(0x28, 120, 4), &[]).data, vec![4; 4 * BS]);
    for lba in [BLOCKS, BLOCKS + 1, u64::MAX] {
        let r = run(&l, &cdb16(0x93, lba, 0), &[0; BS]);
        assert_eq!(asc(&r), Asc::LBA_OUT_OF_RANGE, "lba {lba}");
    }
}

#[test]
fn write_same_is_bounded_by_the_maximum_write_same_length() {
    let backend = MemoryBackend::new("big", BS as u32, 20_000);
    let max = u64::from(max_write_same_blocks(&backend.geometry()));
    assert!(max < 20_000);
    let l = Lun::new(Arc::new(backend));
    let ws = |lba: u64, blocks: u32| run(&l, &cdb16(0x93, lba, blocks), &[1; BS]);
    assert_eq!(
        asc(&ws(0, 0)),
        Asc::INVALID_FIELD_IN_CDB,
        "to the end is too long"
    );
    assert_eq!(asc(&ws(20_000 - max - 1, 0)), Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(asc(&ws(0, max as u32 + 1)), Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(ws(20_000 - max, 0).status, Status::Good);
    let last = run(&l, &cdb16(0x88, 19_999, 1), &[]).data;
    assert_eq!(last, vec![1; BS]);
}

#[test]
fn orwrite_ors_into_the_blocks() {
    let l = lun();
    run(&l, &cdb10(0x2a, 6, 2), &[0x0f; 2 * BS]);
    let mut data = vec![0xa0; BS];
    data.extend(vec![0x50; BS]);
    data.extend(vec![0x05; BS]);
    assert_eq!(run(&l, &cdb16(0x8b, 6, 3), &data).status, Status::Good);
    let d = run(&l, &cdb10(0x28, 6, 3), &[]).data;
    assert_eq!(d[..BS], [0xaf; BS]);
    assert_eq!(d[BS..2 * BS], [0x5f; BS]);
    assert_eq!(
        d[2 * BS..],
        [0x05; BS],
        "a deallocated block ORs with zeros"
    );
    let mut fua = cdb16(0x8b, 6, 1);
    fua[1] = 0x18;
    assert_eq!(run(&l, &fua, &[0x10; BS]).status, Status::Good);
    assert_eq!(run(&l, &cdb16(0x8b, 0, 0), &[]).status, Status::Good);
}

#[test]
fn orwrite_errors() {
    let l = lun();
    for lba in [BLOCKS, BLOCKS - 1, u64::MAX] {
        let r = run(&l, &cdb16(0x8b, lba, 2), &[0; 2 * BS]);
        assert_eq!(asc(&r), Asc::LBA_OUT_OF_RANGE, "lba {lba}");
    }
    assert_eq!(
        asc(&run(&l, &cdb16(0x8b, BLOCKS + 1, 0), &[])),
        Asc::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        asc(&run(&l, &cdb16(0x8b, 0, 2), &[0; BS])),
        Asc::PARAMETER_LIST_LENGTH_ERROR
    );
    let mut protect = cdb16(0x8b, 0, 1);
    for orprotect in 1..8u8 {
        protect[1] = orprotect << 5;
        let r = run(&l, &protect, &[0; BS]);
        assert_eq!(asc(&r), Asc::INVALID_FIELD_IN_CDB, "ORPROTECT {orprotect}");
    }
    let max = l.geometry().max_transfer_blocks;
    let big = MemoryBackend::new("big", BS as u32, u64::from(max) * 2);
    let big = Lun::new(Arc::new(big));
    let r = run(&big, &cdb16(0x8b, 0, max + 1), &[]);
    assert_eq!(
        asc(&r),
        Asc::INVALID_FIELD_IN_CDB,
        "beyond the maximum transfer"
    );
    let ro = Lun::new(Arc::new(MemoryBackend::new("ro", 512, 16).read_only()));
    let r = run(&ro, &cdb16(0x8b, 0, 1), &[1; BS]);
    assert_eq!(r.sense.unwrap().key, SenseKey::DataProtect);
}

#[test]
fn write_atomic_writes_within_the_atomic_limit() {
    let l = lun();
    let data = vec![0x6c; 4 * BS];
    assert_eq!(run(&l, &cdb_atomic(9, 4, 0), &data).status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 9, 4), &[]).data, data);
    assert_eq!(run(&l, &cdb_atomic(0, 0, 0), &[]).status, Status::Good);
    for lba in [BLOCKS + 1, 1 << 63, u64::MAX] {
        let r = run(&l, &cdb_atomic(lba, 0, 0), &[]);
        assert_eq!(asc(&r), Asc::LBA_OUT_OF_RANGE, "lba {lba}");
    }
    let r = run(&l, &cdb_atomic(BLOCKS - 1, 2, 0), &[0; 2 * BS]);
    assert_eq!(asc(&r), Asc::LBA_OUT_OF_RANGE);
    let r = run(&l, &cdb_atomic(0, 1, 1), &[0; BS]);
    assert_eq!(
        asc(&r),
        Asc::INVALID_FIELD_IN_CDB,
        "atomic boundaries unsupported"
    );
    let mut protect = cdb_atomic(0, 1, 0);
    protect[1] = 0x20;
    assert_eq!(asc(&run(&l, &protect, &[0; BS])), Asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn write_atomic_refuses_more_than_the_atomic_maximum() {
    let mut small = MemoryBackend::new("small", BS as u32, BLOCKS);
    small = small.with_max_atomic_blocks(2);
    let l = Lun::new(Arc::new(small));
    assert_eq!(
        run(&l, &cdb_atomic(0, 2, 0), &[1; 2 * BS]).status,
        Status::Good
    );
    let r = run(&l, &cdb_atomic(0, 3, 0), &[1; 3 * BS]);
    assert_eq!(asc(&r), Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(
        run(&l, &cdb10(0x28, 2, 1), &[]).data,
        vec![0; BS],
        "nothing written"
    );
    let none = MemoryBackend::new("none", BS as u32, BLOCKS).with_max_atomic_blocks(0);
    let r = run(&Lun::new(Arc::new(none)), &cdb_atomic(0, 1, 0), &[1; BS]);
    assert_eq!(asc(&r), Asc::INVALID_COMMAND_OPERATION_CODE);
}

fn cdb_atomic(lba: u64, blocks: u16, boundary: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9c;
    crate::wire::put_be(&mut c[2..10], lba);
    crate::wire::put_be(&mut c[10..12], u64::from(boundary));
    crate::wire::put_be(&mut c[12..14], u64::from(blocks));
    c
}

#[test]
fn read_defect_data_reports_empty_lists() {
    let l = lun();
    let d = run(&l, &[0x37, 0, 0x18, 0, 0, 0, 0, 0, 32, 0], &[]).data;
    assert_eq!(
        d,
        [0, 0x18, 0, 0],
        "PLISTV, GLISTV, short block format, no defects"
    );
    let d = run(&l, &[0x37, 0, 0x03, 0, 0, 0, 0, 0, 2, 0], &[]).data;
    assert_eq!(d, [0, 0x03], "clipped to the allocation length");
    let mut c12 = [0u8; 12];
    c12[0] = 0xb7;
    c12[1] = 0x14;
    c12[9] = 32;
    assert_eq!(run(&l, &c12, &[]).data, [0, 0x14, 0, 0, 0, 0, 0, 0]);
    let r = run(&l, &[0x37, 0, 0x01, 0, 0, 0, 0, 0, 32, 0], &[]);
    assert_eq!(asc(&r), Asc::INVALID_FIELD_IN_CDB, "reserved format");
}

#[test]
fn read_capacity_16_reports_the_physical_block() {
    let backend = MemoryBackend::new("pb", 512, 64).with_physical_block_size(4096);
    let l = Lun::new(Arc::new(backend));
    let mut c = cdb16(0x9e, 0, 32);
    c[1] = 0x10;
    let d = run(&l, &c, &[]).data;
    assert_eq!(d[13] & 0x0f, 3, "8 logical blocks per physical block");
    assert_eq!((d[14] & 0x3f, d[15]), (0, 0), "lowest aligned LBA 0");
    assert_eq!(run(&lun(), &c, &[]).data[13], 0);
}

#[test]
fn inquiry_report_luns_and_sense() {
    let l = lun();
    let d = run(&l, &[0x12, 0, 0, 0, 36, 0], &[]).data;
    assert_eq!(d.len(), 36);
    let d = run(&l, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0], &[]).data;
    assert_eq!(d, [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let bad = [0xa0, 0, 0x55, 0, 0, 0, 0, 0, 0, 16, 0, 0];
    assert_eq!(asc(&run(&l, &bad, &[])), Asc::INVALID_FIELD_IN_CDB);
    let d = run(&l, &[0x03, 0, 0, 0, 18, 0], &[]).data;
    assert_eq!((d[0], d[2]), (0x70, 0));
    assert_eq!(run(&l, &[0, 0, 0, 0, 0, 0], &[]).status, Status::Good);
    assert_eq!(run(&l, &[0x1b, 0, 0, 0, 1, 0], &[]).status, Status::Good);
    assert_eq!(run(&l, &[0x1e, 0, 0, 0, 1, 0], &[]).status, Status::Good);
}

#[test]
fn data_out_lengths() {
    assert_eq!(data_out_len(&cdb10(0x2a, 0, 3), 512), Some(1536));
    assert_eq!(data_out_len(&cdb10(0x28, 0, 3), 512), Some(0));
    assert_eq!(data_out_len(&cdb16(0x93, 0, 9), 512), Some(512));
    let mut caw = cdb16(0x89, 0, 0);
    caw[13] = 2;
    assert_eq!(data_out_len(&caw, 512), Some(2048));
    assert_eq!(data_out_len(&cdb16(0x8b, 0, 3), 512), Some(1536));
    assert_eq!(data_out_len(&cdb_atomic(0, 2, 0), 512), Some(1024));
    assert_eq!(
        data_out_len(&[0x37, 0, 0, 0, 0, 0, 0, 0, 32, 0], 512),
        Some(0)
    );
}

#[test]
fn truncated_write_writes_whole_blocks_only() {
    let l = lun();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let r = rt.block_on(l.execute_truncated_write(&cdb10(0x2a, 0, 2), &[3; BS + 100]));
    assert_eq!(r.status, Status::Good);
    assert_eq!(run(&l, &cdb10(0x28, 0, 1), &[]).data, vec![3; BS]);
    assert_eq!(run(&l, &cdb10(0x28, 1, 1), &[]).data, vec![0; BS]);
}

#[test]
fn no_room_for_a_write_is_space_allocation_failed_write_protect() {
    let s = backend_sense(BackendError::NoSpace);
    assert_eq!(s.key, SenseKey::DataProtect);
    assert_eq!((s.asc.0, s.asc.1), (0x27, 0x07));
}
