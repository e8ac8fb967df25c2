//! `Session::run` performs zero heap allocations: proven with a counting
//! global allocator around real runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        BYTES.fetch_add(l.size(), Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        BYTES.fetch_add(n, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counters are global: tests of this binary take turns.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn run_does_not_allocate() {
    let _g = LOCK.lock();
    let dir = mote_tests::models_dir();
    for name in ["mlp", "cnn", "mobilenet", "dynamic"] {
        let bytes = std::fs::read(dir.join(format!("{name}.onnx"))).expect("model");
        let model = mote_core::Model::from_onnx(&bytes).expect("import");
        let input = mote_std::read_npy(dir.join(format!("{name}.input.npy"))).expect("input");
        let in_name = model.input_names().next().expect("input").to_string();
        let plan = mote_core::SessionBuilder::new(&model)
            .input_shape(&in_name, input.shape())
            .plan()
            .expect("plan");
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = mote_core::Session::new(&model, &plan, &mut arena).expect("session");
        let view = input.view();
        let feeds = [(in_name.as_str(), view)];
        s.run(&feeds).expect("warm-up run");
        let before = ALLOCS.load(Ordering::SeqCst);
        for _ in 0..3 {
            s.run(&feeds).expect("run");
        }
        let after = ALLOCS.load(Ordering::SeqCst);
        assert_eq!(
            after - before,
            0,
            "{name}: Session::run allocated {} times",
            after - before
        );
    }
}

#[test]
fn weights_are_copied_at_most_once_on_load() {
    let _g = LOCK.lock();
    let bytes = std::fs::read(mote_tests::models_dir().join("mlp.onnx")).expect("model");
    let before = BYTES.load(Ordering::SeqCst);
    let model = mote_core::Model::from_onnx(&bytes).expect("import");
    let allocated = BYTES.load(Ordering::SeqCst) - before;
    let weights: usize = model
        .graph
        .tensors
        .iter()
        .filter_map(|t| t.value.as_ref())
        .map(|c| c.byte_len())
        .sum();
    println!(
        "mlp: file {} B, weights {weights} B, allocated on load {allocated} B",
        bytes.len()
    );
    // One copy of the weights plus small metadata; two copies would exceed this.
    assert!(
        allocated < weights + weights / 4 + 64 * 1024,
        "allocated {allocated} B for {weights} B of weights"
    );
}
