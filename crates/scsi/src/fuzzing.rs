//! Entry points for the fuzz targets (`fuzz/`) and the proptest replay tests. Each takes
//! arbitrary bytes and must never panic.

use std::sync::Arc;

use crate::cdb::Cdb;
use crate::lun::{data_out_len, Lun};
use crate::memory::MemoryBackend;

/// Decodes `data` as a CDB, asks what data-out it needs, and (when the first byte says so)
/// executes it against a small memory unit with the rest of `data` as data-out, on a
/// single-threaded executor that polls the future to completion.
pub fn fuzz_cdb(data: &[u8]) {
    let split = data.len().min(16);
    let (cdb, data_out) = data.split_at(split);
    let _ = Cdb::parse(cdb);
    let _ = data_out_len(cdb, 512);
    let lun = Lun::new(Arc::new(MemoryBackend::new("fuzz", 512, 64)));
    let _ = block_on(lun.execute(cdb, data_out));
}

/// Polls a future that never waits on anything external (the memory backend never
/// returns `Pending`) to completion without a runtime.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}
