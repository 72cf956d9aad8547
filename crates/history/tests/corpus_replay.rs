//! Replays the committed fuzz seed corpus (`history_digest` under `fuzz/corpus/`) through the
//! entry point the fuzz target calls.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/corpus.rs"]
mod support;

use mariner_history::fuzzing::fuzz_digest;

#[test]
fn history_digest_corpus_replays_without_panics() {
    support::replay("history_digest", fuzz_digest);
}
