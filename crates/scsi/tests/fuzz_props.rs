#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Arbitrary bytes into the CDB decoder and executor never panic.

use mariner_scsi::fuzzing::fuzz_cdb;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]
    #[test]
    fn cdb_decoder_never_panics(data in proptest::collection::vec(any::<u8>(), 0..1200)) {
        fuzz_cdb(&data);
    }

    #[test]
    fn known_opcodes_never_panic(op in prop::sample::select(vec![
        0x00u8, 0x03, 0x08, 0x0a, 0x12, 0x15, 0x1a, 0x1b, 0x1e, 0x25, 0x28, 0x2a, 0x2e, 0x2f,
        0x34, 0x35, 0x41, 0x42, 0x55, 0x5a, 0x83, 0x84, 0x88, 0x89, 0x8a, 0x8e, 0x8f, 0x90,
        0x91, 0x93, 0x9e, 0xa0, 0xa3, 0xa8, 0xaa, 0xae, 0xaf]),
        rest in proptest::collection::vec(any::<u8>(), 0..1100)) {
        let mut data = vec![op];
        data.extend(rest);
        fuzz_cdb(&data);
    }
}
