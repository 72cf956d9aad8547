//! Seeding a volume's history again while the node serves. History breaks for a volume when
//! the log lets go of records its base image lacked (roll-forward fell behind a log that
//! filled; `mariner_history_cuts_total`): instants before the cut are gone. The node then
//! copies a new base from the volume's current image — on the store's applier thread, which
//! holds the images still meanwhile (`Store::at_rest`) — and history starts again there, as
//! it does at start-up for a volume it does not follow (DESIGN.md "History": "the base is
//! re-seeded from the current image").
//!
//! Writes go on during the copy: the log holds them, and the applier catches up after it.
//! A volume's copy reads only its allocated extents.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mariner_history::{DigestEntry, History, HistoryError, SeedPoint};
use mariner_store::AtRest;
use tokio::sync::watch;

use crate::Node;

/// How often the node looks for broken histories.
const EVERY: Duration = Duration::from_secs(1);
/// How long a volume whose seeding failed waits before the next attempt.
const AFTER_FAILURE: Duration = Duration::from_secs(30);

/// Per volume: `None` while its seeding is queued or running, else no attempt before then.
type Attempts = Arc<Mutex<BTreeMap<u32, Option<Instant>>>>;

/// Seeds every broken history again, until `quit`.
pub(crate) async fn watch(node: Arc<Node>, mut quit: watch::Receiver<bool>) {
    let Some(h) = node.history.clone() else {
        return;
    };
    let attempts: Attempts = Arc::default();
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = quit.wait_for(|v| *v) => return,
        }
        for id in h.broken_volumes() {
            {
                let mut a = attempts.lock().unwrap_or_else(PoisonError::into_inner);
                match a.get(&id) {
                    Some(None) => continue,
                    Some(Some(t)) if *t > Instant::now() => continue,
                    _ => {}
                }
                a.insert(id, None);
            }
            let Some(block_size) = node.block_size_of(id) else {
                attempts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
                continue;
            };
            tracing::warn!(
                volume = id,
                "history: the volume's history broke (the log reused records its base image \
                 lacked); seeding a new base from the current image"
            );
            let (h, attempts) = (h.clone(), attempts.clone());
            node.store.at_rest(Box::new(move |at| {
                let next = match seed_at_rest(&h, id, block_size, at) {
                    Ok(()) => {
                        tracing::info!(volume = id, seq = at.applied_seq, "history: seeded again");
                        attempts
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(&id);
                        return;
                    }
                    Err(HistoryError::Retry(why)) => {
                        tracing::debug!(volume = id, %why, "history: seeding again shortly");
                        Instant::now()
                    }
                    Err(e) => {
                        tracing::error!(volume = id, error = %e, "history: seeding failed; trying again in 30 s");
                        Instant::now() + AFTER_FAILURE
                    }
                };
                attempts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(id, Some(next));
            }));
        }
    }
}

/// Seeds volume `id` from its image at rest, as of the newest record the store holds: the
/// image plus the store's pending records of the volume.
fn seed_at_rest(
    h: &History,
    id: u32,
    block_size: u32,
    at: &AtRest<'_>,
) -> Result<(), HistoryError> {
    let Some((image, size)) = at.image(id) else {
        return Err(HistoryError::Retry(format!(
            "volume {id} has no image (deleted?)"
        )));
    };
    let after: Vec<DigestEntry> = at
        .pending
        .iter()
        .map(|(header, addr)| DigestEntry::from_header(header, *addr))
        .collect();
    let (seq, timestamp_ns) = at
        .pending
        .last()
        .map_or((at.applied_seq, at.applied_ts), |(hd, _)| {
            (hd.seq, hd.timestamp_ns)
        });
    let volume_seq = after
        .iter()
        .rev()
        .find(|e| e.volume == id)
        .map(|e| e.volume_seq)
        .or_else(|| at.volume_seqs.get(&id).copied())
        .unwrap_or(0);
    let point = SeedPoint {
        seq,
        timestamp_ns,
        volume_seq,
    };
    h.seed(id, image.as_ref(), size, block_size, point, &after)
}
