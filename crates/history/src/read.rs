//! Reading the past: an instant named by time, by volume sequence number or as "now"
//! resolves to one volume sequence number ([`History::resolve`]); a read as of it takes each
//! sector's newest version at or before it — from the unindexed tail, else the index, else
//! the base image ([`History::read_at`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::PoisonError;

use crate::engine::{lock, History, View};
use crate::index::Version;
use crate::pieces::{sectors_of, SECTOR};
use crate::state::FLAG_BROKEN;
use crate::HistoryError;

/// Most bytes one [`History::allocation_at`] describes (its per-sector versions, 24 bytes
/// each, are in memory meanwhile: 3 MiB).
pub const ALLOCATION_SPAN: u64 = 64 << 20;

/// How a stretch of a volume as of an instant is held ([`History::allocation_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Bytes a write put there (in the log, or in the base image's allocated blocks).
    Data,
    /// Zeros a trim or write-zeroes put there.
    Zero,
    /// Nothing the base image holds: reads as zeros.
    Hole,
}

/// An instant as a user names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The newest write history has.
    Latest,
    /// The volume after its write number N (`@N`).
    Seq(u64),
    /// The volume at this wall-clock time (nanoseconds since the Unix epoch).
    Time(u64),
}

/// An instant resolved: the volume after its write `volume_seq`, made at `timestamp_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    pub volume_seq: u64,
    pub timestamp_ns: u64,
}

/// The instants of a volume that can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub oldest: Point,
    pub newest: Point,
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "@{} ({} ns) to @{} ({} ns)",
            self.oldest.volume_seq,
            self.oldest.timestamp_ns,
            self.newest.volume_seq,
            self.newest.timestamp_ns
        )
    }
}

impl View {
    /// Marked broken, or a gap was declared above the base (the indexer marks it at its next
    /// round; readers must not wait for that).
    pub(crate) fn broken(&self) -> bool {
        self.state.flags & FLAG_BROKEN != 0 || self.gap_seq > self.state.base_seq
    }

    /// The oldest readable instant: the base's, or a roll-forward's target while it runs.
    fn oldest(&self) -> Point {
        let s = &self.state;
        if s.rolling_seq > s.base_seq {
            Point {
                volume_seq: s.rolling_vseq,
                timestamp_ns: s.rolling_ts,
            }
        } else {
            Point {
                volume_seq: s.base_vseq,
                timestamp_ns: s.base_ts,
            }
        }
    }

    pub(crate) fn window(&self) -> Window {
        Window {
            oldest: self.oldest(),
            newest: Point {
                volume_seq: self.last_vseq,
                timestamp_ns: self.last_ts,
            },
        }
    }
}

impl History {
    pub(crate) fn view(&self, volume: u32) -> Result<View, HistoryError> {
        let views = self
            .inner
            .views
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let v = *views
            .get(&volume)
            .ok_or(HistoryError::UnknownVolume(volume))?;
        if self.broken(&v) {
            return Err(HistoryError::Broken(volume));
        }
        Ok(v)
    }

    /// Marked broken, or the log has just cut records the base does not hold (the indexer
    /// marks it at its next round; readers must not wait for that).
    fn broken(&self, v: &View) -> bool {
        let cut = self.inner.holder.get().and_then(|h| h.cut_to());
        v.broken() || cut.is_some_and(|c| c > v.state.base_seq && c > v.state.rolling_seq)
    }

    /// The instants of `volume` that can be read now.
    pub fn window(&self, volume: u32) -> Result<Window, HistoryError> {
        Ok(self.view(volume)?.window())
    }

    /// Resolves `at` to the volume sequence number a read as of it uses.
    pub fn resolve(&self, volume: u32, at: At) -> Result<Point, HistoryError> {
        let view = self.view(volume)?;
        let w = view.window();
        let expired = |asked: String| HistoryError::Expired {
            volume,
            asked,
            window: w.to_string(),
        };
        match at {
            At::Latest => Ok(w.newest),
            At::Seq(n) => {
                if n < w.oldest.volume_seq || n > w.newest.volume_seq {
                    return Err(expired(format!("@{n}")));
                }
                if n == w.oldest.volume_seq {
                    return Ok(w.oldest);
                }
                let ts = self.timestamp_of(volume, n)?;
                Ok(Point {
                    volume_seq: n,
                    timestamp_ns: ts.ok_or_else(|| expired(format!("@{n}")))?,
                })
            }
            At::Time(t) => {
                if t < w.oldest.timestamp_ns {
                    return Err(expired(format!("{t} ns")));
                }
                let from_tail = self
                    .inner
                    .tail
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .newest_at_or_before(volume, t);
                let from_digests = lock(&self.inner.digests)
                    .newest_at_or_before(volume, t)?
                    .map(|e| (e.volume_seq, e.timestamp_ns));
                let best = [from_tail, from_digests]
                    .into_iter()
                    .flatten()
                    .max_by_key(|&(s, _)| s)
                    .filter(|&(s, _)| s > w.oldest.volume_seq)
                    .map_or(w.oldest, |(s, ts)| Point {
                        volume_seq: s,
                        timestamp_ns: ts,
                    });
                Ok(best)
            }
        }
    }

    fn timestamp_of(&self, volume: u32, vseq: u64) -> Result<Option<u64>, HistoryError> {
        let t = self
            .inner
            .tail
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .timestamp_of(volume, vseq);
        if t.is_some() {
            return Ok(t);
        }
        Ok(lock(&self.inner.digests)
            .by_volume_seq(volume, vseq)?
            .map(|e| e.timestamp_ns))
    }

    /// The read-locked views' entry for `volume`, if `at` can be read as of now.
    fn readable(
        &self,
        views: &std::collections::BTreeMap<u32, View>,
        volume: u32,
        at: u64,
    ) -> Result<View, HistoryError> {
        let view = *views
            .get(&volume)
            .ok_or(HistoryError::UnknownVolume(volume))?;
        if self.broken(&view) {
            return Err(HistoryError::Broken(volume));
        }
        let w = view.window();
        if at < w.oldest.volume_seq || at > w.newest.volume_seq {
            return Err(HistoryError::Expired {
                volume,
                asked: format!("@{at}"),
                window: w.to_string(),
            });
        }
        Ok(view)
    }

    /// For each sector of `[offset, offset + len)` (whole sectors), the version a read as of
    /// `at` takes: the newest at or before it from the tail, else the index; `None` where
    /// that is the base image's (none, or one at or below the base). Returns the first sector
    /// too.
    #[allow(clippy::type_complexity)]
    fn sources(
        &self,
        view: &View,
        volume: u32,
        at: u64,
        offset: u64,
        len: u64,
    ) -> Result<(u64, Vec<Option<(u64, Version)>>), HistoryError> {
        let inner = &self.inner;
        let bad = HistoryError::BadRange {
            offset,
            len,
            size: view.state.size,
        };
        let (start, end) = sectors_of(offset, len).ok_or(bad)?;
        let mut slots = inner.index.newest_range(volume, start, end, at)?;
        inner
            .tail
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .overlay(volume, start, end, at, &mut slots);
        let base_vseq = view.state.base_vseq;
        for s in &mut slots {
            if s.is_some_and(|(vseq, _)| vseq <= base_vseq) {
                *s = None;
            }
        }
        Ok((start, slots))
    }

    /// How `[offset, offset + len)` of `volume` (whole sectors) is held as of its write `at`,
    /// as runs in order: data where a write or the base image's allocated blocks hold it, zeros
    /// where a trim or write-zeroes put them, holes where the base has none. Describes at most
    /// [`ALLOCATION_SPAN`] bytes from `offset` (callers ask again for the rest), from the
    /// index and the base's allocation map only: no payload is read.
    pub fn allocation_at(
        &self,
        volume: u32,
        at: u64,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Held)>, HistoryError> {
        let inner = &self.inner;
        let len = len.min(ALLOCATION_SPAN);
        // Read-locked throughout, as for a read: the base does not move under the answer.
        let views = inner.views.read().unwrap_or_else(PoisonError::into_inner);
        let view = self.readable(&views, volume, at)?;
        let (start, slots) = self.sources(&view, volume, at, offset, len)?;
        let mut out: Vec<(u64, Held)> = Vec::new();
        let mut push = |n: u64, held: Held| match out.last_mut() {
            Some((l, h)) if *h == held => *l += n,
            _ if n == 0 => {}
            _ => out.push((n, held)),
        };
        let base = lock(&inner.bases).get(&volume).cloned();
        let mut i = 0usize;
        // Per sector: from the base (`None`), or zeros (`Some(true)`) or data from the log.
        let kind = |s: Option<(u64, Version)>| s.map(|(_, v)| v == Version::Zero);
        while i < slots.len() {
            let first = kind(slots[i]);
            let mut j = i + 1;
            while j < slots.len() && kind(slots[j]) == first {
                j += 1;
            }
            let at_byte = (start + i as u64) * SECTOR;
            let bytes = (j - i) as u64 * SECTOR;
            match first {
                Some(false) => push(bytes, Held::Data),
                Some(true) => push(bytes, Held::Zero),
                None => {
                    let Some(disk) = &base else {
                        push(bytes, Held::Hole);
                        i = j;
                        continue;
                    };
                    let name = crate::engine::base_name(volume);
                    let io = crate::engine::io_err(inner.files.as_ref(), &name);
                    // Past the base file's end (a volume grown since): a hole.
                    let have = disk.len().map_err(&io)?.saturating_sub(at_byte).min(bytes);
                    if have > 0 {
                        for e in disk.allocation(at_byte, have).map_err(&io)? {
                            push(e.len, if e.allocated { Held::Data } else { Held::Hole });
                        }
                    }
                    push(bytes - have, Held::Hole);
                }
            }
            i = j;
        }
        Ok(out)
    }

    /// Fills `out` with `volume`'s bytes at `offset` as of its write `at` (a volume sequence
    /// number from [`Self::resolve`]).
    pub fn read_at(
        &self,
        volume: u32,
        at: u64,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), HistoryError> {
        let inner = &self.inner;
        inner.stats.reads.fetch_add(1, Relaxed);
        // The views stay read-locked for the whole read: a roll-forward moves readers to the
        // new base (and then lets the log reuse what they might be reading) only after every
        // read that chose a version under the old one has finished.
        let views = inner.views.read().unwrap_or_else(PoisonError::into_inner);
        let view = self.readable(&views, volume, at)?;
        let (start, slots) = self.sources(&view, volume, at, offset, out.len() as u64)?;
        let mut i = 0usize;
        let mut from_base = false;
        while i < slots.len() {
            let first = slots[i];
            let mut j = i + 1;
            while j < slots.len() && slots[j] == first {
                j += 1;
            }
            let bytes = &mut out[i * SECTOR as usize..j * SECTOR as usize];
            let at_byte = (start + i as u64) * SECTOR;
            match first {
                None => {
                    from_base = true;
                    self.read_base(volume, at_byte, bytes)?;
                }
                Some((_, Version::Zero)) => bytes.fill(0),
                Some((vseq, Version::Log(addr))) => {
                    let log = inner
                        .log
                        .get()
                        .ok_or_else(|| HistoryError::Config("history is not started".into()))?;
                    match log.read_part(addr, volume, vseq, at_byte, bytes) {
                        Ok(()) => {}
                        Err(
                            mariner_log::LogError::Gone { .. }
                            | mariner_log::LogError::Corrupt { .. },
                        ) if inner
                            .holder
                            .get()
                            .and_then(|h| h.cut_to())
                            .is_some_and(|c| c > view.state.base_seq) =>
                        {
                            // Cut while a roll-forward needed it, or while this read ran.
                            return Err(HistoryError::Broken(volume));
                        }
                        Err(
                            mariner_log::LogError::Gone { .. }
                            | mariner_log::LogError::Corrupt { .. },
                        ) => {
                            return Err(HistoryError::Expired {
                                volume,
                                asked: format!("@{at}"),
                                window: format!(
                                    "the log no longer holds write @{vseq}; {}",
                                    self.window(volume)
                                        .map_or_else(|e| e.to_string(), |w| w.to_string())
                                ),
                            })
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            i = j;
        }
        drop(views);
        if from_base {
            inner.stats.base_reads.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    fn read_base(&self, volume: u32, offset: u64, out: &mut [u8]) -> Result<(), HistoryError> {
        let Some(disk) = lock(&self.inner.bases).get(&volume).cloned() else {
            // Created so recently that its (empty) base is not made yet.
            out.fill(0);
            return Ok(());
        };
        let name = crate::engine::base_name(volume);
        let io = crate::engine::io_err(self.inner.files.as_ref(), &name);
        let len = disk.len().map_err(&io)?;
        // Past the base file's end (a volume grown since): zeros.
        let have = len.saturating_sub(offset).min(out.len() as u64) as usize;
        if have > 0 {
            disk.read_at(&mut out[..have], offset).map_err(&io)?;
        }
        out[have..].fill(0);
        Ok(())
    }
}
