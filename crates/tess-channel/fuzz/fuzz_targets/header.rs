//! The channel header parser on arbitrary bytes: decode, validate, and check that whatever is
//! accepted describes a layout inside the file (`tess_channel::fuzzing::parse_header`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tess_channel::fuzzing::parse_header(data);
});
