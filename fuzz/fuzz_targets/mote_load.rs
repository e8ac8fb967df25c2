//! Bytes → `CompiledModel::from_bytes` → `CompiledSession::invoke`, with the
//! header's length and CRC-32 fixed up so that mutations reach the record
//! validator instead of stopping at the checksum.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mote_fuzz::compiled_load_run(data);
});
