//! A structured generator: one to three nodes of any registered operator,
//! random attributes, input dtypes, shapes, constants and values, encoded
//! as ONNX and then loaded, planned and run like `onnx_load`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut u = arbitrary::Unstructured::new(data);
    if let Ok(g) = mote_fuzz::gen::Generated::new(&mut u) {
        mote_fuzz::load_plan_run(&g.bytes, &g.input_bytes);
    }
});
