//! `mariner log dump|verify`: offline inspection of log devices (raft-engine `ctl` in spirit).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use mariner_disk::{FileDisk, OpenOptions};
use mariner_log::scan::{scan_device, SegmentScan, Stop};
use mariner_log::{read_superblock, RecordKind, Superblock};

#[derive(Args)]
pub struct LogArgs {
    /// Data directory whose log to read [default: ./mariner-data].
    #[arg(long, env = "MARINER_DATA", default_value = "mariner-data")]
    data: PathBuf,
    /// Read these devices instead of the data directory's (in order).
    #[arg(long = "dev")]
    devices: Vec<PathBuf>,
    /// Print at most this many records (dump).
    #[arg(long)]
    limit: Option<usize>,
}

fn device_paths(a: &LogArgs) -> Result<Vec<PathBuf>, String> {
    if !a.devices.is_empty() {
        return Ok(a.devices.clone());
    }
    // As the server finds them: relative to the data directory (format 1: looked for there,
    // then against the working directory).
    let state = mariner_node::datadir::read_state(&a.data)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{}: no mariner.json", a.data.display()))?;
    mariner_node::logdevices::resolve(&a.data, &state).map_err(|e| e.to_string())
}

fn scan_all(a: &LogArgs) -> Result<Vec<(PathBuf, Superblock, Vec<SegmentScan>)>, String> {
    let mut out = Vec::new();
    for (i, path) in device_paths(a)?.into_iter().enumerate() {
        let disk = FileDisk::open(&path, &OpenOptions::new().read_only(true))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let sb = read_superblock(&disk, i).map_err(|e| format!("{}: {e}", path.display()))?;
        let dev = u8::try_from(i).map_err(|_| "too many devices".to_string())?;
        let scan = scan_device(&disk, dev, &sb).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push((path, sb, scan));
    }
    Ok(out)
}

pub fn dump(a: &LogArgs) -> Result<ExitCode, String> {
    let devices = scan_all(a)?;
    let mut records = Vec::new();
    for (path, sb, scan) in &devices {
        println!(
            "# {} device {}/{} log {:032x} segments {}x{} align {}",
            path.display(),
            sb.device_index,
            sb.device_count,
            sb.log_id,
            sb.segment_count,
            sb.segment_bytes,
            sb.align_bytes
        );
        records.extend(
            scan.iter()
                .flat_map(|s| s.records.iter().map(move |r| (s.segment, *r))),
        );
    }
    records.sort_by_key(|(_, r)| r.header.seq);
    println!(
        "{:>10} {:>20} {:>4} {:>14} {:>8} {:>6} {:>7} {:>14} {:>10} {:>10}",
        "SEQ",
        "TIMESTAMP_NS",
        "DEV",
        "LOG_OFFSET",
        "SEGMENT",
        "GEN",
        "KIND",
        "VOL_OFFSET",
        "LENGTH",
        "VOL_SEQ"
    );
    for (segment, r) in records.iter().take(a.limit.unwrap_or(usize::MAX)) {
        let h = &r.header;
        println!(
            "{:>10} {:>20} {:>4} {:>14} {:>8} {:>6} {:>7} {:>14} {:>10} {:>10}",
            h.seq,
            h.timestamp_ns,
            r.addr.dev(),
            r.addr.offset(),
            segment,
            h.generation,
            kind_name(h.kind),
            format!("{}:{}", h.volume, h.offset),
            h.length,
            h.volume_seq
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn kind_name(k: RecordKind) -> &'static str {
    match k {
        RecordKind::Write => "write",
        RecordKind::Trim => "trim",
        RecordKind::WriteZeroes => "zeroes",
        RecordKind::Void => "void",
        RecordKind::VolumeCreated => "created",
        RecordKind::VolumeResized => "resized",
        RecordKind::VolumeDeleted => "deleted",
        RecordKind::HistoryGap => "gap",
    }
}

pub fn verify(a: &LogArgs) -> Result<ExitCode, String> {
    let devices = scan_all(a)?;
    let mut problems = 0;
    let mut seqs: BTreeMap<u64, usize> = BTreeMap::new();
    let first_id = devices.first().map(|d| d.1.log_id);
    for (i, (path, sb, scan)) in devices.iter().enumerate() {
        if Some(sb.log_id) != first_id || usize::from(sb.device_index) != i {
            println!("{}: belongs to another log or position", path.display());
            problems += 1;
        }
        let used = scan.iter().filter(|s| s.generation.is_some()).count();
        let records: usize = scan.iter().map(|s| s.records.len()).sum();
        let torn = scan
            .iter()
            .filter(|s| matches!(s.stop, Stop::BadHeader | Stop::BadPayload))
            .count();
        let mut gens: Vec<u64> = scan.iter().filter_map(|s| s.generation).collect();
        gens.sort_unstable();
        let dup_gens = gens.windows(2).filter(|w| w[0] == w[1]).count();
        if dup_gens > 0 {
            println!("{}: {dup_gens} segments share a generation", path.display());
            problems += 1;
        }
        for s in scan {
            for r in &s.records {
                *seqs.entry(r.header.seq).or_insert(0) += 1;
            }
        }
        println!(
            "{}: device {}/{}, {used}/{} segments written, {records} valid records, {torn} segment(s) end in a damaged record (a torn tail is normal after a crash)",
            path.display(),
            sb.device_index,
            sb.device_count,
            sb.segment_count
        );
    }
    let dups = seqs.values().filter(|&&n| n > 1).count();
    if dups > 0 {
        println!("{dups} sequence number(s) appear more than once");
        problems += 1;
    }
    if let (Some((&lo, _)), Some((&hi, _))) = (seqs.first_key_value(), seqs.last_key_value()) {
        let missing = (hi - lo + 1) - seqs.len() as u64;
        println!("sequence numbers {lo}..={hi}, {missing} missing (reused space, or never durable and not yet voided)");
    }
    if problems == 0 {
        println!("ok");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{problems} problem(s)");
        Ok(ExitCode::from(1))
    }
}
