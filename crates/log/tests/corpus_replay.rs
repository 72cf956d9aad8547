//! Replays the committed fuzz seed corpora (`log_record` under `fuzz/corpus/`) through the entry
//! points the fuzz targets call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/corpus.rs"]
mod support;

use mariner_log::fuzzing::fuzz_record;

#[test]
fn log_record_corpus_replays_without_panics() {
    support::replay("log_record", fuzz_record);
}
