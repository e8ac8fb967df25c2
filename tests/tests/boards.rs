//! The board firmware of `boards/` under QEMU, compared exactly with the
//! host run of the same `.mote` file on the same input.
//!
//! For each (board, model): the int8 QDQ model is compiled in-process
//! (`compile_onnx`), written with its `--emit-rust` module and the
//! quantized input into `target/boards/models/<board>-<model>/`
//! (`MOTE_FW_MODEL_DIR`, see boards/README.md), the board crate is built
//! with `cargo build --release` (its own target dir
//! `target/boards/<board>`), and `qemu-system-arm -icount shift=0` runs it
//! under a timeout. Every `MOTE out` line must equal `MoteFile::run` on
//! the host; a fault, a panic, a mote error, a non-zero exit or a timeout
//! fails the test with the firmware's output (the fault line names the
//! address); firmware features `fault`, `panic` and `hang` test those paths.
//!
//! Needs `qemu-system-arm` and the targets thumbv7m-none-eabi,
//! thumbv7em-none-eabihf and thumbv8m.main-none-eabihf. `cost_report`
//! (ignored; `scripts/board-costs.sh`) prints flash, RAM and instruction
//! figures, with `arm-none-eabi-nm`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mote_core::DType;
use mote_std::compiled::{compile_onnx, emit_rust, MoteFile};
use mote_tests::{quant_dir, repo};

/// A QEMU board crate of `boards/`.
#[derive(Clone, Copy, Debug)]
struct Board {
    dir: &'static str,
    triple: &'static str,
    machine: &'static str,
    cpu: &'static str,
    /// The unmapped address the `fault` feature reads (0: no such feature).
    unmapped: u32,
}

const LM3S6965EVB: Board = Board {
    dir: "lm3s6965evb",
    triple: "thumbv7m-none-eabi",
    machine: "lm3s6965evb",
    cpu: "cortex-m3",
    unmapped: 0,
};
const MPS2_AN386: Board = Board {
    dir: "mps2-an386",
    triple: "thumbv7em-none-eabihf",
    machine: "mps2-an386",
    cpu: "cortex-m4",
    unmapped: 0x3000_0000,
};
const MPS3_AN547: Board = Board {
    dir: "mps3-an547",
    triple: "thumbv8m.main-none-eabihf",
    machine: "mps3-an547",
    cpu: "cortex-m55",
    unmapped: 0x2C00_0000,
};

/// Every (board, model) the tests and the cost report run.
const PAIRS: [(Board, &str); 6] = [
    (LM3S6965EVB, "kws"),
    (MPS2_AN386, "kws"),
    (MPS2_AN386, "resnet8"),
    (MPS3_AN547, "kws"),
    (MPS3_AN547, "mbv1"),
    (MPS3_AN547, "resnet8"),
];

/// KWS's arena as planned (with QConv in place: depthwise and pointwise
/// C -> C layers write over their input; the two-buffer bound is 16000);
/// CI fails if it grows more than 3%.
const KWS_ARENA_BASELINE: usize = 8496;
/// Runtime code and kernel bytes of the KWS firmware on lm3s6965evb
/// (`scripts/board-costs.sh`, with lazily checked IO names and the column
/// and depthwise kernels of `kern/qcol.rs`).
const KWS_M3_RUNTIME_BASELINE: u64 = 9554;
const KWS_M3_KERNELS_BASELINE: u64 = 17626;
/// TFLM's framework without kernels on the Cortex-M3: the runtime code
/// must stay at or below it whatever the 3 % margin allows.
const TFLM_M3_RUNTIME: u64 = 9732;

const QEMU_TIMEOUT: Duration = Duration::from_secs(120);

/// A model compiled and laid out for a firmware build.
struct Prepared {
    dir: PathBuf,
    mote_bytes: usize,
    input_bytes: usize,
    arena: usize,
    /// Host outputs (`MoteFile::run`), as integers.
    host: Vec<Vec<i64>>,
}

fn as_ints(dtype: DType, bytes: &[u8]) -> Vec<i64> {
    match dtype {
        DType::I8 => bytes.iter().map(|&b| b as i8 as i64).collect(),
        _ => bytes.iter().map(|&b| b as i64).collect(),
    }
}

/// Compiles `quant-models/<model>.qdq.onnx` and writes `model.mote`,
/// `model.rs` and `input.bin` into `target/boards/models/<tag>`.
fn prepare(model: &str, tag: &str) -> Prepared {
    prepare_variant(model, "qdq", tag)
}

/// [`prepare`] for `quant-models/<model>.<variant>.onnx`.
fn prepare_variant(model: &str, variant: &str, tag: &str) -> Prepared {
    let onnx = quant_dir().join(format!("{model}.{variant}.onnx"));
    let c = compile_onnx(&onnx, &[]).unwrap_or_else(|e| panic!("compiling {onnx:?}: {e}"));
    let f = MoteFile::from_bytes(&c.bytes).unwrap_or_else(|e| panic!("{model}: {e}"));
    let m = f.model().unwrap_or_else(|e| panic!("{model}: {e}"));
    let dir = repo().join("target/boards/models").join(tag);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        // Unchanged files keep their mtime: cargo does not rebuild.
        if std::fs::read(&p).ok().as_deref() != Some(bytes) {
            std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        }
    };
    write("model.mote", &c.bytes);
    let rs = emit_rust(&m, "model.mote", &format!("{model}.{variant}.onnx"))
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    write("model.rs", rs.as_bytes());

    let input_path = quant_dir().join(format!("{model}.input.npy"));
    let input = mote_std::read_npy(&input_path).unwrap_or_else(|e| panic!("{input_path:?}: {e}"));
    let d = m.input(0).unwrap_or_else(|e| panic!("{model}: {e}"));
    assert!(d.quant.is_some(), "{model}: input 0 is not quantized");
    // The .npy holds a batch: the compiled model takes its first sample.
    let shape = d.tensor.shape();
    let numel: usize = shape.iter().product();
    let mut first = input.to_f32_vec();
    assert!(
        first.len() >= numel,
        "{input_path:?}: fewer than {numel} values"
    );
    first.truncate(numel);
    let input = mote_std::Tensor::from_f32(shape, first).unwrap_or_else(|e| panic!("{e}"));
    let bytes: Vec<u8> = input
        .to_f32_vec()
        .iter()
        .map(|&v| d.quantize(v).unwrap_or(0) as u8)
        .collect();
    write("input.bin", &bytes);

    let outs = f
        .run(&[input])
        .unwrap_or_else(|e| panic!("{model}: host run: {e}"));
    let host = outs.iter().map(|t| as_ints(t.dtype(), t.bytes())).collect();
    Prepared {
        dir,
        mote_bytes: c.bytes.len(),
        input_bytes: bytes.len(),
        arena: m.arena_bytes(),
        host,
    }
}

/// Firmware builds share one target dir (`target/boards`, with
/// c_example.rs and onnx_on_device.rs): the host-side proc-macros and
/// build-script dependencies are built once, not once per board (CI disk).
/// One build at a time, each ELF copied out before the next build of the
/// same board overwrites it.
static BUILD: Mutex<()> = Mutex::new(());

/// Builds the firmware of `board` for the model in `model_dir`; the ELF
/// (copied into `model_dir`) or cargo's stderr.
fn build(board: Board, model_dir: &Path, features: &[&str]) -> Result<PathBuf, String> {
    let _g = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let target_dir = repo().join("target/boards");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(repo().join("boards").join(board.dir))
        .args(["build", "--release", "--quiet"])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("MOTE_FW_MODEL_DIR", model_dir);
    // The board's .cargo/config.toml sets the target and `-Tlink.x`; a
    // RUSTFLAGS of the host build (e.g. `-D warnings` in CI) would replace
    // them.
    for v in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
    ] {
        cmd.env_remove(v);
    }
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    let out = cmd.output().map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let elf = target_dir
        .join(board.triple)
        .join("release")
        .join(format!("mote-fw-{}", board.dir));
    let name = if features.is_empty() {
        "firmware.elf".to_string()
    } else {
        format!("firmware-{}.elf", features.join("-"))
    };
    let dst = model_dir.join(name);
    std::fs::copy(&elf, &dst).map_err(|e| format!("copying {elf:?}: {e}"))?;
    Ok(dst)
}

/// QEMU's exit status and stdout (stderr appended).
struct Run {
    code: i32,
    out: String,
}

/// Runs `elf` under QEMU (`-icount shift=0`, semihosting) with a timeout.
fn qemu(board: Board, elf: &Path) -> Result<Run, String> {
    qemu_within(board, elf, QEMU_TIMEOUT)
}

/// [`qemu`] with a given timeout.
fn qemu_within(board: Board, elf: &Path, timeout: Duration) -> Result<Run, String> {
    let mut child = Command::new("qemu-system-arm")
        .args(["-machine", board.machine, "-cpu", board.cpu, "-nographic"])
        .args(["-icount", "shift=0"])
        .args(["-semihosting-config", "enable=on,target=native"])
        .arg("-kernel")
        .arg(elf)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running qemu-system-arm: {e}"))?;
    // Drain the pipes in threads so a chatty firmware cannot block.
    let mut so = child.stdout.take().ok_or("no stdout")?;
    let mut se = child.stderr.take().ok_or("no stderr")?;
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child
            .try_wait()
            .map_err(|e| format!("waiting for qemu: {e}"))?
        {
            Some(st) => break st,
            None if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                let out = t_out.join().unwrap_or_default();
                return Err(format!(
                    "timeout: {} on {} ran past {timeout:?}; output so far:\n{out}",
                    elf.display(),
                    board.machine
                ));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut out = t_out.join().unwrap_or_default();
    out.push_str(&t_err.join().unwrap_or_default());
    Ok(Run {
        code: status.code().unwrap_or(-1),
        out,
    })
}

/// The parsed `MOTE` lines of a successful run.
#[derive(Debug, Default, PartialEq)]
struct Report {
    calib: (u64, u64),
    arena: usize,
    /// Per run: (ticks, instructions).
    icount: Vec<(u64, u64)>,
    /// (run, output) → values.
    outs: BTreeMap<(usize, usize), Vec<i64>>,
    stack: usize,
    stack_capacity: usize,
}

fn num<T: std::str::FromStr>(w: Option<&str>, line: &str) -> Result<T, String> {
    w.and_then(|w| w.parse().ok())
        .ok_or_else(|| format!("unparsable line: {line}"))
}

/// Parses a run; any fault, panic, error, missing `MOTE ok` or non-zero
/// exit is an Err carrying the firmware's output.
fn parse(run: &Run) -> Result<Report, String> {
    let fail = |why: &str| format!("{why} (exit {}); firmware output:\n{}", run.code, run.out);
    for l in run.out.lines() {
        for bad in ["MOTE fault", "MOTE panic", "MOTE error"] {
            if l.starts_with(bad) {
                return Err(fail(l));
            }
        }
    }
    if run.code != 0 {
        return Err(fail("non-zero exit"));
    }
    if !run.out.lines().any(|l| l == "MOTE ok") {
        return Err(fail("no `MOTE ok` line"));
    }
    let mut r = Report::default();
    for l in run.out.lines() {
        let Some(rest) = l.strip_prefix("MOTE ") else {
            continue;
        };
        let mut w = rest.split_whitespace();
        match w.next() {
            Some("calib") => r.calib = (num(w.next(), l)?, num(w.next(), l)?),
            Some("arena") => r.arena = num(w.next(), l)?,
            Some("icount") => {
                let run: usize = num(w.next(), l)?;
                if run != r.icount.len() {
                    return Err(fail("icount lines out of order"));
                }
                r.icount.push((num(w.next(), l)?, num(w.next(), l)?));
            }
            Some("out") => {
                let run: usize = num(w.next(), l)?;
                let o: usize = num(w.next().map(|s| s.trim_end_matches(':')), l)?;
                let v = w
                    .map(|x| x.parse().map_err(|_| format!("unparsable line: {l}")))
                    .collect::<Result<Vec<i64>, String>>()?;
                r.outs.insert((run, o), v);
            }
            Some("stack") => {
                r.stack = num(w.next(), l)?;
                r.stack_capacity = num(w.nth(1), l)?;
            }
            _ => {}
        }
    }
    Ok(r)
}

/// Builds, runs and checks one pair; the report of a run that matched
/// the host exactly.
fn check(board: Board, model: &str) -> (Prepared, PathBuf, Report) {
    let p = prepare(model, &format!("{}-{model}", board.dir));
    let elf = build(board, &p.dir, &[])
        .unwrap_or_else(|e| panic!("{model} firmware for {} does not build:\n{e}", board.dir));
    let run = qemu(board, &elf).unwrap_or_else(|e| panic!("{e}"));
    let r = parse(&run).unwrap_or_else(|e| panic!("{} {model}: {e}", board.dir));
    assert_eq!(r.arena, p.arena, "arena line");
    assert_eq!(r.icount.len(), 2, "two inferences timed:\n{}", run.out);
    for run_i in 0..2 {
        for (o, want) in p.host.iter().enumerate() {
            let got = r.outs.get(&(run_i, o)).unwrap_or_else(|| {
                panic!(
                    "{} {model}: no output {o} of run {run_i}:\n{}",
                    board.dir, run.out
                )
            });
            assert_eq!(
                got, want,
                "{} {model}: run {run_i} output {o} differs from the host run",
                board.dir
            );
        }
    }
    // Same code path twice: equal up to where a SysTick wrap falls.
    let (a, b) = (r.icount[0].0, r.icount[1].0);
    assert!(a.abs_diff(b) <= 1, "tick counts of two runs: {a} vs {b}");
    assert!(r.stack > 0 && r.stack < r.stack_capacity, "stack {r:?}");
    (p, elf, r)
}

#[test]
fn lm3s6965evb_kws() {
    let (p, elf, r) = check(LM3S6965EVB, "kws");
    // Flash regressions are bugs: mote-core's runtime code and kernels in
    // this firmware (README's cost table) may not grow more than 3 %.
    let syms = symbols(&elf);
    let (runtime, kern) = core_flash(&code_split(&elf, &syms), &syms);
    assert!(
        runtime * 100 <= KWS_M3_RUNTIME_BASELINE * 103,
        "KWS runtime code on the Cortex-M3 grew more than 3%: {runtime} bytes, baseline {KWS_M3_RUNTIME_BASELINE}"
    );
    assert!(
        runtime <= TFLM_M3_RUNTIME,
        "KWS runtime code on the Cortex-M3 is {runtime} bytes, above TFLM's framework ({TFLM_M3_RUNTIME} B)"
    );
    assert!(
        kern * 100 <= KWS_M3_KERNELS_BASELINE * 103,
        "KWS kernel code on the Cortex-M3 grew more than 3%: {kern} bytes, baseline {KWS_M3_KERNELS_BASELINE}"
    );
    // It linked, so arena and model fit 64 KB RAM / 256 KB flash.
    assert!(
        p.arena * 100 <= KWS_ARENA_BASELINE * 103,
        "KWS arena grew more than 3%: {} bytes, baseline {KWS_ARENA_BASELINE}",
        p.arena
    );
    assert!(p.mote_bytes < 256 * 1024);
    // 80 instructions per SysTick tick under -icount shift=0.
    assert_eq!(r.calib, (8_000_000, 100_000), "calibration");
}

#[test]
fn mps2_an386_kws() {
    let (_, _, r) = check(MPS2_AN386, "kws");
    // 40 instructions per tick.
    assert_eq!(r.calib, (8_000_000, 200_000), "calibration");
}

#[test]
fn mps2_an386_resnet8() {
    check(MPS2_AN386, "resnet8");
}

#[test]
fn mps3_an547_kws() {
    let (_, _, r) = check(MPS3_AN547, "kws");
    // 31.25 instructions per tick (32 MHz SysTick); +1: the loop's ends.
    assert_eq!(r.calib, (8_000_000, 256_001), "calibration");
}

#[test]
fn mps3_an547_mbv1() {
    check(MPS3_AN547, "mbv1");
}

#[test]
fn mps3_an547_resnet8() {
    check(MPS3_AN547, "resnet8");
}

/// A uint8 model (onnxruntime's uint8-activation QDQ KWS): the default
/// firmware links the int8 kernels alone and refuses it at load with a
/// message naming the feature; with feature `uint8` it runs, exactly as
/// the host does.
#[test]
fn mps2_an386_kws_uint8_needs_its_feature() {
    let board = MPS2_AN386;
    let p = prepare_variant("kws", "qdq_u8", "mps2-an386-kws-u8");
    let elf = build(board, &p.dir, &[]).unwrap_or_else(|e| panic!("{e}"));
    let run = qemu(board, &elf).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(run.code, 1, "exit status of a refused model:\n{}", run.out);
    assert!(
        run.out.contains("MOTE error: ") && run.out.contains("feature `uint8`"),
        "the refusal does not name the feature:\n{}",
        run.out
    );

    let elf = build(board, &p.dir, &["uint8"]).unwrap_or_else(|e| panic!("{e}"));
    let run = qemu(board, &elf).unwrap_or_else(|e| panic!("{e}"));
    let r = parse(&run).unwrap_or_else(|e| panic!("kws uint8: {e}"));
    for (o, want) in p.host.iter().enumerate() {
        assert_eq!(
            r.outs.get(&(0, o)),
            Some(want),
            "kws uint8 output {o} differs from the host run:\n{}",
            run.out
        );
    }
}

/// MobileNetV1 (a 260 KB `.mote`) does not fit the lm3s6965's 256 KB
/// flash: the link fails instead of a firmware that cannot work.
#[test]
fn lm3s6965evb_rejects_mbv1() {
    let p = prepare("mbv1", "lm3s6965evb-mbv1");
    match build(LM3S6965EVB, &p.dir, &[]) {
        Ok(elf) => panic!("mbv1 firmware for lm3s6965evb linked: {elf:?}"),
        Err(e) => assert!(
            e.contains("FLASH") && e.contains("overflow"),
            "link error does not name FLASH overflowing:\n{e}"
        ),
    }
}

/// A firmware that reads an unmapped address: the HardFault handler's
/// line (with the address, from BFAR) and exit status 3 reach the test,
/// which fails. Not lm3s6965evb: that legacy QEMU machine ignores bus
/// errors (an unmapped read returns 0).
fn fault_is_reported(board: Board) {
    let p = prepare("kws", &format!("{}-kws-fault", board.dir));
    let elf = build(board, &p.dir, &["fault"]).unwrap_or_else(|e| panic!("{e}"));
    let run = qemu(board, &elf).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(run.code, 3, "exit status of a fault:\n{}", run.out);
    let want = format!("addr=0x{:08x}", board.unmapped);
    let line = run
        .out
        .lines()
        .find(|l| l.starts_with("MOTE fault pc=0x"))
        .unwrap_or_else(|| panic!("no fault line:\n{}", run.out));
    assert!(line.contains(&want), "fault line {line:?} lacks {want}");
    let err = parse(&run).expect_err("a faulted run must not parse as a success");
    assert!(
        err.contains(&want),
        "failure message lacks the address: {err}"
    );
}

#[test]
fn mps2_an386_fault_is_reported_with_its_address() {
    fault_is_reported(MPS2_AN386);
}

#[test]
fn mps3_an547_fault_is_reported_with_its_address() {
    fault_is_reported(MPS3_AN547);
}

/// `(address, size, kind, demangled name)` of every sized symbol in `elf`.
fn symbols(elf: &Path) -> Vec<(u64, u64, char, String)> {
    let out = Command::new("arm-none-eabi-nm")
        .args(["--size-sort", "-S", "-C"])
        .arg(elf)
        .output()
        .unwrap_or_else(|e| panic!("running arm-none-eabi-nm: {e}"));
    assert!(out.status.success(), "arm-none-eabi-nm failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.splitn(4, ' ');
            let addr = u64::from_str_radix(w.next()?, 16).ok()?;
            let size = u64::from_str_radix(w.next()?, 16).ok()?;
            let kind = w.next()?.chars().next()?;
            Some((addr, size, kind, w.next()?.to_string()))
        })
        .collect()
}

/// Who a byte of code belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Kernel,
    Runtime,
    Other,
}

fn owner_of_symbol(name: &str) -> Owner {
    if name.contains("mote_core::kern::") {
        Owner::Kernel
    } else if name.contains("mote_core::") {
        Owner::Runtime
    } else {
        Owner::Other
    }
}

/// Code bytes per owner. Each row of the DWARF line table (an address
/// range of instructions) belongs to the innermost frame of its inline
/// chain (`addr2line -i`) that is mote-core source: `core/src/kern/` is
/// kernels, the rest of `core/src/` runtime; a chain with no mote-core
/// frame is other. So mote-core code that LTO inlined into the firmware,
/// and library code (`core::`, iterators, arithmetic) inlined into
/// mote-core, count as mote-core. Functions called, not inlined, count by
/// their symbol's name (`libm`, `compiler_builtins`: other).
fn code_split(elf: &Path, syms: &[(u64, u64, char, String)]) -> BTreeMap<&'static str, u64> {
    let out = Command::new("arm-none-eabi-objdump")
        .arg("--dwarf=decodedline")
        .arg(elf)
        .output()
        .unwrap_or_else(|e| panic!("running arm-none-eabi-objdump: {e}"));
    assert!(out.status.success(), "arm-none-eabi-objdump failed");
    let mut addrs: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            u64::from_str_radix(w.get(2)?.strip_prefix("0x")?, 16).ok()
        })
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    let mut child = Command::new("arm-none-eabi-addr2line")
        .arg("-e")
        .arg(elf)
        .args(["-i", "-a"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running arm-none-eabi-addr2line: {e}"));
    let list: String = addrs.iter().map(|a| format!("0x{a:x}\n")).collect();
    let mut stdin = child.stdin.take().expect("addr2line stdin");
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(list.as_bytes());
    });
    let out = child.wait_with_output().expect("addr2line output");
    let _ = writer.join();
    let core_src = repo().join("core/src").to_string_lossy().into_owned();
    // (address, owner) of every row.
    let mut rows: Vec<(u64, Owner)> = Vec::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(a) = l.strip_prefix("0x") {
            if let Ok(a) = u64::from_str_radix(a, 16) {
                rows.push((a, Owner::Other));
            }
        } else if let (Some(last), Some(rest)) = (rows.last_mut(), l.strip_prefix(&core_src)) {
            // Frames come innermost first: the first mote-core one wins.
            if last.1 == Owner::Other {
                last.1 = if rest.starts_with("/kern/") {
                    Owner::Kernel
                } else {
                    Owner::Runtime
                };
            }
        }
    }
    let mut split = BTreeMap::new();
    for (addr, size, kind, name) in syms {
        if !matches!(kind, 't' | 'T') {
            continue;
        }
        let (lo, hi) = (addr & !1, (addr & !1) + size);
        let mut owner = owner_of_symbol(name);
        let mut at = lo;
        let start = rows.partition_point(|r| r.0 < lo);
        for &(a, o) in rows[start..].iter().take_while(|r| r.0 < hi) {
            *split.entry(label(owner)).or_insert(0) += a - at;
            at = a;
            owner = o;
        }
        *split.entry(label(owner)).or_insert(0) += hi - at;
    }
    split
}

/// (runtime, kernels) bytes of mote-core in a firmware, as the cost table
/// splits them: runtime is mote-core code outside `kern/` plus mote-core's
/// read-only data (the model's bytes excepted).
fn core_flash(code: &BTreeMap<&'static str, u64>, syms: &[(u64, u64, char, String)]) -> (u64, u64) {
    let rodata_core: u64 = syms
        .iter()
        .filter(|(_, _, kind, name)| {
            matches!(kind, 'r' | 'R')
                && name.contains("mote_core::")
                && !name.contains("model::BYTES")
        })
        .map(|s| s.1)
        .sum();
    let runtime = code.get("runtime").copied().unwrap_or(0) + rodata_core;
    (runtime, code.get("kernels").copied().unwrap_or(0))
}

fn label(o: Owner) -> &'static str {
    match o {
        Owner::Kernel => "kernels",
        Owner::Runtime => "runtime",
        Owner::Other => "other",
    }
}

/// `(text, data, bss)` of `arm-none-eabi-size`.
fn sizes(elf: &Path) -> (u64, u64, u64) {
    let out = Command::new("arm-none-eabi-size")
        .arg(elf)
        .output()
        .unwrap_or_else(|e| panic!("running arm-none-eabi-size: {e}"));
    let s = String::from_utf8_lossy(&out.stdout);
    let l = s.lines().nth(1).unwrap_or_default();
    let v: Vec<u64> = l
        .split_whitespace()
        .take(3)
        .filter_map(|x| x.parse().ok())
        .collect();
    assert_eq!(v.len(), 3, "arm-none-eabi-size output: {s}");
    (v[0], v[1], v[2])
}

/// The flash and RAM split, stack and instruction figures of every pair
/// (run: `scripts/board-costs.sh`). Each firmware runs twice under QEMU;
/// their reports must be identical (`-icount` is deterministic).
#[test]
#[ignore = "cost report: scripts/board-costs.sh"]
fn cost_report() {
    println!(
        "| board | model | flash | runtime (mote-core) | kernels | weights (.mote) | input | \
         other code | other data | RAM statics | arena | stack HWM | instructions/inference | \
         ticks (instr/tick) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (board, model) in PAIRS {
        let (p, elf, r) = check(board, model);
        let again = parse(&qemu(board, &elf).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r, again, "{} {model}: two QEMU runs differ", board.dir);
        let (text, data, bss) = sizes(&elf);
        let syms = symbols(&elf);
        let code = code_split(&elf, &syms);
        let weights: u64 = syms
            .iter()
            .filter(|(_, _, kind, name)| matches!(kind, 'r' | 'R') && name.contains("model::BYTES"))
            .map(|s| s.1)
            .sum();
        assert_eq!(weights, p.mote_bytes as u64, "model bytes in flash");
        let (runtime, kern) = core_flash(&code, &syms);
        let other_code = code.get("other").copied().unwrap_or(0);
        let input = p.input_bytes as u64;
        let flash = text + data;
        let other_data = flash.saturating_sub(kern + runtime + weights + input + other_code);
        let ram = data + bss;
        let per_tick = r.calib.0 as f64 / r.calib.1 as f64;
        println!(
            "| {} | {model} | {flash} | {runtime} | {kern} | {weights} | {input} | {other_code} | \
             {other_data} | {ram} | {} | {} | {} | {} ({per_tick:.2}) |",
            board.dir, p.arena, r.stack, r.icount[0].1, r.icount[0].0,
        );
        println!(
            "<!-- {} {model}: (ticks, instructions) of runs 0 and 1: {:?}; second QEMU run: {:?} -->",
            board.dir, r.icount, again.icount
        );
    }
}

/// A firmware that panics: the panic line and exit status 2 reach the
/// test, which fails with the message.
#[test]
fn lm3s6965evb_panic_is_reported() {
    let board = LM3S6965EVB;
    let p = prepare("kws", "lm3s6965evb-kws-panic");
    let elf = build(board, &p.dir, &["panic"]).unwrap_or_else(|e| panic!("{e}"));
    let run = qemu(board, &elf).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(run.code, 2, "exit status of a panic:\n{}", run.out);
    let err = parse(&run).expect_err("a panicked run must not parse as a success");
    assert!(
        err.contains("MOTE panic: ") && err.contains("requested by feature `panic`"),
        "failure message lacks the panic: {err}"
    );
}

/// A firmware that never ends is killed at the timeout, with "timeout".
#[test]
fn lm3s6965evb_hang_times_out() {
    let board = LM3S6965EVB;
    let p = prepare("kws", "lm3s6965evb-kws-hang");
    let elf = build(board, &p.dir, &["hang"]).unwrap_or_else(|e| panic!("{e}"));
    let err = match qemu_within(board, &elf, Duration::from_secs(3)) {
        Ok(run) => panic!("a hanging firmware ended (exit {}):\n{}", run.code, run.out),
        Err(e) => e,
    };
    assert!(err.starts_with("timeout: "), "{err}");
}
