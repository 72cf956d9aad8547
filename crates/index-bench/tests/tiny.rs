#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Every engine of the index benchmark with tiny parameters, checked against a `BTreeMap`
//! model (every record after the timed phases and again after the reopen, plus a full scan
//! for the range engines), so the benchmark cannot rot. 512-byte blocks and a 256 KiB budget
//! make BOSC split leaves, probe full pages and commit under memory pressure.

use std::time::Duration;

use mariner_index_bench::{reopen, run, Config, EngineKind, Report};

fn tiny(engine: EngineKind) -> Report {
    tiny_in_parts(engine, 1)
}

/// The tiny parameters every test runs with, in `dir`.
fn tiny_config(engine: EngineKind, dir: &std::path::Path) -> Config {
    Config {
        budget_bytes: 256 << 10,
        preload_entries: 3000,
        ops: 2500,
        window: Duration::from_secs(120),
        sync_every: 100,
        queries: 200,
        range_len: 20,
        seed: 7,
        block_bytes: 512,
        verify: true,
        ..Config::new(engine, dir.join(engine.name()))
    }
}

/// `log_parts`: the parts bosc-btree logs each batch in.
fn tiny_in_parts(engine: EngineKind, log_parts: usize) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        reopen_in_run: true,
        log_parts,
        ..tiny_config(engine, dir.path())
    };
    let r = run(&cfg).unwrap_or_else(|e| panic!("{}: {e}", engine.name()));
    // And the reopen of a separate process, on the files the run left.
    let again = reopen(&cfg).unwrap_or_else(|e| panic!("{} reopen: {e}", engine.name()));
    assert!(again.inserts_checked > 25, "{again:?}");
    assert!(r.verified);
    assert_eq!((r.insert.ops, r.update.ops), (2500, 2500), "{r:?}");
    assert!(r.insert.ops_per_s > 0.0 && r.update.ops_per_s > 0.0);
    assert_eq!(r.point.count, 200);
    assert!(r.point.p50_us > 0.0 && r.point.p99_us >= r.point.p50_us);
    assert!(r.index_disk_bytes > 0);
    match &r.range {
        Some(range) => {
            assert!(engine.ranges());
            assert_eq!(range.count, 200);
            // 20 preloaded LBAs per range, plus the inserted versions that fell inside.
            assert!(range.records_mean.unwrap() >= 19.0, "{range:?}");
        }
        None => assert!(!engine.ranges()),
    }
    serde_json::to_string(&r).unwrap();
    r
}

fn note(r: &Report, name: &str) -> u64 {
    r.notes[name]
        .as_u64()
        .unwrap_or_else(|| panic!("note {name}"))
}

#[test]
fn bosc_btree_tiny() {
    let r = tiny(EngineKind::BoscBtree);
    assert!(note(&r, "splits_in_memory") + note(&r, "splits_with_read") > 0);
    assert!(note(&r, "leaves_prefetched") > 0, "{:?}", r.notes);
    assert!(note(&r, "runs_committed") > 0);
    // The reopen replayed BOSC's log (recovery may requeue records a commit already wrote:
    // the LSN check skips them); the model check after the reopen saw every record.
    let notes = &r.reopen.as_ref().unwrap().notes;
    let requeued = notes["pending_requeued"].as_u64().unwrap();
    assert!(requeued <= notes["records_scanned"].as_u64().unwrap());
}

/// Batches logged in three parts each: the model still sees every record, across the reopen.
#[test]
fn bosc_btree_tiny_in_parts() {
    let r = tiny_in_parts(EngineKind::BoscBtree, 3);
    assert!(note(&r, "leaves_prefetched") > 0, "{:?}", r.notes);
}

#[test]
fn redb_tiny() {
    tiny(EngineKind::Redb);
}

#[test]
fn fjall_tiny() {
    tiny(EngineKind::Fjall);
}

#[test]
fn bosc_hash_tiny() {
    let r = tiny(EngineKind::BoscHash);
    assert!(note(&r, "blind_puts") > 0);
}

#[test]
fn plain_hash_tiny() {
    let r = tiny(EngineKind::PlainHash);
    assert!(note(&r, "page_writes") >= 5000);
}

/// `--commit-queued`: each timed phase ends with a timed commit of BOSC's queues, so the
/// phase reports the blocks it left queued and the commit's time, and nothing is pending
/// once the update phase's commit returned; engines that queue nothing report no commit.
fn tiny_committed(engine: EngineKind) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        commit_queued: true,
        ..tiny_config(engine, dir.path())
    };
    run(&cfg).unwrap_or_else(|e| panic!("{}: {e}", engine.name()))
}

#[test]
fn commit_queued_is_timed_for_bosc() {
    for engine in [EngineKind::BoscBtree, EngineKind::BoscHash] {
        let r = tiny_committed(engine);
        for phase in [&r.insert, &r.update] {
            assert!(phase.queued_blocks.unwrap() > 0, "{engine:?}: {phase:?}");
            let commit = phase.commit_s.unwrap();
            assert!(commit > 0.0, "{engine:?}: {phase:?}");
            let with = phase.ops_per_s_committed.unwrap();
            assert!(
                with > 0.0 && with < phase.ops_per_s,
                "{engine:?}: {phase:?}"
            );
        }
        assert_eq!(note(&r, "pending_at_end"), 0, "{engine:?}: {:?}", r.notes);
    }
    let r = tiny_committed(EngineKind::Redb);
    assert!(r.insert.commit_s.is_none() && r.update.commit_s.is_none());
}
