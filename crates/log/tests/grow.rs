#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Growing a closed log by devices (crate::grow): every record a holder keeps is found again
//! afterwards, whether the segments in use wrapped around the ring or not, and the new device
//! takes writes at once that would have waited for space before; a grow cut short is finished
//! by running it again; a device of another log, or one in use, is refused.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mariner_disk::{Disk, MemDisk};
use mariner_log::{
    read_superblock, Durable, DurableSink, Entry, HolderSpec, Log, LogConfig, LogError, Recovery,
    DATA_OFFSET,
};

const LOG_ID: u128 = 0x0061_200e;
const SEG: u64 = 64 * 1024;
const SEGMENTS: u64 = 4;
const STORE: &str = "store";

struct Ignore;

impl DurableSink for Ignore {
    fn durable(&self, _: &[Durable]) {}
}

fn cfg() -> LogConfig {
    LogConfig {
        segment_bytes: SEG,
        t_wait_ns: 20_000,
        ..LogConfig::default()
    }
}

fn disk() -> Arc<dyn Disk> {
    Arc::new(MemDisk::new((DATA_OFFSET + SEGMENTS * SEG) as usize))
}

fn devices(n: usize) -> Vec<Arc<dyn Disk>> {
    let devs: Vec<Arc<dyn Disk>> = (0..n).map(|_| disk()).collect();
    Log::format(&devs, &cfg(), LOG_ID).unwrap();
    devs
}

fn open(devs: &[Arc<dyn Disk>], store: u64) -> (Log, Recovery) {
    Log::open(
        devs.to_vec(),
        cfg(),
        LOG_ID,
        &[HolderSpec::must_hold(STORE, store, 0)],
        Arc::new(Ignore),
    )
    .unwrap()
}
/// Record `seq`'s payload: 4 KiB of one byte the sequence number decides.
fn payload(seq: u64) -> u8 {
    (seq % 251) as u8
}

/// Appends `n` writes, each acknowledged within two seconds (a writer waiting for space
/// fails the test); returns the last sequence number.
fn append(log: &Log, n: u64, next_seq: u64) -> u64 {
    let mut last = next_seq - 1;
    for i in 0..n {
        let seq = next_seq + i;
        let e = Entry::write(1, (seq % 64) * 4096, Bytes::from(vec![payload(seq); 4096]));
        let mut rx = log.append(e).unwrap();
        let start = std::time::Instant::now();
        let a = loop {
            match rx.try_recv() {
                Ok(r) => break r.unwrap(),
                Err(_) if start.elapsed() > Duration::from_secs(2) => {
                    panic!("append {seq} waited for log space")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        assert_eq!(a.seq, seq);
        last = seq;
    }
    last
}

/// Every record above `after` through `last`, in order, with its payload.
fn check_replay(devs: &[Arc<dyn Disk>], log: &Log, rec: &Recovery, after: u64, last: u64) {
    let mut seen = Vec::new();
    log.replay::<LogError>(&rec.replay, |f, bytes| {
        assert!(
            bytes.iter().all(|&b| b == payload(f.header.seq)),
            "record {} reads back other bytes",
            f.header.seq
        );
        seen.push(f.header.seq);
        Ok(())
    })
    .unwrap();
    seen.sort_unstable();
    let want: Vec<u64> = (after + 1..=last).collect();
    assert_eq!(seen, want, "{} devices", devs.len());
}

#[test]
fn a_grown_log_keeps_every_held_record_and_takes_more_wrapped_or_not() {
    // Records before the held run shift where it starts on the ring: with some of these it
    // wraps past the last segment, with others not.
    for pre in [0u64, 10, 20, 30, 40, 50] {
        let mut devs = devices(1);
        let (log, _) = open(&devs, 0);
        let store = log.holder(STORE).unwrap();
        let mut last = 0;
        for _ in 0..pre {
            last = append(&log, 1, last + 1);
            store.release(last);
        }
        // The store stops releasing: what follows is held, about 2.5 of the 4 segments.
        let held_after = last;
        last = append(&log, 35, last + 1);
        log.shutdown();
        drop(log);

        let added = disk();
        let g = Log::add_devices(&devs, std::slice::from_ref(&added), LOG_ID).unwrap();
        assert_eq!((g.devices_before, g.devices_after), (1, 2), "pre {pre}");
        devs.push(added);
        for (i, d) in devs.iter().enumerate() {
            let sb = read_superblock(d.as_ref(), i).unwrap();
            assert_eq!((sb.device_index, sb.device_count), (i as u16, 2));
        }

        let (log, rec) = open(&devs, held_after);
        assert_eq!(rec.last_seq, last, "pre {pre}");
        check_replay(&devs, &log, &rec, held_after, last);
        // Three and a half segments more, none released: more than the old log held in all.
        last = append(&log, 50, last + 1);
        log.shutdown();
        drop(log);

        let (log, rec) = open(&devs, held_after);
        check_replay(&devs, &log, &rec, held_after, last);
        // And it runs on: released, the rings go round.
        let store = log.holder(STORE).unwrap();
        store.release(last);
        for _ in 0..200 {
            last = append(&log, 1, last + 1);
            store.release(last);
        }
        log.shutdown();
    }
}

#[test]
fn a_grow_cut_short_is_refused_at_open_and_finished_by_growing_again() {
    let mut devs = devices(2);
    let (log, _) = open(&devs, 0);
    let last = append(&log, 20, 1);
    log.shutdown();
    drop(log);
    // As a crash leaves them after the new device was formatted and device 0's superblock
    // rewritten: device 1 still says it is one of two.
    let added = disk();
    let mut sb = read_superblock(devs[0].as_ref(), 0).unwrap();
    sb.device_count = 3;
    devs[0].write_at(&sb.encode(), 0).unwrap();
    let new = mariner_log::Superblock {
        device_index: 2,
        ..sb
    };
    added.write_at(&new.encode(), 0).unwrap();
    let err = Log::open(
        devs.clone(),
        cfg(),
        LOG_ID,
        &[HolderSpec::must_hold(STORE, 0, 0)],
        Arc::new(Ignore),
    )
    .err()
    .unwrap();
    assert!(
        matches!(err, LogError::WrongPosition { dev: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("log grow"), "{err}");

    let g = Log::add_devices(&devs, std::slice::from_ref(&added), LOG_ID).unwrap();
    assert_eq!(g.devices_after, 3);
    devs.push(added);
    let (log, rec) = open(&devs, 0);
    check_replay(&devs, &log, &rec, 0, last);
    log.shutdown();
}

#[test]
fn a_device_of_another_log_or_one_holding_a_log_is_refused() {
    let devs = devices(1);
    let other = devices(1);
    let err = Log::add_devices(&devs, &other, LOG_ID).unwrap_err();
    assert!(
        matches!(err, LogError::AlreadyFormatted { dev: 1 }),
        "{err}"
    );
    let err = Log::add_devices(&devs, &[disk()], LOG_ID ^ 1).unwrap_err();
    assert!(
        matches!(err, LogError::ForeignDevice { dev: 0, .. }),
        "{err}"
    );
    // Nothing changed: the log opens as it was.
    let (log, _) = open(&devs, 0);
    log.shutdown();
}
