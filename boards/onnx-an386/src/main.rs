//! On-device ONNX on mps2-an386 (Cortex-M4F, QEMU): the plain `.onnx`
//! embedded in flash is imported, optimized (QDQ fusion, then 8-bit graph
//! IO as `mote compile` does), planned and run with a heap
//! (embedded-alloc); the outputs are printed over semihosting as
//! `output <i>: <int8 values>` (for each input of `input.bin` in turn), with the heap use, and the firmware exits 0
//! (1 with the error printed on failure).

#![no_std]
#![no_main]

extern crate alloc;

use core::alloc::{GlobalAlloc, Layout};
use core::mem::MaybeUninit;
use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicUsize, Ordering};

use alloc::vec;
// Links cortex-m's single-core critical section (used by the heap).
use cortex_m as _;
use cortex_m_rt::entry;
use embedded_alloc::LlffHeap;
use mote_core::{Model, Session};
use semihosting::{println, process};

/// The ONNX file, as is.
static ONNX: &[u8] = include_bytes!(concat!(env!("MOTE_FW_MODEL_DIR_ABS"), "/model.onnx"));
/// The inputs (int8 after `optimize::int8_io`), one after the other: each
/// is run in turn.
static INPUT: &[u8] = include_bytes!(concat!(env!("MOTE_FW_MODEL_DIR_ABS"), "/input.bin"));

/// Heap for import and planning (of the 4 MB of RAM).
const HEAP_BYTES: usize = 2 << 20;

/// The heap, counting its peak use.
struct Counted {
    heap: LlffHeap,
    used: AtomicUsize,
    peak: AtomicUsize,
}

// SAFETY: forwards to LlffHeap; the counters do not affect allocation.
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { self.heap.alloc(layout) };
        if !p.is_null() {
            let now = self.used.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.used.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.heap.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static HEAP: Counted = Counted {
    heap: LlffHeap::empty(),
    used: AtomicUsize::new(0),
    peak: AtomicUsize::new(0),
};

#[entry]
fn main() -> ! {
    static mut MEM: [MaybeUninit<u8>; HEAP_BYTES] = [MaybeUninit::uninit(); HEAP_BYTES];
    // SAFETY: `MEM` is handed to the heap once, before any allocation
    // (cortex-m-rt gives `main` its statics by `&mut` exactly once).
    unsafe { HEAP.heap.init(addr_of_mut!(*MEM) as usize, HEAP_BYTES) };
    match run() {
        Ok(()) => process::exit(0),
        Err(e) => {
            println!("error: {e}");
            process::exit(1)
        }
    }
}

fn run() -> Result<(), mote_core::Error> {
    let mut model = Model::from_onnx(ONNX)?;
    let after_import = HEAP.used.load(Ordering::Relaxed);
    mote_core::optimize::int8_io(&mut model);
    let plan = model.session_builder().plan().inspect_err(|e| {
        println!("plan failed: {}", model.explain(e));
    })?;
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&model, &plan, &mut arena)?;
    let n = s.input_mut(0)?.bytes_mut().len();
    if n == 0 || !INPUT.len().is_multiple_of(n) {
        println!(
            "input.bin has {} bytes, not a whole number of inputs of {n}",
            INPUT.len()
        );
        return Err(mote_core::Error::new(mote_core::ErrorKind::Invalid(
            "input size",
        )));
    }
    for x in INPUT.chunks_exact(n) {
        s.input_mut(0)?.bytes_mut().copy_from_slice(x);
        s.invoke()
            .inspect_err(|e| println!("invoke failed: {}", model.explain(e)))?;
        for i in 0..s.outputs().len() {
            let o = s.output(i)?;
            let signed = o.dtype() == mote_core::DType::I8;
            let mut line = alloc::string::String::new();
            for &b in o.bytes() {
                use core::fmt::Write as _;
                let _ = if signed {
                    write!(line, " {}", b as i8)
                } else {
                    write!(line, " {b}")
                };
            }
            println!("output {i}:{line}");
        }
    }
    println!(
        "onnx {} bytes; heap after import {} bytes, peak {} bytes; arena {} bytes",
        ONNX.len(),
        after_import,
        HEAP.peak.load(Ordering::Relaxed),
        plan.arena_bytes()
    );
    Ok(())
}
