//! Property tests: random operations on [`VolatileDisk`] and [`MemDisk`] against a `Vec<u8>`.

use std::io;

use mariner_disk::{Disk, FileDisk, MemDisk, VolatileDisk};
use proptest::prelude::*;

use crate::contract::check_allocation;
use crate::{assert_same, disk_path, read_all, tempdir};

const MAX_LEN: u64 = 20_000;

#[derive(Debug, Clone)]
enum Op {
    Write {
        offset: u64,
        len: usize,
        byte: u8,
    },
    Punch {
        offset: u64,
        len: u64,
    },
    SetLen(u64),
    Sync,
    /// The process dies: the overlay is lost (a no-op for `MemDisk`).
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..MAX_LEN, 1..6000usize, 1..=255u8)
            .prop_map(|(offset, len, byte)| Op::Write { offset, len, byte }),
        2 => (0..MAX_LEN, 1..9000u64).prop_map(|(offset, len)| Op::Punch { offset, len }),
        1 => (0..MAX_LEN).prop_map(Op::SetLen),
        2 => Just(Op::Sync),
        1 => Just(Op::Crash),
    ]
}

fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// What a file does: writes past the end grow it, holes past the end change nothing.
fn apply_file(model: &mut Vec<u8>, op: &Op) {
    match *op {
        Op::Write { offset, len, byte } => {
            let offset = usize_of(offset);
            if model.len() < offset + len {
                model.resize(offset + len, 0);
            }
            model[offset..offset + len].fill(byte);
        }
        Op::Punch { offset, len } => {
            let end = usize_of(offset + len).min(model.len());
            let start = usize_of(offset).min(end);
            model[start..end].fill(0);
        }
        Op::SetLen(len) => model.resize(usize_of(len), 0),
        Op::Sync | Op::Crash => {}
    }
}

fn run_volatile(ops: &[Op]) -> io::Result<()> {
    let dir = tempdir()?;
    let path = disk_path(&dir);
    let mut disk = VolatileDisk::new(FileDisk::create_sized(&path, 4096)?)?;
    let mut live = vec![0u8; 4096];
    let mut synced = live.clone();
    for op in ops {
        match op {
            Op::Write { offset, len, byte } => disk.write_at(&vec![*byte; *len], *offset)?,
            Op::Punch { offset, len } => disk.punch_hole(*offset, *len)?,
            Op::SetLen(len) => disk.set_len(*len)?,
            Op::Sync => {
                disk.sync()?;
                synced.clone_from(&live);
            }
            Op::Crash => {
                drop(disk);
                disk = VolatileDisk::new(FileDisk::open(&path, &Default::default())?)?;
                live.clone_from(&synced);
            }
        }
        apply_file(&mut live, op);
        assert_same(&read_all(&disk)?, &live, &format!("after {op:?}"));
    }
    check_allocation(&disk, 0, disk.len()?)?;
    let file = FileDisk::open(&path, &Default::default())?;
    assert_same(
        &read_all(&file)?,
        &synced,
        "the file holds exactly what was synced",
    );
    Ok(())
}

/// `MemDisk` does not grow implicitly: ops are clipped to the current length.
fn clip(op: &Op, len: u64) -> Op {
    match *op {
        Op::Write {
            offset,
            len: n,
            byte,
        } => {
            let offset = offset.min(len);
            let n = n.min(usize_of(len - offset));
            Op::Write {
                offset,
                len: n,
                byte,
            }
        }
        Op::Punch { offset, len: n } => {
            let offset = offset.min(len);
            Op::Punch {
                offset,
                len: n.min(len - offset),
            }
        }
        ref other => other.clone(),
    }
}

fn run_mem(ops: &[Op]) -> io::Result<()> {
    let disk = MemDisk::new(4096);
    let mut model = vec![0u8; 4096];
    for op in ops {
        let op = clip(op, model.len() as u64);
        match &op {
            Op::Write { offset, len, byte } => disk.write_at(&vec![*byte; *len], *offset)?,
            Op::Punch { offset, len } => disk.punch_hole(*offset, *len)?,
            Op::SetLen(len) => disk.set_len(*len)?,
            Op::Sync | Op::Crash => disk.sync()?,
        }
        apply_file(&mut model, &op);
        assert_same(&disk.to_vec(), &model, &format!("after {op:?}"));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn volatile_disk_matches_the_model(ops in prop::collection::vec(op(), 1..40)) {
        run_volatile(&ops)?;
    }

    #[test]
    fn mem_disk_matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run_mem(&ops)?;
    }
}
