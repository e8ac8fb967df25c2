//! Support shared by the QEMU board firmware of `boards/`.
//!
//! - Output and exit through semihosting ([`println!`], [`exit`]): QEMU's
//!   exit status is the firmware's, so a test can tell success from failure.
//! - A HardFault handler and a panic handler that print a `MOTE fault` /
//!   `MOTE panic` line and exit with status 3 / 2 (never hang a test).
//! - Stack high-water mark: cortex-m-rt's `paint-stack` fills the RAM
//!   between the end of the statics (`_stack_end`) and the initial stack
//!   pointer with `0xCCCCCCCC` before `main`; [`stack_high_water_mark`]
//!   finds the lowest word the stack ever overwrote.
//! - Instruction counting: QEMU does not emulate DWT CYCCNT, but under
//!   `-icount shift=0` (one instruction per virtual nanosecond) SysTick
//!   ticks at a fixed number of instructions per tick. The 24-bit counter
//!   wraps in the SysTick exception, which extends it to 64 bits
//!   ([`ticks`]). [`calibrate`] times a loop of known length to turn ticks
//!   into instructions.
//!
//! Every line meant for the host starts with `MOTE ` (see boards/README.md).

#![no_std]

use core::panic::PanicInfo;
use core::sync::atomic::{AtomicU32, Ordering};

use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::SYST;
use cortex_m_rt::{exception, ExceptionFrame};

pub use semihosting::{print, println};

/// Exit status of a firmware that panicked.
pub const EXIT_PANIC: i32 = 2;
/// Exit status of a firmware that took a HardFault.
pub const EXIT_FAULT: i32 = 3;

/// Ends the emulation with `code` as QEMU's exit status.
pub fn exit(code: i32) -> ! {
    semihosting::process::exit(code)
}

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    println!("MOTE panic: {}", info);
    exit(EXIT_PANIC)
}

// System Control Block fault status registers (ARMv7-M / ARMv8-M Mainline).
const CFSR: *const u32 = 0xE000_ED28 as *const u32;
const HFSR: *const u32 = 0xE000_ED2C as *const u32;
const MMFAR: *const u32 = 0xE000_ED34 as *const u32;
const BFAR: *const u32 = 0xE000_ED38 as *const u32;

/// Prints the faulting PC and, when the core recorded one, the faulting
/// data address (BFAR for a precise bus fault, MMFAR for a memory
/// management fault), then exits with [`EXIT_FAULT`].
#[exception]
unsafe fn HardFault(ef: &ExceptionFrame) -> ! {
    // SAFETY: architecturally defined, always-readable SCB registers.
    let (cfsr, hfsr, mmfar, bfar) = unsafe {
        (
            CFSR.read_volatile(),
            HFSR.read_volatile(),
            MMFAR.read_volatile(),
            BFAR.read_volatile(),
        )
    };
    let addr = if cfsr & (1 << 15) != 0 {
        Some(bfar)
    } else if cfsr & (1 << 7) != 0 {
        Some(mmfar)
    } else {
        None
    };
    match addr {
        Some(a) => println!(
            "MOTE fault pc=0x{:08x} addr=0x{:08x} cfsr=0x{:08x} hfsr=0x{:08x}",
            ef.pc(),
            a,
            cfsr,
            hfsr
        ),
        None => println!(
            "MOTE fault pc=0x{:08x} addr=none cfsr=0x{:08x} hfsr=0x{:08x}",
            ef.pc(),
            cfsr,
            hfsr
        ),
    }
    exit(EXIT_FAULT)
}

/// Bytes of stack used so far (deepest point since reset), from the
/// paint cortex-m-rt laid down before `main`.
pub fn stack_high_water_mark() -> usize {
    extern "C" {
        static _stack_end: u32;
        static _stack_start: u32;
    }
    let lo = &raw const _stack_end as usize;
    let hi = &raw const _stack_start as usize;
    let mut p = lo;
    while p < hi {
        // SAFETY: [lo, hi) is RAM owned by the stack; reading a word the
        // stack may also use is fine (volatile, aligned).
        if unsafe { (p as *const u32).read_volatile() } != cortex_m_rt::STACK_PAINT_VALUE {
            break;
        }
        p += 4;
    }
    hi - p
}

/// Bytes between the end of the statics and the initial stack pointer.
pub fn stack_capacity() -> usize {
    extern "C" {
        static _stack_end: u32;
        static _stack_start: u32;
    }
    (&raw const _stack_start as usize) - (&raw const _stack_end as usize)
}

static WRAPS: AtomicU32 = AtomicU32::new(0);
const RELOAD: u32 = 0x00FF_FFFF;

#[exception]
fn SysTick() {
    WRAPS.fetch_add(1, Ordering::Relaxed);
}

/// Starts SysTick free-running on the core clock, interrupting on every
/// wrap of its 24-bit counter.
pub fn start_ticks(mut syst: SYST) {
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(RELOAD);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
    // Enabled at 0, the counter loads RELOAD on its first tick without an
    // exception; read before that, it would count as a whole wrap.
    while SYST::get_current() == 0 {
        core::hint::spin_loop();
    }
}

/// Ticks just after a wrap during which [`ticks`] waits: QEMU may show the
/// reloaded counter a little before it takes the wrap's exception.
const WRAP_SLACK: u32 = 64;

/// SysTick ticks since [`start_ticks`] (64-bit: wraps counted).
pub fn ticks() -> u64 {
    loop {
        // Just after a wrap, the exception that counts it may still be
        // pending: wait until it surely ran (at most WRAP_SLACK ticks,
        // only when a read lands there).
        while SYST::get_current() > RELOAD - WRAP_SLACK {
            core::hint::spin_loop();
        }
        let w0 = WRAPS.load(Ordering::Relaxed);
        let cur = SYST::get_current();
        let w1 = WRAPS.load(Ordering::Relaxed);
        // A wrap between the loads, or the counter just reloaded: again.
        if w0 == w1 && cur <= RELOAD - WRAP_SLACK {
            return w0 as u64 * (RELOAD as u64 + 1) + (RELOAD - cur) as u64;
        }
    }
}

/// Instructions of [`calibrate`]'s loop: two per iteration (`subs`, `bne`).
pub const CALIBRATION_ITERS: u32 = 4_000_000;

/// Times a loop of `2 * CALIBRATION_ITERS` instructions; returns
/// `(instructions, ticks)`. Under `-icount shift=0` their ratio is the
/// instructions per SysTick tick of the machine (its SysTick clock period
/// in ns: 80 on lm3s6965evb, 40 on mps2, 31.25 on mps3-an547).
pub fn calibrate() -> (u64, u64) {
    let t0 = ticks();
    // SAFETY: a register-only countdown loop.
    unsafe {
        core::arch::asm!(
            "2:",
            "subs {n}, {n}, #1",
            "bne 2b",
            n = inout(reg) CALIBRATION_ITERS => _,
            options(nomem, nostack),
        );
    }
    let t1 = ticks();
    (2 * CALIBRATION_ITERS as u64, t1 - t0)
}

/// What can fail in [`run_model`].
#[derive(Debug)]
pub enum FwError {
    /// From mote-core.
    Mote(mote_core::Error),
    /// `input.bin` does not have the input's byte length.
    InputLen {
        /// Bytes the model's input 0 takes.
        expected: usize,
        /// Bytes of `input.bin`.
        got: usize,
    },
}

impl From<mote_core::Error> for FwError {
    fn from(e: mote_core::Error) -> Self {
        FwError::Mote(e)
    }
}

impl core::fmt::Display for FwError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FwError::Mote(e) => write!(f, "{e}"),
            FwError::InputLen { expected, got } => write!(
                f,
                "input.bin has {got} bytes, the model's input 0 takes {expected}"
            ),
        }
    }
}

/// Inferences [`run_model`] times (the counts of all must be equal).
pub const RUNS: usize = 2;

/// The demo of every board: validates `model` (a `.mote` file), runs it
/// [`RUNS`] times on `input` (copied into input 0 before each run) in
/// `arena`, and prints the `MOTE` lines of boards/README.md.
pub fn run_model(model: &[u8], input: &[u8], arena: &mut [u8]) -> Result<(), FwError> {
    use mote_core::compiled::{CompiledModel, CompiledSession};
    let (ci, ct) = calibrate();
    println!("MOTE calib {} {}", ci, ct);
    // Instructions per tick under -icount shift=0: 80 on lm3s6965evb, 40
    // on mps2, 31.25 on mps3-an547 (32 MHz SysTick): scaled, not rounded.
    let insns = |t: u64| t * ci / ct.max(1);
    let t0 = ticks();
    let m = CompiledModel::from_bytes(model)?;
    let t1 = ticks();
    println!(
        "MOTE model {} steps {} load {} {}",
        model.len(),
        m.num_steps(),
        t1 - t0,
        insns(t1 - t0)
    );
    println!("MOTE arena {} of {}", m.arena_bytes(), arena.len());
    let mut s = CompiledSession::new(&m, arena)?;
    for run in 0..RUNS {
        let dst = s.input_bytes_mut(0)?;
        if dst.len() != input.len() {
            return Err(FwError::InputLen {
                expected: dst.len(),
                got: input.len(),
            });
        }
        dst.copy_from_slice(input);
        let t0 = ticks();
        s.invoke()?;
        let t1 = ticks();
        println!("MOTE icount {} {} {}", run, t1 - t0, insns(t1 - t0));
        for o in 0..m.num_outputs() {
            let signed = m.output(o)?.tensor.dtype == mote_core::DType::I8;
            print!("MOTE out {} {}:", run, o);
            for &b in s.output_bytes(o)? {
                if signed {
                    print!(" {}", b as i8);
                } else {
                    print!(" {}", b);
                }
            }
            println!();
        }
    }
    println!(
        "MOTE stack {} of {}",
        stack_high_water_mark(),
        stack_capacity()
    );
    Ok(())
}

/// [`run_model`], then exit: 0 after `MOTE ok`, 1 after `MOTE error: ...`.
pub fn main(syst: SYST, model: &[u8], input: &[u8], arena: &mut [u8]) -> ! {
    start_ticks(syst);
    match run_model(model, input, arena) {
        Ok(()) => {
            println!("MOTE ok");
            exit(0)
        }
        Err(e) => {
            println!("MOTE error: {}", e);
            exit(1)
        }
    }
}
