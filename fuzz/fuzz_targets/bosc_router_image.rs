#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mariner_bosc::fuzzing::fuzz_router_image(data);
});
