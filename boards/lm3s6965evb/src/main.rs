//! mote on QEMU lm3s6965evb (Cortex-M3, 256 KB flash, 64 KB RAM): the model of `MOTE_FW_MODEL_DIR`
//! (see boards/README.md) from flash, its arena a static (so the linker
//! rejects a model whose arena does not fit in RAM).

#![no_std]
#![no_main]

use core::ptr::addr_of_mut;

use cortex_m_rt::entry;

mod model {
    include!(concat!(env!("OUT_DIR"), "/model.rs"));
}

/// Input 0 as stored (int8 bytes).
static INPUT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/input.bin"));
static mut ARENA: [u8; model::ARENA_BYTES] = [0; model::ARENA_BYTES];

#[entry]
fn main() -> ! {
    let Some(p) = cortex_m::Peripherals::take() else {
        fw_support::println!("MOTE error: peripherals taken");
        fw_support::exit(1)
    };
    // SAFETY: the only reference to ARENA, taken once.
    let arena = unsafe { &mut *addr_of_mut!(ARENA) };
    fw_support::main(p.SYST, model::MODEL, INPUT, arena)
}
