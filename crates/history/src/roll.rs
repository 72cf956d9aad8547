//! Rolling the base images forward (retention.rs decides when and how far): a round's
//! records applied to the bases of the volumes rolling past them, each byte written once from
//! the newest record that covers it, then the bases synced.
//!
//! The records' payloads are read back from the log in log order, runs of nearby records
//! with one read each (`Log::read_near`): a round of 131,072 4 KiB writes otherwise cost two
//! reads and an allocation per record on history's thread. Where a round's records lie apart
//! (other volumes' records, versions overwritten later in the round), a gap of more than
//! `NEAR_GAP` starts a new read rather than reading what lies between.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use mariner_log::{DeviceBusy, LogAddr, RecordKind, RECORD_HEADER_LEN};

use crate::engine::{base_name, io_err, lock, Inner};
use crate::round::Plan;
use crate::state::FLAG_BROKEN;
use crate::{DigestEntry, HistoryError};

/// Most bytes one read of nearby records takes (a record larger than this is read alone;
/// never more than the log reads at once, `Log::max_read_following`).
const NEAR_SPAN: u64 = 1 << 20;
/// The widest gap between two records read with one read.
const NEAR_GAP: u64 = 64 << 10;

/// A base's writes go on to the device in pieces of about this many bytes, in offset order,
/// before its sync ([`mariner_disk::Disk::write_out`]). A round writes 100–130 MB of 4 KiB
/// pieces every 5 s under a writer at ~30 k/s; synced at once, they took the device for
/// 110–240 ms, every log write in that time waited behind them, and a depth-1 writer's p99
/// was 872 µs against 251 µs without history (docs/benchmarks.md). The log's gap piece
/// fits between two of a depth-1 writer's log writes ([`Pace`]).
const WRITE_OUT_BYTES: u64 = DeviceBusy::PIECE;

/// The longest a piece waits for a gap between the log's device writes.
pub(crate) const YIELD_MAX: Duration = Duration::from_millis(2);

/// The longest a round's write-out is spread over ([`Pace`]): a sixth of the longest
/// interval between expiry rounds (20 s). At 5 s, a slow disk's write-out of a 256 MiB round
/// (5.8–7.9 s flat out) was always behind the line and no piece waited for a gap
/// (bench/history-trace.sh, 2026-12-03). The log fills meanwhile: once it is pressed, the
/// rest of the round goes flat out.
const PACE_MAX: Duration = Duration::from_secs(crate::retention::ROLL_INTERVAL_MAX.as_secs() / 6);

/// A range of a base to be written from one record's payload.
#[derive(Debug, Clone, Copy)]
struct Piece {
    volume: u32,
    start: u64,
    end: u64,
    record: DigestEntry,
}

impl Inner {
    /// The volumes rolling forward (not broken): the records after their base, through their
    /// rolling target.
    pub(crate) fn rolling(&self) -> BTreeMap<u32, (u64, u64)> {
        lock(&self.state)
            .volumes
            .iter()
            .filter(|(_, v)| v.rolling_seq > v.base_seq && v.flags & FLAG_BROKEN == 0)
            .map(|(&id, v)| (id, (v.base_seq, v.rolling_seq)))
            .collect()
    }

    /// Applies `plan` to the bases of the volumes rolling past its records (each byte from
    /// the newest record covering it, which gives the image applying them in order gives),
    /// syncs, and saves the bases at their targets.
    pub(crate) fn apply_rolling(&self, plan: Plan) -> Result<(), HistoryError> {
        let log = self
            .log
            .get()
            .ok_or_else(|| HistoryError::Config("history is not started".into()))?;
        let rolling = self.rolling();
        let bases = lock(&self.bases).clone();
        let mut lost = Vec::new();
        let Plan {
            volumes: plans,
            gone,
            records,
            first_ts,
            last_ts,
            ..
        } = plan;
        let written_to: Vec<u32> = plans.keys().copied().collect();
        let started = Instant::now();
        // Bases grown to what the round writes, trims punched; the writes' pieces collected.
        let mut pieces = Vec::new();
        for (id, plan) in plans {
            let Some(disk) = bases.get(&id).filter(|_| rolling.contains_key(&id)) else {
                continue;
            };
            let io = io_err(self.files.as_ref(), &base_name(id));
            let end = plan.0.values().map(|&(end, _)| end).max().unwrap_or(0);
            if end > disk.len().map_err(&io)? {
                disk.set_len(end).map_err(&io)?;
            }
            for (start, (end, record)) in plan.0 {
                if record.kind == RecordKind::Write {
                    pieces.push(Piece {
                        volume: id,
                        start,
                        end,
                        record,
                    });
                } else {
                    disk.punch_hole(start, end - start).map_err(&io)?;
                }
            }
        }
        // The records read in log order, nearby ones with one read ([`Log::read_near`]); the
        // bases are written in that order too (their page cache sorts it out at the sync).
        pieces.sort_unstable_by_key(|p| (p.record.addr.0, p.start));
        let mut buf = Vec::new();
        let mut writes = 0u64;
        let mut bytes = 0u64;
        let mut read_time = Duration::ZERO;
        let span = NEAR_SPAN.min(log.max_read_following());
        for group in near_groups(&pieces, span) {
            let records: Vec<(LogAddr, u64, u32)> = dedup_records(group);
            let t = Instant::now();
            let got = log.read_near(&records, &mut buf)?;
            read_time += t.elapsed();
            // Per record, its payload's range in `buf`, or `None`: reused — a record in its
            // place (Gone) or the middle of one (a header that does not decode). Either way
            // the log let it go (it was cut while history was down) and the base cannot have it.
            let mut ranges = Vec::with_capacity(got.len());
            for r in got {
                ranges.push(match r {
                    Ok((_, range)) => Some(range),
                    Err(
                        mariner_log::LogError::Gone { .. } | mariner_log::LogError::Corrupt { .. },
                    ) => None,
                    Err(err) => return Err(err.into()),
                });
            }
            // Pieces come in their records' order: `k` follows them.
            let mut k = 0;
            for p in group {
                let e = &p.record;
                while records.get(k).is_some_and(|r| r.1 != e.seq) {
                    k += 1;
                }
                if lost.contains(&p.volume) {
                    continue;
                }
                let Some(range) = ranges.get(k).cloned().flatten() else {
                    lost.push(p.volume);
                    continue;
                };
                // The base's name is made only for an error: this loop runs per piece.
                let corrupt = || HistoryError::Corrupt {
                    path: self.files.path(&base_name(p.volume)),
                    at: p.start,
                    why: format!("record {} is shorter than its extent", e.seq),
                };
                let from = range.start + (p.start - e.offset) as usize;
                let to = range.start + (p.end - e.offset) as usize;
                let part = buf
                    .get(from..to)
                    .filter(|_| to <= range.end)
                    .ok_or_else(corrupt)?;
                let Some(disk) = bases.get(&p.volume) else {
                    continue;
                };
                disk.write_at(part, p.start)
                    .map_err(|e| io_err(self.files.as_ref(), &base_name(p.volume))(e))?;
                writes += 1;
                bytes += part.len() as u64;
            }
        }
        let written = started.elapsed();
        let mut ranges: Vec<(u32, u64, u64)> =
            pieces.iter().map(|p| (p.volume, p.start, p.end)).collect();
        ranges.sort_unstable();
        // Spread over three quarters of the time the round's records took to arrive (a third
        // above their rate keeps pace), unless the log is pressed: then as fast as the device
        // goes.
        let arrived = Duration::from_nanos(first_ts.map_or(0, |a| last_ts.saturating_sub(a)));
        let budget = if self.log_pressed() {
            Duration::ZERO
        } else {
            (arrived * 3 / 4).min(PACE_MAX)
        };
        let pressed = || self.log_pressed();
        let mut pace = Pace::new(&log.stats().busy, &pressed, budget, bytes);
        for same in ranges.chunk_by(|a, b| a.0 == b.0) {
            if let Some(disk) = bases.get(&same[0].0) {
                write_out_paced(disk.as_ref(), same, &mut pace, || self.turn_after())
                    .map_err(io_err(self.files.as_ref(), &base_name(same[0].0)))?;
            }
        }
        let paced = started.elapsed();
        for id in &written_to {
            if let Some(disk) = bases.get(id).filter(|_| rolling.contains_key(id)) {
                let _turn = self.turn_after();
                disk.sync()
                    .map_err(io_err(self.files.as_ref(), &base_name(*id)))?;
            }
        }
        tracing::debug!(
            read_ms = read_time.as_millis(),
            write_ms = (written - read_time).as_millis(),
            write_out_ms = (paced - written).as_millis(),
            sync_ms = (started.elapsed() - paced).as_millis(),
            writes,
            bytes,
            budget_ms = budget.as_millis(),
            yielded = pace.waited,
            gaps = pace.found,
            "history applied records to the base images"
        );
        {
            let mut st = lock(&self.state);
            for (id, v) in st.volumes.iter_mut() {
                if !rolling.contains_key(id) {
                    continue;
                }
                if lost.contains(id) {
                    v.flags |= FLAG_BROKEN;
                }
                v.base_seq = v.rolling_seq;
                v.base_vseq = v.rolling_vseq;
                v.base_ts = v.rolling_ts;
                v.rolling_seq = 0;
                v.rolling_vseq = 0;
                v.rolling_ts = 0;
            }
            if !lost.is_empty() {
                // The log cut this round's records while it ran (`check_cut` leaves a
                // volume rolling past the cut to this round): counted and said like any cut.
                self.stats.cuts.fetch_add(1, Relaxed);
                tracing::warn!(
                    volumes = ?lost,
                    "the log filled faster than history's base images rolled forward: their \
                     history is lost until it is seeded again"
                );
            }
            for id in &gone {
                st.volumes.remove(id);
            }
        }
        for id in &gone {
            lock(&self.bases).remove(id);
            self.views
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(id);
        }
        self.stats.rolled_records.fetch_add(records, Relaxed);
        self.stats.rolled_bytes.fetch_add(bytes, Relaxed);
        // Readers move to the new base only once it is durable, and before the log is
        // released (in `save`): a read that chose a log version waits for nothing after this.
        self.note_views();
        self.save(true)?;
        // The deleted volumes' bases go once the state no longer names them.
        for id in gone {
            let name = base_name(id);
            self.files
                .remove(&name)
                .map_err(io_err(self.files.as_ref(), &name))?;
        }
        Ok(())
    }
}

/// A round's write-out schedule. While the pieces handed to the device are ahead of a
/// straight line from nothing at the start to everything at `budget`, each waits (at most
/// [`YIELD_MAX`]) for a moment when no log write is on the device ([`DeviceBusy`]), so that
/// it lands in the gap between a depth-1 writer's log writes rather than in front of one.
/// Behind the line, pieces go at once: the round takes about `budget`, or as long as the
/// device needs, never the sum of the waits. In seconds when the roll wrote its pieces back
/// to back (200 MB/s), a depth-1 writer's requests between 0.4 and 1 ms rose from ~10 to
/// 400–900 a second (docs/benchmarks.md, issue 17). Once the log is pressed (`pressed`),
/// the rest goes at once.
struct Pace<'a> {
    busy: &'a DeviceBusy,
    pressed: &'a dyn Fn() -> bool,
    started: Instant,
    budget: Duration,
    total: u64,
    done: u64,
    /// Pieces that waited for a gap, and how many found one.
    waited: u64,
    found: u64,
}

impl<'a> Pace<'a> {
    fn new(
        busy: &'a DeviceBusy,
        pressed: &'a dyn Fn() -> bool,
        budget: Duration,
        total: u64,
    ) -> Self {
        Self {
            busy,
            pressed,
            started: Instant::now(),
            budget,
            total,
            done: 0,
            waited: 0,
            found: 0,
        }
    }

    /// Before a piece of `bytes`: waits for a gap if ahead of the schedule.
    fn before(&mut self, bytes: u64) {
        if !self.budget.is_zero() && (self.pressed)() {
            self.budget = Duration::ZERO;
        }
        if self.total > 0 && !self.budget.is_zero() {
            let share = self.done as f64 / self.total as f64;
            let time = self.started.elapsed().as_secs_f64() / self.budget.as_secs_f64();
            if share >= time {
                self.waited += 1;
                if self.busy.wait_idle(YIELD_MAX) {
                    self.found += 1;
                }
            }
        }
        self.done += bytes;
    }
}

/// Hands one base's written `ranges` (sorted by offset) to the device in pieces of
/// [`WRITE_OUT_BYTES`], each waited for before the next, each at its moment (`pace`) and in
/// history's I/O turn (`Inner::io_turn`, taken by `turn`).
fn write_out_paced<'a>(
    disk: &dyn mariner_disk::Disk,
    ranges: &[(u32, u64, u64)],
    pace: &mut Pace<'_>,
    turn: impl Fn() -> std::sync::MutexGuard<'a, ()>,
) -> std::io::Result<()> {
    let mut rest = ranges;
    while let Some(&(_, start, first_end)) = rest.first() {
        let (mut end, mut bytes, mut n) = (first_end, first_end - start, 1);
        while let Some(&(_, s, e)) = rest.get(n).filter(|_| bytes < WRITE_OUT_BYTES) {
            end = end.max(e);
            bytes += e - s;
            n += 1;
        }
        pace.before(bytes);
        {
            let _turn = turn();
            disk.write_out(start, end - start)?;
        }
        rest = &rest[n..];
    }
    Ok(())
}

/// `pieces` (sorted by their records' addresses) cut into runs whose records are read with
/// one read: one device, at most `span` bytes (a larger record alone), no gap wider than
/// `NEAR_GAP`.
fn near_groups(pieces: &[Piece], span: u64) -> impl Iterator<Item = &[Piece]> + '_ {
    let end_of = |e: &DigestEntry| e.addr.offset() + RECORD_HEADER_LEN as u64 + u64::from(e.length);
    let mut rest = pieces;
    std::iter::from_fn(move || {
        let first = rest.first()?;
        let head = &first.record;
        let mut reach = end_of(head);
        let mut n = 1;
        while let Some(p) = rest.get(n) {
            let e = &p.record;
            let near = e.addr.dev() == head.addr.dev()
                && e.addr.offset() <= reach + NEAR_GAP
                && end_of(e) - head.addr.offset() <= span;
            if !near {
                break;
            }
            reach = reach.max(end_of(e));
            n += 1;
        }
        let (group, tail) = rest.split_at(n);
        rest = tail;
        Some(group)
    })
}

/// The distinct records of a group, in order: (address, sequence number, payload length).
fn dedup_records(group: &[Piece]) -> Vec<(LogAddr, u64, u32)> {
    let mut out: Vec<(LogAddr, u64, u32)> = Vec::with_capacity(group.len());
    for p in group {
        let e = &p.record;
        if out.last().is_none_or(|r| r.1 != e.seq) {
            out.push((e.addr, e.seq, e.length));
        }
    }
    out
}
