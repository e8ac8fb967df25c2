//! Bytes → `Model::from_onnx` → plan → run: every outcome must be `Ok` or
//! `Err`, never a panic, hang or unbounded allocation.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mote_fuzz::load_plan_run(data, &[]);
});
