//! The application shared by the build-only real boards (`rp2040`,
//! `nrf52840`): runs the compiled model embedded from `MOTE_FW_MODEL_DIR`
//! once, from flash, in a static arena, with no heap, then reports the
//! outputs over defmt-RTT (feature `defmt`) or keeps them alive for the
//! optimizer (no feature: nothing to print to without a probe).

use core::ptr::addr_of_mut;

use mote_core::compiled::{CompiledModel, CompiledSession};

/// `mote compile --emit-rust` output: `MODEL`, `ARENA_BYTES`, IO shapes.
#[allow(dead_code)]
mod model {
    include!(concat!(env!("MOTE_FW_MODEL_DIR_ABS"), "/model.rs"));
}

/// The quantized inputs (int8 bytes, `INPUT0_LEN` per input), one after
/// the other: each is run in turn.
static INPUT: &[u8] = include_bytes!(concat!(env!("MOTE_FW_MODEL_DIR_ABS"), "/input.bin"));

/// The arena: a too-large model fails to link (RAM overflow), not at run time.
static mut ARENA: [u8; model::ARENA_BYTES] = [0; model::ARENA_BYTES];

/// Runs the model once; on success the outputs are reported, on error the
/// error is (with `defmt`).
pub fn run_once() {
    // SAFETY: called once from `main`, before any interrupt is enabled: this
    // is the only reference to ARENA.
    let arena: &'static mut [u8] = unsafe { &mut *addr_of_mut!(ARENA) };
    match invoke(arena) {
        Ok(()) => {}
        #[cfg(feature = "defmt")]
        Err(e) => defmt::println!("error: {}", defmt::Display2Format(&e)),
        #[cfg(not(feature = "defmt"))]
        Err(e) => {
            core::hint::black_box(e);
        }
    }
}

fn invoke(arena: &mut [u8]) -> Result<(), mote_core::Error> {
    let m = CompiledModel::from_bytes(model::MODEL)?;
    let mut s = CompiledSession::new(&m, arena)?;
    let n = s.input_bytes_mut(0)?.len();
    if n == 0 || !INPUT.len().is_multiple_of(n) {
        return Err(mote_core::Error::new(mote_core::ErrorKind::Invalid(
            "input.bin is not a whole number of the model's inputs",
        )));
    }
    for x in INPUT.chunks_exact(n) {
        s.input_bytes_mut(0)?.copy_from_slice(x);
        s.invoke()?;
        for i in 0..m.num_outputs() {
            report(i, s.output_bytes(i)?);
        }
    }
    Ok(())
}

#[cfg(feature = "defmt")]
fn report(i: usize, out: &[u8]) {
    let mut top = (0usize, i8::MIN);
    for (k, &b) in out.iter().enumerate() {
        if (b as i8) > top.1 {
            top = (k, b as i8);
        }
    }
    defmt::println!("output {}: {=[u8]} (top1 {} = {})", i, out, top.0, top.1);
}

#[cfg(not(feature = "defmt"))]
fn report(_i: usize, out: &[u8]) {
    core::hint::black_box(out);
}
