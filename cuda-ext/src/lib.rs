//! CUDA execution provider of mote, for NVIDIA GPUs and Jetson boards.
//!
//! ```text
//!  mote-core Plan ──partition()──▶ segments: [GPU steps][CPU steps][GPU steps]
//!                                      │            │
//!  CudaExecutor: device arena (mirrors the host arena's offsets),
//!                weights uploaded once, one stream, cuBLAS + NVRTC kernels;
//!                copies only at segment boundaries
//! ```
//!
//! The CUDA libraries are loaded at run time (cudarc's `dynamic-loading`),
//! so this crate builds and its tests run on machines with no toolkit and
//! no driver; there [`CudaProvider::new`] returns [`Error::NoDriver`] and
//! the GPU tests say they were skipped. Kernels: cuBLAS SGEMM for
//! MatMul/Gemm; convolution by im2col + SGEMM, a direct depthwise kernel,
//! or cuDNN (where it loads and was faster when both were timed at build);
//! the element-wise, pooling, softmax, concat and transpose kernels of
//! `kernels.cu`, compiled once per process with NVRTC for the device's
//! compute capability. All arithmetic is f32 (no TF32): results match the
//! CPU provider to rounding. Every GPU segment is captured once into a CUDA
//! graph (all addresses are fixed at build) and replayed per run.
//!
//! What runs where is decided by [`lower::lower`], without a GPU, and
//! reported by [`CudaExecutor::partition`] (`mote inspect --provider cuda`).

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    sys as drv_sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
};
use cudarc::driver::{CudaGraph, LaunchConfig, PushKernelArg};
use mote_core::provider::{self, ExecutionProvider, Partition, Place, StepInfo};
use mote_core::{Model, Plan, TensorId, TensorView};

mod dnn;
pub mod lower;
use lower::{Act, GpuOp, Operand, Window};

/// Errors of the CUDA provider.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No CUDA driver library could be loaded (no NVIDIA driver here).
    #[error(
        "no CUDA driver found (libcuda could not be loaded): this machine has no usable NVIDIA GPU"
    )]
    NoDriver,
    /// The driver loaded but the device does not exist.
    #[error("CUDA device {ordinal} not found ({count} device(s) present)")]
    NoDevice {
        /// Requested ordinal.
        ordinal: usize,
        /// Devices the driver reports.
        count: i32,
    },
    /// A CUDA library other than the driver is missing.
    #[error("CUDA library {0} could not be loaded (install the CUDA runtime libraries or set LD_LIBRARY_PATH)")]
    NoLibrary(&'static str),
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// A cuBLAS call failed.
    #[error("cuBLAS: {0:?}")]
    Cublas(cudarc::cublas::result::CublasError),
    /// NVRTC could not compile mote's kernels.
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    /// A cuDNN call failed at run time.
    #[error("{0}")]
    Cudnn(String),
    /// mote-core refused (planning, a CPU step, ...).
    #[error("{0}")]
    Core(mote_core::Error),
    /// An invariant of this crate broke (a bug: please report).
    #[error("internal: {0}")]
    Internal(&'static str),
}

impl From<mote_core::Error> for Error {
    fn from(e: mote_core::Error) -> Self {
        Error::Core(e)
    }
}

impl From<cudarc::cublas::result::CublasError> for Error {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        Error::Cublas(e)
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Whether a CUDA driver can be loaded on this machine (no device is
/// touched). Tests use it to skip, with the reason, where there is none.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver's library names.
    unsafe { drv_sys::is_culib_present() }
}

const KERNELS: &str = include_str!("kernels.cu");
/// cuBLAS workspace bytes (what cuBLAS asks for on Hopper is 32 MiB).
const CUBLAS_WORKSPACE: usize = 32 << 20;
const FUNCTIONS: [&str; 14] = [
    "im2col_nb",
    "from_mnp",
    "unary",
    "binary",
    "bcast_copy",
    "bias_act",
    "scale_shift",
    "im2col",
    "dwconv",
    "pool2d",
    "row_reduce",
    "softmax",
    "concat_piece",
    "transpose",
];

/// mote's kernels as PTX for compute capability `cc`: compiled by NVRTC on
/// first use, then cached for the process (every session on a device of
/// that capability loads the same PTX).
fn kernels_ptx(cc: (i32, i32)) -> Result<cudarc::nvrtc::Ptx> {
    static CACHE: Mutex<Vec<((i32, i32), cudarc::nvrtc::Ptx)>> = Mutex::new(Vec::new());
    let mut cache = CACHE
        .lock()
        .map_err(|_| Error::Internal("PTX cache poisoned"))?;
    if let Some((_, ptx)) = cache.iter().find(|(c, _)| *c == cc) {
        return Ok(ptx.clone());
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts)
        .map_err(|e| Error::Nvrtc(format!("{e:?}")))?;
    cache.push((cc, ptx.clone()));
    Ok(ptx)
}

/// A CUDA device with mote's kernels loaded: context, stream, cuBLAS.
pub struct CudaProvider {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    _workspace: CudaSlice<u8>,
    _module: Arc<CudaModule>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// cuDNN on the same stream, or why not.
    dnn: std::result::Result<dnn::Dnn, String>,
    name: String,
    cc: (i32, i32),
}

impl std::fmt::Debug for CudaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaProvider({}, sm_{}{})",
            self.name, self.cc.0, self.cc.1
        )
    }
}

impl CudaProvider {
    /// Opens device `ordinal`, loads the kernels (compiled by NVRTC once
    /// per process and compute capability) and creates a
    /// stream and a cuBLAS handle. Errs, never panics, where there is no
    /// driver, no such device, or no NVRTC / cuBLAS library.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        // SAFETY: dlopen probes only.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::NoLibrary("nvrtc"));
        }
        // SAFETY: as above.
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(Error::NoLibrary("cublas"));
        }
        let count = CudaContext::device_count()?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        // One stream, raw device addresses: cudarc's per-buffer events
        // would only add work.
        // SAFETY: every launch and copy of this crate goes to `stream`, in
        // order, so no cross-stream synchronization is needed.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name()?;
        let cc = ctx.compute_capability()?;
        let module = ctx.load_module(kernels_ptx(cc)?)?;
        let mut funcs = HashMap::new();
        for f in FUNCTIONS {
            funcs.insert(f, module.load_function(f)?);
        }
        // A stream of our own: the legacy default stream cannot be
        // captured into CUDA graphs.
        let stream = ctx.new_stream()?;
        let blas = CudaBlas::new(stream.clone())?;
        // An explicit cuBLAS workspace, so that no allocation happens while
        // a segment is captured into a graph.
        let workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE)?;
        let (wp, _) = workspace.device_ptr(&stream);
        // SAFETY: `workspace` lives as long as the handle (both fields of
        // the provider) and is CUBLAS_WORKSPACE bytes.
        unsafe {
            blas_sys::cublasSetWorkspace_v2(
                *blas.handle(),
                wp as *mut std::ffi::c_void,
                CUBLAS_WORKSPACE,
            )
            .result()?;
        }
        let dnn = dnn::Dnn::new(stream.cu_stream());
        Ok(CudaProvider {
            ctx,
            stream,
            blas,
            dnn,
            _workspace: workspace,
            _module: module,
            funcs,
            name,
            cc,
        })
    }

    /// The device's name (`NVIDIA H200`, `Orin`, ...).
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    fn func(&self, name: &'static str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or(Error::Internal("kernel not loaded"))
    }

    /// Waits for all work queued on the provider's stream.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }
}

/// The claim rule without a device: what [`lower::lower`] accepts. Lets
/// `mote inspect --provider cuda` show a partition on any machine.
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaCapability;

impl ExecutionProvider for CudaCapability {
    fn name(&self) -> &str {
        "cuda"
    }
    fn claims(&self, model: &Model, plan: &Plan, step: &StepInfo<'_>) -> bool {
        lower::lower(model, plan, step).is_some()
    }
}

impl ExecutionProvider for CudaProvider {
    fn name(&self) -> &str {
        "cuda"
    }
    fn claims(&self, model: &Model, plan: &Plan, step: &StepInfo<'_>) -> bool {
        CudaCapability.claims(model, plan, step)
    }
}

/// A launch with every operand resolved to a device address.
#[derive(Debug)]
struct Ready {
    op: GpuOp,
    /// Device addresses of the op's host-built tables (meta, scale/shift).
    tables: Vec<u64>,
    /// A Conv that cuDNN runs (else mote's own kernels).
    dnn: Option<dnn::ConvPlan>,
}

/// A plan bound to a device: the device arena, the weights the GPU steps
/// read, and each GPU step lowered. Build once per plan; run many times.
pub struct CudaExecutor {
    provider: Arc<CudaProvider>,
    partition: Partition,
    arena: CudaSlice<u8>,
    base: u64,
    scratch: Option<CudaSlice<f32>>,
    scratch_ptr: u64,
    consts: HashMap<TensorId, (CudaSlice<u8>, u64)>,
    _tables: Vec<CudaSlice<u8>>,
    steps: Vec<Option<Ready>>,
    const_bytes: usize,
    /// One CUDA graph per GPU segment (`None`: launched step by step).
    graphs: Vec<Option<Graph>>,
    /// [`ConvPath::WideN`] threshold this executor was built with.
    wide_p: i64,
    /// Which Conv steps cuDNN runs, or why none.
    cudnn_note: String,
    /// Why graphs are off, if they are.
    graph_note: Option<String>,
    /// One run at a time: runs share the device arena.
    lock: Mutex<()>,
    /// Host memory pinned by [`CudaExecutor::register_host`] (address, bytes).
    pinned: Option<(usize, usize)>,
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        self.unregister_host();
    }
}

/// A captured segment.
struct Graph(CudaGraph);
// SAFETY: the graph is only launched under the executor's `lock`, so no
// two threads use the executable graph at once; it holds device handles
// only, valid from any thread once the context is bound.
unsafe impl Send for Graph {}
// SAFETY: as above.
unsafe impl Sync for Graph {}

impl std::fmt::Debug for CudaExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaExecutor")
            .field("provider", &self.provider)
            .field("partition", &self.partition)
            .finish_non_exhaustive()
    }
}

fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> Result<(CudaSlice<u8>, u64)> {
    let s = stream.clone_htod(bytes)?;
    let (p, _) = s.device_ptr(stream);
    Ok((s, p))
}

/// A kernel's shape table as the `int` array kernels.cu reads.
fn i32_bytes(v: &[i64]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for &x in v {
        let x = i32::try_from(x).map_err(|_| Error::Internal("shape table entry over i32"))?;
        out.extend_from_slice(&x.to_le_bytes());
    }
    Ok(out)
}

/// A count the kernels index in 32 bits (lower.rs claims nothing larger).
fn i32c(v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Internal("count over i32"))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// How a Conv runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConvPath {
    /// One input channel per group: the direct depthwise kernel.
    Direct,
    /// Per image and group, `Y = W · col` batched over images, written in
    /// place; `col` is the input itself for a pointwise conv.
    PerImage,
    /// Batch > 1 with small output planes: the whole batch's im2col side
    /// by side, one GEMM with N = images × plane per group, then the
    /// epilogue scatters back to NCHW.
    WideN,
}

/// Output planes below this many pixels take [`ConvPath::WideN`] when the
/// batch is over 1 (`MOTE_CUDA_WIDE_P` overrides, for tuning).
const WIDE_N_MAX_P: i64 = 1024;

fn wide_n_max_p() -> i64 {
    std::env::var("MOTE_CUDA_WIDE_P")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(WIDE_N_MAX_P)
}

fn conv_path(n: i64, c: i64, group: i64, win: &Window, wide_p: i64) -> ConvPath {
    if direct(c / group, win) {
        ConvPath::Direct
    } else if n > 1 && (win.oh as i64 * win.ow as i64) < wide_p {
        ConvPath::WideN
    } else {
        ConvPath::PerImage
    }
}

/// Scratch elements (f32) a GPU op needs: the im2col buffer (and for
/// [`ConvPath::WideN`] the GEMM's output before the scatter).
fn scratch_elems(op: &GpuOp, wide_p: i64) -> usize {
    let GpuOp::Conv {
        n,
        c,
        m,
        group,
        win,
        ..
    } = op
    else {
        return 0;
    };
    let k = (*c / *group) as usize * win.kh as usize * win.kw as usize;
    let p = win.oh as usize * win.ow as usize;
    let n = *n as usize;
    match conv_path(n as i64, *c, *group, win, wide_p) {
        ConvPath::Direct => 0,
        ConvPath::PerImage if pointwise(win) => 0,
        ConvPath::PerImage => n * k * p,
        ConvPath::WideN => n * k * p + (*m / *group) as usize * n * p,
    }
}

/// Depthwise-like: one input channel per group.
fn direct(c_per_group: i64, _win: &Window) -> bool {
    c_per_group == 1
}

/// 1×1, stride 1, no padding: the input already is the im2col matrix.
fn pointwise(w: &Window) -> bool {
    w.kh == 1
        && w.kw == 1
        && w.sh == 1
        && w.sw == 1
        && w.ph == 0
        && w.pw == 0
        && w.oh == w.h
        && w.ow == w.w
}

/// Device time of one GPU step ([`CudaExecutor::invoke_profiled`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StepTime {
    /// Plan step index.
    pub step: usize,
    /// What ran: `conv`, `conv-dw`, `gemm`, `elementwise`, `pool`, ...
    pub kind: &'static str,
    /// Floating-point operations of the step (2 per multiply-add for Conv
    /// and GEMM; 0 where not counted).
    pub flops: f64,
    /// Device milliseconds between the events around its launches.
    pub ms: f32,
}

fn kind(op: &GpuOp) -> &'static str {
    match op {
        GpuOp::Unary { .. } | GpuOp::Binary { .. } | GpuOp::ScaleShift { .. } => "elementwise",
        GpuOp::Gemm { .. } => "gemm",
        GpuOp::Conv { c, group, .. } if c / group == 1 => "conv-depthwise",
        GpuOp::Conv { .. } => "conv",
        GpuOp::Pool { .. } | GpuOp::RowReduce { .. } => "pool",
        GpuOp::Softmax { .. } => "softmax",
        GpuOp::Concat { .. } | GpuOp::Transpose { .. } => "layout",
    }
}

fn flops(op: &GpuOp) -> f64 {
    match op {
        GpuOp::Gemm { m, n, k, batch, .. } => {
            2.0 * (*m as f64) * (*n as f64) * (*k as f64) * (*batch as f64)
        }
        GpuOp::Conv {
            n,
            c,
            m,
            group,
            win,
            ..
        } => {
            let kk = (c / group) as f64 * win.kh as f64 * win.kw as f64;
            2.0 * (*n as f64) * (*m as f64) * (win.oh as f64 * win.ow as f64) * kk
        }
        _ => 0.0,
    }
}

/// Conv → Relu / Clip where the Conv's output feeds only that activation:
/// the Conv writes the activation's output through its epilogue and the
/// activation step is dropped (one pass over the tensor saved).
fn fuse_activations(model: &Model, plan: &Plan, steps: &mut [Option<Ready>]) -> Result<()> {
    for i in 1..steps.len() {
        let Some(Some(Ready {
            op: GpuOp::Unary { x, y, act, .. },
            ..
        })) = steps.get(i)
        else {
            continue;
        };
        let (x, y, act) = (*x, *y, *act);
        if act.op != 1 && act.op != 4 {
            continue;
        }
        let Some(t) = plan.step(model, i - 1)?.outputs.first().copied().flatten() else {
            continue;
        };
        let readers = model
            .graph
            .nodes
            .iter()
            .filter(|n| n.inputs.contains(&Some(t)))
            .count();
        if readers != 1 || model.graph.outputs.contains(&t) {
            continue;
        }
        if let Some(Some(Ready {
            op: GpuOp::Conv {
                y: cy, act: cact, ..
            },
            ..
        })) = steps.get_mut(i - 1)
        {
            if *cy == x && cact.op == 0 {
                *cy = y;
                *cact = act;
                if let Some(s) = steps.get_mut(i) {
                    *s = None;
                }
            }
        }
    }
    Ok(())
}

impl CudaExecutor {
    /// Partitions `plan` (built from `model`) between `provider` and the
    /// CPU, allocates the device arena (the plan's arena size), uploads the
    /// constants the GPU steps read and the kernels' tables.
    pub fn new(provider: Arc<CudaProvider>, model: &Model, plan: &Plan) -> Result<Self> {
        let partition = provider::partition(model, plan, provider.as_ref())?;
        let stream = provider.stream.clone();
        let arena = stream.alloc_zeros::<u8>(plan.arena_bytes().max(1))?;
        let (base, _) = arena.device_ptr(&stream);
        let mut consts = HashMap::new();
        let mut tables = Vec::new();
        let mut steps = Vec::with_capacity(plan.num_steps());
        let mut scratch = 0usize;
        let mut const_bytes = 0usize;
        let wide_p = wide_n_max_p();
        // (Conv steps on the GPU, of which cuDNN runs)
        let mut convs = (0usize, 0usize);
        let on_gpu: Vec<bool> = {
            let mut v = vec![false; plan.num_steps()];
            for s in partition.segments.iter().filter(|s| s.on_provider) {
                for i in s.steps.clone() {
                    if let Some(x) = v.get_mut(i) {
                        *x = true;
                    }
                }
            }
            v
        };
        for (i, &gpu) in on_gpu.iter().enumerate() {
            if !gpu {
                steps.push(None);
                continue;
            }
            let st = plan.step(model, i)?;
            let op = lower::lower(model, plan, &st)
                .ok_or(Error::Internal("claimed step does not lower"))?;
            for &t in st.inputs.iter().flatten() {
                if let Some((_, _, Place::Const(v))) = plan.place(model, t) {
                    if let std::collections::hash_map::Entry::Vacant(e) = consts.entry(t) {
                        const_bytes += v.bytes().len();
                        e.insert(upload(&stream, v.bytes())?);
                    }
                }
            }
            let table_bytes: Vec<Vec<u8>> = match &op {
                GpuOp::Binary { meta: Some(m), .. } => vec![i32_bytes(m)?],
                GpuOp::Gemm {
                    c: Some((_, m)), ..
                } => vec![i32_bytes(m)?],
                GpuOp::Transpose { meta, .. } => vec![i32_bytes(meta)?],
                GpuOp::ScaleShift { scale, shift, .. } => vec![f32_bytes(scale), f32_bytes(shift)],
                _ => vec![],
            };
            let mut ptrs = Vec::new();
            for b in table_bytes {
                let (s, p) = upload(&stream, &b)?;
                tables.push(s);
                ptrs.push(p);
            }
            let conv_dnn = match (&op, &provider.dnn) {
                (
                    GpuOp::Conv {
                        n,
                        c,
                        m,
                        group,
                        win,
                        ..
                    },
                    Ok(d),
                ) if conv_path(*n, *c, *group, win, wide_p) != ConvPath::Direct => {
                    d.plan_conv(*n, *c, *m, *group, win)
                }
                _ => None,
            };
            // Room for either path: the choice is made by timing both.
            scratch = scratch.max(scratch_elems(&op, wide_p));
            if let Some(p) = &conv_dnn {
                scratch = scratch.max(p.workspace.div_ceil(4));
                convs.1 += 1;
            }
            if matches!(op, GpuOp::Conv { .. }) {
                convs.0 += 1;
            }
            steps.push(Some(Ready {
                op,
                tables: ptrs,
                dnn: conv_dnn,
            }));
        }
        fuse_activations(model, plan, &mut steps)?;
        let provider_dnn_note = provider.dnn.as_ref().err().cloned();
        let scratch_buf = if scratch > 0 {
            Some(stream.alloc_zeros::<f32>(scratch)?)
        } else {
            None
        };
        let scratch_ptr = scratch_buf.as_ref().map_or(0, |s| s.device_ptr(&stream).0);
        stream.synchronize()?;
        let mut exec = CudaExecutor {
            provider,
            partition,
            arena,
            base,
            scratch: scratch_buf,
            scratch_ptr,
            consts,
            _tables: tables,
            steps,
            const_bytes,
            graphs: Vec::new(),
            wide_p,
            cudnn_note: match &provider_dnn_note {
                Some(why) => format!("cuDNN {why}"),
                None => format!("cuDNN on {} of {} Conv steps", convs.1, convs.0),
            },
            graph_note: None,
            lock: Mutex::new(()),
            pinned: None,
        };
        exec.choose_conv_kernels()?;
        if std::env::var("MOTE_CUDA_GRAPHS").is_ok_and(|v| v == "0") {
            exec.graph_note = Some("off (MOTE_CUDA_GRAPHS=0)".into());
        } else {
            exec.capture();
        }
        Ok(exec)
    }

    /// For each Conv that cuDNN can run, times it both ways (cuDNN, and
    /// mote's im2col + cuBLAS or direct kernels) on the device arena and
    /// keeps the faster, as onnxruntime's cuDNN algorithm search does:
    /// neither wins everywhere (cuDNN's FMA kernels lose on pointwise and
    /// batch-1 convolutions here, win on batch-32 3×3 ones).
    fn choose_conv_kernels(&mut self) -> Result<()> {
        let stream = self.provider.stream.clone();
        let timing = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
        let time = |exec: &CudaExecutor, r: &Ready| -> Result<f32> {
            exec.launch(r)?; // warm-up (cuDNN loads its kernels lazily)
            let (a, b) = (
                exec.provider.ctx.new_event(timing)?,
                exec.provider.ctx.new_event(timing)?,
            );
            a.record(&stream)?;
            for _ in 0..3 {
                exec.launch(r)?;
            }
            b.record(&stream)?;
            Ok(a.elapsed_ms(&b)?)
        };
        let (mut kept, mut total) = (0usize, 0usize);
        for i in 0..self.steps.len() {
            let Some(Some(r)) = self.steps.get(i) else {
                continue;
            };
            if r.dnn.is_none() {
                continue;
            }
            total += 1;
            let with = time(self, r);
            let own_ready = Ready {
                op: r.op.clone(),
                tables: r.tables.clone(),
                dnn: None,
            };
            let own = time(self, &own_ready);
            let keep = match (with, own) {
                (Ok(d), Ok(o)) => d < o,
                (Ok(_), Err(_)) => true,
                _ => false,
            };
            if keep {
                kept += 1;
            } else if let Some(Some(r)) = self.steps.get_mut(i) {
                r.dnn = None;
            }
        }
        stream.synchronize()?;
        if total > 0 {
            self.cudnn_note =
                format!("cuDNN faster on {kept} of {total} Conv steps it can run (timed at build)");
        }
        Ok(())
    }

    /// Captures every GPU segment into a CUDA graph (one launch per segment
    /// instead of one per kernel: every address is fixed at build, which is
    /// what the static arena buys). Any failure leaves step-by-step launches.
    fn capture(&mut self) {
        let stream = self.provider.stream.clone();
        let mut graphs = Vec::with_capacity(self.partition.segments.len());
        for seg in &self.partition.segments {
            if !seg.on_provider {
                graphs.push(None);
                continue;
            }
            let r = (|| -> Result<Option<CudaGraph>> {
                stream.begin_capture(
                    drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )?;
                let launched = seg
                    .steps
                    .clone()
                    .filter_map(|i| self.steps.get(i).and_then(Option::as_ref))
                    .try_for_each(|r| self.launch(r));
                let g = stream.end_capture(drv_sys::CUgraphInstantiate_flags(0));
                launched?;
                Ok(g?)
            })();
            match r {
                Ok(Some(g)) => graphs.push(Some(Graph(g))),
                Ok(None) => graphs.push(None),
                Err(e) => {
                    self.graph_note = Some(format!("off (capture failed: {e})"));
                    self.graphs = Vec::new();
                    return;
                }
            }
        }
        self.graph_note = Some("on".into());
        self.graphs = graphs;
    }

    /// Page-locks the host arena `[ptr, ptr + len)` (`cuMemHostRegister`), so
    /// that boundary copies are DMA at full bus speed instead of staged
    /// through the driver (the input of a batch-32 ImageNet model is 19 MB).
    /// Returns whether it could (some systems refuse: copies then stay
    /// pageable, which is only slower).
    ///
    /// # Safety
    /// The memory must stay allocated, at that address, until this executor
    /// is dropped or [`CudaExecutor::unregister_host`] is called.
    pub unsafe fn register_host(&mut self, ptr: *mut u8, len: usize) -> bool {
        self.unregister_host();
        if len == 0 || self.provider.ctx.bind_to_thread().is_err() {
            return false;
        }
        // SAFETY: the caller keeps `ptr..ptr + len` allocated and in place
        // until it is unregistered (in `unregister_host` or on drop).
        let r = unsafe {
            drv_sys::cuMemHostRegister_v2(ptr.cast(), len, drv_sys::CU_MEMHOSTREGISTER_PORTABLE)
                .result()
        };
        if r.is_ok() {
            self.pinned = Some((ptr as usize, len));
        }
        r.is_ok()
    }

    /// Undoes [`CudaExecutor::register_host`] (nothing if none).
    pub fn unregister_host(&mut self) {
        if let Some((p, _)) = self.pinned.take() {
            if self.provider.ctx.bind_to_thread().is_ok() {
                // SAFETY: `p` was registered by `register_host` and is still
                // allocated (its contract).
                let _ = unsafe { drv_sys::cuMemHostUnregister(p as *mut std::ffi::c_void) };
            }
        }
    }

    /// Bytes of host memory pinned for copies (0 if none).
    pub fn pinned_bytes(&self) -> usize {
        self.pinned.map_or(0, |(_, l)| l)
    }

    /// Whether GPU segments run as CUDA graphs, and why not.
    pub fn graphs(&self) -> &str {
        self.graph_note.as_deref().unwrap_or("off")
    }

    /// How the executor runs: CUDA graphs, cuDNN, pinned copies (one line).
    pub fn summary(&self) -> String {
        format!(
            "CUDA graphs {}, {}, host arena {}",
            self.graphs(),
            self.cudnn_note,
            if self.pinned.is_some() {
                "page-locked"
            } else {
                "pageable"
            }
        )
    }

    /// How the plan is split, with the boundary copies.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// Device bytes: (arena, GPU scratch, uploaded constants).
    pub fn device_bytes(&self) -> (usize, usize, usize) {
        (
            self.arena.len(),
            self.scratch.as_ref().map_or(0, |s| s.len() * 4),
            self.const_bytes,
        )
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<CudaProvider> {
        &self.provider
    }

    fn addr(&self, o: Operand) -> Result<u64> {
        match o {
            Operand::Arena(off) => Ok(self.base + off as u64),
            Operand::Const(t) => self
                .consts
                .get(&t)
                .map(|c| c.1)
                .ok_or(Error::Internal("constant not uploaded")),
        }
    }

    /// Feeds `inputs` into `session` (a session of the same plan and
    /// model), runs every segment on its side with the boundary copies,
    /// and leaves the outputs in the session's arena (read them with
    /// [`mote_core::Session::output`]).
    pub fn run(
        &self,
        session: &mut mote_core::Session<'_>,
        inputs: &[(&str, TensorView<'_>)],
    ) -> Result<()> {
        session.feed(inputs)?;
        self.invoke(session)
    }

    /// Runs on the inputs already in `session`'s arena.
    pub fn invoke(&self, session: &mut mote_core::Session<'_>) -> Result<()> {
        self.invoke_with(session, None)
    }

    /// [`CudaExecutor::invoke`] with a CUDA event pair around every GPU
    /// step (which serializes nothing: one stream): the device time of each
    /// step, with its op and FLOPs, for `mote bench --profile`.
    pub fn invoke_profiled(&self, session: &mut mote_core::Session<'_>) -> Result<Vec<StepTime>> {
        let mut times = Vec::new();
        self.invoke_with(session, Some(&mut times))?;
        Ok(times)
    }

    fn invoke_with(
        &self,
        session: &mut mote_core::Session<'_>,
        mut profile: Option<&mut Vec<StepTime>>,
    ) -> Result<()> {
        let _one_run = self
            .lock
            .lock()
            .map_err(|_| Error::Internal("a previous run panicked"))?;
        // Raw driver calls below: the context must be current on this
        // thread (a pool thread, or one the session moved to).
        self.provider.ctx.bind_to_thread()?;
        let stream = &self.provider.stream;
        let cu = stream.cu_stream();
        for (k, seg) in self.partition.segments.iter().enumerate() {
            if seg.on_provider {
                for &(_, off, len) in &seg.copies {
                    let src = session
                        .arena()
                        .get(off..off + len)
                        .ok_or(Error::Internal("copy span"))?;
                    // SAFETY: the destination is inside the device arena
                    // (same offsets as the host arena, same size); the
                    // source is pageable host memory, which the driver
                    // stages before the call returns.
                    unsafe {
                        cudarc::driver::result::memcpy_htod_async(self.base + off as u64, src, cu)?
                    };
                }
                if let (None, Some(Some(g))) = (profile.as_ref(), self.graphs.get(k)) {
                    g.0.launch()?;
                    continue;
                }
                for i in seg.steps.clone() {
                    let Some(Some(r)) = self.steps.get(i) else {
                        continue;
                    };
                    match profile.as_deref_mut() {
                        None => self.launch(r)?,
                        Some(times) => {
                            let timing = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
                            let (a, b) = (
                                self.provider.ctx.new_event(timing)?,
                                self.provider.ctx.new_event(timing)?,
                            );
                            a.record(stream)?;
                            self.launch(r)?;
                            b.record(stream)?;
                            times.push(StepTime {
                                step: i,
                                kind: kind(&r.op),
                                flops: flops(&r.op),
                                ms: a.elapsed_ms(&b)?,
                            });
                        }
                    }
                }
            } else {
                for &(_, off, len) in &seg.copies {
                    let dst = session
                        .arena_mut()
                        .get_mut(off..off + len)
                        .ok_or(Error::Internal("copy span"))?;
                    // SAFETY: source inside the device arena; the copy to
                    // pageable memory completes before the call returns.
                    unsafe {
                        cudarc::driver::result::memcpy_dtoh_async(dst, self.base + off as u64, cu)?
                    };
                }
                stream.synchronize()?;
                session.invoke_steps(seg.steps.clone())?;
            }
        }
        for &(_, off, len) in &self.partition.final_copies {
            let dst = session
                .arena_mut()
                .get_mut(off..off + len)
                .ok_or(Error::Internal("copy span"))?;
            // SAFETY: as above.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, self.base + off as u64, cu)? };
        }
        stream.synchronize()?;
        Ok(())
    }

    fn grid(n: i64) -> LaunchConfig {
        Self::grid2(n, 1)
    }

    /// `images` rows of blocks (blockIdx.y = image), each covering `per`
    /// elements with a grid-stride loop.
    fn grid2(per: i64, images: i64) -> LaunchConfig {
        let blocks = ((per.max(1) + 255) / 256).min(65535 * 32) as u32;
        LaunchConfig {
            grid_dim: (blocks, images.clamp(1, 65535) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn launch(&self, r: &Ready) -> Result<()> {
        let p = &*self.provider;
        let stream = &p.stream;
        let t = |k: usize| r.tables.get(k).copied().ok_or(Error::Internal("table"));
        // SAFETY: (every launch below) operands are device addresses inside
        // the arena or uploaded constants, with the sizes `lower` checked
        // against the plan's shapes; arguments match the kernel signatures
        // in kernels.cu one for one.
        unsafe {
            match &r.op {
                GpuOp::Unary { x, y, n, act } => {
                    let (x, y) = (self.addr(*x)?, self.addr(*y)?);
                    stream
                        .launch_builder(p.func("unary")?)
                        .arg(&x)
                        .arg(&y)
                        .arg(&i32c(*n)?)
                        .arg(&act.op)
                        .arg(&act.a)
                        .arg(&act.b)
                        .launch(Self::grid(*n))?;
                }
                GpuOp::Binary {
                    a,
                    b,
                    y,
                    n,
                    op,
                    meta,
                } => {
                    let (a, b, y) = (self.addr(*a)?, self.addr(*b)?, self.addr(*y)?);
                    let m = if meta.is_some() { t(0)? } else { 0u64 };
                    stream
                        .launch_builder(p.func("binary")?)
                        .arg(&a)
                        .arg(&b)
                        .arg(&y)
                        .arg(&i32c(*n)?)
                        .arg(op)
                        .arg(&m)
                        .launch(Self::grid(*n))?;
                }
                GpuOp::Gemm {
                    a,
                    b,
                    y,
                    c,
                    m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                    alpha,
                    beta,
                    batch,
                    stride_a,
                    stride_b,
                } => {
                    let (a, b, y) = (self.addr(*a)?, self.addr(*b)?, self.addr(*y)?);
                    let mut beta_run = 0.0f32;
                    if let Some((c, _)) = c {
                        let c = self.addr(*c)?;
                        let total = m * n * batch;
                        let meta = t(0)?;
                        stream
                            .launch_builder(p.func("bcast_copy")?)
                            .arg(&c)
                            .arg(&y)
                            .arg(&i32c(total)?)
                            .arg(beta)
                            .arg(&meta)
                            .launch(Self::grid(total))?;
                        beta_run = 1.0;
                    }
                    self.sgemm(
                        *trans_a, *trans_b, *m, *n, *k, *alpha, a, b, beta_run, y, *batch,
                        *stride_a, *stride_b,
                    )?;
                }
                GpuOp::Conv {
                    x,
                    w,
                    bias,
                    y,
                    n,
                    m,
                    win,
                    act,
                    ..
                } if r.dnn.is_some() => {
                    let (Some(plan), Ok(d)) = (&r.dnn, &p.dnn) else {
                        return Err(Error::Internal("cuDNN plan without handle"));
                    };
                    let (xa, wa, ya) = (self.addr(*x)?, self.addr(*w)?, self.addr(*y)?);
                    d.run_conv(plan, xa, wa, ya, self.scratch_ptr)
                        .map_err(Error::Cudnn)?;
                    let b = match bias {
                        Some(b) => self.addr(*b)?,
                        None => 0,
                    };
                    self.bias_act(ya, b, *m, win.oh as i64 * win.ow as i64, *n, act)?;
                }
                GpuOp::Conv {
                    x,
                    w,
                    bias,
                    y,
                    n,
                    c,
                    m,
                    group,
                    win,
                    act,
                } => self.conv(*x, *w, *bias, *y, *n, *c, *m, *group, win, act)?,
                GpuOp::Pool {
                    x,
                    y,
                    n,
                    c,
                    win,
                    is_max,
                    count_pad,
                } => {
                    let (x, y) = (self.addr(*x)?, self.addr(*y)?);
                    let per = c * win.oh as i64 * win.ow as i64;
                    stream
                        .launch_builder(p.func("pool2d")?)
                        .arg(&x)
                        .arg(&y)
                        .arg(&i32c(*c)?)
                        .arg(&win.h)
                        .arg(&win.w)
                        .arg(&win.oh)
                        .arg(&win.ow)
                        .arg(&win.kh)
                        .arg(&win.kw)
                        .arg(&win.sh)
                        .arg(&win.sw)
                        .arg(&win.ph)
                        .arg(&win.pw)
                        .arg(&win.dh)
                        .arg(&win.dw)
                        .arg(&(*is_max as i32))
                        .arg(&(*count_pad as i32))
                        .launch(Self::grid2(per, *n))?;
                }
                GpuOp::RowReduce {
                    x,
                    y,
                    rows,
                    len,
                    is_max,
                } => {
                    let (x, y) = (self.addr(*x)?, self.addr(*y)?);
                    let cfg = LaunchConfig {
                        grid_dim: ((*rows).clamp(1, 65535) as u32, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    stream
                        .launch_builder(p.func("row_reduce")?)
                        .arg(&x)
                        .arg(&y)
                        .arg(rows)
                        .arg(len)
                        .arg(&(*is_max as i32))
                        .launch(cfg)?;
                }
                GpuOp::Softmax {
                    x,
                    y,
                    outer,
                    axis,
                    inner,
                    log,
                } => {
                    let (x, y) = (self.addr(*x)?, self.addr(*y)?);
                    stream
                        .launch_builder(p.func("softmax")?)
                        .arg(&x)
                        .arg(&y)
                        .arg(&i32c(*outer)?)
                        .arg(&i32c(*axis)?)
                        .arg(&i32c(*inner)?)
                        .arg(&(*log as i32))
                        .launch(Self::grid(outer * inner))?;
                }
                GpuOp::ScaleShift {
                    x,
                    y,
                    n,
                    channels,
                    inner,
                    ..
                } => {
                    let (x, y) = (self.addr(*x)?, self.addr(*y)?);
                    let (s, b) = (t(0)?, t(1)?);
                    stream
                        .launch_builder(p.func("scale_shift")?)
                        .arg(&x)
                        .arg(&y)
                        .arg(&s)
                        .arg(&b)
                        .arg(&i32c(*n)?)
                        .arg(&i32c(*channels)?)
                        .arg(&i32c(*inner)?)
                        .launch(Self::grid(*n))?;
                }
                GpuOp::Concat {
                    y,
                    pieces,
                    inner_out,
                } => {
                    let y = self.addr(*y)?;
                    for (x, outer, inner_in, off) in pieces {
                        let x = self.addr(*x)?;
                        stream
                            .launch_builder(p.func("concat_piece")?)
                            .arg(&x)
                            .arg(&y)
                            .arg(&i32c(*outer)?)
                            .arg(&i32c(*inner_in)?)
                            .arg(&i32c(*inner_out)?)
                            .arg(&i32c(*off)?)
                            .launch(Self::grid(outer * inner_in))?;
                    }
                }
                GpuOp::Transpose { x, y, n, .. } => {
                    let (x, y) = (self.addr(*x)?, self.addr(*y)?);
                    let meta = t(0)?;
                    stream
                        .launch_builder(p.func("transpose")?)
                        .arg(&x)
                        .arg(&y)
                        .arg(&i32c(*n)?)
                        .arg(&meta)
                        .launch(Self::grid(*n))?;
                }
            }
        }
        Ok(())
    }

    /// Row-major `y[b] = alpha · op(a[b]) · op(b[b]) + beta · y[b]`, `m × n`,
    /// as the column-major product `yᵀ = op(b)ᵀ · op(a)ᵀ` cuBLAS computes.
    #[allow(clippy::too_many_arguments)]
    fn sgemm(
        &self,
        ta: bool,
        tb: bool,
        m: i64,
        n: i64,
        k: i64,
        alpha: f32,
        a: u64,
        b: u64,
        beta: f32,
        y: u64,
        batch: i64,
        stride_a: i64,
        stride_b: i64,
    ) -> Result<()> {
        use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let int = |v: i64| i32::try_from(v).map_err(|_| Error::Internal("GEMM dimension over i32"));
        let (op_b, ldb) = if tb {
            (CUBLAS_OP_T, k)
        } else {
            (CUBLAS_OP_N, n)
        };
        let (op_a, lda) = if ta {
            (CUBLAS_OP_T, m)
        } else {
            (CUBLAS_OP_N, k)
        };
        let h = *self.provider.blas.handle();
        // SAFETY: a, b, y are device addresses of buffers holding at least
        // the batch × matrix elements `lower` derived from the plan's shapes.
        unsafe {
            if batch == 1 {
                blas::sgemm(
                    h,
                    op_b,
                    op_a,
                    int(n)?,
                    int(m)?,
                    int(k)?,
                    &alpha,
                    b as *const f32,
                    int(ldb)?,
                    a as *const f32,
                    int(lda)?,
                    &beta,
                    y as *mut f32,
                    int(n)?,
                )?;
            } else {
                blas::sgemm_strided_batched(
                    h,
                    op_b,
                    op_a,
                    int(n)?,
                    int(m)?,
                    int(k)?,
                    &alpha,
                    b as *const f32,
                    int(ldb)?,
                    stride_b,
                    a as *const f32,
                    int(lda)?,
                    stride_a,
                    &beta,
                    y as *mut f32,
                    int(n)?,
                    m * n,
                    int(batch)?,
                )?;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn conv(
        &self,
        x: Operand,
        w: Operand,
        bias: Option<Operand>,
        y: Operand,
        n: i64,
        c: i64,
        m: i64,
        group: i64,
        win: &Window,
        act: &Act,
    ) -> Result<()> {
        let p = &*self.provider;
        let stream = &p.stream;
        let (x, w, y) = (self.addr(x)?, self.addr(w)?, self.addr(y)?);
        let bias = match bias {
            Some(b) => self.addr(b)?,
            None => 0,
        };
        let (cg, mg) = (c / group, m / group);
        let hw_in = win.h as i64 * win.w as i64;
        let hw_out = win.oh as i64 * win.ow as i64;
        let kk = cg * win.kh as i64 * win.kw as i64;
        let path = conv_path(n, c, group, win, self.wide_p);
        if path == ConvPath::WideN {
            return self.conv_wide(x, w, bias, y, n, c, m, group, win, act);
        }
        if path == ConvPath::Direct {
            // SAFETY: as in `launch`.
            unsafe {
                stream
                    .launch_builder(p.func("dwconv")?)
                    .arg(&x)
                    .arg(&w)
                    .arg(&bias)
                    .arg(&y)
                    .arg(&(c as i32))
                    .arg(&win.h)
                    .arg(&win.w)
                    .arg(&(m as i32))
                    .arg(&win.kh)
                    .arg(&win.kw)
                    .arg(&win.sh)
                    .arg(&win.sw)
                    .arg(&win.ph)
                    .arg(&win.pw)
                    .arg(&win.dh)
                    .arg(&win.dw)
                    .arg(&win.oh)
                    .arg(&win.ow)
                    .arg(&act.op)
                    .arg(&act.a)
                    .arg(&act.b)
                    .launch(Self::grid2(m * hw_out, n))?;
            }
            return Ok(());
        }
        let f = 4u64;
        for g in 0..group {
            let xg = x + (g * cg * hw_in) as u64 * f;
            let wg = w + (g * mg * kk) as u64 * f;
            let yg = y + (g * mg * hw_out) as u64 * f;
            let (col, col_stride) = if pointwise(win) {
                (xg, c * hw_in)
            } else {
                let col = self.scratch_ptr;
                self.im2col("im2col", xg, col, cg, c * hw_in, n, win)?;
                (col, kk * hw_out)
            };
            // Per image: Y_g (mg × P) = W_g (mg × kk) · col (kk × P); in
            // column-major terms Yᵀ = colᵀ · W_gᵀ.
            self.gemm_cm(
                hw_out,
                mg,
                kk,
                col,
                hw_out,
                col_stride,
                wg,
                kk,
                yg,
                hw_out,
                m * hw_out,
                n,
            )?;
        }
        self.bias_act(y, bias, m, hw_out, n, act)
    }

    /// The Conv epilogue on `n` images of `m` planes of `hw` values in
    /// place: `y = act(y + bias[channel])`; nothing when there is neither a
    /// bias (`bias == 0`) nor an activation.
    fn bias_act(&self, y: u64, bias: u64, m: i64, hw: i64, n: i64, act: &Act) -> Result<()> {
        if bias == 0 && act.op == 0 {
            return Ok(());
        }
        let p = &*self.provider;
        // SAFETY: as in `launch`: `y` holds n·m·hw f32 and `bias` (if not
        // 0) m f32, from the plan's shapes.
        unsafe {
            p.stream
                .launch_builder(p.func("bias_act")?)
                .arg(&y)
                .arg(&bias)
                .arg(&i32c(m)?)
                .arg(&i32c(hw)?)
                .arg(&act.op)
                .arg(&act.a)
                .arg(&act.b)
                .launch(Self::grid2(m * hw, n))?;
        }
        Ok(())
    }

    /// [`ConvPath::WideN`]: per group, im2col of every image side by side
    /// (`kk × n·P`), one GEMM `T (mg × n·P) = W_g · col`, then `from_mnp`
    /// scatters `T` into NCHW with bias and activation.
    #[allow(clippy::too_many_arguments)]
    fn conv_wide(
        &self,
        x: u64,
        w: u64,
        bias: u64,
        y: u64,
        n: i64,
        c: i64,
        m: i64,
        group: i64,
        win: &Window,
        act: &Act,
    ) -> Result<()> {
        let p = &*self.provider;
        let stream = &p.stream;
        let (cg, mg) = (c / group, m / group);
        let hw_in = win.h as i64 * win.w as i64;
        let pp = win.oh as i64 * win.ow as i64;
        let kk = cg * win.kh as i64 * win.kw as i64;
        let col = self.scratch_ptr;
        let tmp = col + (n * kk * pp) as u64 * 4;
        for g in 0..group {
            let xg = x + (g * cg * hw_in) as u64 * 4;
            let wg = w + (g * mg * kk) as u64 * 4;
            self.im2col("im2col_nb", xg, col, cg, c * hw_in, n, win)?;
            // Column-major T' (n·P × mg) = col' (n·P × kk) · W_g' (kk × mg).
            self.gemm_cm(n * pp, mg, kk, col, n * pp, 0, wg, kk, tmp, n * pp, 0, 1)?;
            let c0 = (g * mg) as i32;
            // SAFETY: as in `launch`.
            unsafe {
                stream
                    .launch_builder(p.func("from_mnp")?)
                    .arg(&tmp)
                    .arg(&y)
                    .arg(&bias)
                    .arg(&(mg as i32))
                    .arg(&(m as i32))
                    .arg(&c0)
                    .arg(&(pp as i32))
                    .arg(&act.op)
                    .arg(&act.a)
                    .arg(&act.b)
                    .launch(Self::grid2(mg * pp, n))?;
            }
        }
        Ok(())
    }

    /// Launches `kernel` (`im2col`, or `im2col_nb` for the batch side by
    /// side) over `n` images of `cg` channels from `x` (`ximg` elements per
    /// image) into `col`, the scratch (sized at build for this op's path).
    #[allow(clippy::too_many_arguments)]
    fn im2col(
        &self,
        kernel: &'static str,
        x: u64,
        col: u64,
        cg: i64,
        ximg: i64,
        n: i64,
        win: &Window,
    ) -> Result<()> {
        let p = &*self.provider;
        let kk = cg * win.kh as i64 * win.kw as i64;
        let pp = win.oh as i64 * win.ow as i64;
        // SAFETY: as in `launch`; `col` holds n·kk·P f32 for this op.
        unsafe {
            p.stream
                .launch_builder(p.func(kernel)?)
                .arg(&x)
                .arg(&col)
                .arg(&i32c(cg)?)
                .arg(&win.h)
                .arg(&win.w)
                .arg(&win.kh)
                .arg(&win.kw)
                .arg(&win.sh)
                .arg(&win.sw)
                .arg(&win.ph)
                .arg(&win.pw)
                .arg(&win.dh)
                .arg(&win.dw)
                .arg(&win.oh)
                .arg(&win.ow)
                .arg(&ximg)
                .launch(Self::grid2(kk * pp, n))?;
        }
        Ok(())
    }

    /// Column-major `C (mm × nn) = A (mm × kk) · B (kk × nn)` for `batch`
    /// A and C (B shared).
    #[allow(clippy::too_many_arguments)]
    fn gemm_cm(
        &self,
        mm: i64,
        nn: i64,
        kk: i64,
        a: u64,
        lda: i64,
        stride_a: i64,
        b: u64,
        ldb: i64,
        c: u64,
        ldc: i64,
        stride_c: i64,
        batch: i64,
    ) -> Result<()> {
        use blas_sys::cublasOperation_t::CUBLAS_OP_N;
        let int = |v: i64| i32::try_from(v).map_err(|_| Error::Internal("GEMM dimension over i32"));
        let (one, zero) = (1.0f32, 0.0f32);
        let h = *self.provider.blas.handle();
        // SAFETY: addresses of the conv's input (or im2col scratch),
        // weights and output, sized from the plan's shapes.
        unsafe {
            blas::sgemm_strided_batched(
                h,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                int(mm)?,
                int(nn)?,
                int(kk)?,
                &one,
                a as *const f32,
                int(lda)?,
                stride_a,
                b as *const f32,
                int(ldb)?,
                0,
                &zero,
                c as *mut f32,
                int(ldc)?,
                stride_c,
                int(batch)?,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match CudaProvider::new(0) {
            Ok(p) => eprintln!("GPU present: {}", p.device_name()),
            Err(e) => {
                eprintln!("skipped GPU: {e}");
                assert!(!driver_present() || !matches!(e, Error::NoDriver));
            }
        }
    }
}
