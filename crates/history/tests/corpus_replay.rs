//! Replays the committed fuzz seed corpora (`history_digest`, `history_state` and
//! `history_rollback` under `fuzz/corpus/`) through the entry points the fuzz targets call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/corpus.rs"]
mod support;

use mariner_history::fuzzing::{fuzz_digest, fuzz_rollback, fuzz_state};

#[test]
fn history_digest_corpus_replays_without_panics() {
    support::replay("history_digest", fuzz_digest);
}

#[test]
fn history_state_corpus_replays_without_panics() {
    support::replay("history_state", fuzz_state);
}

#[test]
fn history_rollback_corpus_replays_without_panics() {
    support::replay("history_rollback", fuzz_rollback);
}
