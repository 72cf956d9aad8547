//! What one roll-forward round takes (retention.rs decides when; roll.rs applies it): the
//! digests passed in sequence order, each record taken or left, and of those taken only the
//! newest record covering each byte kept ([`Plan`]).
//!
//! A round is bounded by the distinct ranges it will write ([`Plan::pieces`]), not by the
//! records it passes: the base's writes per record fall with the records per round wherever
//! blocks are overwritten, and a round's memory is its pieces, not its records. With a round
//! capped at 262,144 records (held in memory), 4 KiB random writes over 256 MiB at ~30 k/s
//! rewrote the whole working set every 15 s round, and a depth-1 writer's requests between
//! 0.4 and 1 ms rose to 7–8 % while it ran; rounds of up to 4 M records 45 s apart wrote
//! 256 MiB in the phase where 15 s rounds wrote 618 MiB (docs/benchmarks.md, 34th session).
//!
//! Which records a round takes, per volume (a prefix of the volume's records above its base):
//! - expiry: its records older than its window, up to the first that is not (or the first
//!   above its oldest pin: a pinned instant stays readable);
//! - shrink (the log pressed): every record up to the shrink's end, whatever its volume and
//!   pins — under the throttle policy not past `min_window`.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use mariner_log::RecordKind;

use crate::retention::Target;
use crate::DigestEntry;

/// Byte ranges of a volume, each to be written from one record: putting a range cuts what
/// it overlaps, so the newest put wins every byte.
#[derive(Debug, Default)]
pub(crate) struct Overlay(pub BTreeMap<u64, (u64, DigestEntry)>);

impl Overlay {
    fn put(&mut self, start: u64, end: u64, record: DigestEntry) {
        // A range starting before `start` that reaches into it keeps its head (and its tail
        // past `end`, if it reaches that far).
        if let Some((&s, &(e, r))) = self.0.range(..start).next_back() {
            if e > start {
                self.0.insert(s, (start, r));
                if e > end {
                    self.0.insert(end, (e, r));
                }
            }
        }
        let inside: Vec<u64> = self.0.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            if let Some((e, r)) = self.0.remove(&s) {
                if e > end {
                    self.0.insert(end, (e, r));
                }
            }
        }
        self.0.insert(start, (end, record));
    }
}

/// What a round applies to the bases.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Per volume, each byte range with the newest record taken that covers it (writes,
    /// trims and write-zeroes alike).
    pub volumes: BTreeMap<u32, Overlay>,
    /// Volumes whose deletion was taken: their whole history has left.
    pub gone: Vec<u32>,
    /// Records taken.
    pub records: u64,
    /// The timestamps of the first and the last record taken.
    pub first_ts: Option<u64>,
    pub last_ts: u64,
    pieces: usize,
}

impl Plan {
    /// Takes `e` (records come in sequence order).
    pub fn take(&mut self, e: &DigestEntry) {
        self.records += 1;
        self.first_ts.get_or_insert(e.timestamp_ns);
        self.last_ts = e.timestamp_ns;
        if e.kind == RecordKind::VolumeDeleted {
            self.gone.push(e.volume);
            return;
        }
        if e.kind.changes_data() && e.length > 0 {
            let o = self.volumes.entry(e.volume).or_default();
            let before = o.0.len();
            o.put(e.offset, e.offset + u64::from(e.length), *e);
            self.pieces = self.pieces - before + o.0.len();
        }
    }

    /// The distinct ranges the round writes or punches.
    pub fn pieces(&self) -> usize {
        self.pieces
    }
}

/// One volume in a round's scan.
#[derive(Debug)]
pub(crate) struct VolumeScan {
    /// The last record taken: the volume's sequence number and timestamp the base is then
    /// as of (the base's own to start with).
    pub vseq: u64,
    pub ts: u64,
    pub base_seq: u64,
    /// Expiry takes records older than this (wall-clock nanoseconds)...
    pub cutoff: u64,
    /// ...numbered at most this (its oldest pin; `u64::MAX`: none).
    pub pin: u64,
    pub window_ns: u64,
    /// Expiry still takes this volume's records; once not, `ended` is the last it took.
    pub expiring: bool,
    pub ended: u64,
}

/// A shrink's reach in a round: every record up to `end`, while older than `floor`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shrink {
    pub end: u64,
    pub floor: Option<u64>,
}

/// A round's scan over the digests, record by record.
#[derive(Debug)]
pub(crate) struct Scan {
    pub volumes: BTreeMap<u32, VolumeScan>,
    /// Volumes whose expiry still takes records, and the latest cutoff of any volume.
    open: usize,
    max_cutoff: u64,
    shrink: Option<Shrink>,
    /// The last record a shrink took (0: none).
    shrunk_to: u64,
    pub plan: Plan,
    /// When the oldest record kept leaves its window, and its timestamp (`u64::MAX`: no
    /// record kept was seen).
    pub next_wall: u64,
    pub oldest_kept: u64,
    /// Records taken only because the log is pressed.
    pub shrank: usize,
}

impl Scan {
    pub fn new(volumes: BTreeMap<u32, VolumeScan>, shrink: Option<Shrink>) -> Self {
        Self {
            open: volumes.values().filter(|v| v.expiring).count(),
            max_cutoff: volumes.values().map(|v| v.cutoff).max().unwrap_or(0),
            volumes,
            shrink,
            shrunk_to: 0,
            plan: Plan::default(),
            next_wall: u64::MAX,
            oldest_kept: u64::MAX,
            shrank: 0,
        }
    }

    /// Passes `e` (in sequence order); `Break` once no later record can be taken. Stopping
    /// anywhere is sound: a volume still expiring took every record of it passed.
    pub fn pass(&mut self, e: &DigestEntry) -> ControlFlow<()> {
        let shrinking = self
            .shrink
            .is_some_and(|s| e.seq <= s.end && s.floor.is_none_or(|f| e.timestamp_ns < f));
        if shrinking {
            self.shrunk_to = e.seq;
        } else {
            self.shrink = None;
        }
        if let Some(v) = self
            .volumes
            .get_mut(&e.volume)
            .filter(|v| e.seq > v.base_seq)
        {
            let mut expired = false;
            if v.expiring {
                if e.timestamp_ns >= v.cutoff {
                    v.expiring = false;
                    self.next_wall = self
                        .next_wall
                        .min(e.timestamp_ns.saturating_add(v.window_ns));
                    self.oldest_kept = self.oldest_kept.min(e.timestamp_ns);
                } else if e.volume_seq > v.pin {
                    // Held by a pin: no due time from it (`unpin` makes the next round look).
                    v.expiring = false;
                } else {
                    expired = true;
                }
                if !v.expiring {
                    v.ended = e.seq - 1;
                    self.open -= 1;
                }
            }
            if expired || shrinking {
                if !expired {
                    self.shrank += 1;
                }
                v.vseq = e.volume_seq;
                v.ts = e.timestamp_ns;
                self.plan.take(e);
            }
        }
        // Timestamps rise with sequence numbers (the log's dispatcher stamps them): once this
        // record is inside every window, no later one leaves one. Were they out of order, a
        // later round would take what this one left.
        if self.shrink.is_none() && (self.open == 0 || e.timestamp_ns >= self.max_cutoff) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    /// The bases' targets, every record through `through` passed: a volume goes past the
    /// records it took, and past other volumes' records while its expiry still took (its base
    /// does not change there).
    pub fn targets(&self, through: u64) -> BTreeMap<u32, Target> {
        let mut out = BTreeMap::new();
        for (&id, v) in &self.volumes {
            let seq = if v.expiring { through } else { v.ended }.max(self.shrunk_to);
            if seq > v.base_seq {
                out.insert(
                    id,
                    Target {
                        seq,
                        vseq: v.vseq,
                        ts: v.ts,
                    },
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Overlay, Scan, Shrink, VolumeScan};
    use crate::DigestEntry;
    use mariner_log::{LogAddr, RecordKind};

    fn entry(seq: u64) -> DigestEntry {
        DigestEntry {
            seq,
            volume: 1,
            kind: RecordKind::Write,
            volume_seq: seq,
            timestamp_ns: seq,
            offset: 0,
            length: 0,
            addr: LogAddr(0),
        }
    }

    fn rec(seq: u64, volume: u32, ts: u64) -> DigestEntry {
        DigestEntry {
            volume,
            timestamp_ns: ts,
            offset: seq * 4096,
            length: 4096,
            ..entry(seq)
        }
    }

    fn volume(base_seq: u64, cutoff: u64, pin: u64) -> VolumeScan {
        VolumeScan {
            vseq: 0,
            ts: 0,
            base_seq,
            cutoff,
            pin,
            window_ns: 100,
            expiring: true,
            ended: base_seq,
        }
    }

    /// Expiry takes each volume's records older than its window, up to the first that is
    /// not or is pinned past, and the scan stops once no later record can leave a window.
    #[test]
    fn expiry_takes_a_prefix_per_volume_and_stops_when_nothing_more_can_leave() {
        // Volume 1: window ends at 50; volume 2: at 30, pinned at its record 3.
        let vols = [(1, volume(0, 50, u64::MAX)), (2, volume(0, 30, 3))].into();
        let mut scan = Scan::new(vols, None);
        let records = [
            rec(1, 1, 10),
            rec(2, 2, 12),
            rec(3, 2, 14),
            rec(4, 2, 16),
            rec(5, 1, 40),
            rec(6, 1, 55),
            rec(7, 1, 60),
        ];
        let mut passed = 0;
        for e in &records {
            passed = e.seq;
            if scan.pass(e).is_break() {
                break;
            }
        }
        assert_eq!(
            passed, 6,
            "record 6 is inside both windows: nothing later can leave"
        );
        let t = scan.targets(passed);
        assert_eq!((t[&1].seq, t[&1].vseq), (5, 5));
        // Record 4 is past the pin (its volume sequence number 4 > 3).
        assert_eq!((t[&2].seq, t[&2].vseq), (3, 3));
        assert_eq!(scan.plan.records, 4);
        assert_eq!(scan.plan.pieces(), 4);
        assert_eq!(scan.next_wall, 155);
        assert_eq!(scan.shrank, 0);
    }

    /// A shrink takes every record up to its end whatever the windows and pins, never past
    /// its floor, and every volume's base goes to its end.
    #[test]
    fn a_shrink_passes_pins_and_windows_but_not_its_floor() {
        let vols = [(1, volume(0, 0, u64::MAX)), (2, volume(0, 0, 0))].into();
        let shrink = Shrink {
            end: 10,
            floor: Some(30),
        };
        let mut scan = Scan::new(vols, Some(shrink));
        for e in [rec(1, 1, 10), rec(2, 2, 20), rec(3, 1, 30), rec(4, 2, 40)] {
            if scan.pass(&e).is_break() {
                break;
            }
        }
        let t = scan.targets(3);
        assert_eq!(scan.plan.records, 2);
        assert_eq!(scan.shrank, 2);
        assert_eq!((t[&1].seq, t[&1].vseq), (2, 1));
        assert_eq!((t[&2].seq, t[&2].vseq), (2, 2));
    }

    /// The overlay gives every byte the newest record that covered it.
    #[test]
    fn the_newest_put_wins_every_byte() {
        let mut x = 7u64;
        for _ in 0..200 {
            let mut o = Overlay::default();
            let mut model = vec![None; 64];
            for r in 0..12u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let s = x % 64;
                let e = (s + 1 + (x >> 8) % 20).min(64);
                o.put(s, e, entry(r));
                for b in &mut model[s as usize..e as usize] {
                    *b = Some(r);
                }
            }
            let mut got = vec![None; 64];
            let mut last_end = 0;
            for (&s, &(e, r)) in &o.0 {
                assert!(s >= last_end && e > s, "ranges overlap or are empty");
                last_end = e;
                for b in &mut got[s as usize..e as usize] {
                    *b = Some(r.seq);
                }
            }
            assert_eq!(got, model);
        }
    }
}
