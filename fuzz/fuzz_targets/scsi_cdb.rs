//! CDB bytes (then data-out) into the SCSI CDB decoder and executor on a memory unit. See `mariner_scsi::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mariner_scsi::fuzzing::fuzz_cdb(data);
});
