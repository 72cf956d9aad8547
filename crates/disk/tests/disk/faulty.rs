//! [`FaultyDisk`]: crashes, torn writes, corruption, injected failures, determinism.

use std::io;
use std::sync::Arc;

use mariner_disk::{CrashMode, Disk, FaultyDisk};

use crate::{pattern, read_all};

fn is_eio(result: io::Result<()>) -> bool {
    matches!(result, Err(e) if e.raw_os_error() == Some(libc::EIO))
}

/// `write_out` paces the device; it is not a durability point.
#[test]
fn written_out_but_unsynced_writes_are_lost() -> io::Result<()> {
    let disk = Arc::new(FaultyDisk::new(4096, 1));
    let faults = disk.faults();
    disk.write_at(b"out", 0)?;
    disk.write_out(0, 4096)?;
    let after = faults.crash_with(CrashMode::LoseUnsynced);
    assert_eq!(&read_all(&after)?[..3], &[0; 3]);
    Ok(())
}

#[test]
fn unsynced_writes_are_lost_and_synced_ones_survive() -> io::Result<()> {
    let disk = Arc::new(FaultyDisk::new(4096, 1));
    let faults = disk.faults();
    disk.write_at(b"synced", 0)?;
    disk.sync()?;
    disk.write_at(b"lost", 100)?;
    disk.write_at(b"SYNCED", 0)?;
    assert_eq!(faults.pending(), 2);

    let after = faults.crash_with(CrashMode::LoseUnsynced);
    let image = read_all(&after)?;
    assert_eq!(&image[..6], b"synced", "stale data must show through");
    assert_eq!(&image[100..104], &[0; 4]);
    assert_eq!(after.faults().pending(), 0);

    // Whatever the random crash does, synced data is there.
    for seed in 0..32 {
        let disk = FaultyDisk::new(4096, seed);
        disk.write_at(b"synced", 0)?;
        disk.sync()?;
        disk.write_at(b"maybe", 10)?;
        let image = read_all(&disk.crash())?;
        assert_eq!(&image[..6], b"synced");
        assert!(&image[10..15] == b"maybe" || image[10..15] == [0; 5]);
    }
    Ok(())
}

#[test]
fn keep_unsynced_applies_every_pending_write() -> io::Result<()> {
    let disk = FaultyDisk::new(64, 1);
    disk.write_at(b"one", 0)?;
    disk.write_at(b"two", 2)?;
    let after = disk.faults().crash_with(CrashMode::KeepUnsynced);
    assert_eq!(&read_all(&after)?[..5], b"ontwo");
    Ok(())
}

#[test]
fn torn_write_keeps_a_prefix_of_sectors() -> io::Result<()> {
    const SECTOR: usize = 512;
    let (mut torn, mut whole, mut lost) = (0, 0, 0);
    for seed in 0..64 {
        let disk = FaultyDisk::from_image(vec![0x11; 16 * SECTOR], seed);
        disk.write_at(&[0x22; 8 * SECTOR], 4 * SECTOR as u64)?;
        let image = read_all(&disk.crash())?;
        let new_sectors = image[4 * SECTOR..12 * SECTOR]
            .chunks(SECTOR)
            .take_while(|s| s == &[0x22; SECTOR])
            .count();
        let rest = &image[(4 + new_sectors) * SECTOR..];
        assert!(rest.iter().all(|&b| b == 0x11), "seed {seed}: not a prefix");
        assert!(image[..4 * SECTOR].iter().all(|&b| b == 0x11));
        match new_sectors {
            0 => lost += 1,
            8 => whole += 1,
            _ => torn += 1,
        }
    }
    assert!(
        torn > 0 && whole > 0 && lost > 0,
        "torn {torn} whole {whole} lost {lost}"
    );
    Ok(())
}

#[test]
fn sector_size_bounds_tearing() -> io::Result<()> {
    for seed in 0..32 {
        let disk = FaultyDisk::from_image(vec![1; 8192], seed);
        disk.faults().set_sector_size(4096)?;
        disk.write_at(&[2; 4096], 4096)?;
        let image = read_all(&disk.crash())?;
        let new = &image[4096..];
        assert!(
            new.iter().all(|&b| b == 2) || new.iter().all(|&b| b == 1),
            "seed {seed}"
        );
    }
    assert!(FaultyDisk::new(1, 0).faults().set_sector_size(0).is_err());
    Ok(())
}

#[test]
fn unsynced_shrink_leaves_the_old_tail() -> io::Result<()> {
    let disk = FaultyDisk::from_image(pattern(1000, 3), 5);
    disk.set_len(10)?;
    assert_eq!(disk.len()?, 10);
    let lost = disk.faults().crash_with(CrashMode::LoseUnsynced);
    assert_eq!(read_all(&lost)?, pattern(1000, 3));

    lost.set_len(10)?;
    lost.sync()?;
    let kept = lost.faults().crash_with(CrashMode::LoseUnsynced);
    assert_eq!(read_all(&kept)?, pattern(10, 3));
    Ok(())
}

#[test]
fn corrupt_changes_bytes_in_both_images() -> io::Result<()> {
    let disk = FaultyDisk::from_image(vec![0; 2048], 9);
    let faults = disk.faults();
    faults.corrupt(512, 512);
    let image = read_all(&disk)?;
    assert!(image[512..1024].iter().all(|&b| b != 0));
    assert!(image[..512].iter().chain(&image[1024..]).all(|&b| b == 0));
    let after = faults.crash_with(CrashMode::LoseUnsynced);
    assert_eq!(read_all(&after)?, image);
    // Out of range is ignored.
    after.faults().corrupt(4096, 10);
    Ok(())
}

#[test]
fn fail_after_fails_the_next_io_and_every_later_sync() -> io::Result<()> {
    let disk = FaultyDisk::new(64, 2);
    let faults = disk.faults();
    faults.fail_after(2);
    disk.write_at(b"a", 0)?;
    disk.sync()?;
    assert!(is_eio(disk.write_at(b"b", 1)));
    assert!(faults.has_failed());
    assert_eq!(
        read_all(&disk)?[..2],
        *b"a\0",
        "a failed write changes nothing"
    );
    disk.write_at(b"c", 2)?;
    for _ in 0..3 {
        assert!(is_eio(disk.sync()));
    }
    faults.set_sync_fails(false);
    assert!(is_eio(disk.sync()), "a failed fsync is final");
    assert_eq!(faults.writes(), 3);
    assert_eq!(faults.syncs(), 5);
    assert_eq!(
        &read_all(&faults.crash_with(CrashMode::KeepUnsynced))?[..3],
        b"a\0\0"
    );

    let disk = FaultyDisk::new(64, 2);
    disk.faults().fail_after(0);
    assert!(is_eio(disk.sync()));
    disk.write_at(b"x", 0)?;
    assert!(is_eio(disk.sync()));

    let disk = FaultyDisk::new(64, 2);
    disk.faults().fail_after(0);
    disk.faults().cancel_fail_after();
    disk.write_at(b"x", 0)?;
    disk.sync()
}

#[test]
fn a_failed_sync_forgets_the_pending_writes() -> io::Result<()> {
    let disk = FaultyDisk::new(64, 2);
    let faults = disk.faults();
    disk.write_at(b"data", 0)?;
    faults.set_sync_fails(true);
    assert!(is_eio(disk.sync()));
    faults.set_sync_fails(false);
    // The retry "succeeds" and reads still see the data, but it never reached the media.
    disk.sync()?;
    assert_eq!(&read_all(&disk)?[..4], b"data");
    assert_eq!(&faults.durable_image()[..4], &[0; 4]);
    let after = faults.crash_with(CrashMode::KeepUnsynced);
    assert_eq!(&read_all(&after)?[..4], &[0; 4]);
    Ok(())
}

/// Many overlapping writes, some synced, then a crash: the image depends only on the seed.
fn scenario(seed: u64) -> io::Result<Vec<u8>> {
    let disk = FaultyDisk::new(64 * 1024, seed);
    for i in 0..40usize {
        let len = 100 + (i * 977) % 5000;
        disk.write_at(
            &pattern(len, i.to_le_bytes()[0]),
            ((i * 1531) % 50_000) as u64,
        )?;
        if i % 13 == 12 {
            disk.sync()?;
        }
    }
    disk.faults().corrupt(3000, 10);
    disk.set_len(60_000)?;
    read_all(&disk.crash())
}

#[test]
fn crashes_are_deterministic_given_the_seed() -> io::Result<()> {
    let mut images = Vec::new();
    for seed in 0..8 {
        let image = scenario(seed)?;
        assert_eq!(image, scenario(seed)?, "seed {seed}");
        images.push(image);
    }
    images.sort();
    images.dedup();
    assert!(images.len() > 1, "different seeds should crash differently");
    Ok(())
}
