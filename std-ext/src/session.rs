//! Sessions that own their model, plan and arena.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mote_core::model::Dim;
use mote_core::{DType, IoInfo, Model, Plan, TensorView};

use crate::error::{Error, Result};
use crate::external::ExternalData;
use crate::provider::Provider;
use crate::tensor::{fmt_shape, Tensor};
use crate::threads::Pool;

/// Reads and imports an ONNX file. Errors name the file, and the node and
/// tensor when the model itself is at fault. Tensors in external files
/// are read from the model's folder only ([`ExternalData`]).
pub fn load_model(path: impl AsRef<Path>) -> Result<Model> {
    load_model_with(path, ExternalData::default())
}

/// [`load_model`] with a policy for external tensor data.
pub fn load_model_with(path: impl AsRef<Path>, external: ExternalData) -> Result<Model> {
    let path = path.as_ref();
    let buf = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let not_onnx = || {
        Error::Model(format!(
            "not an ONNX model or truncated: {}",
            path.display()
        ))
    };
    if buf.is_empty() {
        return Err(Error::Model(format!(
            "not an ONNX model or truncated: {} (empty file)",
            path.display()
        )));
    }
    // Weights are sliced out of the file's buffer (no copy) where aligned.
    let mut proto = mote_proto::decode_model(bytes::Bytes::from(buf)).map_err(|_| not_onnx())?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let external_data = crate::external::has_external(&proto);
    if external_data {
        crate::external::resolve(&mut proto, dir, external)
            .map_err(|e| Error::Model(format!("{}: {e}", path.display())))?;
    }
    Model::from_proto(proto).map_err(|e| {
        // Import again as far as it goes, for the names of the error's
        // node and tensor (the error path only: the file is read again
        // rather than held while the import frees what it can).
        let mut p = std::fs::read(path)
            .ok()
            .and_then(|b| mote_proto::decode_model(bytes::Bytes::from(b)).ok())
            .unwrap_or_default();
        if external_data {
            let _ = crate::external::resolve(&mut p, dir, external);
        }
        Error::Model(format!(
            "{}: {}",
            path.display(),
            mote_core::onnx::explain_import(p, &e)
        ))
    })
}

/// A core error, explained with the model's names.
pub fn explain(model: &Model, e: &mote_core::Error) -> Error {
    Error::Model(model.explain(e).to_string())
}

/// `[batch,3,224,224]` from a declared shape (`?` for unknown dims).
pub fn fmt_declared(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape
        .iter()
        .map(|d| match d {
            Dim::Fixed(v) => v.to_string(),
            Dim::Param(p) => p.clone(),
            Dim::Unknown => "?".into(),
        })
        .collect();
    format!("[{}]", parts.join(","))
}

/// Checks a tensor given for graph input `name` against the model's
/// declaration (name, dtype, rank and fixed dims), before any planning.
pub fn check_declared(model: &Model, name: &str, dtype: DType, shape: &[usize]) -> Result<()> {
    let g = &model.graph;
    let Some(info) = g
        .inputs
        .iter()
        .filter_map(|&i| g.tensors.get(i as usize))
        .find(|t| t.name == name)
    else {
        let names: Vec<&str> = model.input_names().collect();
        return Err(Error::Input(format!(
            "unknown input '{name}' (model inputs: {})",
            names.join(", ")
        )));
    };
    let ok_dtype = info.dtype.is_none_or(|d| d == dtype);
    let ok_shape = info.shape.as_ref().is_none_or(|decl| {
        decl.len() == shape.len()
            && decl
                .iter()
                .zip(shape)
                .all(|(d, &v)| !matches!(d, Dim::Fixed(f) if *f != v))
    });
    if !ok_dtype || !ok_shape {
        let want_dt = info.dtype.map_or_else(
            || DType::onnx_name(info.onnx_type).to_string(),
            |d| d.to_string(),
        );
        let want_shape = info
            .shape
            .as_deref()
            .map_or_else(|| "[?]".to_string(), fmt_declared);
        return Err(Error::Input(format!(
            "input '{name}': expected {want_dt} {want_shape}, got {dtype} {}",
            fmt_shape(shape)
        )));
    }
    Ok(())
}

/// A session over a model file: owns the model (shared), the plan and a
/// 16-byte-aligned arena.
///
/// ```no_run
/// # fn main() -> mote_std::Result<()> {
/// use mote_std::{Session, Tensor};
/// let mut s = Session::builder("models/digits_mlp.onnx").dim("batch", 1).build()?;
/// let x = Tensor::from_f32(&[1, 64], vec![0.0; 64])?;
/// let outputs = s.run(&[("input", x)])?;
/// println!("{} {:?}: {:?}", s.outputs()[0].name, outputs[0].shape(), outputs[0].to_f32_vec());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Session {
    model: Arc<Model>,
    plan: Plan,
    arena: Vec<u128>,
    threads: usize,
    pool: Pool,
    provider: Provider,
    /// The GPU side of a CUDA session: device arena, weights, kernels.
    #[cfg(feature = "cuda")]
    cuda: Option<mote_cuda::CudaExecutor>,
}

/// Options of a [`Session`]: symbolic dims, input shapes, memory budget,
/// threads, execution provider.
#[derive(Debug, Clone)]
pub struct SessionBuilder {
    source: Source,
    dims: Vec<(String, usize)>,
    shapes: Vec<(String, Vec<usize>)>,
    max_arena: Option<usize>,
    max_memory: Option<usize>,
    max_loop: Option<u64>,
    external: ExternalData,
    threads: usize,
    provider: Provider,
}

#[derive(Debug, Clone)]
enum Source {
    Path(PathBuf),
    Model(Arc<Model>),
}

impl SessionBuilder {
    /// Options for a model already loaded.
    pub fn from_model(model: Arc<Model>) -> Self {
        SessionBuilder {
            source: Source::Model(model),
            dims: Vec::new(),
            shapes: Vec::new(),
            max_arena: None,
            max_memory: None,
            max_loop: None,
            external: ExternalData::default(),
            threads: 1,
            provider: Provider::Cpu,
        }
    }
    /// Binds a symbolic dimension such as `batch`.
    pub fn dim(mut self, name: &str, value: usize) -> Self {
        self.dims.push((name.into(), value));
        self
    }
    /// Sets the full shape of a graph input.
    pub fn input_shape(mut self, name: &str, shape: &[usize]) -> Self {
        self.shapes.push((name.into(), shape.into()));
        self
    }
    /// Refuses plans whose arena exceeds `bytes`.
    pub fn max_arena_bytes(mut self, bytes: usize) -> Self {
        self.max_arena = Some(bytes);
        self
    }
    /// Refuses, before allocating anything for it, a plan whose weights,
    /// folded constants and arena together exceed `bytes`
    /// ([`mote_core::SessionBuilder::max_memory`]); the model file being
    /// read is not counted. Kernels then keep no packed copies of weights
    /// (the speed of x86_64's f32 MatMul with a constant B and direct
    /// Conv, for the memory of a second copy of those weights).
    pub fn max_memory(mut self, bytes: usize) -> Self {
        self.max_memory = Some(bytes);
        self
    }
    /// Bounds every `Loop` node's iterations per run
    /// ([`mote_core::SessionBuilder::max_loop_iterations`]).
    pub fn max_loop_iterations(mut self, n: u64) -> Self {
        self.max_loop = Some(n);
        self
    }
    /// Where tensors stored in external files may be read from (default:
    /// inside the model's folder only). Applies when the model is loaded
    /// from a path by [`SessionBuilder::build`].
    pub fn external_data(mut self, policy: ExternalData) -> Self {
        self.external = policy;
        self
    }
    /// Intra-op threads (like onnxruntime's `intra_op_num_threads`; default
    /// 1): with `n > 1` the session runs on its own pool of `n` threads,
    /// and GEMMs, Conv output channels and batches are split among them.
    /// Results are bit-identical to one thread's. `n > 1` needs the `rayon`
    /// feature (on by default); [`SessionBuilder::build`] refuses 0, and
    /// `n > 1` without the feature.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }
    /// Where the session runs (default [`Provider::Cpu`]). With
    /// [`Provider::Cuda`], [`SessionBuilder::build`] opens the device,
    /// uploads the weights the GPU steps read and compiles the kernels;
    /// the steps the GPU does not support run on the CPU (on the session's
    /// threads). It errs, and never falls back to the CPU alone, when this
    /// build has no CUDA support (feature `cuda`) or the machine has no
    /// driver or no such device.
    pub fn provider(mut self, provider: Provider) -> Self {
        self.provider = provider;
        self
    }
    /// Loads the model (if given by path) and plans it (and, for a CUDA
    /// session, binds the plan to the device).
    pub fn build(self) -> Result<Session> {
        crate::threads::check(self.threads)?;
        self.provider.check_compiled_in()?;
        crate::cpu::init();
        let model = match self.source {
            Source::Path(p) => Arc::new(load_model_with(&p, self.external)?),
            Source::Model(m) => m,
        };
        let names: Vec<&str> = model.input_names().collect();
        for (n, _) in &self.shapes {
            if !names.contains(&n.as_str()) {
                return Err(Error::Input(format!(
                    "unknown input '{n}' (model inputs: {})",
                    names.join(", ")
                )));
            }
        }
        let mut b = model.session_builder();
        for (n, v) in &self.dims {
            b = b.dim(n, *v);
        }
        for (n, s) in &self.shapes {
            b = b.input_shape(n, s);
        }
        if let Some(m) = self.max_arena {
            b = b.max_arena_bytes(m);
        }
        if let Some(m) = self.max_memory {
            b = b.max_memory(m);
        }
        if let Some(n) = self.max_loop {
            b = b.max_loop_iterations(n);
        }
        let plan = b.plan().map_err(|e| explain(&model, &e))?;
        let words = plan.arena_bytes().div_ceil(16).max(1);
        let mut arena = Vec::new();
        arena.try_reserve_exact(words).map_err(|_| {
            Error::Model(format!(
                "out of memory: the arena of {} bytes could not be allocated",
                plan.arena_bytes()
            ))
        })?;
        arena.resize(words, 0u128);
        let pool = Pool::new(self.threads)?;
        #[cfg(feature = "cuda")]
        let cuda = match self.provider {
            Provider::Cpu => None,
            Provider::Cuda { device } => {
                let mut x = cuda_executor(&model, &plan, device)?;
                let bytes = std::mem::size_of_val(&arena[..]);
                // SAFETY: the arena's buffer is never reallocated (no push
                // or resize after this) and the Session drops the executor
                // (which unregisters it) before the arena (see its Drop).
                unsafe { x.register_host(arena.as_mut_ptr().cast(), bytes) };
                Some(x)
            }
        };
        Ok(Session {
            model,
            plan,
            arena,
            threads: self.threads,
            pool,
            provider: self.provider,
            #[cfg(feature = "cuda")]
            cuda,
        })
    }
}

/// A CUDA provider on `device` and an executor of `plan` on it.
#[cfg(feature = "cuda")]
fn cuda_executor(model: &Model, plan: &Plan, device: usize) -> Result<mote_cuda::CudaExecutor> {
    let provider = mote_cuda::CudaProvider::new(device)
        .map_err(|e| Error::Provider(format!("provider cuda:{device}: {e}")))?;
    mote_cuda::CudaExecutor::new(Arc::new(provider), model, plan)
        .map_err(|e| cuda_error(model, device, e))
}

/// A mote-cuda error as a session error: core errors explained with the
/// model's names, the others prefixed with the provider.
#[cfg(feature = "cuda")]
fn cuda_error(model: &Model, device: usize, e: mote_cuda::Error) -> Error {
    match e {
        mote_cuda::Error::Core(e) => explain(model, &e),
        e => Error::Provider(format!("provider cuda:{device}: {e}")),
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The executor unpins the arena: it must go first.
        #[cfg(feature = "cuda")]
        drop(self.cuda.take());
    }
}

impl Session {
    /// Loads and plans a model with default bindings (unbound dims are 1).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::builder(path).build()
    }
    /// Options for a model file.
    pub fn builder(path: impl AsRef<Path>) -> SessionBuilder {
        SessionBuilder {
            source: Source::Path(path.as_ref().to_path_buf()),
            ..SessionBuilder::from_model(Arc::default())
        }
    }
    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    /// Intra-op threads ([`SessionBuilder::threads`]).
    pub fn threads(&self) -> usize {
        self.threads
    }
    /// Where the session runs ([`SessionBuilder::provider`]).
    pub fn provider(&self) -> Provider {
        self.provider
    }
    /// The GPU's name for a CUDA session (`NVIDIA H200`); `None` on the CPU.
    pub fn device_name(&self) -> Option<&str> {
        #[cfg(feature = "cuda")]
        if let Some(x) = &self.cuda {
            return Some(x.provider().device_name());
        }
        None
    }
    /// How a CUDA session runs (CUDA graphs, cuDNN, page-locked copies:
    /// [`mote_cuda::CudaExecutor::summary`]); `None` on the CPU.
    pub fn cuda_summary(&self) -> Option<String> {
        #[cfg(feature = "cuda")]
        if let Some(x) = &self.cuda {
            return Some(x.summary());
        }
        None
    }
    /// The CUDA executor of a CUDA session: its partition
    /// ([`mote_cuda::CudaExecutor::partition`]) and device memory.
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Option<&mote_cuda::CudaExecutor> {
        self.cuda.as_ref()
    }
    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
    /// Graph inputs with bound shapes.
    pub fn inputs(&self) -> &[IoInfo] {
        self.plan.inputs()
    }
    /// Graph outputs with inferred shapes.
    pub fn outputs(&self) -> &[IoInfo] {
        self.plan.outputs()
    }

    /// Checks `inputs` against the plan: every input given once, by a known
    /// name, with the bound dtype and shape.
    pub fn check_inputs(&self, inputs: &[(&str, Tensor)]) -> Result<()> {
        for (n, _) in inputs {
            if !self.inputs().iter().any(|i| i.name == *n) {
                let names: Vec<&str> = self.inputs().iter().map(|i| i.name.as_str()).collect();
                return Err(Error::Input(format!(
                    "unknown input '{n}' (model inputs: {})",
                    names.join(", ")
                )));
            }
        }
        for info in self.inputs() {
            let given: Vec<&Tensor> = inputs
                .iter()
                .filter(|(n, _)| *n == info.name)
                .map(|(_, t)| t)
                .collect();
            let t = match given[..] {
                [t] => t,
                [] => return Err(Error::Input(format!("input '{}' not given", info.name))),
                _ => {
                    return Err(Error::Input(format!(
                        "input '{}' given more than once",
                        info.name
                    )))
                }
            };
            if t.dtype() != info.dtype || t.shape() != &info.shape[..] {
                return Err(Error::Input(format!(
                    "input '{}': expected {} {}, got {} {}",
                    info.name,
                    info.dtype,
                    fmt_shape(&info.shape),
                    t.dtype(),
                    fmt_shape(t.shape())
                )));
            }
        }
        Ok(())
    }

    /// Runs once on the GPU with CUDA events around every GPU step
    /// ([`mote_cuda::CudaExecutor::invoke_profiled`]); `None` for a CPU
    /// session.
    #[cfg(feature = "cuda")]
    pub fn profile_gpu(
        &mut self,
        inputs: &[(&str, Tensor)],
    ) -> Result<Option<Vec<mote_cuda::StepTime>>> {
        self.check_inputs(inputs)?;
        let Some(x) = self.cuda.as_ref() else {
            return Ok(None);
        };
        let device = match self.provider {
            Provider::Cuda { device } => device,
            Provider::Cpu => 0,
        };
        let views: Vec<(&str, TensorView<'_>)> =
            inputs.iter().map(|(n, t)| (*n, t.view())).collect();
        let model = &*self.model;
        let arena: &mut [u8] = bytemuck::cast_slice_mut(&mut self.arena);
        let mut s =
            mote_core::Session::new(model, &self.plan, arena).map_err(|e| explain(model, &e))?;
        s.feed(&views).map_err(|e| explain(model, &e))?;
        x.invoke_profiled(&mut s)
            .map(Some)
            .map_err(|e| cuda_error(model, device, e))
    }

    /// Runs once on owned inputs (by name); returns the outputs in the
    /// order of [`Session::outputs`].
    pub fn run(&mut self, inputs: &[(&str, Tensor)]) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        let views: Vec<(&str, TensorView<'_>)> =
            inputs.iter().map(|(n, t)| (*n, t.view())).collect();
        let model = &*self.model;
        let plan = &self.plan;
        let arena: &mut [u8] = bytemuck::cast_slice_mut(&mut self.arena);
        #[cfg(feature = "cuda")]
        let cuda = self.cuda.as_ref();
        #[cfg(feature = "cuda")]
        let device = match self.provider {
            Provider::Cuda { device } => device,
            Provider::Cpu => 0,
        };
        let outputs = self.pool.install(|| -> Result<Vec<Tensor>> {
            let mut s =
                mote_core::Session::new(model, plan, arena).map_err(|e| explain(model, &e))?;
            #[cfg(feature = "cuda")]
            if let Some(x) = cuda {
                x.run(&mut s, &views)
                    .map_err(|e| cuda_error(model, device, e))?;
            } else {
                s.run(&views).map_err(|e| explain(model, &e))?;
            }
            #[cfg(not(feature = "cuda"))]
            s.run(&views).map_err(|e| explain(model, &e))?;
            (0..plan.outputs().len())
                .map(|i| {
                    s.output(i)
                        .map(|v| Tensor::from_view(&v))
                        .map_err(|e| explain(model, &e))
                })
                .collect()
        })??;
        Ok(outputs)
    }
}
