//! Convolution through cuDNN, where its library loads.
//!
//! One descriptor set per Conv step, built with the executor: NCHW f32,
//! cross-correlation, groups, and `CUDNN_FMA_MATH` (no tensor cores, so no
//! TF32: results stay within f32 rounding of the CPU provider). The
//! algorithm is cuDNN's first heuristic choice that is FMA-only. Anything
//! cuDNN refuses (asymmetric padding that changes the output size, a
//! status other than success) leaves the step on mote's own im2col + cuBLAS
//! path; `MOTE_CUDA_CUDNN=0` turns cuDNN off altogether.

use cudarc::cudnn::{result as dnn, sys};

use crate::lower::Window;

/// A cuDNN handle on the provider's stream.
pub(crate) struct Dnn {
    handle: sys::cudnnHandle_t,
}

// SAFETY: the handle is used only under the executor's run lock (or while
// the executor is built, before it is shared), never from two threads at
// once; cuDNN handles may move between threads.
unsafe impl Send for Dnn {}
// SAFETY: as above.
unsafe impl Sync for Dnn {}

impl Drop for Dnn {
    fn drop(&mut self) {
        // SAFETY: created by `Dnn::new`, destroyed once.
        let _ = unsafe { dnn::destroy_handle(self.handle) };
    }
}

impl Dnn {
    /// A handle on `stream`, or why not (library missing, init failure).
    pub(crate) fn new(stream: cudarc::driver::sys::CUstream) -> Result<Self, String> {
        if std::env::var("MOTE_CUDA_CUDNN").is_ok_and(|v| v == "0") {
            return Err("off (MOTE_CUDA_CUDNN=0)".into());
        }
        // SAFETY: dlopen probe only.
        if !unsafe { sys::is_culib_present() } {
            return Err("not found (libcudnn)".into());
        }
        let handle = dnn::create_handle().map_err(|e| format!("{e:?}"))?;
        let d = Dnn { handle };
        // SAFETY: a live handle and the provider's live stream.
        unsafe { dnn::set_stream(handle, stream as _) }.map_err(|e| format!("{e:?}"))?;
        Ok(d)
    }
}

/// Descriptors and algorithm of one convolution.
pub(crate) struct ConvPlan {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    /// Workspace bytes the algorithm needs.
    pub(crate) workspace: usize,
}

// SAFETY: descriptors are plain host objects, read-only after build.
unsafe impl Send for ConvPlan {}
// SAFETY: as above.
unsafe impl Sync for ConvPlan {}

impl std::fmt::Debug for ConvPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cudnn {:?}, workspace {} B", self.algo, self.workspace)
    }
}

impl Drop for ConvPlan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created in `plan_conv` and is
        // destroyed once.
        unsafe {
            let _ = dnn::destroy_tensor_descriptor(self.x);
            let _ = dnn::destroy_filter_descriptor(self.w);
            let _ = dnn::destroy_tensor_descriptor(self.y);
            let _ = dnn::destroy_convolution_descriptor(self.conv);
        }
    }
}

fn ok<T>(r: Result<T, dnn::CudnnError>) -> Option<T> {
    r.ok()
}

impl Dnn {
    /// cuDNN's plan for a Conv of `n` images `c → m` channels, or `None`
    /// when cuDNN cannot run exactly this convolution without TF32.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan_conv(
        &self,
        n: i64,
        c: i64,
        m: i64,
        group: i64,
        win: &Window,
    ) -> Option<ConvPlan> {
        let i = |v: i64| i32::try_from(v).ok();
        let f = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let mut p = ConvPlan {
            x: ok(dnn::create_tensor_descriptor())?,
            w: ok(dnn::create_filter_descriptor())?,
            y: ok(dnn::create_tensor_descriptor())?,
            conv: ok(dnn::create_convolution_descriptor())?,
            algo: sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            workspace: 0,
        };
        // SAFETY: every descriptor is freshly created above and owned by
        // `p` (destroyed on drop, also on the early returns).
        unsafe {
            ok(dnn::set_tensor4d_descriptor(
                p.x,
                nchw,
                f,
                [i(n)?, i(c)?, win.h, win.w],
            ))?;
            ok(dnn::set_filter4d_descriptor(
                p.w,
                f,
                nchw,
                [i(m)?, i(c / group)?, win.kh, win.kw],
            ))?;
            ok(dnn::set_convolution2d_descriptor(
                p.conv,
                win.ph,
                win.pw,
                win.sh,
                win.sw,
                win.dh,
                win.dw,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                f,
            ))?;
            ok(dnn::set_convolution_group_count(p.conv, i(group)?))?;
            ok(dnn::set_convolution_math_type(
                p.conv,
                sys::cudnnMathType_t::CUDNN_FMA_MATH,
            ))?;
            // cuDNN pads both ends alike: its output size must be the
            // plan's (ONNX pads may differ at the end).
            let (mut on, mut oc, mut oh, mut ow) = (0, 0, 0, 0);
            ok(sys::cudnnGetConvolution2dForwardOutputDim(
                p.conv, p.x, p.w, &mut on, &mut oc, &mut oh, &mut ow,
            )
            .result())?;
            if (on, oc, oh, ow) != (i(n)?, i(m)?, win.oh, win.ow) {
                return None;
            }
            ok(dnn::set_tensor4d_descriptor(p.y, nchw, f, [on, oc, oh, ow]))?;
            let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); 8];
            let mut count = 0;
            ok(dnn::get_convolution_forward_algorithm(
                self.handle,
                p.x,
                p.w,
                p.conv,
                p.y,
                perf.len() as i32,
                &mut count,
                perf.as_mut_ptr(),
            ))?;
            let best = perf.iter().take(usize::try_from(count).ok()?).find(|r| {
                r.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                    && r.mathType == sys::cudnnMathType_t::CUDNN_FMA_MATH
            })?;
            let workspace = ok(dnn::get_convolution_forward_workspace_size(
                self.handle,
                p.x,
                p.w,
                p.conv,
                p.y,
                best.algo,
            ))?;
            p.algo = best.algo;
            p.workspace = workspace;
            Some(p)
        }
    }

    /// `y = conv(x, w)` with the plan's algorithm; `ws` holds at least
    /// `plan.workspace` bytes.
    pub(crate) fn run_conv(
        &self,
        plan: &ConvPlan,
        x: u64,
        w: u64,
        y: u64,
        ws: u64,
    ) -> Result<(), String> {
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: x, w, y are device addresses of tensors with the shapes
        // the descriptors were built from (the plan's); ws is the
        // executor's scratch, at least `plan.workspace` bytes.
        unsafe {
            dnn::convolution_forward(
                self.handle,
                (&one as *const f32).cast(),
                plan.x,
                x as *const std::ffi::c_void,
                plan.w,
                w as *const std::ffi::c_void,
                plan.conv,
                plan.algo,
                ws as *mut std::ffi::c_void,
                plan.workspace,
                (&zero as *const f32).cast(),
                plan.y,
                y as *mut std::ffi::c_void,
            )
        }
        .map_err(|e| format!("cuDNN convolution: {e:?}"))
    }
}
