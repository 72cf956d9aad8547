//! A second holder of log space beside the store, as history (shrinkable) and a replica
//! (bounded) will be (crates/log/src/holders.rs): it releases now and then, lags the store,
//! and releases nothing at all while the node drains. The log must cut it rather than keep
//! writers waiting, must never cut it past what the store released, and must hand it back its
//! persisted watermark's segments after a crash. After a restart, every record it still needs
//! must be readable from the first record the log says it kept on the record's device on
//! (`Recovery::first_kept`, which history's start uses to find a cut it did not hear of).
//!
//! Drawn from its own generator (seeded from the seed), so a seed without it runs exactly as
//! before it existed.

use std::collections::BTreeMap;

use mariner_log::format::LogAddr;
use mariner_log::{HoldKind, Holder, HolderSpec, Recovery};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::World;
use crate::Failure;

const NAME: &str = "history";

pub(crate) struct SecondHolder {
    rng: SmallRng,
    kind: HoldKind,
    /// The watermark it persisted (at once, in this simulation): what it opens with.
    persisted: u64,
    handle: Option<Holder>,
    /// Cuts already counted into the summary.
    cuts_seen: u64,
    /// Durable records above `persisted`, where they lie.
    held: BTreeMap<u64, LogAddr>,
}

impl SecondHolder {
    /// Half the seeds run one: shrinkable or bounded (to 0–2 segments).
    pub(crate) fn draw(seed: u64, segment_bytes: u64) -> Option<Self> {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x6869_7374_6f72_7921);
        let kind = match rng.random_range(0..4) {
            0 | 1 => return None,
            2 => HoldKind::Shrinkable,
            _ => HoldKind::Bounded {
                max_bytes: segment_bytes * rng.random_range(0..=2),
            },
        };
        Some(Self {
            rng,
            kind,
            persisted: 0,
            handle: None,
            cuts_seen: 0,
            held: BTreeMap::new(),
        })
    }

    pub(crate) fn spec(&self) -> HolderSpec {
        HolderSpec::new(NAME, self.kind, self.persisted, 0)
    }
}

impl World {
    /// After an open: takes the second holder's handle.
    pub(crate) fn attach_second_holder(&mut self) -> Result<(), Failure> {
        let handle = match (&self.node, &self.second) {
            (Some(node), Some(_)) => node.log.holder(NAME),
            _ => return Ok(()),
        };
        let handle = handle.map_err(|e| self.fail(format!("no handle for {NAME}: {e}")))?;
        if let Some(s) = self.second.as_mut() {
            s.cuts_seen = 0;
            s.handle = Some(handle);
        }
        Ok(())
    }

    /// After every step: checks what the log did to the second holder, and now and then
    /// releases (and persists) up to a durable record a little past its watermark.
    pub(crate) fn second_holder_step(&mut self) -> Result<(), Failure> {
        let (Some(node), Some(s)) = (&self.node, self.second.as_mut()) else {
            return Ok(());
        };
        let Some(h) = s.handle.clone() else {
            return Ok(());
        };
        let store = node.log.holder(mariner_store::STORE_HOLDER).ok();
        let store_released = store.map_or(0, |st| st.released());
        let durable = node
            .log
            .stats()
            .durable_seq
            .load(std::sync::atomic::Ordering::Relaxed);
        let release = s.rng.random_range(0..8) == 0;
        let target = s.persisted + u64::from(s.rng.random_range(0..=20u32));
        let new_cuts = h.cuts() - s.cuts_seen;
        s.cuts_seen = h.cuts();
        let persisted = s.persisted;
        if release && target <= durable {
            h.release(target);
            s.persisted = s.persisted.max(target);
            s.held = s.held.split_off(&(s.persisted + 1));
        }
        self.summary.holder_cuts += new_cuts;
        if let Some(cut) = h.cut_to().filter(|&c| c > store_released) {
            return Err(self.fail(format!(
                "{NAME} was cut to {cut}, past what the store released ({store_released})"
            )));
        }
        if h.released() < persisted {
            return Err(self.fail(format!(
                "{NAME}'s watermark {} is below what it released ({persisted})",
                h.released()
            )));
        }
        Ok(())
    }

    /// Record `seq`, at `addr`, is durable (acknowledged, or found by recovery).
    pub(crate) fn second_holder_durable(&mut self, seq: u64, addr: LogAddr) {
        if let Some(s) = self.second.as_mut().filter(|s| seq > s.persisted) {
            s.held.insert(seq, addr);
        }
    }

    /// After an open: every record the second holder still needs that lies at or after the
    /// first record recovery says its device kept is readable; those gone lie below it.
    pub(crate) fn check_first_kept(&mut self, rec: &Recovery) -> Result<(), Failure> {
        let Some(node) = &self.node else {
            return Ok(());
        };
        let Some(s) = self.second.as_ref() else {
            return Ok(());
        };
        // Records the log cut since it opened (writing the voids may take the space) are
        // gone with the holder told so: not recovery's to say.
        let cut_since = s.handle.as_ref().and_then(Holder::cut_to).unwrap_or(0);
        let mut gone = 0;
        for (&seq, &addr) in s.held.range(s.persisted.max(cut_since) + 1..) {
            let kept = rec.first_kept.get(addr.dev()).copied().flatten();
            match node.log.read(addr, seq) {
                Ok(_) => {}
                Err(e) if kept.is_some_and(|f| seq >= f) => {
                    return Err(self.fail(format!(
                        "{NAME}'s record {seq} is gone ({e}), yet its device {} kept every \
                         record from {kept:?} on",
                        addr.dev()
                    )));
                }
                Err(_) => gone += 1,
            }
        }
        self.summary.cut_records_found_at_open += gone;
        Ok(())
    }
}
