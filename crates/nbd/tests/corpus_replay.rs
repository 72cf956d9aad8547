//! Replays the committed fuzz seed corpora (`nbd_option`, `nbd_request` under `fuzz/corpus/`)
//! through the entry points the fuzz targets call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/corpus.rs"]
mod support;

use mariner_nbd::fuzzing::{fuzz_option, fuzz_request};

#[test]
fn replay_nbd_option_corpus() {
    support::replay("nbd_option", fuzz_option);
}

#[test]
fn replay_nbd_request_corpus() {
    support::replay("nbd_request", fuzz_request);
}
