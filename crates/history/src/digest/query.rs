//! Queries: by time, by volume sequence number, by sequence range. Each reads frame heads
//! (header and summaries) forward from a starting point and the entries of only the frames
//! whose summaries say they can hold an answer.

use std::ops::ControlFlow;

use super::files::{DigestFile, Head};
use super::format::{Summary, FILE_HEADER_LEN};
use super::samples::Sample;
use super::Digests;
use crate::{DigestEntry, HistoryError};

/// What a visitor of frame heads says: go on, or stop the whole walk.
type Flow = ControlFlow<()>;

impl Digests {
    /// The newest entry of `volume` whose timestamp is at most `ts`, if one is kept. Assumes
    /// the volume's timestamps do not decrease as its volume sequence numbers rise. Reads the
    /// heads of the frames between one sample and the next (at most about
    /// [`super::SAMPLE_ENTRIES`] of the volume's entries or [`super::SAMPLE_NS`] of its time
    /// apart) and the entries of one frame.
    pub fn newest_at_or_before(
        &self,
        volume: u32,
        ts: u64,
    ) -> Result<Option<DigestEntry>, HistoryError> {
        let Some(v) = self.samples.get(volume) else {
            return Ok(None);
        };
        let i = v.list.partition_point(|s| s.ts <= ts);
        let Some(start) = i.checked_sub(1) else {
            return Ok(None);
        };
        // The answer is in the last frame of the volume whose smallest timestamp for it is at
        // most `ts` (later ones start after `ts`): find it by heads, then read its entries.
        let mut last: Option<(u64, Head)> = None;
        self.walk_samples(&v.list[start..=start], volume, |file, head, s| {
            if s.min_ts > ts {
                return Ok(Flow::Break(()));
            }
            last = Some((file.first_seq, head.clone()));
            Ok(Flow::Continue(()))
        })?;
        let Some((first_seq, head)) = last else {
            return Ok(None);
        };
        let Ok(fi) = self.files.binary_search_by_key(&first_seq, |f| f.first_seq) else {
            return Ok(None);
        };
        Ok(self.files[fi]
            .entries(&head, &self.bytes_read)?
            .into_iter()
            .rfind(|e| e.volume == volume && e.timestamp_ns <= ts))
    }

    /// The entry of `volume` numbered `volume_seq`, if kept (0, "not numbered", finds none).
    /// Where the volume's numbers rise frame by frame (the log's numbering) it reads the
    /// frames between two samples; otherwise every frame holding the volume.
    pub fn by_volume_seq(
        &self,
        volume: u32,
        volume_seq: u64,
    ) -> Result<Option<DigestEntry>, HistoryError> {
        let Some(v) = self.samples.get(volume) else {
            return Ok(None);
        };
        if volume_seq == 0 {
            return Ok(None);
        }
        let samples = if v.ordered {
            let i = v.list.partition_point(|s| s.vseq <= volume_seq);
            let Some(start) = i.checked_sub(1) else {
                return Ok(None);
            };
            &v.list[start..=start]
        } else {
            &v.list[..]
        };
        let mut found = None;
        self.walk_samples(samples, volume, |file, head, s| {
            if v.ordered && s.min_vseq > volume_seq {
                return Ok(Flow::Break(()));
            }
            if !(s.min_vseq..=s.max_vseq).contains(&volume_seq) {
                return Ok(Flow::Continue(()));
            }
            found = file
                .entries(head, &self.bytes_read)?
                .into_iter()
                .find(|e| e.volume == volume && e.volume_seq == volume_seq);
            Ok(if found.is_some() {
                Flow::Break(())
            } else {
                Flow::Continue(())
            })
        })?;
        Ok(found)
    }

    /// Calls `f` for every entry with `seq` in `(after, through]`, in sequence order; with
    /// `volume`, only that volume's, and frames without it are skipped by their summaries
    /// (their entries are not read).
    pub fn for_each(
        &self,
        after: u64,
        through: u64,
        volume: Option<u32>,
        mut f: impl FnMut(&DigestEntry) -> Result<(), HistoryError>,
    ) -> Result<(), HistoryError> {
        self.for_each_until(after, through, volume, |e| {
            f(e).map(|()| ControlFlow::Continue(()))
        })
    }

    /// [`Self::for_each`] until `f` says to stop.
    pub fn for_each_until(
        &self,
        after: u64,
        through: u64,
        volume: Option<u32>,
        mut f: impl FnMut(&DigestEntry) -> Result<ControlFlow<()>, HistoryError>,
    ) -> Result<(), HistoryError> {
        if through <= after {
            return Ok(());
        }
        let mut visit = |file: &DigestFile, head: &Head| {
            let h = &head.header;
            if h.first_seq > through {
                return Ok(Flow::Break(()));
            }
            if h.last_seq <= after {
                return Ok(Flow::Continue(()));
            }
            for e in file.entries(head, &self.bytes_read)? {
                if e.seq > after
                    && e.seq <= through
                    && volume.is_none_or(|v| v == e.volume)
                    && f(&e)?.is_break()
                {
                    return Ok(Flow::Break(()));
                }
            }
            Ok(Flow::Continue(()))
        };
        match volume {
            Some(volume) => {
                let Some(v) = self.samples.get(volume) else {
                    return Ok(());
                };
                let start = v
                    .list
                    .partition_point(|s| s.seq <= after.saturating_add(1))
                    .saturating_sub(1);
                self.walk_samples(&v.list[start..], volume, |file, head, _| visit(file, head))
            }
            None => {
                let start = self
                    .files
                    .partition_point(|f| f.first_seq <= after.saturating_add(1))
                    .saturating_sub(1);
                for file in &self.files[start..] {
                    if file.last_seq <= after {
                        continue;
                    }
                    if self
                        .walk_file(file, FILE_HEADER_LEN as u64, file.len, &mut visit)?
                        .is_break()
                    {
                        break;
                    }
                }
                Ok(())
            }
        }
    }

    /// Calls `f` for every entry of `volume` with a timestamp in `[from_ts, to_ts]`, in
    /// sequence order. Assumes, like [`Self::newest_at_or_before`], that the volume's
    /// timestamps do not decrease with its numbers: the walk starts at the last sample before
    /// `from_ts` and stops at the first frame whose entries of the volume all come
    /// after `to_ts`; frames of the volume entirely before `from_ts` are skipped unread.
    pub fn for_each_in_time(
        &self,
        volume: u32,
        from_ts: u64,
        to_ts: u64,
        mut f: impl FnMut(&DigestEntry) -> Result<(), HistoryError>,
    ) -> Result<(), HistoryError> {
        let Some(v) = self.samples.get(volume) else {
            return Ok(());
        };
        if to_ts < from_ts {
            return Ok(());
        }
        let start = v.list.partition_point(|s| s.ts < from_ts).saturating_sub(1);
        self.walk_samples(&v.list[start..], volume, |file, head, s| {
            if s.min_ts > to_ts {
                return Ok(Flow::Break(()));
            }
            if s.max_ts < from_ts {
                return Ok(Flow::Continue(()));
            }
            for e in file.entries(head, &self.bytes_read)? {
                if e.volume == volume && (from_ts..=to_ts).contains(&e.timestamp_ns) {
                    f(&e)?;
                }
            }
            Ok(Flow::Continue(()))
        })
    }

    /// Visits, in order, the frames holding `volume` from each of `samples` (consecutive
    /// samples of the volume) up to the next sample of the volume or the end of the sample's
    /// file — all of the volume's frames from the first sample on, since each file's first
    /// frame of a volume has a sample — with the volume's summary.
    fn walk_samples(
        &self,
        samples: &[Sample],
        volume: u32,
        mut visit: impl FnMut(&DigestFile, &Head, &Summary) -> Result<Flow, HistoryError>,
    ) -> Result<(), HistoryError> {
        let Some(v) = self.samples.get(volume) else {
            return Ok(());
        };
        for s in samples {
            let Ok(fi) = self.files.binary_search_by_key(&s.file, |f| f.first_seq) else {
                continue;
            };
            let file = &self.files[fi];
            // Where the volume's next sample lies in this file, if it does.
            let next = v
                .list
                .partition_point(|x| (x.file, x.offset) <= (s.file, s.offset));
            let end = match v.list.get(next) {
                Some(n) if n.file == s.file => n.offset,
                _ => file.len,
            };
            let flow = self.walk_file(file, s.offset, end, &mut |file, head| match head
                .summary(volume)
            {
                Some(sum) => visit(file, head, sum),
                None => Ok(Flow::Continue(())),
            })?;
            if flow.is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Visits the frame heads of `file` in `[from, to)`.
    fn walk_file(
        &self,
        file: &DigestFile,
        from: u64,
        to: u64,
        visit: &mut dyn FnMut(&DigestFile, &Head) -> Result<Flow, HistoryError>,
    ) -> Result<Flow, HistoryError> {
        let mut pos = from;
        while pos < to.min(file.len) {
            let head = file.head(pos, &self.bytes_read)?;
            if visit(file, &head)?.is_break() {
                return Ok(Flow::Break(()));
            }
            pos = head.end();
        }
        Ok(Flow::Continue(()))
    }
}
