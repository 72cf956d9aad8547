//! The [`Disk`] contract, one generic function run against every implementation.

use std::io;
use std::sync::Arc;

use mariner_disk::{
    Disk, Extent, FaultyDisk, FileDisk, FullDisk, MemDisk, OpenOptions, VolatileDisk,
};

use crate::{disk_path, pattern, read_all, tempdir};

const LEN: usize = 64 * 1024;

/// Asserts that `extents` are ordered, contiguous, merged and cover `[offset, offset+len)`
/// exactly, and that every hole reads as zeros.
pub fn check_allocation<D: Disk + ?Sized>(disk: &D, offset: u64, len: u64) -> io::Result<()> {
    let extents = disk.allocation(offset, len)?;
    let mut pos = offset;
    let mut prev: Option<Extent> = None;
    for e in &extents {
        assert_eq!(e.offset, pos, "extents not contiguous: {extents:?}");
        assert!(e.len > 0, "empty extent: {extents:?}");
        if let Some(p) = prev {
            assert_ne!(p.allocated, e.allocated, "extents not merged: {extents:?}");
        }
        if !e.allocated {
            let mut buf = vec![0xFF; usize::try_from(e.len).map_err(io::Error::other)?];
            disk.read_at(&mut buf, e.offset)?;
            assert!(
                buf.iter().all(|&b| b == 0),
                "hole {e:?} does not read as zeros"
            );
        }
        pos += e.len;
        prev = Some(*e);
    }
    assert_eq!(
        pos,
        offset + len,
        "extents do not cover the range: {extents:?}"
    );
    Ok(())
}

fn assert_image<D: Disk + ?Sized>(disk: &D, model: &[u8]) -> io::Result<()> {
    assert_eq!(disk.len()?, model.len() as u64);
    assert!(read_all(disk)? == model, "disk differs from the model");
    // A read served from memory, when the disk can, returns the same bytes.
    let mut cached = vec![0xa5u8; model.len()];
    if disk.read_cached(&mut cached, 0)? {
        assert!(cached == model, "read_cached differs from the model");
    }
    let (at, n) = (model.len() / 3, model.len() / 5);
    let mut part = vec![0xa5u8; n];
    if disk.read_cached(&mut part, at as u64)? {
        assert!(part == model[at..at + n], "read_cached of a part differs");
    }
    Ok(())
}

fn write<D: Disk + ?Sized>(
    disk: &D,
    model: &mut [u8],
    data: &[u8],
    offset: usize,
) -> io::Result<()> {
    disk.write_at(data, offset as u64)?;
    model[offset..offset + data.len()].copy_from_slice(data);
    assert_image(disk, model)
}

fn punch<D: Disk + ?Sized>(
    disk: &D,
    model: &mut [u8],
    offset: usize,
    len: usize,
) -> io::Result<()> {
    disk.punch_hole(offset as u64, len as u64)?;
    model[offset..offset + len].fill(0);
    assert_image(disk, model)
}

fn assert_kind(result: io::Result<()>, kind: io::ErrorKind) {
    assert_eq!(result.err().map(|e| e.kind()), Some(kind));
}

/// The contract every implementation keeps. `disk` must be empty and take any alignment.
pub fn check_contract<D: Disk + ?Sized>(disk: &D) -> io::Result<()> {
    assert_eq!(disk.alignment(), 1);
    disk.set_len(LEN as u64)?;
    let mut model = vec![0u8; LEN];
    assert_image(disk, &model)?;
    check_allocation(disk, 0, LEN as u64)?;

    // Round trips, aligned and not, overlapping (newest wins).
    write(disk, &mut model, &pattern(4096, 1), 0)?;
    write(disk, &mut model, &pattern(1000, 2), 4097)?;
    write(disk, &mut model, &pattern(3, 3), 4095)?;
    write(disk, &mut model, &pattern(20_000, 4), 30_001)?;
    let mut buf = vec![0; 2000];
    disk.read_at(&mut buf, 4000)?;
    assert_eq!(buf, model[4000..6000]);

    // Reads past the end fail; an empty read at the end does not.
    let len = LEN as u64;
    assert_kind(
        disk.read_at(&mut [0; 10], len - 5),
        io::ErrorKind::UnexpectedEof,
    );
    assert_kind(disk.read_at(&mut [0; 1], len), io::ErrorKind::UnexpectedEof);
    assert_kind(
        disk.read_at(&mut [0; 1], u64::MAX),
        io::ErrorKind::UnexpectedEof,
    );
    disk.read_at(&mut [], len)?;
    // Past the end there is nothing to serve from memory either.
    assert!(!disk.read_cached(&mut [0; 10], len - 5)?);
    assert!(!disk.read_cached(&mut [0; 1], u64::MAX)?);

    // Holes read as zeros.
    punch(disk, &mut model, 8192, 16_384)?;
    punch(disk, &mut model, 100, 50)?;
    punch(disk, &mut model, 30_500, 9_000)?;
    check_allocation(disk, 0, len)?;
    check_allocation(disk, 123, 45_678)?;

    // Writing out a range, or all of it, changes nothing a read sees.
    disk.write_out(4096, 8192)?;
    disk.write_out(0, len)?;
    disk.write_out(len, 0)?;
    assert_image(disk, &model)?;

    // A prefetch hint, inside the disk, across its end or empty, changes nothing either.
    disk.prefetch(4000, 30_000)?;
    disk.prefetch(len - 100, 4096)?;
    disk.prefetch(len, 0)?;
    assert_image(disk, &model)?;

    disk.sync()?;
    assert_image(disk, &model)?;

    // Growing adds zeros; shrinking then growing does not bring old bytes back.
    disk.set_len(len + 10_000)?;
    model.resize(LEN + 10_000, 0);
    assert_image(disk, &model)?;
    disk.set_len(1000)?;
    model.truncate(1000);
    assert_image(disk, &model)?;
    disk.set_len(len)?;
    model.resize(LEN, 0);
    assert_image(disk, &model)?;
    check_allocation(disk, 0, len)?;
    disk.sync()?;
    assert_image(disk, &model)
}

#[test]
fn mem_disk_keeps_the_contract() -> io::Result<()> {
    check_contract(&MemDisk::new(0))?;
    check_contract(&Arc::new(MemDisk::default()))
}

#[test]
fn faulty_disk_keeps_the_contract() -> io::Result<()> {
    check_contract(&FaultyDisk::new(0, 42))
}

#[test]
fn full_disk_keeps_the_contract() -> io::Result<()> {
    check_contract(&FullDisk::new(MemDisk::new(0)))
}

#[test]
fn file_disk_keeps_the_contract() -> io::Result<()> {
    let dir = tempdir()?;
    check_contract(&FileDisk::create_sized(disk_path(&dir), 0)?)
}

#[test]
fn volatile_disk_keeps_the_contract() -> io::Result<()> {
    let dir = tempdir()?;
    let disk = VolatileDisk::new(FileDisk::create_sized(disk_path(&dir), 0)?)?;
    check_contract(&disk)?;
    // Everything was synced: the file holds the same image.
    let file = FileDisk::open(disk_path(&dir), &Default::default())?;
    assert!(read_all(&file)? == read_all(&disk)?);
    Ok(())
}

#[test]
fn write_through_volatile_disk_keeps_the_contract() -> io::Result<()> {
    let dir = tempdir()?;
    FileDisk::create_sized(disk_path(&dir), 0)?;
    let file = FileDisk::open(disk_path(&dir), &OpenOptions::new().dsync(true))?;
    let disk = VolatileDisk::write_through(file)?;
    check_contract(&disk)?;
    let file = FileDisk::open(disk_path(&dir), &Default::default())?;
    assert!(read_all(&file)? == read_all(&disk)?);
    Ok(())
}

#[test]
fn dyn_disk_keeps_the_contract() -> io::Result<()> {
    let disk: Arc<dyn Disk> = Arc::new(MemDisk::new(0));
    check_contract(&disk)
}
