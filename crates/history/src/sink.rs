//! How durable records reach history: the log's sink (held weakly by the log), the unindexed
//! tail and the readers' views updated before the writer is acknowledged, and the records'
//! digest entries.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, PoisonError};

use mariner_log::{Durable, DurableSink, RecordKind};

use crate::engine::{lock, History, Inner, View};
use crate::state::VolumeState;
use crate::DigestEntry;

/// The log's handle on history ([`History::sink`]): it holds history weakly, since history
/// holds the log — a strong handle both ways would keep both alive after the last user let
/// go, with the index's threads still running.
struct WeakSink(std::sync::Weak<Inner>);

impl DurableSink for WeakSink {
    fn durable(&self, records: &[Durable]) {
        if let Some(inner) = self.0.upgrade() {
            inner.take_durable(records);
        }
    }
}

impl History {
    /// What the log is opened with to feed history.
    pub fn sink(&self) -> Arc<dyn DurableSink> {
        Arc::new(WeakSink(Arc::downgrade(&self.inner)))
    }
}

impl Inner {
    /// Durable records from the log (on its dispatcher thread: quick, no I/O).
    fn take_durable(&self, records: &[Durable]) {
        if self.stop.load(Relaxed) {
            // Stopped (or failed for good): keep nothing, or the tail would grow without end.
            // The log lets go of history's space as of a shrinkable holder's.
            return;
        }
        let entries: Vec<DigestEntry> = records
            .iter()
            .map(|d| entry_of(&d.header, d.addr))
            .collect();
        {
            let mut tail = self.tail.write().unwrap_or_else(PoisonError::into_inner);
            for e in &entries {
                tail.push(*e);
            }
            self.stats.tail_records.store(tail.len() as u64, Relaxed);
        }
        {
            let mut views = self.views.write().unwrap_or_else(PoisonError::into_inner);
            let windows = lock(&self.windows);
            for e in &entries {
                note_in_view(&mut views, &windows, e);
            }
        }
        let queued = {
            let mut q = lock(&self.incoming);
            q.extend(entries);
            q.len()
        };
        // While the log is pressed, the indexer must not sit out its batch interval: a burst
        // can fill the log within one, and the round that shrinks history needs these
        // indexed.
        if self.behind(queued) {
            // From the log's completion path, which is never starved: history's threads may
            // be in the idle class while a CPU-bound writer takes every core.
            self.cpu.set_background(false);
            self.wake.notify_one();
        }
    }
}

impl DurableSink for History {
    fn durable(&self, records: &[Durable]) {
        self.inner.take_durable(records);
    }
}

pub(crate) fn entry_of(h: &mariner_log::RecordHeader, addr: mariner_log::LogAddr) -> DigestEntry {
    DigestEntry::from_header(h, addr)
}

impl DigestEntry {
    /// What history keeps of the record with header `h` at `addr`.
    pub fn from_header(h: &mariner_log::RecordHeader, addr: mariner_log::LogAddr) -> Self {
        Self {
            seq: h.seq,
            volume: h.volume,
            kind: h.kind,
            volume_seq: h.volume_seq,
            timestamp_ns: h.timestamp_ns,
            offset: h.offset,
            length: h.length,
            addr,
        }
    }
}

/// What the readers' views learn from a record history has but has not indexed: a volume
/// created (unless history is off for it), a newer instant.
pub(crate) fn note_in_view(
    views: &mut BTreeMap<u32, View>,
    windows: &BTreeMap<u32, Option<std::time::Duration>>,
    e: &DigestEntry,
) {
    if e.kind == RecordKind::Void {
        return;
    }
    if windows.get(&e.volume) != Some(&None) {
        provisional_view(views, e);
    }
    if let Some(v) = views.get_mut(&e.volume) {
        if e.volume_seq > v.last_vseq {
            v.last_vseq = e.volume_seq;
            v.last_ts = e.timestamp_ns;
        }
        if e.kind == RecordKind::HistoryGap {
            v.gap_seq = v.gap_seq.max(e.seq);
        }
    }
}

/// A volume created while history is on can be read at once, before its creation record is
/// indexed: its view starts with the empty base the indexer will make for it.
pub(crate) fn provisional_view(views: &mut BTreeMap<u32, View>, e: &DigestEntry) {
    if e.kind != RecordKind::VolumeCreated || views.contains_key(&e.volume) {
        return;
    }
    views.insert(
        e.volume,
        View {
            state: VolumeState::created(e),
            last_vseq: e.volume_seq,
            last_ts: e.timestamp_ns,
            gap_seq: 0,
        },
    );
}

pub(crate) fn void_entry(seq: u64) -> DigestEntry {
    DigestEntry {
        seq,
        volume: 0,
        kind: RecordKind::Void,
        volume_seq: 0,
        timestamp_ns: 0,
        offset: 0,
        length: 0,
        addr: mariner_log::LogAddr::NONE,
    }
}
