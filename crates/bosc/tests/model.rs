#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Model-based crash test: random modifications, queries, commit cycles and crashes (lost,
//! reordered and torn unsynced writes on FaultyDisk, data and log alike) against a BTreeMap
//! oracle. After every recovery every acknowledged modification is visible and nothing else.
//!
//! Most crashes hit the disks while the engine runs: writer threads keep batches in flight, so
//! the crash meets log writes not yet synced (counted, and asserted to happen). Changes whose
//! batch's durability was not signalled may or may not survive, but each writer's survivors
//! are a prefix, in sequence order, of what it issued. The engine is dropped only after the crash; what it writes then
//! reaches no surviving image.

#[path = "support/faulty.rs"]
mod faulty;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use faulty::{engine_cfg, Disks, Rng};
use mariner_bosc::{BlockApp, Bosc, BoscConfig, Change};

/// Payload = `SLOTS` u64 slots spread over it (one a sector in a 4 KiB block, so a torn write
/// shows); a modification sets one slot: (slot u16, value u64).
struct Slots;
impl BlockApp for Slots {
    fn apply(&self, _block: u64, payload: &mut [u8], m: &[u8]) {
        let at = slot_at(payload, u16::from_le_bytes([m[0], m[1]]) as usize);
        payload[at..at + 8].copy_from_slice(&m[2..10]);
    }
}

fn slot_at(payload: &[u8], slot: usize) -> usize {
    slot * (payload.len() / SLOTS as usize)
}

fn modification(slot: u16, value: u64) -> Vec<u8> {
    let mut m = slot.to_le_bytes().to_vec();
    m.extend_from_slice(&value.to_le_bytes());
    m
}

fn slot_of(payload: &[u8], slot: usize) -> u64 {
    let at = slot_at(payload, slot);
    u64::from_le_bytes(payload[at..at + 8].try_into().unwrap())
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
        self.open_own_logs(c, Slots, LOG_ID, 7)
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

/// What the crashes of a run met.
#[derive(Default, Debug)]
struct Crashes {
    count: u64,
    repaired: u64,
    /// Crashes that found log operations not yet synced.
    unsynced_log: u64,
    /// Crashes with a writer's batch issued and its durability not signalled.
    in_flight: u64,
    /// Without a double-write area: opens that found a block torn (`Error::Torn`), which end
    /// the run (the application would rebuild the tree).
    torn: u64,
    /// Power cuts during a commit (without a double-write area).
    cuts: u64,
}

fn run(seed: u64, steps: usize, budget: usize, logs: u64) -> Crashes {
    run_with(seed, steps, budget, logs, cfg(budget).dw_runs, false)
}

/// `dw_runs` 0 with `shadow`: shadow extents, whose torn moves must leave every open whole.
fn run_with(
    seed: u64,
    steps: usize,
    budget: usize,
    logs: u64,
    dw_runs: u16,
    shadow: bool,
) -> Crashes {
    let mut rng = Rng(seed | 1);
    // Every other seed keeps images within a quarter of the budget: a modified clean image
    // past it is dropped and the modification queued (`BoscConfig::image_share`).
    let c = BoscConfig {
        image_share: if seed.is_multiple_of(2) { 1.0 } else { 0.25 },
        dw_runs,
        shadow,
        // Blocks of one 512-byte sector cannot tear (a torn run is a prefix of whole
        // blocks): without the double-write area the blocks are of eight.
        block_bytes: if dw_runs == 0 { 4096 } else { 512 },
        ..cfg(budget)
    };
    let mut disks = Disks::with_logs::<Slots>(seed, &c, 2 << 20, LOG_ID, logs);
    let mut bosc = disks.open(&c);
    let mut oracle = BTreeMap::new();
    let mut crashes = Crashes::default();
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
                // Shadow extents: most crashes cut the power inside a commit, where a move can tear.
                let cut = if shadow {
                    rng.below(4) != 0
                } else {
                    rng.below(3) == 0
                };
                let issued = if dw_runs == 0 && cut {
                    // The power goes while a commit writes blocks in place: with nothing to
                    // repair them from, a torn one must fail the open. Shadow extents write
                    // to the home not in use: every open must succeed, whole.
                    disks.data.power_cut_after(rng.below(6));
                    crashes.cuts += 1;
                    let _ = bosc.commit_cycle();
                    let (d, _) = disks.crash_counting();
                    disks = d;
                    Vec::new()
                } else if rng.below(3) == 0 {
                    // Crash in the middle of a commit cycle: the data disk fails after a few
                    // more writes/syncs, leaving double-write or in-place writes unsynced.
                    disks.data.fail_after(rng.below(6));
                    let _ = bosc.commit_cycle();
                    let (d, _) = disks.crash_counting();
                    disks = d;
                    Vec::new()
                } else {
                    let (d, issued, unsynced) = crash_live(&bosc, disks, &mut rng, step);
                    disks = d;
                    crashes.unsynced_log += u64::from(unsynced > 0);
                    crashes.in_flight +=
                        u64::from(issued.iter().any(|w| w.acked < w.batches.len()));
                    issued
                };
                drop(bosc);
                let (b, report) = match disks.try_open_own_logs(&c, Slots, LOG_ID, 7) {
                    Ok(opened) => opened,
                    Err(mariner_bosc::Error::Torn { .. }) if dw_runs == 0 && !shadow => {
                        crashes.torn += 1;
                        crashes.count += 1;
                        return crashes;
                    }
                    Err(e) => panic!("seed {seed}: open after a crash: {e}"),
                };
                bosc = b;
                crashes.repaired += report.blocks_repaired;
                crashes.count += 1;
                for (w, issued) in issued.iter().enumerate() {
                    settle(&bosc, &mut oracle, w as u64, issued);
                }
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
    assert!(crashes.count > 0);
    crashes
}

/// Writer threads during a live crash; writer `w` sets slot `w` only.
const WRITERS: u64 = 3;
/// Batches a writer issues at most per crash: the engine commits only between crashes (no
/// background thread), and a full log would wait for it.
const MAX_BATCHES: usize = 40;

/// One writer's batches, in the order issued, each a list of (block, value) set in its slot.
struct Issued {
    batches: Vec<Vec<(u64, u64)>>,
    /// How many of them the engine signalled durable (a prefix: each waits for the last).
    acked: usize,
}

/// Starts writers issuing batches, crashes every disk once they have had a few acknowledged,
/// with the engine still running, and returns the new disks, what each writer issued, and how
/// many log operations were not synced at the crash.
fn crash_live(
    bosc: &Bosc<Slots>,
    disks: Disks,
    rng: &mut Rng,
    step: usize,
) -> (Disks, Vec<Issued>, usize) {
    let target = 1 + rng.below(16);
    let seeds: Vec<u64> = (0..WRITERS).map(|_| rng.next()).collect();
    let stop = AtomicBool::new(false);
    let acked = AtomicU64::new(0);
    std::thread::scope(|s| {
        let writers: Vec<_> = seeds
            .iter()
            .enumerate()
            .map(|(w, &seed)| {
                let (stop, acked) = (&stop, &acked);
                s.spawn(move || write_batches(bosc, w as u64, seed, step, stop, acked))
            })
            .collect();
        let started = Instant::now();
        while acked.load(Ordering::SeqCst) < target {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "writers stalled"
            );
            std::thread::yield_now();
        }
        let (disks, unsynced) = disks.crash_meeting_unsynced_log(Duration::from_millis(50));
        stop.store(true, Ordering::SeqCst);
        // Shutting the log down answers every append still waiting (a failed device leaves
        // them unanswered); what it writes now reaches no surviving image.
        bosc.close();
        let issued = writers.into_iter().map(|h| h.join().unwrap()).collect();
        (disks, issued, unsynced)
    })
}

/// Issues batches of one to four changes until the engine refuses one or `stop` is set.
fn write_batches(
    bosc: &Bosc<Slots>,
    w: u64,
    seed: u64,
    step: usize,
    stop: &AtomicBool,
    acked: &AtomicU64,
) -> Issued {
    let mut rng = Rng(seed | 1);
    let mut out = Issued {
        batches: Vec::new(),
        acked: 0,
    };
    while !stop.load(Ordering::SeqCst) && out.batches.len() < MAX_BATCHES {
        let k = out.batches.len() as u64;
        let batch: Vec<(u64, u64)> = (0..1 + rng.below(4))
            .map(|i| {
                (
                    rng.below(BLOCKS),
                    (step as u64) << 32 | w << 28 | k << 4 | i,
                )
            })
            .collect();
        let changes = batch
            .iter()
            .map(|&(block, v)| Change::modify(block, modification(w as u16, v)))
            .collect();
        out.batches.push(batch);
        if bosc.modify_batch(changes).is_err() {
            break;
        }
        out.acked += 1;
        acked.fetch_add(1, Ordering::SeqCst);
    }
    out
}

/// Finds how many of writer `w`'s changes survived: slot `w` of every block must match the
/// oracle plus a prefix of them, in sequence order, that holds every acknowledged batch. (A
/// batch is several log records; a crash may keep only a prefix of an unacknowledged one,
/// which is why the B+tree repairs half-done splits at open.) Records it in the oracle.
fn settle(b: &Bosc<Slots>, oracle: &mut BTreeMap<(u64, u64), u64>, w: u64, issued: &Issued) {
    let got: Vec<u64> = (0..BLOCKS)
        .map(|block| slot_of(&b.read(block).unwrap(), w as usize))
        .collect();
    let mut want: Vec<u64> = (0..BLOCKS)
        .map(|block| oracle.get(&(block, w)).copied().unwrap_or(0))
        .collect();
    let changes: Vec<(u64, u64)> = issued.batches.iter().flatten().copied().collect();
    let acked: usize = issued.batches[..issued.acked].iter().map(Vec::len).sum();
    for &(block, v) in &changes[..acked] {
        want[block as usize] = v;
    }
    let mut survived = acked;
    while got != want {
        let Some(&(block, v)) = changes.get(survived) else {
            panic!(
                "writer {w}: no prefix of its {} changes ({} acknowledged) gives what \
                 recovery shows: got {got:?}, all issued {want:?}",
                changes.len(),
                acked
            );
        };
        want[block as usize] = v;
        survived += 1;
    }
    for &(block, v) in &changes[..survived] {
        oracle.insert((block, w), v);
    }
}

#[test]
fn crashes_keep_every_acknowledged_modification() {
    let runs = runs_meeting_live_log(1..=8, |seed| run(seed, 600, 1 << 20, 1));
    assert!(
        runs.iter().map(|r| r.repaired).sum::<u64>() > 0,
        "some crash tore a run and the double-write area repaired it"
    );
    assert_met_live_log(&runs);
}

/// Without a double-write area a crash can tear a block in place and nothing repairs it: open
/// must then fail with `Error::Torn` — never open and answer with a torn block's loss (every
/// open that succeeds is checked against the oracle, as above).
#[test]
fn without_a_double_write_area_a_torn_block_fails_open() {
    let runs: Vec<Crashes> = (40..=63)
        .map(|seed| run_with(seed, 600, 1 << 20, 1, 0, false))
        .collect();
    let torn: u64 = runs.iter().map(|r| r.torn).sum();
    let opened: u64 = runs.iter().map(|r| r.count - r.torn).sum();
    eprintln!("{opened} opens after a crash checked, {torn} found a torn block");
    assert!(torn > 0, "no crash tore a block in place: {runs:?}");
    assert!(opened > 0, "no open after a crash was checked: {runs:?}");
}

/// Shadow extents: power cuts in the middle of commits tear extents being moved to their other
/// home, and crashes come before and after a move is logged; every open succeeds and holds
/// every acknowledged modification (checked against the oracle after each crash).
#[test]
fn shadow_extents_survive_torn_moves() {
    let runs: Vec<Crashes> = (40..=63)
        .map(|seed| run_with(seed, 800, 1 << 20, 1, 0, true))
        .collect();
    let cuts: u64 = runs.iter().map(|r| r.cuts).sum();
    let opened: u64 = runs.iter().map(|r| r.count).sum();
    eprintln!("{opened} opens after a crash checked, {cuts} of them after a power cut in a commit");
    assert!(cuts > 20, "power cuts in commits: {runs:?}");
    assert!(runs.iter().all(|r| r.torn == 0));
}

#[test]
fn tight_budget_forces_commits_and_survives_crashes() {
    let runs = runs_meeting_live_log(10..=12, |seed| run(seed, 400, 2048, 1));
    assert_met_live_log(&runs);
}

#[test]
fn crashes_of_two_log_devices_keep_every_acknowledged_modification() {
    let runs = runs_meeting_live_log(20..=25, |seed| run(seed, 400, 1 << 20, 2));
    assert_met_live_log(&runs);
}

/// Runs `run` for every seed of `seeds`, then for the seeds after them until enough crashes met
/// a live log ([`assert_met_live_log`]), at most as many seeds again: on a loaded machine the
/// writers can be starved through a crash's patience, and a run whose crashes all met a
/// settled log has not tested what it claims. More seeds, not a lower bar.
fn runs_meeting_live_log(
    seeds: std::ops::RangeInclusive<u64>,
    run: impl Fn(u64) -> Crashes,
) -> Vec<Crashes> {
    let (first, last) = (*seeds.start(), *seeds.end());
    let mut runs: Vec<Crashes> = seeds.map(&run).collect();
    let met = |runs: &[Crashes]| {
        runs.iter().map(|r| r.unsynced_log).sum::<u64>() >= 3
            && runs.iter().map(|r| r.in_flight).sum::<u64>() >= 3
    };
    let mut seed = last + 1;
    // Under load (a busy CI machine) fewer crashes meet a live log: up to three more ranges.
    while !met(&runs) && seed <= last + 3 * (last - first + 1) {
        runs.push(run(seed));
        seed += 1;
    }
    runs
}

/// The crashes were not all taken after the log had settled. How many meet a live log varies
/// with scheduling (typically a tenth to a fifth of them); a few suffice to make the check bite.
fn assert_met_live_log(runs: &[Crashes]) {
    let unsynced: u64 = runs.iter().map(|r| r.unsynced_log).sum();
    let in_flight: u64 = runs.iter().map(|r| r.in_flight).sum();
    let count: u64 = runs.iter().map(|r| r.count).sum();
    eprintln!("{count} crashes: {unsynced} met unsynced log writes, {in_flight} batches in flight");
    assert!(
        unsynced >= 3 && in_flight >= 3,
        "too few crashes met a live log: {runs:?}"
    );
}

/// A block with modifications still in the own log, damaged in place (as a torn write leaves
/// it) on a disk without a double-write area: open names it.
#[test]
fn without_a_double_write_area_open_finds_a_damaged_block() {
    let c = BoscConfig {
        dw_runs: 0,
        block_bytes: 4096,
        ..cfg(1 << 20)
    };
    let disks = Disks::new::<Slots>(3, &c, 2 << 20, LOG_ID);
    let bosc = disks.open(&c);
    for block in 0..8 {
        bosc.modify(block, &modification(1, block + 1)).unwrap();
    }
    bosc.commit_all().unwrap();
    bosc.modify(5, &modification(2, 50)).unwrap();
    drop(bosc);
    // Block 5 at 8192 + 5 × 4096: its second sector.
    disks.data.corrupt(8192 + 5 * 4096 + 512, 512);
    let disks = disks.crash();
    match disks.try_open_own_logs(&c, Slots, LOG_ID, 7) {
        Err(mariner_bosc::Error::Torn { first, count }) => assert_eq!((first, count), (5, 1)),
        Err(e) => panic!("open: {e}"),
        Ok(_) => panic!("open took a damaged block"),
    }
}
