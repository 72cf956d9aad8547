//! Byte-granular I/O on a volume of 512-byte blocks, through the front ends' own interfaces
//! (`mariner_nbd::Export` for NBD, `mariner_scsi::BlockBackend` for iSCSI): reads and writes
//! that start or end inside a block, trims and write-zeroes of partial blocks, and partial-block
//! writes racing other writers of the same block. Each test checks against a model and again
//! after the node is shut down and reopened (the records replayed from the log).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use bytesize::ByteSize;
use mariner_nbd::{Export, ExportError};
use mariner_node::iscsi::ScsiDisk;
use mariner_node::nbd::NbdExport;
use mariner_node::volume::Volume;
use mariner_node::{Config, Node};
use mariner_scsi::BlockBackend;

const VOLUME_BYTES: u64 = 4 << 20;
const BLOCK: u64 = 512;

/// The volume as NBD serves it.
fn nbd(vol: &Arc<Volume>) -> NbdExport<Volume> {
    NbdExport(Arc::clone(vol))
}

fn open(dir: &Path) -> (Arc<Node>, Arc<Volume>) {
    let mut cfg = Config {
        data: dir.join("data"),
        ..Config::default()
    };
    cfg.log.file_size = ByteSize::mib(16);
    cfg.volume.default_size = ByteSize::b(VOLUME_BYTES);
    let node = Node::open(cfg).unwrap();
    let vol = node.volume("vol0").unwrap();
    (node, vol)
}

/// Deterministic bytes, different for every seed and never all zero.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8 | 1
        })
        .collect()
}

async fn write(vol: &Arc<Volume>, model: &mut [u8], offset: u64, data: Vec<u8>) {
    let at = offset as usize;
    model[at..at + data.len()].copy_from_slice(&data);
    Export::write(&nbd(vol), offset, Bytes::from(data), false)
        .await
        .unwrap_or_else(|e| panic!("write at {offset}: {e}"));
}

/// Checks the volume against `model`, shuts the node down, reopens it (the records replayed
/// from the log) and checks again.
async fn assert_survives_reopen(dir: &Path, node: Arc<Node>, vol: Arc<Volume>, model: &[u8]) {
    assert_matches(&vol, model, "before the reopen").await;
    reopened_matches(dir, node, vol, model).await;
}

/// Shuts the node down, reopens it and checks the volume against `model`.
async fn reopened_matches(dir: &Path, node: Arc<Node>, vol: Arc<Volume>, model: &[u8]) {
    drop(vol);
    node.shutdown();
    drop(node);
    let (node, vol) = open(dir);
    assert_matches(&vol, model, "after the reopen").await;
    node.shutdown();
}

async fn read(vol: &Arc<Volume>, offset: u64, len: u32) -> Vec<u8> {
    let data = Export::read(&nbd(vol), offset, len)
        .await
        .unwrap_or_else(|e| panic!("read of {len} bytes at {offset}: {e}"));
    assert_eq!(data.len(), len as usize, "read of {len} bytes at {offset}");
    data.to_vec()
}

/// Reads the whole volume in odd-sized pieces at odd offsets and compares with `model`.
async fn assert_matches(vol: &Arc<Volume>, model: &[u8], when: &str) {
    let mut at = 0u64;
    let mut piece = 1u64;
    while at < VOLUME_BYTES {
        let len = piece.min(VOLUME_BYTES - at);
        let got = read(vol, at, len as u32).await;
        let want = &model[at as usize..(at + len) as usize];
        if got != want {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
            panic!(
                "{when}: {len} bytes read at {at} differ from the model at byte {}",
                at + first as u64
            );
        }
        at += len;
        piece = piece * 3 + 7;
        if piece > 200_000 {
            piece = 1;
        }
    }
}

/// Partial-block requests past the end are refused and change nothing.
async fn assert_range_checked(vol: &Arc<Volume>) {
    let end = VOLUME_BYTES;
    let short = Bytes::from(vec![1u8; 10]);
    let past = Export::write(&nbd(vol), end - 5, short, false).await;
    assert_eq!(past, Err(ExportError::OutOfRange), "write across the end");
    let past = Export::read(&nbd(vol), end - 5, 10).await;
    assert_eq!(
        past.err(),
        Some(ExportError::OutOfRange),
        "read across the end"
    );
    let past = Export::write_zeroes(&nbd(vol), end - 5, 10, false, true).await;
    assert_eq!(past, Err(ExportError::OutOfRange), "zeroes across the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_block_reads_and_writes_match_a_model_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (node, vol) = open(dir.path());
    assert_eq!(nbd(&vol).info().block_size_min, 1, "byte-granular requests");
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let writes: &[(u64, usize)] = &[
        (300, 256),                          // inside one block
        (1000, 1000),                        // straddles three blocks
        (4095, 2),                           // across a page boundary
        (0, 100),                            // the volume's first bytes
        (VOLUME_BYTES - 7, 7),               // its last bytes
        ((1 << 19) + 1, 70_000),             // many whole blocks between two partial ones
        (8192, 512 + 3),                     // starts aligned, ends inside a block
        (10_000, 1),                         // one byte
        (512, 512),                          // an aligned write among them
        (1001, 256),                         // over earlier partial writes
        ((1 << 19) + 40_000, 3 * 4096 + 17), // inside the large earlier one
    ];
    // The largest write the front ends advertise, misaligned: its covering blocks outgrow the
    // log's largest record and go as two, split at a block boundary.
    let largest = vol.max_io_bytes() as usize;
    let writes = [writes, &[((2 << 20) + 3, largest)]].concat();
    for (i, &(offset, len)) in writes.iter().enumerate() {
        write(&vol, &mut model, offset, pattern(i as u64 + 1, len)).await;
        for (o, l) in [
            (offset, len as u32),
            (offset.saturating_sub(3), 100),
            (7, 100),
        ] {
            let l = l.min((VOLUME_BYTES - o) as u32);
            let want = &model[o as usize..o as usize + l as usize];
            assert_eq!(
                read(&vol, o, l).await,
                want,
                "read {l} at {o} after write {i}"
            );
        }
    }
    assert_range_checked(&vol).await;
    assert_matches(&vol, &model, "before the reopen").await;
    let stats = &vol.stats;
    let written: usize = writes.iter().map(|w| w.1).sum();
    assert_eq!(
        stats.write_bytes.load(std::sync::atomic::Ordering::Relaxed),
        written as u64,
        "write_bytes counts the bytes the clients wrote"
    );
    reopened_matches(dir.path(), node, vol, &model).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroing_partial_blocks_zeroes_exactly_those_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (node, vol) = open(dir.path());
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    write(&vol, &mut model, 0, pattern(7, 64 << 10)).await;
    // (offset, length, trim?) — each inside a block, straddling, or whole blocks between
    // partial ones.
    let zeroes: &[(u64, u32, bool)] = &[
        (100, 10, false),
        (500, 1100, false),
        (3000, 5000, true),
        (9000, 20, true),
        (10_240, 1024, false),
        (12_287, 2, true),
        (20_000, 30_000, false),
        (60_000, 5536, true),
    ];
    for &(offset, len, trim) in zeroes {
        let r = if trim {
            Export::trim(&nbd(&vol), offset, len, false).await
        } else {
            Export::write_zeroes(&nbd(&vol), offset, len, false, true).await
        };
        r.unwrap_or_else(|e| panic!("zeroing {len} bytes at {offset} (trim {trim}): {e}"));
        model[offset as usize..(offset + u64::from(len)) as usize].fill(0);
        let around = offset.saturating_sub(BLOCK);
        let span = (u64::from(len) + 2 * BLOCK).min(VOLUME_BYTES - around) as u32;
        assert_eq!(
            read(&vol, around, span).await,
            &model[around as usize..(around + u64::from(span)) as usize],
            "around {len} bytes zeroed at {offset} (trim {trim})"
        );
    }
    assert_survives_reopen(dir.path(), node, vol, &model).await;
}

/// The block's expected contents when a whole-block write `whole` and a partial write `part`
/// at `at` both completed, in either order.
fn either_order(whole: &[u8], part: &[u8], at: usize) -> [Vec<u8>; 2] {
    let mut part_last = whole.to_vec();
    part_last[at..at + part.len()].copy_from_slice(part);
    [part_last, whole.to_vec()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_write_racing_a_whole_block_iscsi_write_loses_neither() {
    let dir = tempfile::tempdir().unwrap();
    let (node, vol) = open(dir.path());
    for round in 0..64u64 {
        let block = round * 3 % (VOLUME_BYTES / BLOCK);
        let offset = block * BLOCK;
        let old = pattern(1000 + round, BLOCK as usize);
        BlockBackend::write(&ScsiDisk(Arc::clone(&vol)), block, Bytes::from(old.clone()))
            .await
            .unwrap();
        let whole = pattern(2000 + round, BLOCK as usize);
        let part = pattern(3000 + round, 100);
        let at = 100 + (round as usize % 300);
        // A torn read-modify-write reads `old`, lets the whole-block write land, then writes
        // `old` patched with `part` back over it.
        let (v1, v2) = (Arc::clone(&vol), Arc::clone(&vol));
        let (p, w) = (part.clone(), whole.clone());
        let partial = tokio::spawn(async move {
            Export::write(&nbd(&v1), offset + at as u64, Bytes::from(p), false).await
        });
        let aligned =
            tokio::spawn(
                async move { BlockBackend::write(&ScsiDisk(v2), block, Bytes::from(w)).await },
            );
        joined(partial).await.unwrap();
        joined(aligned).await.unwrap();
        let got = read(&vol, offset, BLOCK as u32).await;
        assert!(
            either_order(&whole, &part, at).contains(&got),
            "round {round}: block {block} holds neither order of the two writes (torn: {})",
            {
                let mut torn = old.clone();
                torn[at..at + part.len()].copy_from_slice(&part);
                got == torn
            }
        );
    }
    node.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_partial_writes_of_one_block_all_land() {
    let dir = tempfile::tempdir().unwrap();
    let (node, vol) = open(dir.path());
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    for round in 0..32u64 {
        // Eight writers each change 60 bytes of the same two blocks (some straddle them), one
        // of them zeroes its bytes instead.
        let base = round * 4 * BLOCK + 10;
        let mut tasks = Vec::new();
        for k in 0..8u64 {
            let offset = base + k * 120;
            let data = pattern(round * 8 + k + 1, 60);
            let v = Arc::clone(&vol);
            if k == 5 {
                model[offset as usize..offset as usize + 60].fill(0);
                tasks.push(tokio::spawn(async move {
                    Export::write_zeroes(&nbd(&v), offset, 60, false, true).await
                }));
            } else {
                model[offset as usize..offset as usize + 60].copy_from_slice(&data);
                tasks.push(tokio::spawn(async move {
                    Export::write(&nbd(&v), offset, Bytes::from(data), false).await
                }));
            }
        }
        for t in tasks {
            joined(t).await.unwrap();
        }
        let start = round * 4 * BLOCK;
        let got = read(&vol, start, 4 * BLOCK as u32).await;
        assert_eq!(
            got,
            &model[start as usize..(start + 4 * BLOCK) as usize],
            "round {round}: a partial write was lost"
        );
    }
    node.shutdown();
}

/// Awaits a spawned write for at most 30 s: writers that deadlock on a block's lock must fail
/// the test, not hang it.
async fn joined<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(30), task)
        .await
        .expect("a concurrent write did not finish within 30 s (deadlock?)")
        .unwrap()
}

/// Written back and synced: every record of the log is in the images.
async fn written_back(node: &Node) {
    use std::sync::atomic::Ordering::Relaxed;
    let last = node.log().stats().durable_seq.load(Relaxed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while node.store().progress().applied_seq < last {
        assert!(std::time::Instant::now() < deadline, "written back in time");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroing_what_reads_as_zeros_costs_no_record_and_data_is_still_zeroed() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    let (node, vol) = open(dir.path());
    let records = || node.log().stats().records.load(Relaxed);
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let (mib, data) = (1u64 << 20, pattern(9, 64 << 10));

    // Never written: a hole in the image, nothing in the log. Zeroing or trimming it needs
    // no record.
    let before = records();
    Export::write_zeroes(&nbd(&vol), 0, mib as u32, false, false)
        .await
        .unwrap();
    Export::trim(&nbd(&vol), mib, mib as u32, false)
        .await
        .unwrap();
    assert_eq!(records(), before, "nothing appended for ranges of zeros");
    assert_eq!(vol.stats.zeroings_elided.load(Relaxed), 2);

    // Data not yet applied (in the overlay) and data written back (in the image) both take a
    // record, and read as zeros afterwards, also after a reopen.
    write(&vol, &mut model, 2 * mib, data.clone()).await;
    let before = records();
    Export::write_zeroes(&nbd(&vol), 2 * mib, 64 << 10, false, false)
        .await
        .unwrap();
    assert_eq!(records(), before + 1, "zeroing unapplied data is a record");
    model[2 * mib as usize..][..64 << 10].fill(0);
    write(&vol, &mut model, 3 * mib, data.clone()).await;
    written_back(&node).await;
    let before = records();
    Export::trim(&nbd(&vol), 3 * mib, 64 << 10, false)
        .await
        .unwrap();
    assert_eq!(records(), before + 1, "trimming applied data is a record");
    model[3 * mib as usize..][..64 << 10].fill(0);
    // Once that trim is applied its range is a hole again: zeroing it is free.
    written_back(&node).await;
    let before = records();
    Export::write_zeroes(&nbd(&vol), 3 * mib, 64 << 10, false, false)
        .await
        .unwrap();
    assert_eq!(
        records(),
        before,
        "the trimmed range reads as zeros for good"
    );

    assert_survives_reopen(dir.path(), node, vol, &model).await;
}

/// Large reads go into buffers kept from earlier reads: a read of never-written, zeroed or
/// other data after one of a pattern shows none of the pattern.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_into_reused_buffers_show_only_what_they_read() {
    let dir = tempfile::tempdir().unwrap();
    let (node, vol) = open(dir.path());
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let mib = 1u64 << 20;
    write(&vol, &mut model, 0, pattern(1, mib as usize)).await;
    write(&vol, &mut model, 2 * mib, pattern(2, (mib / 2) as usize)).await;
    let zeroed = Export::write_zeroes(&nbd(&vol), 2 * mib + 4096, 8192, false, false).await;
    zeroed.unwrap();
    model[(2 * mib + 4096) as usize..(2 * mib + 12288) as usize].fill(0);
    for round in 0..2 {
        for at in [0, mib, 0, 2 * mib, 0, 3 * mib] {
            let got = read(&vol, at, mib as u32).await;
            assert!(
                got == model[at as usize..(at + mib) as usize],
                "round {round}: 1 MiB read at {at} differs from the model"
            );
        }
        written_back(&node).await;
    }
    node.shutdown();
}
