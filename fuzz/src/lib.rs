//! What the fuzz targets share: load → plan → run with the bounds a caller
//! facing hostile models would set, and the structured graph generator.
//!
//! Every outcome must be `Ok` or a clean `Err`; a panic, an abort, a hang
//! (libFuzzer's `-timeout`) or an allocation over `-malloc_limit_mb` is a
//! finding.

pub mod gen;

use mote_core::{CompiledModel, CompiledSession, Model, Session, SessionBuilder};

/// Budget for everything a plan holds (weights, folded constants, arena).
pub const MAX_MEMORY: usize = 256 << 20;
/// Loop iterations a fuzzed model may run (build-time folding included).
pub const MAX_LOOP_ITERATIONS: u64 = 256;

/// Imports `bytes` and, if that works, plans and runs it (see [`plan_run`]).
pub fn load_plan_run(bytes: &[u8], input_bytes: &[u8]) {
    match Model::from_onnx(bytes) {
        // Errors are explained with names: that path must not panic either.
        Ok(model) => {
            if let Err(e) = plan_run(&model, input_bytes) {
                let _ = format!("{}", model.explain(&e));
            }
        }
        Err(e) => {
            let _ = mote_core::onnx::explain_import_bytes(bytes, &e);
        }
    }
}

/// Plans `model` under the bounds above, fills its inputs from
/// `input_bytes` (cycled; zeros when empty) and runs it once.
pub fn plan_run(model: &Model, input_bytes: &[u8]) -> mote_core::Result<()> {
    let plan = SessionBuilder::new(model)
        .max_memory(MAX_MEMORY)
        .max_loop_iterations(MAX_LOOP_ITERATIONS)
        .plan()?;
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(model, &plan, &mut arena)?;
    let mut src = input_bytes.iter().copied().cycle();
    for i in 0..plan.inputs().len() {
        if let Ok(mut t) = s.input_mut(i) {
            let b = t.bytes_mut();
            if !input_bytes.is_empty() {
                b.iter_mut().for_each(|x| *x = src.next().unwrap_or(0));
            }
        }
    }
    s.invoke()?;
    for i in 0..plan.outputs().len() {
        let _ = s.output(i)?;
    }
    Ok(())
}

/// The `.mote` target: fixes up magic, version, length and CRC-32 so that
/// mutated files reach the validator, copies them to a 16-aligned buffer
/// (as a firmware's flash would hold them) and runs what validates.
pub fn compiled_load_run(data: &[u8]) {
    let mut words = vec![0u128; data.len().div_ceil(16)];
    let buf: &mut [u8] = &mut bytemuck_bytes(&mut words)[..data.len()];
    buf.copy_from_slice(data);
    if buf.len() >= 80 {
        buf[..4].copy_from_slice(b"MOTE");
        buf[4..6].copy_from_slice(&mote_core::compiled::FORMAT_VERSION.to_le_bytes());
        buf[6..8].fill(0);
        let len = buf.len() as u32;
        buf[8..12].copy_from_slice(&len.to_le_bytes());
        let crc = mote_core::compiled::crc32(&buf[16..]);
        buf[12..16].copy_from_slice(&crc.to_le_bytes());
    }
    let buf: &[u8] = buf;
    let Ok(m) = CompiledModel::from_bytes(buf) else {
        return;
    };
    if m.arena_bytes() > MAX_MEMORY {
        return;
    }
    let mut arena = vec![0u128; m.arena_bytes().div_ceil(16)];
    let Ok(mut s) = CompiledSession::new(&m, bytemuck_bytes(&mut arena)) else {
        return;
    };
    for i in 0..m.num_inputs() {
        if let Ok(b) = s.input_bytes_mut(i) {
            for (k, x) in b.iter_mut().enumerate() {
                *x = (k * 37 % 251) as u8;
            }
        }
    }
    let _ = s.invoke();
    for i in 0..m.num_outputs() {
        let _ = s.output_bytes(i);
    }
}

fn bytemuck_bytes(w: &mut [u128]) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirements; the length is
    // the words' byte length.
    unsafe { core::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<u8>(), w.len() * 16) }
}
