//! Compiled models (`.mote`): `mote compile` output runs exactly like the
//! planned session of the same model (the int8 kernels are shared, so the
//! bytes must be equal; QDQ and QOperator models), keeps the planned arena, and every corrupt,
//! truncated, misaligned or version-mismatched file is an `Err`, never a
//! panic.

use std::path::PathBuf;

use mote_core::compiled::{crc32, CompiledModel, CompiledSession};
use mote_core::{ErrorKind, Model, Session};
use mote_std::compiled::{compile_onnx, MoteFile};
use mote_std::Tensor;

fn dir() -> PathBuf {
    mote_tests::quant_dir()
}

/// First sample of `<base>.input.npy` (float32, one sample's shape).
fn sample(base: &str) -> Tensor {
    let t = mote_std::read_npy(dir().join(format!("{base}.input.npy"))).expect("input npy");
    let shape = t.shape()[1..].to_vec();
    let len = t.bytes().len() / t.shape()[0];
    Tensor::from_bytes(t.dtype(), &shape, &t.bytes()[..len]).expect("sample")
}

/// The planned session of the same model (int8 IO), fed the int8 input the
/// compiled model quantized: its output bytes.
fn session_output(file: &str, q_input: &[u8]) -> (Vec<u8>, usize, usize) {
    let bytes = std::fs::read(dir().join(file)).expect("model file");
    let mut model = Model::from_onnx(&bytes).expect("import");
    mote_core::optimize::int8_io(&mut model);
    let plan = model.session_builder().plan().expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&model, &plan, &mut arena).expect("session");
    s.input_mut(0)
        .expect("input")
        .bytes_mut()
        .copy_from_slice(q_input);
    s.invoke().expect("invoke");
    let out = s.output(0).expect("output").bytes().to_vec();
    (out, plan.arena_bytes(), plan.lower_bound())
}

fn compiled(file: &str) -> MoteFile {
    let c = compile_onnx(dir().join(file), &[]).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert!(
        c.report.unsupported().next().is_none(),
        "{file}: {:?}",
        c.report
    );
    MoteFile::from_bytes(&c.bytes).expect("reload")
}

#[test]
fn compiled_models_match_the_planned_session_exactly() {
    let cases = [
        "mlp.qdq.onnx",
        "mlp.qdq_pc.onnx",
        "kws.qdq.onnx",
        "kws.qdq_pc.onnx",
        "kws.qdq_u8.onnx",
        "mbv1.qdq.onnx",
        "mbv1.qdq_pc.onnx",
        "resnet8.qdq.onnx",
        "resnet8.qdq_pc.onnx",
        // QOperator: QLinearConv / QGemm run as the same kernels, with
        // onnxruntime's f32 requantization (feature `qoperator`).
        "mlp.qop.onnx",
        "mlp.qop_pc.onnx",
        "kws.qop.onnx",
        "kws.qop_pc.onnx",
        "mbv1.qop.onnx",
        "mbv1.qop_pc.onnx",
        "resnet8.qop.onnx",
        "resnet8.qop_pc.onnx",
    ];
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>6}",
        "model", "file B", "data B", "arena B", "steps"
    );
    for file in cases {
        let base = file.split('.').next().expect("base");
        let f = compiled(file);
        let m = f.model().expect("model");
        let x = sample(base);
        let d = m.input(0).expect("input 0");
        assert!(d.quant.is_some(), "{file}: input not quantized");
        let q: Vec<u8> = x
            .to_f32_vec()
            .iter()
            .map(|&v| d.quantize(v).expect("quantize") as u8)
            .collect();
        let got = f.run(&[x]).expect("run .mote");
        let (want, arena, lower) = session_output(file, &q);
        assert_eq!(
            got[0].bytes(),
            &want[..],
            "{file}: .mote differs from the session"
        );
        assert_eq!(m.arena_bytes(), arena, "{file}: arena");
        assert_eq!(m.arena_lower_bound(), lower, "{file}: lower bound");
        assert!(
            arena as f64 <= 1.02 * lower as f64,
            "{file}: arena {arena} > 1.02 x lower bound {lower}"
        );
        // Same output on a second run and from int8 input bytes directly.
        let q_t = Tensor::from_bytes(d.tensor.dtype, d.tensor.shape(), &q).expect("q");
        let again = f.run(&[q_t]).expect("second run");
        assert_eq!(again[0].bytes(), got[0].bytes(), "{file}: second run");
        println!(
            "{:<22} {:>9} {:>9} {:>9} {:>6}",
            file,
            f.bytes().len(),
            m.data_bytes(),
            m.arena_bytes(),
            m.num_steps()
        );
    }
}

/// A copy of `bytes` at a 16-aligned address plus `shift`.
fn aligned(bytes: &[u8], shift: usize) -> (Vec<u128>, usize) {
    let mut buf = vec![0u128; (bytes.len() + shift).div_ceil(16) + 1];
    let b: &mut [u8] = bytemuck_cast(&mut buf);
    b[shift..shift + bytes.len()].copy_from_slice(bytes);
    (buf, shift)
}

fn bytemuck_cast(v: &mut [u128]) -> &mut [u8] {
    // SAFETY: u128 has no padding; any byte pattern is valid for u8.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 16) }
}

fn view(buf: &mut [u128], shift: usize, len: usize) -> &[u8] {
    &bytemuck_cast(buf)[shift..shift + len]
}

fn kind(bytes: &[u8]) -> Result<(), ErrorKind> {
    let (mut buf, s) = aligned(bytes, 0);
    CompiledModel::from_bytes(view(&mut buf, s, bytes.len()))
        .map(|_| ())
        .map_err(|e| e.kind)
}

/// Rewrites the checksum so that a mutation reaches the validator.
fn fix_crc(b: &mut [u8]) {
    let c = crc32(&b[16..]);
    b[12..16].copy_from_slice(&c.to_le_bytes());
}

#[test]
fn corrupt_truncated_and_foreign_files_are_errors() {
    let good = compiled("kws.qdq.onnx").bytes().to_vec();
    assert_eq!(kind(&good), Ok(()));
    // Every single-bit flip is caught (by the CRC or the header checks).
    for i in (0..good.len()).step_by(7) {
        let mut b = good.clone();
        b[i] ^= 1 << (i % 8);
        assert!(kind(&b).is_err(), "bit flip at byte {i} accepted");
    }
    // Truncations.
    for n in [0, 3, 16, 79, 80, good.len() / 2, good.len() - 1] {
        assert!(kind(&good[..n]).is_err(), "truncated to {n} accepted");
    }
    // Version mismatch names both versions.
    let mut b = good.clone();
    b[4..6].copy_from_slice(&2u16.to_le_bytes());
    fix_crc(&mut b);
    assert_eq!(
        kind(&b),
        Err(ErrorKind::Version {
            supported: 1,
            got: 2
        })
    );
    // A checksum mismatch says so.
    let mut b = good.clone();
    let last = b.len() - 20;
    b[last] ^= 0xff;
    assert_eq!(
        kind(&b),
        Err(ErrorKind::BadFile("checksum mismatch (corrupt file)"))
    );
    // Misaligned bytes are refused, not read unaligned.
    let (mut buf, s) = aligned(&good, 1);
    assert!(CompiledModel::from_bytes(view(&mut buf, s, good.len())).is_err());
    // An ONNX file is not a .mote file.
    let onnx = std::fs::read(dir().join("kws.qdq.onnx")).expect("onnx");
    assert!(kind(&onnx).is_err());
}

/// IO names are checked for UTF-8 when asked for, not at load (firmware
/// that never reads a name does not link the validator): a file whose
/// input name is not UTF-8 loads and runs, and `name()` says what is wrong.
#[test]
fn non_utf8_io_names_are_an_error_when_asked_for() {
    let good = compiled("kws.qdq.onnx").bytes().to_vec();
    let (mut buf, s) = aligned(&good, 0);
    let name = {
        let m = CompiledModel::from_bytes(view(&mut buf, s, good.len())).expect("good");
        m.input(0).expect("input").name().expect("name").to_owned()
    };
    let at = good
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .expect("the name is stored");
    let mut b = good.clone();
    b[at] = 0xff;
    fix_crc(&mut b);
    let (mut buf, s) = aligned(&b, 0);
    let m = CompiledModel::from_bytes(view(&mut buf, s, b.len())).expect("loads");
    let d = m.input(0).expect("input 0");
    assert_eq!(
        d.name().map_err(|e| e.kind),
        Err(ErrorKind::BadFile("IO name not UTF-8"))
    );
    let mut arena = vec![0u8; m.arena_bytes()];
    let mut sess = CompiledSession::new(&m, &mut arena).expect("session");
    sess.invoke().expect("runs");
}

/// Random mutations with a valid checksum: the validator and the kernels
/// must return `Err` or run, never panic (they check every record).
#[test]
fn mutated_files_with_valid_checksums_never_panic() {
    let good = compiled("kws.qdq.onnx").bytes().to_vec();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut accepted, mut ran) = (0, 0);
    // Mutate only the header, tables and parameters (the weights are any
    // bytes by design): the first part of the file.
    let m = MoteFile::from_bytes(&good).expect("good");
    let data_at = good.len() - m.model().expect("model").data_bytes();
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..1 + next() % 3 {
            let i = 16 + (next() as usize) % (data_at - 16);
            b[i] = match next() % 4 {
                0 => 0,
                1 => 0xff,
                2 => b[i].wrapping_add(1),
                _ => next() as u8,
            };
        }
        fix_crc(&mut b);
        let (mut buf, s) = aligned(&b, 0);
        let bytes = view(&mut buf, s, b.len());
        let r = std::panic::catch_unwind(|| {
            let Ok(m) = CompiledModel::from_bytes(bytes) else {
                return (false, false);
            };
            let mut arena = vec![0u8; m.arena_bytes().min(1 << 20)];
            let Ok(mut s) = CompiledSession::new(&m, &mut arena) else {
                return (true, false);
            };
            (true, s.invoke().is_ok())
        });
        let (a, r) = r.expect("a mutated .mote file made mote-core panic");
        accepted += a as usize;
        ran += r as usize;
    }
    println!("3000 mutations: {accepted} accepted by the validator, {ran} ran to the end");
}

#[test]
fn arena_too_small_is_an_error() {
    let f = compiled("kws.qdq.onnx");
    let m = f.model().expect("model");
    let mut arena = vec![0u8; m.arena_bytes() - 1];
    let e = CompiledSession::new(&m, &mut arena).expect_err("small arena accepted");
    assert_eq!(
        e.kind,
        ErrorKind::ArenaTooSmall {
            needed: m.arena_bytes(),
            got: m.arena_bytes() - 1
        }
    );
}
