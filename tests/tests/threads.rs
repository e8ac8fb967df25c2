//! The rayon provider on whole models: outputs with 2 and 4 intra-op
//! threads are the 1-thread outputs bit for bit (kernels split outputs, never
//! a sum), for the f32 models of `quant_dir()` and their int8 QDQ versions.

use mote_std::{Session, Tensor};
use mote_tests::quant_dir;

fn run(file: &str, threads: usize) -> Vec<Tensor> {
    let path = quant_dir().join(file);
    let mut s = Session::builder(&path)
        .threads(threads)
        .build()
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(s.threads(), threads);
    let ins = mote_tests::patterned_inputs(&s);
    let ins: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    s.run(&ins).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn threads_give_the_single_thread_bytes() {
    for base in ["mlp", "kws", "mbv1", "resnet8"] {
        for file in [
            format!("{base}.f32.onnx"),
            format!("{base}.qdq.onnx"),
            format!("{base}.qdq_pc.onnx"),
        ] {
            let want = run(&file, 1);
            for threads in [2, 4] {
                let got = run(&file, threads);
                assert_eq!(got.len(), want.len(), "{file}");
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.shape(), w.shape(), "{file} {threads} threads");
                    assert_eq!(g.bytes(), w.bytes(), "{file}: {threads} threads differ");
                }
            }
        }
    }
}
