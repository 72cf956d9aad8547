//! Opening the digests: validate every file's header and every frame's header and summaries,
//! read the newest file whole, cut a torn tail, rebuild the samples.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::files::{self, DigestFile};
use super::format::{self, Damage, FILE_HEADER_LEN};
use super::samples::Samples;
use super::{Digests, DigestsConfig, DigestsOpen};
use crate::files::Files;
use crate::HistoryError;

impl Digests {
    /// Opens the digest files named `prefix…` in `store` (none: empty digests). Checks every frame's
    /// header and summaries (entries only in the newest file, which is read whole), cuts a
    /// torn tail of the newest file (and says why in [`DigestsOpen::truncated`]), refuses
    /// damage anywhere else with [`HistoryError::Corrupt`], and rebuilds the samples.
    pub fn open_with(
        store: Arc<dyn Files>,
        prefix: &str,
        config: DigestsConfig,
    ) -> Result<(Self, DigestsOpen), HistoryError> {
        if config.file_bytes < (FILE_HEADER_LEN + format::FRAME_HEADER_LEN) as u64 {
            return Err(HistoryError::Config(format!(
                "digest file size {} is too small",
                config.file_bytes
            )));
        }
        let names = files::list(store.as_ref(), prefix)?;
        let mut d = Digests {
            store,
            prefix: prefix.to_string(),
            config,
            files: Vec::with_capacity(names.len()),
            samples: Samples::default(),
            last_seq: 0,
            dir_dirty: false,
            failed: None,
            bytes_read: AtomicU64::new(0),
        };
        let mut report = DigestsOpen::default();
        let newest = names.len().saturating_sub(1);
        for (i, (first_seq, name)) in names.into_iter().enumerate() {
            let mut f = files::open(d.store.as_ref(), first_seq, name)?;
            let frames = d.scan(&mut f, i == newest, &mut report)?;
            if frames == 0 {
                // Only the newest file can get here (scan refuses an empty older one): it was
                // created, and the crash came before its first frame was synced.
                d.store.remove(&f.name).map_err(|e| f.io(e))?;
                let why = format!("{}: no intact frame; removed", f.path.display());
                report.truncated = Some(match report.truncated.take() {
                    Some(cut) => format!("{cut}; {why}"),
                    None => why,
                });
                continue;
            }
            report.frames += frames;
            d.files.push(f);
        }
        report.last_seq = d.last_seq;
        report.files = d.files.len() as u64;
        Ok((d, report))
    }

    /// Checks one file and takes note of its frames; returns how many it keeps. The newest
    /// file's entries are read and checked too, and its torn tail cut.
    fn scan(
        &mut self,
        f: &mut DigestFile,
        newest: bool,
        report: &mut DigestsOpen,
    ) -> Result<u64, HistoryError> {
        let counter = AtomicU64::new(0);
        let mut header = vec![0u8; FILE_HEADER_LEN.min(f.len as usize)];
        f.disk.read_at(&mut header, 0).map_err(|e| f.io(e))?;
        let checked = format::decode_file_header(&header).and_then(|seq| {
            if seq == f.first_seq {
                Ok(())
            } else {
                Err(Damage {
                    at: 16,
                    why: format!("header names sequence number {seq}, the file name another"),
                })
            }
        });
        if let Err(d) = checked {
            return self.damaged(f, newest, 0, d, report).map(|()| 0);
        }
        let mut pos = FILE_HEADER_LEN as u64;
        let mut frames = 0u64;
        while pos < f.len {
            let found = f.try_head(pos, &counter)?.and_then(|head| {
                let h = &head.header;
                if frames == 0 && h.first_seq != f.first_seq {
                    return Err(Damage {
                        at: 16,
                        why: "first frame does not start at the file's sequence number".into(),
                    });
                }
                if h.first_seq <= self.last_seq {
                    return Err(Damage {
                        at: 16,
                        why: format!(
                            "frame starts at sequence number {}, not above {}",
                            h.first_seq, self.last_seq
                        ),
                    });
                }
                Ok(head)
            });
            let found = match (found, newest) {
                (Ok(head), true) => f.try_entries(&head, &counter)?.map(|_| head),
                (found, _) => found,
            };
            match found {
                Ok(head) => {
                    self.samples.add_frame(
                        f.first_seq,
                        pos,
                        head.header.first_seq,
                        &head.summaries,
                    );
                    self.last_seq = head.header.last_seq;
                    f.last_seq = head.header.last_seq;
                    pos = head.end();
                    frames += 1;
                }
                Err(d) => {
                    self.damaged(f, newest, pos, d, report)?;
                    break;
                }
            }
        }
        if frames == 0 && !newest {
            return Err(f.corrupt(
                Damage {
                    at: 0,
                    why: "a digest file without frames before the newest one".into(),
                },
                FILE_HEADER_LEN as u64,
            ));
        }
        Ok(frames)
    }

    /// Damage `d` in the frame (or file header) at `pos`: a torn tail (cut the file there) if
    /// it is in the newest file and no intact frame follows, else corruption.
    fn damaged(
        &self,
        f: &mut DigestFile,
        newest: bool,
        pos: u64,
        d: Damage,
        report: &mut DigestsOpen,
    ) -> Result<(), HistoryError> {
        if !newest || f.intact_frame_after(pos + 1, self.last_seq)? {
            return Err(f.corrupt(d, pos));
        }
        let cut = f.len - pos;
        f.disk.set_len(pos).map_err(|e| f.io(e))?;
        f.disk.sync().map_err(|e| f.io(e))?;
        f.len = pos;
        report.truncated = Some(format!(
            "{}: cut {cut} bytes at byte {pos} (torn tail: {} at byte {})",
            f.path.display(),
            d.why,
            pos + d.at
        ));
        Ok(())
    }
}
