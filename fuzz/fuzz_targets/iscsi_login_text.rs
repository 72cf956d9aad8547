//! Login key=value text into the text parser and the login state machine. See `mariner_iscsi::fuzzing`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mariner_iscsi::fuzzing::fuzz_login_text(data);
});
