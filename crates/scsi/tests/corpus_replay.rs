//! Replays the committed fuzz seed corpora (`scsi_cdb` under `fuzz/corpus/`) through the entry
//! points the fuzz targets call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/corpus.rs"]
mod support;

use mariner_scsi::fuzzing::fuzz_cdb;

#[test]
fn replay_scsi_cdb_corpus() {
    support::replay("scsi_cdb", fuzz_cdb);
}
