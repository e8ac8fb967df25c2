use super::*;

/// A folder for one test's files, removed when the test drops it.
fn tmp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("mote-std-test-")
        .tempdir()
        .unwrap()
}

#[test]
fn npy_round_trip_every_dtype() {
    let dir = tmp_dir();
    let cases = vec![
        Tensor::from_f32(&[2, 3], vec![0.5, -1.0, 2.0, 3.25, f32::MAX, 0.0]).unwrap(),
        Tensor::from_slice::<f64>(&[3], &[1.0, -2.5, 1e300]).unwrap(),
        Tensor::from_slice(&[2], &[half::f16::from_f32(1.5), half::f16::from_f32(-2.0)]).unwrap(),
        Tensor::from_slice::<i8>(&[2, 2], &[-128, 0, 1, 127]).unwrap(),
        Tensor::from_slice::<u8>(&[4], &[0, 1, 200, 255]).unwrap(),
        Tensor::from_slice::<i16>(&[2], &[-30000, 5]).unwrap(),
        Tensor::from_slice::<u16>(&[2], &[60000, 5]).unwrap(),
        Tensor::from_slice::<i32>(&[1, 2], &[-7, i32::MAX]).unwrap(),
        Tensor::from_slice::<u32>(&[2], &[u32::MAX, 0]).unwrap(),
        Tensor::from_slice::<i64>(&[2, 1], &[i64::MIN, 42]).unwrap(),
        Tensor::from_slice::<u64>(&[1], &[u64::MAX]).unwrap(),
        Tensor::from_bools(&[3], &[true, false, true]).unwrap(),
        Tensor::from_f32(&[], vec![7.0]).unwrap(),
        Tensor::from_f32(&[0, 4], vec![]).unwrap(),
    ];
    for (i, t) in cases.iter().enumerate() {
        let p = dir.path().join(format!("rt{i}.npy"));
        write_npy(&p, &t.view()).unwrap();
        let back = read_npy(&p).unwrap();
        assert_eq!(&back, t, "case {i} ({})", t.dtype());
    }
}

#[test]
fn to_f32_vec_converts() {
    let t = Tensor::from_slice::<i64>(&[3], &[1, -2, 3]).unwrap();
    assert_eq!(t.to_f32_vec(), vec![1.0, -2.0, 3.0]);
    let b = Tensor::from_bools(&[2], &[true, false]).unwrap();
    assert_eq!(b.to_f32_vec(), vec![1.0, 0.0]);
    assert!(Tensor::from_f32(&[2], vec![1.0]).is_err());
}

#[test]
fn bad_npy_is_an_error() {
    let dir = tmp_dir();
    let p = dir.path().join("bad.npy");
    std::fs::write(&p, b"hello, not npy").unwrap();
    let e = read_npy(&p).unwrap_err();
    assert!(matches!(e, Error::Npy(_)), "{e}");
    // Truncated data.
    let good = dir.path().join("good.npy");
    write_npy(
        &good,
        &Tensor::from_f32(&[16], vec![1.0; 16]).unwrap().view(),
    )
    .unwrap();
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 8]).unwrap();
    let e = read_npy(&p).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    let e = read_npy(dir.path().join("missing.npy")).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
}

/// npy preambles the fuzzer (scripts/fuzz.sh, target npy) found: a header
/// length of 660 MB that npyz allocated before reading, and a 150-byte
/// header of nested brackets that its parser took over 10 s on.
#[test]
fn fuzz_npy_headers() {
    let dir = tmp_dir();
    let mut huge = b"\x93NUMPY\x03\x00".to_vec();
    huge.extend_from_slice(&0x2759_0000u32.to_le_bytes());
    huge.extend_from_slice(b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }");
    let e = read_npy_bytes("huge.npy", &huge).unwrap_err();
    assert!(e.to_string().contains("longer than the file"), "{e}");
    let mut nested = b"\x93NUMPY\x01\x00".to_vec();
    let dict = format!("{{'descr': '<f4', 'fortran_order': {}", "[".repeat(120));
    nested.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    nested.extend_from_slice(dict.as_bytes());
    let t = std::time::Instant::now();
    let e = read_npy_bytes("nested.npy", &nested).unwrap_err();
    assert!(e.to_string().contains("nests brackets"), "{e}");
    assert!(t.elapsed().as_secs() < 1);
    // A shape whose element count overflows u64 (npyz multiplies the dims
    // unchecked: a panic under overflow checks; found by the fuzzer).
    let mut over = b"\x93NUMPY\x01\x00".to_vec();
    let dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (8, 44444444448, 444444444441, 1, 49), }";
    over.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    over.extend_from_slice(dict.as_bytes());
    let e = read_npy_bytes("over.npy", &over).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    // Brackets inside quoted strings do not count; a normal header reads.
    let good = dir.path().join("bytes.npy");
    write_npy(
        &good,
        &Tensor::from_f32(&[2, 2], vec![1.0, 2.0, 3.0, 4.0])
            .unwrap()
            .view(),
    )
    .unwrap();
    let t = read_npy_bytes("bytes.npy", &std::fs::read(&good).unwrap()).unwrap();
    assert_eq!(t.shape(), [2, 2]);
}

#[test]
fn fortran_order_is_read_row_major() {
    let dir = tmp_dir();
    // np.asfortranarray(np.arange(6, dtype='<i4').reshape(2, 3))
    let header = "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }";
    let mut h = header.to_string();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut f = b"\x93NUMPY\x01\x00".to_vec();
    f.extend((h.len() as u16).to_le_bytes());
    f.extend(h.as_bytes());
    for v in [0i32, 3, 1, 4, 2, 5] {
        f.extend(v.to_le_bytes());
    }
    let p = dir.path().join("fortran.npy");
    std::fs::write(&p, f).unwrap();
    let t = read_npy(&p).unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.as_slice::<i32>().unwrap(), &[0, 1, 2, 3, 4, 5]);
}

#[test]
fn safe_names() {
    assert_eq!(safe_name("logits"), "logits");
    assert_eq!(safe_name("a/b"), "a_b");
    assert_eq!(safe_name("out:0 x"), "out_0_x");
    assert_eq!(safe_name("x.y-z_1"), "x.y-z_1");
    assert_eq!(safe_name("é"), "_");
    assert_eq!(safe_name(""), "_");
    assert_eq!(safe_name(".."), "_..");
    assert_eq!(safe_name("../etc"), ".._etc");
}

#[test]
fn missing_and_garbage_models() {
    let dir = tmp_dir();
    let e = load_model(dir.path().join("nope.onnx")).unwrap_err();
    assert!(matches!(e, Error::Io { .. }));
    let p = dir.path().join("garbage.onnx");
    std::fs::write(&p, b"hi\n").unwrap();
    let e = load_model(&p).unwrap_err().to_string();
    assert!(e.contains("not an ONNX model or truncated"), "{e}");
    std::fs::write(&p, b"").unwrap();
    let e = load_model(&p).unwrap_err().to_string();
    assert!(e.contains("not an ONNX model or truncated"), "{e}");
}

fn digits_mlp() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/digits_mlp.onnx")
}

#[test]
fn provider_names_parse() {
    assert_eq!("cpu".parse::<Provider>().unwrap(), Provider::Cpu);
    assert_eq!(" CPU ".parse::<Provider>().unwrap(), Provider::Cpu);
    assert_eq!(
        "cuda".parse::<Provider>().unwrap(),
        Provider::Cuda { device: 0 }
    );
    assert_eq!(
        "cuda:3".parse::<Provider>().unwrap(),
        Provider::Cuda { device: 3 }
    );
    assert_eq!(Provider::default(), Provider::Cpu);
    for p in [Provider::Cpu, Provider::Cuda { device: 2 }] {
        assert_eq!(p.to_string().parse::<Provider>().unwrap(), p);
    }
    let e = "gpu".parse::<Provider>().unwrap_err();
    assert!(matches!(e, Error::Provider(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "unknown provider 'gpu' (expected cpu, cuda or cuda:N)"
    );
    for bad in ["cuda:", "cuda:-1", "cuda:x", "cuda:1:2"] {
        let e = bad.parse::<Provider>().unwrap_err().to_string();
        assert!(
            e.contains("is not a non-negative integer") && e.contains("cuda:N"),
            "{bad}: {e}"
        );
    }
    for bad in ["", "cuda0", "rocm:0", "cpu:0"] {
        let e = bad.parse::<Provider>().unwrap_err().to_string();
        assert!(e.starts_with("unknown provider"), "{bad}: {e}");
    }
    assert!(Provider::Cpu.compiled_in());
    assert_eq!(
        Provider::Cuda { device: 0 }.compiled_in(),
        cfg!(feature = "cuda")
    );
}

#[test]
fn cpu_provider_has_no_partition() {
    let s = Session::builder(digits_mlp())
        .provider(Provider::Cpu)
        .build()
        .unwrap();
    assert_eq!(s.provider(), Provider::Cpu);
    assert_eq!(s.device_name(), None);
    let r = provider::partition_report(s.model(), s.plan(), Provider::Cpu).unwrap();
    assert_eq!(r, None);
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_is_an_error() {
    let e = Session::builder(digits_mlp())
        .provider(Provider::Cuda { device: 0 })
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::Provider(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("this build of mote has no CUDA support")
            && msg.contains("cargo build --release --features cuda"),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    // inspect's partition report refuses the same way.
    let s = Session::from_file(digits_mlp()).unwrap();
    let e = provider::partition_report(s.model(), s.plan(), Provider::Cuda { device: 0 })
        .unwrap_err()
        .to_string();
    assert_eq!(e, msg);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_session_errs_without_a_gpu_or_matches_the_cpu() {
    let x = read_npy(digits_mlp().with_file_name("digits_sample.npy")).unwrap();
    let built = Session::builder(digits_mlp())
        .provider(Provider::Cuda { device: 0 })
        .build();
    let mut gpu = match built {
        Err(e) => {
            let msg = e.to_string();
            assert!(matches!(e, Error::Provider(_)), "{msg}");
            assert!(msg.starts_with("provider cuda:0: "), "{msg}");
            assert_eq!(msg.lines().count(), 1, "{msg}");
            if !mote_cuda::driver_present() {
                assert!(msg.contains("no CUDA driver found"), "{msg}");
            }
            eprintln!("skipped: no GPU ({msg})");
            return;
        }
        Ok(s) => s,
    };
    eprintln!("GPU: {}", gpu.device_name().unwrap());
    assert_eq!(gpu.provider(), Provider::Cuda { device: 0 });
    let p = gpu.cuda().unwrap().partition();
    assert!(p.provider_steps() > 0, "{p:?}");
    let mut cpu = Session::from_file(digits_mlp()).unwrap();
    let want = cpu.run(&[("input", x.clone())]).unwrap();
    let got = gpu.run(&[("input", x.clone())]).unwrap();
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.shape(), g.shape());
        for (a, b) in w.to_f32_vec().iter().zip(g.to_f32_vec()) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{a} vs {b}");
        }
    }
    // Again: the executor and its device arena are reused.
    let again = gpu.run(&[("input", x.clone())]).unwrap();
    assert_eq!(again, got);
    // From another thread than the one that built it (the device's
    // context is not current there).
    let (gpu, moved) = std::thread::spawn({
        let x = x.clone();
        move || {
            let r = gpu.run(&[("input", x)]).unwrap();
            (gpu, r)
        }
    })
    .join()
    .unwrap();
    assert_eq!(moved, got);
    drop(gpu);
    // On a pool of threads: the run happens on a pool thread.
    if cfg!(feature = "rayon") {
        let mut pooled = Session::builder(digits_mlp())
            .provider(Provider::Cuda { device: 0 })
            .threads(3)
            .build()
            .unwrap();
        assert_eq!(pooled.run(&[("input", x)]).unwrap(), got);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_partition_report_of_digits_mlp() {
    let s = Session::from_file(digits_mlp()).unwrap();
    let r = provider::partition_report(s.model(), s.plan(), Provider::Cuda { device: 0 })
        .unwrap()
        .unwrap();
    assert_eq!(r.steps, s.plan().num_steps());
    assert!(r.provider_steps > 0);
    let lines = r.lines();
    let text = lines.join("\n");
    assert!(
        lines[0].starts_with(&format!(
            "provider cuda: {} of {} steps on the GPU, ",
            r.provider_steps, r.steps
        )),
        "{text}"
    );
    assert!(lines[0].contains("copies host->device 1 (256 B)"), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("  [gpu] steps 0..") && l.contains("Gemm")),
        "{text}"
    );
    assert!(text.contains("(copies in: 'input' 256 B)"), "{text}");
    assert_eq!(
        lines.len(),
        1 + r.segments.len() + usize::from(!r.final_copies.is_empty())
    );
    let v = r.to_json();
    assert_eq!(v["provider"], "cuda");
    assert_eq!(v["segments"][0]["on"], "gpu");
    assert_eq!(v["segments"][0]["copies_in"][0]["tensor"], "input");
}
