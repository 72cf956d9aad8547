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
        let len = out.len() as u64;
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
        let source = |s: Option<(u64, Version)>| match s {
            Some((vseq, v)) if vseq > base_vseq => Some((vseq, v)),
            _ => None,
        };
        let mut i = 0usize;
        let mut from_base = false;
        while i < slots.len() {
            let first = source(slots[i]);
            let mut j = i + 1;
            while j < slots.len() && source(slots[j]) == first {
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
