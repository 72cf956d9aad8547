#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Model-based crash test: random modifications, queries, commit cycles and crashes (lost,
//! reordered and torn unsynced writes on FaultyDisk, data and log alike) against a BTreeMap
//! oracle. After every recovery every acknowledged modification is visible and nothing else.

#[path = "support/faulty.rs"]
mod faulty;

use std::collections::BTreeMap;
use std::sync::Arc;

use faulty::{engine_cfg, Disks, Rng};
use mariner_bosc::{BlockApp, Bosc, BoscConfig};

/// Payload = an array of u64 slots; a modification sets one slot: (slot u16, value u64).
struct Slots;
impl BlockApp for Slots {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let slot = u16::from_le_bytes([m[0], m[1]]) as usize;
        payload[slot * 8..slot * 8 + 8].copy_from_slice(&m[2..10]);
    }
}

fn modification(slot: u16, value: u64) -> Vec<u8> {
    let mut m = slot.to_le_bytes().to_vec();
    m.extend_from_slice(&value.to_le_bytes());
    m
}

fn slot_of(payload: &[u8], slot: usize) -> u64 {
    u64::from_le_bytes(payload[slot * 8..slot * 8 + 8].try_into().unwrap())
}

const BLOCKS: u64 = 96;
const SLOTS: u64 = 8;
const LOG_ID: u128 = 0xB05C;

fn cfg(budget: usize) -> BoscConfig {
    engine_cfg(BLOCKS, budget)
}

impl Disks {
    fn open(&self, c: &BoscConfig) -> Bosc<Slots> {
        self.open_report(c).0
    }

    fn open_report(&self, c: &BoscConfig) -> (Bosc<Slots>, mariner_bosc::OpenReport) {
        self.open_own_log(Arc::clone(&self.log_disk), c, Slots, LOG_ID, 7)
    }
}

fn check_all(b: &Bosc<Slots>, oracle: &BTreeMap<(u64, u64), u64>) {
    for block in 0..BLOCKS {
        let p = b.read(block).unwrap();
        for slot in 0..SLOTS {
            let want = oracle.get(&(block, slot)).copied().unwrap_or(0);
            assert_eq!(
                slot_of(&p, slot as usize),
                want,
                "block {block} slot {slot}"
            );
        }
    }
}

fn run(seed: u64, steps: usize, budget: usize) -> u64 {
    let mut rng = Rng(seed | 1);
    let c = cfg(budget);
    let mut disks = Disks::new::<Slots>(seed, &c, 2 << 20, LOG_ID);
    let mut bosc = disks.open(&c);
    let mut oracle = BTreeMap::new();
    let mut crashes = 0;
    let mut repaired = 0;
    for step in 0..steps {
        match rng.below(100) {
            0..=69 => {
                // Clustered blocks so runs form.
                let block = (rng.below(BLOCKS / 4) * 4 + rng.below(4)) % BLOCKS;
                let slot = rng.below(SLOTS);
                let value = step as u64 + 1;
                bosc.modify(block, &modification(slot as u16, value))
                    .unwrap();
                oracle.insert((block, slot), value);
            }
            70..=79 => {
                let block = rng.below(BLOCKS);
                let p = bosc.read(block).unwrap();
                let slot = rng.below(SLOTS);
                let want = oracle.get(&(block, slot)).copied().unwrap_or(0);
                assert_eq!(slot_of(&p, slot as usize), want);
            }
            80..=94 => {
                bosc.commit_cycle().unwrap();
            }
            _ => {
                if rng.below(2) == 0 {
                    // Crash in the middle of a commit cycle: the data disk fails after a few
                    // more writes/syncs, leaving double-write or in-place writes unsynced.
                    disks.data.fail_after(rng.below(6));
                    let _ = bosc.commit_cycle();
                }
                drop(bosc);
                disks = disks.crash();
                let (b, report) = disks.open_report(&c);
                bosc = b;
                repaired += report.blocks_repaired;
                crashes += 1;
                check_all(&bosc, &oracle);
            }
        }
    }
    bosc.commit_all().unwrap();
    check_all(&bosc, &oracle);
    drop(bosc);
    let disks = disks.crash();
    let bosc = disks.open(&c);
    check_all(&bosc, &oracle);
    assert_eq!(
        bosc.pending_modifications(),
        0,
        "a clean commit leaves nothing to replay"
    );
    assert!(crashes > 0);
    repaired
}

#[test]
fn crashes_keep_every_acknowledged_modification() {
    let repaired: u64 = (1..=8).map(|seed| run(seed, 600, 1 << 20)).sum();
    assert!(
        repaired > 0,
        "some crash tore a run and the double-write area repaired it"
    );
}

#[test]
fn tight_budget_forces_commits_and_survives_crashes() {
    for seed in 10..=12 {
        run(seed, 400, 2048);
    }
}
