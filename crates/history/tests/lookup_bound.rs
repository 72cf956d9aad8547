#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The LT index's lookup bound (docs/ARCHITECTURE.md "History"): a one-block lookup as of V
//! costs one predecessor search per piece level the volume uses, each reading at most two
//! leaves here — however often the neighbouring blocks were written. A cold block beside a
//! hot one, both covered by large writes, is looked up as of many instants.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use mariner_disk::{Disk, MemDisk};
use mariner_history::files::MemFiles;
use mariner_history::index::{IndexConfig, LtIndex, Version};
use mariner_history::DigestEntry;
use mariner_log::{LogAddr, RecordKind};

const VOL: u32 = 3;

fn entry(vseq: u64, offset: u64, length: u32) -> DigestEntry {
    DigestEntry {
        seq: vseq,
        volume: VOL,
        kind: RecordKind::Write,
        volume_seq: vseq,
        timestamp_ns: vseq,
        offset,
        length,
        addr: LogAddr::new(0, 4096 * vseq),
    }
}

#[test]
fn a_cold_block_beside_a_hot_one_costs_the_same_lookups() {
    let files = MemFiles::new(BTreeMap::new(), |_| {
        Arc::new(MemDisk::new(0)) as Arc<dyn Disk>
    });
    let cfg = IndexConfig {
        block_count: 16_384,
        block_bytes: 4096,
        memory_budget_bytes: 8 << 20,
        log_bytes: 32 << 20,
        log_segment_bytes: 1 << 20,
        background: None,
        cpu_class: None,
        write_gap: None,
    };
    LtIndex::create(&files, &cfg).unwrap();
    let ix = LtIndex::open(&files, &cfg, BTreeMap::new()).unwrap();
    // @1: a 1 MiB write over both blocks (level-3 pieces); @2: the cold block alone
    // (4 KiB at 0, level 1); then the hot block beside it (4 KiB at 4096), 30,000 times, and
    // a 512-byte write inside it now and then (level 0).
    let mut vseq = 1;
    ix.insert(&[entry(vseq, 0, 1 << 20)]).unwrap();
    vseq += 1;
    ix.insert(&[entry(vseq, 0, 4096)]).unwrap();
    let cold = vseq;
    let mut batch = Vec::new();
    for i in 0..30_000u64 {
        vseq += 1;
        batch.push(if i % 100 == 0 {
            entry(vseq, 4096 + 512, 512)
        } else {
            entry(vseq, 4096, 4096)
        });
        if batch.len() == 1000 {
            ix.insert(&batch).unwrap();
            batch.clear();
        }
    }
    let last = vseq;
    let leaves = ix.tree().leaf_count();
    assert!(
        leaves > 200,
        "the hot block's versions span {leaves} leaves only"
    );
    let levels_used = 3u64; // 0, 1 and 3
    let searched = || ix.tree().stats().predecessor_leaves.load(Relaxed);
    let mut worst = 0;
    for at in [cold, cold + 1, cold + 5_000, cold + 20_000, last] {
        // Every sector of the cold block: its version is @2.
        for sector in 0..8 {
            let before = searched();
            let got = ix.newest(VOL, sector, at).unwrap();
            worst = worst.max(searched() - before);
            assert_eq!(
                got,
                Some((cold, Version::Log(LogAddr::new(0, 4096 * cold))))
            );
        }
        // The hot block as of the same instant: also bounded.
        let before = searched();
        let got = ix.newest(VOL, 8, at).unwrap().unwrap();
        worst = worst.max(searched() - before);
        assert!(got.0 <= at);
    }
    eprintln!("{leaves} leaves; the worst lookup searched {worst} leaves");
    assert!(
        worst <= 2 * levels_used,
        "a lookup searched {worst} leaves; the bound is 2 per level used ({levels_used} levels)"
    );
    // As of @1 the cold block is the 1 MiB write.
    assert_eq!(ix.newest(VOL, 0, 1).unwrap().map(|v| v.0), Some(1));
}
