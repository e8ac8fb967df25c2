//! The optimized kernels against the reference loops on whole models: the
//! f32 models of `quant_dir()` within the float tolerance, their int8 QDQ
//! versions bit for bit (integer sums do not depend on the order).
//!
//! The kernel choice is process-wide, so this file holds one test that
//! switches it in sequence (its own test binary: nothing else runs
//! beside it).

use mote_core::cpu::{self, Kernels};
use mote_std::{Session, Tensor};
use mote_tests::quant_dir;

fn run(file: &str) -> Vec<Tensor> {
    let path = quant_dir().join(file);
    let mut s = Session::from_file(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let owned = mote_tests::patterned_inputs(&s);
    let ins: Vec<(&str, Tensor)> = owned.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    s.run(&ins).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// A kernel selection: the f32 family, and whether the int8 GEMM uses
/// AVX-512 VNNI.
type Mode = (Kernels, bool);

fn modes() -> Vec<Mode> {
    // Sessions of mote-std detect the CPU once, first.
    let _ = mote_std::cpu::init();
    let mut v = vec![(Kernels::Blocked, false)];
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        v.push((Kernels::Avx2Fma, false));
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni")
        {
            v.push((Kernels::Avx2Fma, true));
        }
    }
    // NEON is baseline on aarch64: the default there, nothing to detect.
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    v.push((Kernels::Neon, false));
    v
}

fn select((k, vnni): Mode) {
    cpu::disable_avx512_vnni();
    match k {
        Kernels::Reference => cpu::force_reference(true),
        Kernels::Avx2Fma => {
            cpu::force_reference(false);
            // SAFETY: only pushed by `modes` after the CPU reported AVX2+FMA
            // (and AVX-512 F, BW and VNNI with `vnni`).
            unsafe {
                cpu::enable_avx2_fma();
                if vnni {
                    cpu::enable_avx512_vnni();
                }
            }
        }
        Kernels::Blocked => cpu::force_blocked(),
        // Neon: the default of aarch64 builds.
        _ => cpu::force_reference(false),
    }
    assert_eq!((cpu::kernels(), cpu::avx512_vnni()), (k, vnni), "selection");
}

#[test]
fn optimized_kernels_match_reference_on_models() {
    let modes = modes();
    for base in ["mlp", "kws", "mbv1", "resnet8"] {
        for (file, exact) in [
            (format!("{base}.f32.onnx"), false),
            (format!("{base}.qdq.onnx"), true),
            (format!("{base}.qdq_pc.onnx"), true),
        ] {
            select((Kernels::Reference, false));
            let want = run(&file);
            for &k in &modes {
                select(k);
                let got = run(&file);
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.shape(), w.shape(), "{file} {k:?}");
                    if exact {
                        assert_eq!(g.bytes(), w.bytes(), "{file} {k:?}: not bit-exact");
                    } else {
                        for (i, (a, b)) in g.to_f32_vec().iter().zip(w.to_f32_vec()).enumerate() {
                            assert!(
                                (a - b).abs() <= 1e-4 + 1e-3 * b.abs(),
                                "{file} {k:?} element {i}: {a} vs reference {b}"
                            );
                        }
                    }
                }
            }
        }
    }
    select((Kernels::Blocked, false));
}
