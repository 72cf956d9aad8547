//! PDU byte streams into the iSCSI PDU decoder (with and without digests) and the encoder. See `mariner_iscsi::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mariner_iscsi::fuzzing::fuzz_pdu(data);
});
