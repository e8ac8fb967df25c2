//! `Session::run` performs zero heap allocations: proven with a counting
//! global allocator around real runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
thread_local! {
    /// Allocations by this thread: what a run on it does, without the
    /// test harness's own threads (on a loaded machine libtest's main
    /// thread was still allocating for the test thread it had just spawned
    /// while the first runs were counted).
    static MINE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn count_mine() {
    let _ = MINE.try_with(|c| c.set(c.get() + 1));
}

fn mine() -> usize {
    MINE.with(|c| c.get())
}
static BYTES: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated and not yet freed, and the most there were.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grow(n: usize) {
    let now = LIVE.fetch_add(n, Ordering::SeqCst) + n;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count_mine();
        BYTES.fetch_add(l.size(), Ordering::SeqCst);
        grow(l.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count_mine();
        BYTES.fetch_add(n, Ordering::SeqCst);
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
        grow(n);
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
        let before = mine();
        for _ in 0..3 {
            s.run(&feeds).expect("run");
        }
        let after = mine();
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

/// A chain of `n` Conv (c → c, 3×3) + BatchNormalization, weights as
/// `raw_data`.
fn conv_bn_chain(n: usize, c: usize) -> Vec<u8> {
    use mote_tests::onnx::{attr_ints, model, node, tensor_f32, vi, with_attrs};
    let f32s = |name: &str, dims: &[i64], v: f32| {
        let len: i64 = dims.iter().product();
        let vals: Vec<f32> = (0..len).map(|i| v + (i % 7) as f32 * 1e-3).collect();
        tensor_f32(name, dims, &vals)
    };
    let ci = c as i64;
    let vi = |name: &str| vi(name, 1, &[1, ci, 8, 8]);
    let (mut nodes, mut inits) = (Vec::new(), Vec::new());
    let mut x = "x".to_string();
    for k in 0..n {
        let (w, y, z) = (format!("w{k}"), format!("c{k}"), format!("b{k}"));
        inits.push(f32s(&w, &[ci, ci, 3, 3], 0.01));
        let p: Vec<String> = ["g", "be", "m", "v"]
            .iter()
            .map(|p| format!("{p}{k}"))
            .collect();
        for (name, v) in p.iter().zip([1.5, 0.1, 0.2, 0.9]) {
            inits.push(f32s(name, &[ci], v));
        }
        nodes.push(with_attrs(
            node("Conv", "", &[&x, &w], &[&y]),
            vec![attr_ints("pads", &[1, 1, 1, 1])],
        ));
        let mut ins = vec![y.as_str()];
        ins.extend(p.iter().map(String::as_str));
        nodes.push(node("BatchNormalization", "", &ins, &[&z]));
        x = z;
    }
    model(nodes, vec![vi("x")], vec![vi(&x)], inits)
}

/// Loading a file whose convolutions fold a BatchNormalization never holds
/// three copies of the weights (file, aligned copies, folded weights), and
/// gives the file back once loaded. The file is shifted by 0..8 bytes, so
/// that its weights are 8-byte aligned (kept in the file) for one shift and
/// misaligned (copied) for the others.
#[test]
fn folding_on_load_holds_at_most_two_copies_of_the_weights() {
    let _g = LOCK.lock();
    let file = conv_bn_chain(6, 96);
    let weights = 6 * 96 * 96 * 9 * 4;
    for shift in 0..8 {
        let base = LIVE.load(Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        let mut buf = Vec::with_capacity(shift + file.len());
        buf.resize(shift, 0u8);
        buf.extend_from_slice(&file);
        let bytes = mote_proto::bytes::Bytes::from(buf).slice(shift..);
        let model = mote_core::Model::from_onnx_shared(bytes).expect("import");
        let peak = PEAK.load(Ordering::SeqCst) - base;
        let kept = LIVE.load(Ordering::SeqCst).saturating_sub(base);
        assert!(
            model
                .rewrites
                .iter()
                .filter(|r| r.detail.contains("folded"))
                .count()
                == 6,
            "{:?}",
            model.rewrites
        );
        println!(
            "shift {shift}: file {} B, weights {weights} B, peak {peak} B, kept {kept} B",
            file.len()
        );
        // The file plus one copy of the weights, and one folded layer.
        assert!(
            peak < file.len() + weights + weights / 4,
            "shift {shift}: peak {peak} B on load for {weights} B of weights"
        );
        assert!(
            kept < weights + weights / 8,
            "shift {shift}: {kept} B kept after load for {weights} B of weights"
        );
        drop(model);
    }
}
