//! RP2040 (Raspberry Pi Pico): the compiled model from flash, no heap.
//! Build-only here; see `../build-real.sh`.

#![no_std]
#![no_main]

use cortex_m_rt::entry;
#[cfg(feature = "defmt")]
use defmt_rtt as _;

#[path = "../../real-common/app.rs"]
mod app;

/// Second-stage bootloader for the Pico's W25Q080 flash, placed by
/// `memory.x` in the first 256 bytes of flash.
#[link_section = ".boot2"]
#[used]
pub static BOOT2_FIRMWARE: [u8; 256] = rp2040_boot2::BOOT_LOADER_W25Q080;

#[entry]
fn main() -> ! {
    app::run_once();
    loop {
        cortex_m::asm::wfi();
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // mote-core returns errors rather than panicking; if anything does,
    // idle (a debugger attached sees where).
    loop {
        cortex_m::asm::wfi();
    }
}
