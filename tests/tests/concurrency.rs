//! One `Model` and one `Plan` shared by many threads, each session with its
//! own arena, give the bytes of a single-thread run; mote-std sessions with
//! their own rayon threads do the same side by side.

use mote_core::{Model, Plan, Session, SessionBuilder, TensorView};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

#[test]
fn model_plan_and_sessions_cross_threads() {
    send_sync::<Model>();
    send_sync::<Plan>();
    send::<Session<'static>>();
    send::<mote_std::Session>();
}

/// Input `k` of a set: a distinct deterministic pattern per k.
fn input(shape: &[usize], k: usize) -> Vec<f32> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| (((i + 131 * k) * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn outputs(s: &Session<'_>) -> Vec<Vec<u8>> {
    (0..s.outputs().len())
        .map(|i| s.output(i).expect("output").bytes().to_vec())
        .collect()
}

/// 8 threads × 1,000 inferences on one model (f32 and int8 QDQ KWS), every
/// result compared byte for byte with the single-thread run of its input.
#[test]
fn eight_threads_share_one_model() {
    const THREADS: usize = 8;
    const RUNS: usize = 1000;
    const INPUTS: usize = 5;
    // The kernel family is process-wide: a mote-std session in a sibling
    // test selects AVX2 on first use, which would switch kernels between
    // the single-thread reference run and the threads (float rounding
    // order differs). Select it once, before any run here.
    let _ = mote_std::cpu::init();
    for file in ["kws.f32.onnx", "kws.qdq.onnx"] {
        let bytes = std::fs::read(mote_tests::quant_dir().join(file)).expect("model");
        let model = Model::from_onnx(&bytes).expect("import");
        let plan = SessionBuilder::new(&model).plan().expect("plan");
        let io = plan.inputs().first().expect("one input");
        let (name, shape) = (io.name.as_str(), io.shape.clone());
        let inputs: Vec<Vec<f32>> = (0..INPUTS).map(|k| input(&shape, k)).collect();
        let want: Vec<Vec<Vec<u8>>> = inputs
            .iter()
            .map(|x| {
                let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
                let mut s = Session::new(&model, &plan, &mut arena).expect("session");
                s.run(&[(name, TensorView::new(&shape, x).expect("view"))])
                    .expect("run");
                outputs(&s)
            })
            .collect();
        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let (model, plan, inputs, want, shape) = (&model, &plan, &inputs, &want, &shape);
                sc.spawn(move || {
                    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
                    let mut s = Session::new(model, plan, &mut arena).expect("session");
                    for r in 0..RUNS {
                        let k = (t + r) % INPUTS;
                        let x = TensorView::new(shape, &inputs[k]).expect("view");
                        s.run(&[(name, x)]).expect("run");
                        assert_eq!(outputs(&s), want[k], "{file}: thread {t}, run {r}");
                    }
                });
            }
        });
    }
}

/// Four mote-std sessions of one file, each with 2 rayon threads, run side
/// by side and match a one-thread session.
#[test]
fn threaded_sessions_side_by_side() {
    let path = mote_tests::quant_dir().join("mbv1.f32.onnx");
    let mut one = mote_std::Session::builder(&path)
        .threads(1)
        .build()
        .expect("session");
    let ins = mote_tests::patterned_inputs(&one);
    let ins: Vec<(&str, mote_std::Tensor)> =
        ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want: Vec<Vec<u8>> = one
        .run(&ins)
        .expect("run")
        .iter()
        .map(|t| t.bytes().to_vec())
        .collect();
    std::thread::scope(|sc| {
        for t in 0..4 {
            let (path, ins, want) = (&path, &ins, &want);
            sc.spawn(move || {
                let mut s = mote_std::Session::builder(path)
                    .threads(2)
                    .build()
                    .expect("session");
                for r in 0..50 {
                    let got: Vec<Vec<u8>> = s
                        .run(ins)
                        .expect("run")
                        .iter()
                        .map(|t| t.bytes().to_vec())
                        .collect();
                    assert_eq!(&got, want, "session {t}, run {r}");
                }
            });
        }
    });
}
