//! Bytes → the CLI's `.npy` reader.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mote_std::read_npy_bytes("fuzz.npy", data);
});
