//! Link-time proof that running a compiled model cannot panic.
//!
//! This firmware drives every entry point of mote-core's no-allocator
//! runtime ([`CompiledModel`], [`CompiledSession`]) on bytes the optimizer
//! cannot see (a mutable static read through `black_box`), and its panic
//! handler calls `mote_core_panic_path_is_reachable`, a symbol defined
//! nowhere. If any panic (a bounds check, a division by zero, an
//! `unwrap`) survives optimization anywhere in that code, the link fails
//! and names the symbol. It is built (not run) by `tests/tests/nostd.rs`.

#![no_std]
#![no_main]

use core::hint::black_box;
use core::panic::PanicInfo;
use core::ptr::addr_of_mut;

use cortex_m_rt::entry;
use mote_core::compiled::{CompiledModel, CompiledSession};

use cortex_m as _;

/// Where a host (or a debugger) would put a model: its contents are
/// unknown at compile time.
static mut MODEL: [u32; 4096] = [0; 4096];
static mut ARENA: [u8; 65536] = [0; 65536];

fn exercise(model: &[u8], arena: &mut [u8]) -> Result<i32, mote_core::Error> {
    let m = CompiledModel::from_bytes(model)?;
    let mut acc = (m.arena_bytes() ^ m.arena_lower_bound() ^ m.data_bytes()) as i32;
    for t in 0..m.num_tensors() {
        acc ^= m.tensor(t)?.shape().len() as i32;
    }
    for i in 0..m.num_inputs() {
        let d = m.input(i)?;
        acc ^= d.quantize(black_box(0.5)).unwrap_or(0);
    }
    for o in 0..m.num_outputs() {
        let d = m.output(o)?;
        acc ^= d.dequantize(black_box(3)).map_or(0, |v| v as i32);
    }
    let mut s = CompiledSession::new(&m, arena)?;
    for i in 0..m.num_inputs() {
        for b in s.input_bytes_mut(i)?.iter_mut() {
            *b = black_box(1);
        }
        acc ^= s.input_mut::<i8>(i).map_or(0, |v| v.len() as i32);
    }
    s.invoke()?;
    for k in 0..m.num_steps() {
        s.run_step(k)?;
    }
    for o in 0..m.num_outputs() {
        acc ^= s.output_bytes(o)?.iter().map(|&b| b as i32).sum::<i32>();
        acc ^= s.output::<i8>(o).map_or(0, |v| v.len() as i32);
    }
    Ok(acc)
}

#[entry]
fn main() -> ! {
    // SAFETY: the only references to these statics, taken once here.
    let (model, arena) = unsafe { (&*addr_of_mut!(MODEL), &mut *addr_of_mut!(ARENA)) };
    let bytes: &[u8] = black_box(bytemuck_bytes(model));
    let len = black_box(bytes.len());
    let r = exercise(bytes.get(..len).unwrap_or(&[]), black_box(arena));
    let _ = black_box(r.map_err(|e| e.kind));
    loop {
        cortex_m::asm::wfi();
    }
}

fn bytemuck_bytes(w: &[u32; 4096]) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirement; the length is
    // the array's byte length.
    unsafe { core::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 4) }
}

/// `--features list`: a handler that links, so that the panic call sites
/// can be listed from the disassembly (see `tests/tests/nostd.rs`).
#[cfg(feature = "list")]
#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    loop {
        cortex_m::asm::udf();
    }
}

#[cfg(not(feature = "list"))]
#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    extern "C" {
        /// Defined nowhere: a reachable panic makes the link fail here.
        fn mote_core_panic_path_is_reachable() -> !;
    }
    // SAFETY: never linked; calling it is what the link check forbids.
    unsafe { mote_core_panic_path_is_reachable() }
}
