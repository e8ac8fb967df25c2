//! Soak: 100,000 inferences of the int8 KWS model on one session keep the
//! resident memory flat and every output identical to the first run's.
//! (Own test binary: nothing else runs in the process while RSS is read.)

use mote_core::{Model, Session, SessionBuilder, TensorView};

/// Resident set size of this process, in bytes (Linux `/proc/self/statm`).
fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: usize = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    pages * 4096
}

#[test]
fn hundred_thousand_inferences_keep_memory_flat() {
    let runs: usize = std::env::var("MOTE_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    // The kernels a mote-std program gets (AVX2 where the CPU has it).
    let _ = mote_std::cpu::init();
    let bytes = std::fs::read(mote_tests::quant_dir().join("kws.qdq.onnx")).expect("model");
    let model = Model::from_onnx(&bytes).expect("import");
    let plan = SessionBuilder::new(&model).plan().expect("plan");
    let io = plan.inputs().first().expect("one input");
    let (name, shape) = (io.name.clone(), io.shape.clone());
    let n: usize = shape.iter().product();
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&model, &plan, &mut arena).expect("session");
    let feeds = [(name.as_str(), TensorView::new(&shape, &x).expect("view"))];
    s.run(&feeds).expect("run");
    let want = s.output(0).expect("output").bytes().to_vec();
    // Warm up (lazy pages, thread-locals) before the first reading.
    for _ in 0..1000 {
        s.run(&feeds).expect("run");
    }
    let before = rss();
    let t = std::time::Instant::now();
    for r in 0..runs {
        s.run(&feeds).expect("run");
        assert_eq!(s.output(0).expect("output").bytes(), &want[..], "run {r}");
    }
    let after = rss();
    println!(
        "{runs} runs in {:.1} s; RSS {before} B before, {after} B after",
        t.elapsed().as_secs_f64()
    );
    assert!(
        after <= before + 64 * 1024,
        "RSS grew from {before} B to {after} B over {runs} runs"
    );
}
