//! The leaf readers: a pool of threads that read, concurrently, the leaves a batch's splits
//! will need and the nearly full leaves read ahead for later splits.
//!
//! Apart because it is the tree's only concurrency besides the engine's: threads started at
//! the first batch that needs them and joined when the tree is dropped.

use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use mariner_cpuclass::CpuClass;

use super::leaf::LeafApp;
use crate::{Bosc, Error};

/// Threads reading leaves for the splits of a batch ([`BPlusTree::prefetch`]), started at the
/// first such batch and kept: spawning eight threads per batch (a stack mapped and unmapped
/// each) cost more CPU than the reads.
#[derive(Default)]
pub(super) struct Readers {
    pub(super) jobs: Mutex<Option<mpsc::Sender<ReadJob>>>,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A leaf to read and where to send its payload; with no one to send it to, a read ahead
/// that the engine keeps for [`Bosc::take_hot`].
pub(super) struct ReadJob {
    pub(super) block: u64,
    pub(super) reply: Option<LeafReply>,
}

/// Where a reader sends a leaf's payload.
pub(super) type LeafReply = mpsc::Sender<(u64, Result<Vec<u8>, Error>)>;

impl Readers {
    /// Reads at most this many leaves at once.
    const THREADS: usize = 8;

    pub(super) fn send(
        &self,
        bosc: &Arc<Bosc<LeafApp>>,
        block: u64,
        reply: Option<LeafReply>,
    ) -> Result<(), Error> {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        if jobs.is_none() {
            let (tx, rx) = mpsc::channel::<ReadJob>();
            let rx = Arc::new(Mutex::new(rx));
            let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
            for i in 0..Self::THREADS {
                let (rx, bosc) = (Arc::clone(&rx), Arc::clone(bosc));
                let spawned = std::thread::Builder::new()
                    .name(format!("btree-read{i}"))
                    .spawn(move || {
                        let _class = bosc.cpu_class().map(CpuClass::join);
                        reader(&rx, &bosc);
                    });
                threads.push(spawned.map_err(|e| Error::Failed(format!("leaf reader: {e}")))?);
            }
            *jobs = Some(tx);
        }
        jobs.as_ref()
            .and_then(|tx| tx.send(ReadJob { block, reply }).ok())
            .ok_or_else(|| Error::Failed("the leaf readers stopped".into()))
    }
}

/// A leaf reader's loop, until the jobs' sender is dropped.
fn reader(rx: &Mutex<mpsc::Receiver<ReadJob>>, bosc: &Bosc<LeafApp>) {
    loop {
        let job = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(job) = job else { return };
        match job.reply {
            Some(reply) => {
                let payload = bosc.query(job.block, <[u8]>::to_vec);
                let _ = reply.send((job.block, payload));
            }
            // A failed read ahead leaves the split to read the leaf itself, and to report the
            // error.
            None => drop(bosc.read_hot(job.block)),
        }
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        // Closing the queue ends every thread once it has no job left.
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for t in threads {
            let _ = t.join();
        }
    }
}
