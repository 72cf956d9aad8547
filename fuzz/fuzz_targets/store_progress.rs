#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mariner_store::fuzzing::fuzz_progress(data);
});
