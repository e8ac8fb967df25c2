//! The optimized kernels against the reference loops on whole models: the
//! f32 models of `quant_dir()` within the float tolerance, their int8 QDQ
//! versions bit for bit (integer sums do not depend on the order).
//!
//! The kernel choice is process-wide, so the tests of this file (its own
//! test binary: nothing else runs beside it) switch it one at a time,
//! holding [`SELECTION`].

use mote_core::cpu::{self, Kernels};
use mote_std::{Session, Tensor};
use mote_tests::quant_dir;

/// Held by a test for as long as it switches the kernel selection.
static SELECTION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`SELECTION`] (a test that failed while holding it does not stop
/// the others).
fn hold_selection() -> std::sync::MutexGuard<'static, ()> {
    SELECTION.lock().unwrap_or_else(|e| e.into_inner())
}

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
    let _held = hold_selection();
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

/// A caller's memory budget turns off the packed weight copies (the direct
/// Conv's weights and the f32 MatMul's constant B, heap the budget would
/// not count); where they are made, the plan reports their bytes. ResNet-8
/// (its 3 x 3 layers run the direct Conv with AVX2 + FMA) gives the same
/// outputs either way.
#[test]
fn max_memory_turns_off_packed_weights() {
    let _held = hold_selection();
    let path = quant_dir().join("resnet8.f32.onnx");
    for k in modes() {
        select(k);
        let mut outs = Vec::new();
        for budget in [None, Some(1usize << 30)] {
            let mut b = Session::builder(&path);
            if let Some(m) = budget {
                b = b.max_memory(m);
            }
            let mut s = b.build().expect("session");
            let packed = s.plan().packed_bytes();
            match (budget, k.0) {
                (Some(_), _) => assert_eq!(packed, 0, "{k:?}"),
                // The seven 3 x 3 layers' weights (74,160 floats, 16 to
                // 64 output channels).
                (None, Kernels::Avx2Fma) => assert!(packed >= 74_160 * 4, "{k:?}: {packed}"),
                (None, _) => {}
            }
            let owned = mote_tests::patterned_inputs(&s);
            let ins: Vec<(&str, Tensor)> =
                owned.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            outs.push(s.run(&ins).expect("run")[0].to_f32_vec());
        }
        for (i, (a, b)) in outs[0].iter().zip(&outs[1]).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                "{k:?} element {i}: {a} vs {b}"
            );
        }
    }
    select((Kernels::Blocked, false));
}

/// Runs a one-input model (`x`, f32 of `shape`) on the core session, with
/// no optimizer pass: the outputs' values.
fn run_core(onnx: &[u8], shape: &[usize], x: &[f32]) -> Vec<Vec<f32>> {
    use mote_core::{Model, Session, SessionBuilder, TensorView};
    let m = Model::from_onnx(onnx).expect("import");
    let plan = SessionBuilder::new(&m).plan().expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&m, &plan, &mut arena).expect("session");
    s.run(&[("x", TensorView::new(shape, x).expect("view"))])
        .expect("run");
    (0..m.output_names().count())
        .map(|i| s.output(i).expect("output").f32().expect("f32").to_vec())
        .collect()
}

fn pattern(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

#[test]
fn fused_conv_gives_the_bits_of_conv_then_its_activation_on_every_path() {
    // FusedConv applies its activation where each Conv path writes (the
    // GEMM's last k block for Relu / Clip, after each group's GEMM, after
    // the direct AVX2 conv, after each depthwise plane, after the
    // reference loops): the same bits as the Conv and then the standalone
    // operator, under every kernel selection.
    use mote_tests::onnx::{
        attr_float, attr_floats, attr_int, attr_ints, attr_str, graph, node, tensor_f32, vi,
        with_attrs,
    };
    use prost::Message;
    // (X shape, W shape, group, pads): im2col GEMM (rows < 8), the direct
    // AVX2 conv (rows >= 8), pointwise GEMM, grouped GEMMs over a batch,
    // narrow and wide depthwise planes (the activation on all planes at
    // once, or per plane of more than 4096 values), the reference loops
    // (< 4 output channels).
    let layers: [([i64; 4], [i64; 4], i64, i64); 8] = [
        ([1, 3, 6, 6], [8, 3, 3, 3], 1, 1),
        ([1, 3, 10, 10], [8, 3, 3, 3], 1, 1),
        ([1, 8, 5, 5], [8, 8, 1, 1], 1, 0),
        ([2, 4, 6, 6], [8, 2, 3, 3], 2, 1),
        ([1, 4, 6, 6], [4, 1, 3, 3], 4, 1),
        ([1, 4, 20, 20], [4, 1, 3, 3], 4, 1),
        ([1, 3, 70, 70], [3, 1, 3, 3], 3, 1),
        ([1, 3, 6, 6], [2, 3, 3, 3], 1, 1),
    ];
    // (activation, its FusedConv params: also the standalone node's
    // attributes, and Clip's bounds, the `lo` / `hi` initializers)
    let acts: [(&str, Vec<f32>); 7] = [
        ("Relu", vec![]),
        ("Clip", vec![-0.2, 0.3]),
        ("LeakyRelu", vec![0.3]),
        ("Sigmoid", vec![]),
        ("Tanh", vec![]),
        ("HardSigmoid", vec![0.25, 0.5]),
        ("HardSwish", vec![]),
    ];
    let _held = hold_selection();
    let modes = modes();
    for (li, (xs, ws, group, pad)) in layers.into_iter().enumerate() {
        let n = |s: &[i64]| s.iter().product::<i64>() as usize;
        let mut x = pattern(n(&xs), 1);
        // A NaN, which every activation must pass on as the standalone
        // operator does (a clamp's operand order decides that).
        let nan_at = n(&xs) / 3;
        x[nan_at] = f32::NAN;
        let conv_attrs = || vec![attr_int("group", group), attr_ints("pads", &[pad; 4])];
        let m = ws[0];
        let oh = xs[2] + 2 * pad - ws[2] + 1;
        let ys = [xs[0], m, oh, xs[3] + 2 * pad - ws[3] + 1];
        let inits = || {
            vec![
                tensor_f32("w", &ws, &pattern(n(&ws), 2)),
                tensor_f32("b", &[m], &pattern(m as usize, 3)),
                tensor_f32("lo", &[], &[-0.2]),
                tensor_f32("hi", &[], &[0.3]),
            ]
        };
        let xdims: Vec<usize> = xs.iter().map(|&d| d as usize).collect();
        for (name, params) in &acts {
            // Conv, then the operator; the Conv's output is an output too.
            let mut plain_act = match *name {
                "Clip" => node("Clip", "act", &["c", "lo", "hi"], &["y"]),
                _ => node(name, "act", &["c"], &["y"]),
            };
            plain_act = match *name {
                "LeakyRelu" => with_attrs(plain_act, vec![attr_float("alpha", params[0])]),
                "HardSigmoid" => with_attrs(
                    plain_act,
                    vec![
                        attr_float("alpha", params[0]),
                        attr_float("beta", params[1]),
                    ],
                ),
                _ => plain_act,
            };
            let plain = graph(
                vec![
                    with_attrs(node("Conv", "conv", &["x", "w", "b"], &["c"]), conv_attrs()),
                    plain_act,
                ],
                vec![vi("x", 1, &xs)],
                vec![vi("c", 1, &ys), vi("y", 1, &ys)],
                inits(),
            );
            let mut fused_attrs = conv_attrs();
            fused_attrs.push(attr_str("activation", name));
            if !params.is_empty() {
                fused_attrs.push(attr_floats("activation_params", params));
            }
            let mut fused_node = with_attrs(
                node("FusedConv", "fused", &["x", "w", "b"], &["y"]),
                fused_attrs,
            );
            fused_node.domain = Some("com.microsoft".into());
            let fused = graph(
                vec![fused_node],
                vec![vi("x", 1, &xs)],
                vec![vi("y", 1, &ys)],
                inits(),
            );
            let model = |g| {
                let mut p = mote_tests::onnx::model_proto(g, 14);
                p.opset_import.push(mote_proto::OperatorSetIdProto {
                    domain: Some("com.microsoft".into()),
                    version: Some(1),
                });
                p.encode_to_vec()
            };
            let (plain, fused) = (model(plain), model(fused));
            for &k in &modes {
                select(k);
                let want = run_core(&plain, &xdims, &x).swap_remove(1);
                let got = run_core(&fused, &xdims, &x).swap_remove(0);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "layer {li}, {name}, {k:?}");
            }
        }
    }
    select((Kernels::Blocked, false));
}
