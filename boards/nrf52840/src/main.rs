//! nRF52840 (e.g. nRF52840-DK): the compiled model from flash, no heap.
//! Build-only here; see `../build-real.sh`.

#![no_std]
#![no_main]

use cortex_m_rt::entry;
#[cfg(feature = "defmt")]
use defmt_rtt as _;

#[path = "../../real-common/app.rs"]
mod app;

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
