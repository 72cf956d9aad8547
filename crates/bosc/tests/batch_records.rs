#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A burst is logged as batch records (docs/FORMATS.md "Own-log records"): its modifications
//! share a record's sequence number. What that must not change: several modifications of one
//! block in one record apply in the order they were made, live and after a crash; and groups
//! of blocks whose lowest pending modification is the same record keep the global frontier
//! there until all of them are committed (a set of the groups' lowest numbers lost one of two
//! equal ones when the other group committed, and recovery then dropped its modifications).

#[path = "support/faulty.rs"]
mod faulty;

use faulty::{engine_cfg, Disks};
use mariner_bosc::{BlockApp, Change};

const LOG_ID: u128 = 0xBA7C;

/// Writes the modification's bytes over the payload's start: order matters.
struct Overwrite;
impl BlockApp for Overwrite {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        payload[..m.len()].copy_from_slice(m);
    }
}

#[test]
fn a_records_modifications_of_one_block_apply_in_order_live_and_after_a_crash() {
    let c = engine_cfg(256, 1 << 20);
    let mut disks = Disks::new::<Overwrite>(1, &c, 4 << 20, LOG_ID);
    let (b, _) = disks.open_own_log(disks.log_devices()[0].clone(), &c, Overwrite, LOG_ID, 1);
    // Blocks 3 and 200 are in different groups of 32; both get three modifications.
    let seqs = b
        .modify_batch(vec![
            Change::modify(3, vec![1, 1, 1]),
            Change::modify(200, vec![7, 7]),
            Change::modify(3, vec![2, 2]),
            Change::modify(200, vec![8]),
            Change::modify(3, vec![3]),
        ])
        .unwrap();
    assert!(
        seqs.windows(2).all(|w| w[0] == w[1]),
        "one record: {seqs:?}"
    );
    let want3 = [3, 2, 1, 0];
    let want200 = [8, 7, 0, 0];
    assert_eq!(b.read(3).unwrap()[..4], want3);
    assert_eq!(b.read(200).unwrap()[..4], want200);
    // A later record for block 3 alone; then a crash with nothing committed.
    b.modify_batch(vec![Change::modify(3, vec![4])]).unwrap();
    drop(b);
    disks = disks.crash();
    let (b, report) = disks.open_own_log(disks.log_devices()[0].clone(), &c, Overwrite, LOG_ID, 1);
    assert_eq!(report.records_scanned, 6);
    assert_eq!(b.read(3).unwrap()[..4], [4, 2, 1, 0]);
    assert_eq!(b.read(200).unwrap()[..4], want200);
    // Committed, crashed, reopened: the disk has it all and nothing is replayed twice.
    b.commit_all().unwrap();
    drop(b);
    disks = disks.crash();
    let (b, _) = disks.open_own_log(disks.log_devices()[0].clone(), &c, Overwrite, LOG_ID, 1);
    assert_eq!(b.read(3).unwrap()[..4], [4, 2, 1, 0]);
    assert_eq!(b.read(200).unwrap()[..4], want200);
}

#[test]
fn groups_sharing_a_records_number_hold_the_global_frontier_until_all_are_committed() {
    // A cycle commits three runs: blocks 0, 10 and 20 (group 0) but not 200 (group 6), all
    // four modified in one record.
    let c = engine_cfg(256, 1 << 20);
    let mut disks = Disks::new::<Overwrite>(2, &c, 4 << 20, LOG_ID);
    let (b, _) = disks.open_own_log(disks.log_devices()[0].clone(), &c, Overwrite, LOG_ID, 1);
    let blocks = [0u64, 10, 20, 200];
    b.modify_batch(
        blocks
            .iter()
            .map(|&k| Change::modify(k, vec![k as u8 + 1]))
            .collect(),
    )
    .unwrap();
    b.commit_cycle().unwrap();
    assert_eq!(b.pending_modifications(), 1, "block 200 is still pending");
    // The next record's global frontier must not pass block 200's pending modification.
    b.modify_batch(vec![Change::modify(100, vec![9])]).unwrap();
    drop(b);
    disks = disks.crash();
    let (b, _) = disks.open_own_log(disks.log_devices()[0].clone(), &c, Overwrite, LOG_ID, 1);
    for k in blocks {
        assert_eq!(b.read(k).unwrap()[0], k as u8 + 1, "block {k}");
    }
    assert_eq!(b.read(100).unwrap()[0], 9);
}
