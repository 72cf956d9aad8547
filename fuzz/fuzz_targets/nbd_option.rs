//! Option-phase bytes into the NBD option parser and handshake state machine (and, when the
//! handshake reaches transmission, the request decoder). See `mariner_nbd::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mariner_nbd::fuzzing::fuzz_option(data);
});
