#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mariner_history::fuzzing::fuzz_rollback(data);
});
