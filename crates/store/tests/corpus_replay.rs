//! Replays the committed fuzz seed corpus (`store_progress` under `fuzz/corpus/`) through the
//! entry point the fuzz target calls.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/corpus.rs"]
mod support;

use mariner_store::fuzzing::fuzz_progress;

#[test]
fn store_progress_corpus_replays_without_panics() {
    support::replay("store_progress", fuzz_progress);
}
