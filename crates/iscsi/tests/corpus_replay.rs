//! Replays the committed fuzz seed corpora (`iscsi_pdu`, `iscsi_login_text` under `fuzz/corpus/`)
//! through the entry points the fuzz targets call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/corpus.rs"]
mod support;

use mariner_iscsi::fuzzing::{fuzz_login_text, fuzz_pdu};

#[test]
fn replay_iscsi_pdu_corpus() {
    support::replay("iscsi_pdu", fuzz_pdu);
}

#[test]
fn replay_iscsi_login_text_corpus() {
    support::replay("iscsi_login_text", fuzz_login_text);
}
