//! [`VolatileDisk`]: unsynced data lives only in memory.

use std::io;

use mariner_disk::{AlignedBuf, Disk, Extent, FileDisk, OpenOptions, VolatileDisk};

use crate::{disk_path, pattern, read_all, tempdir};

fn reopen(dir: &tempfile::TempDir) -> io::Result<FileDisk> {
    FileDisk::open(disk_path(dir), &OpenOptions::new())
}

#[test]
fn unsynced_writes_are_visible_but_not_in_the_file() -> io::Result<()> {
    let dir = tempdir()?;
    let file = FileDisk::create_sized(disk_path(&dir), 0)?;
    file.write_at(&pattern(10_000, 1), 0)?;
    let disk = VolatileDisk::new(file)?;

    disk.write_at(&pattern(3000, 2), 1234)?;
    disk.write_at(b"tail", 12_000)?;
    assert_eq!(disk.len()?, 12_004);
    let mut expected = pattern(10_000, 1);
    expected[1234..4234].copy_from_slice(&pattern(3000, 2));
    expected.resize(12_000, 0);
    expected.extend_from_slice(b"tail");
    assert!(read_all(&disk)? == expected);
    assert_eq!(disk.unsynced_bytes(), 3004);
    assert!(
        read_all(&reopen(&dir)?)? == pattern(10_000, 1),
        "the file must not change"
    );

    disk.sync()?;
    assert_eq!(disk.unsynced_bytes(), 0);
    assert!(read_all(&reopen(&dir)?)? == expected);
    assert!(read_all(&disk)? == expected);
    Ok(())
}

#[test]
fn dropping_without_sync_loses_the_writes() -> io::Result<()> {
    let dir = tempdir()?;
    let disk = VolatileDisk::new(FileDisk::create_sized(disk_path(&dir), 4096)?)?;
    disk.write_at(b"synced", 0)?;
    disk.sync()?;
    disk.write_at(b"SYNCED", 0)?;
    disk.write_at(b"lost", 100)?;
    disk.set_len(10)?;
    drop(disk);
    let image = read_all(&reopen(&dir)?)?;
    assert_eq!(image.len(), 4096);
    assert_eq!(&image[..6], b"synced");
    assert_eq!(&image[100..104], &[0; 4]);
    Ok(())
}

#[test]
fn punch_and_set_len_are_held_until_sync() -> io::Result<()> {
    let dir = tempdir()?;
    let file = FileDisk::create_sized(disk_path(&dir), 0)?;
    file.write_at(&[9; 64 * 1024], 0)?;
    let disk = VolatileDisk::new(file)?;

    disk.punch_hole(16 * 1024, 16 * 1024)?;
    disk.set_len(48 * 1024)?;
    disk.set_len(56 * 1024)?;
    assert_eq!(disk.len()?, 56 * 1024);
    let image = read_all(&disk)?;
    assert!(image[16 * 1024..32 * 1024].iter().all(|&b| b == 0));
    assert!(
        image[48 * 1024..].iter().all(|&b| b == 0),
        "a cut tail stays cut"
    );
    let hole = Extent {
        offset: 16 * 1024,
        len: 16 * 1024,
        allocated: false,
    };
    assert!(disk.allocation(0, 56 * 1024)?.contains(&hole));

    let file = reopen(&dir)?;
    assert_eq!(file.len()?, 64 * 1024);
    assert!(read_all(&file)?.iter().all(|&b| b == 9));

    disk.sync()?;
    assert_eq!(file.len()?, 56 * 1024);
    assert!(read_all(&file)? == image);
    let expected = vec![
        Extent {
            offset: 0,
            len: 16 * 1024,
            allocated: true,
        },
        hole,
        Extent {
            offset: 32 * 1024,
            len: 16 * 1024,
            allocated: true,
        },
        Extent {
            offset: 48 * 1024,
            len: 8 * 1024,
            allocated: false,
        },
    ];
    assert_eq!(file.allocation(0, 56 * 1024)?, expected);
    Ok(())
}

#[test]
fn overlay_counts_as_allocated() -> io::Result<()> {
    let dir = tempdir()?;
    let disk = VolatileDisk::new(FileDisk::create_sized(disk_path(&dir), 64 * 1024)?)?;
    disk.write_at(&[1; 100], 5000)?;
    let expected = vec![
        Extent {
            offset: 0,
            len: 5000,
            allocated: false,
        },
        Extent {
            offset: 5000,
            len: 100,
            allocated: true,
        },
        Extent {
            offset: 5100,
            len: 64 * 1024 - 5100,
            allocated: false,
        },
    ];
    assert_eq!(disk.allocation(0, 64 * 1024)?, expected);
    Ok(())
}

#[test]
fn direct_file_keeps_its_alignment_rules() -> io::Result<()> {
    let dir = tempdir()?;
    let options = OpenOptions::new().create(true).direct(true);
    let file = FileDisk::open(disk_path(&dir), &options)?;
    file.set_len(32 * 1024)?;
    let disk = VolatileDisk::new(file)?;
    assert_eq!(disk.alignment(), 4096);

    let mut buf = AlignedBuf::new(4096, 4096)?;
    buf.copy_from_slice(&pattern(4096, 7));
    let err = disk.write_at(&buf[..512], 0).err().map(|e| e.kind());
    assert_eq!(err, Some(io::ErrorKind::InvalidInput));
    disk.write_at(&buf, 8192)?;
    disk.sync()?;
    let mut back = AlignedBuf::new(4096, 4096)?;
    reopen(&dir)?.read_at(&mut back, 8192)?;
    assert_eq!(&back[..], &buf[..]);
    Ok(())
}

#[test]
fn write_through_writes_are_in_the_file_when_they_return() -> io::Result<()> {
    let dir = tempdir()?;
    let file = FileDisk::create_sized(disk_path(&dir), 0)?;
    file.write_at(&pattern(10_000, 1), 0)?;
    let file = FileDisk::open(disk_path(&dir), &OpenOptions::new().dsync(true))?;
    let disk = VolatileDisk::write_through(file)?;

    // A hole punched (held), then partly overwritten: the write wins where it lands.
    disk.punch_hole(0, 4096)?;
    disk.write_at(&pattern(3000, 2), 1234)?;
    let mut expected = pattern(10_000, 1);
    expected[..4096].fill(0);
    expected[1234..4234].copy_from_slice(&pattern(3000, 2));
    assert!(read_all(&disk)? == expected);
    assert_eq!(disk.unsynced_bytes(), 1234, "the hole before the write");

    // Killed now: the write is in the file; the punched hole around it is not.
    let mut in_file = pattern(10_000, 1);
    in_file[1234..4234].copy_from_slice(&pattern(3000, 2));
    assert!(read_all(&reopen(&dir)?)? == in_file);

    // A write past the end takes the file's new length with it (and, more durable than
    // O_DSYNC, whatever was held).
    disk.write_at(b"tail", 12_000)?;
    expected.resize(12_000, 0);
    expected.extend_from_slice(b"tail");
    assert!(read_all(&disk)? == expected);
    assert!(read_all(&reopen(&dir)?)? == expected);
    assert_eq!(disk.unsynced_bytes(), 0);
    Ok(())
}
