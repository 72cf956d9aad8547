//! Replays the committed fuzz seed corpora (`bosc_format`, `bosc_btree`, `bosc_router_image` under `fuzz/corpus/`)
//! through the entry points the fuzz targets call, so `scripts/test.sh --quick` (no fuzz
//! stage) still runs every seed and crash reproducer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/corpus.rs"]
mod support;

use mariner_bosc::fuzzing::{fuzz_btree, fuzz_format, fuzz_router_image};

#[test]
fn replay_bosc_format_corpus() {
    support::replay("bosc_format", fuzz_format);
}

#[test]
fn replay_bosc_btree_corpus() {
    support::replay("bosc_btree", fuzz_btree);
}

#[test]
fn replay_bosc_router_image_corpus() {
    support::replay("bosc_router_image", fuzz_router_image);
}
