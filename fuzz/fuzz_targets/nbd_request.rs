//! Transmission-phase bytes into the NBD request header parser and request decoder. The first
//! byte picks the negotiated session. See `mariner_nbd::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mariner_nbd::fuzzing::fuzz_request(data);
});
