//! onnxruntime's `com.microsoft` quantized operators (the QOperator format
//! of its quantizer): QLinearAdd, QLinearMul, QLinearSigmoid,
//! QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearAveragePool,
//! QLinearConcat and QGemm, over int8 / uint8 data.
//!
//! Arithmetic is integer with the fixed-point [`requant`](crate::ops::requant)
//! module (round half to even, saturating):
//! - Add: `Requant2` over `(a - za, b - zb)` with multipliers `sa/sc`,
//!   `sb/sc`; Mul: `Requant` of `(a - za)(b - zb)` by `sa·sb/sc`;
//!   both broadcast numpy-style;
//! - the average pools sum `x - zx` exactly and divide with
//!   [`Requant::apply_div`] (`sx/sy`); QLinearAveragePool counts the full
//!   kernel when `count_include_pad` is set, the in-bounds taps otherwise, as
//!   onnxruntime does (no dilations);
//! - QGemm accumulates `Σ (a - za)(b - zb) + C` in i32 and requantizes by
//!   `alpha·sa·sb[j]/sy` (per-column `b_scale` / `b_zero_point` allowed);
//!   without `y_scale` the output is f32 `acc · (alpha·sa·sb[j])`;
//! - Sigmoid, LeakyRelu and Concat map each input value through a 256-entry
//!   table built like onnxruntime's: dequantize in f32, apply the function,
//!   quantize with `rint(v / sy) + zy`. With constant scales / zero points
//!   (the usual case) the tables and multipliers are built at prepare;
//!   otherwise the kernel builds them from the inputs at each run, on the
//!   stack.
//!
//! Scales are f32 and per tensor (one element), except QGemm's `b_scale`;
//! a missing zero point is 0.

use alloc::vec::Vec;

use crate::compiled::export::{Export, Params};
use crate::compiled::op::OpView;
use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::qbin::{qbinary, BinParams};
use crate::kern::qpool::{avg_pool, global_avg, PoolParams};
use crate::kern::{check_len, win_mut};
use crate::ops::conv::forward_geom;
use crate::ops::matmul::gemm_geom;
use crate::ops::requant::{clamp, Requant, Requant2};
use crate::ops::{util, Kernel, KernelIo, OpDef, PrepareCtx, Prepared, Unary};
use crate::tensor::{broadcast_shapes, broadcast_strides, ChunksOf as _, TensorView, MAX_RANK};
use crate::DType;

/// Domain of this family.
const MS: &str = "com.microsoft";

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::domain(MS, "QLinearAdd", 1, prepare_add),
    OpDef::domain(MS, "QLinearMul", 1, prepare_mul),
    OpDef::domain(MS, "QLinearSigmoid", 1, prepare_sigmoid),
    OpDef::domain(MS, "QLinearLeakyRelu", 1, prepare_leaky_relu),
    OpDef::domain(MS, "QLinearGlobalAveragePool", 1, prepare_global_avg),
    OpDef::domain(MS, "QLinearAveragePool", 1, prepare_avg_pool),
    OpDef::domain(MS, "QLinearConcat", 1, prepare_concat),
    OpDef::domain(MS, "QGemm", 1, prepare_qgemm),
];

use crate::kern::QInt as Q8;
use crate::ops::qlinear::with_qint as with_q8;

fn len_err(expected: usize, got: usize) -> Error {
    Error::new(ErrorKind::Len {
        expected: expected as u64,
        got: got as u64,
    })
}

fn shape_err(what: &'static str) -> Error {
    Error::new(ErrorKind::Shape(what))
}

fn overflow() -> Error {
    Error::new(ErrorKind::Overflow)
}

/// Table lookup of a byte pattern (the `u8` index is always in the
/// 256-entry table; the compiler drops the check).
#[inline]
fn lut(t: &Table, b: u8) -> Result<u8> {
    t.get(usize::from(b))
        .copied()
        .ok_or(Error::internal("lookup table index"))
}

/// `v` quantized like onnxruntime's `MlasQuantizeLinear`: `rint(v / s) + z`,
/// saturated (NaN gives the zero point).
#[inline]
fn quantize<T: Q8>(v: f32, s: f32, z: i32) -> T {
    let q = libm::rintf(v / s);
    let q = if q.is_nan() {
        0
    } else {
        q.clamp(-1.0e9, 1.0e9) as i64
    };
    T::from_sat(clamp(q, z, T::LO, T::HI))
}

// ---------------------------------------------------------------------------
// Scales and zero points
// ---------------------------------------------------------------------------

/// Reads optional input `i` (a constant at prepare, the live tensor at run).
type Get<'g, 'a> = &'g dyn Fn(usize) -> Result<Option<TensorView<'a>>>;

/// Checks at prepare that input `i` is a per-tensor f32 scale.
fn check_scale(ctx: &PrepareCtx<'_>, i: usize) -> Result<()> {
    let s = ctx.input_of(i, DType::F32)?;
    check_len(s.numel(), 1)
}

/// Checks at prepare that optional input `i` is a per-tensor zero point of
/// dtype `dt`.
fn check_zp(ctx: &PrepareCtx<'_>, i: usize, dt: DType) -> Result<()> {
    if ctx.opt_input(i).is_some() {
        let z = ctx.input_of(i, dt)?;
        check_len(z.numel(), 1)?;
    }
    Ok(())
}

/// Whether every present input among `idx` is known at build time.
fn all_const(ctx: &PrepareCtx<'_>, idx: &[usize]) -> bool {
    idx.iter()
        .all(|&i| ctx.opt_input(i).is_none_or(|x| x.value.is_some()))
}

/// Getter over the constant inputs of prepare.
fn const_get<'a>(ctx: &'a PrepareCtx<'a>) -> impl Fn(usize) -> Result<Option<TensorView<'a>>> + 'a {
    move |i| Ok(ctx.opt_input(i).and_then(|x| x.value))
}

/// A per-tensor scale: one finite f32 > 0.
fn scale(get: Get<'_, '_>, i: usize) -> Result<f32> {
    let v = get(i)?.ok_or(Error::new(ErrorKind::MissingInput { index: i }))?;
    if v.dtype() != DType::F32 {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: DType::F32,
            got: v.dtype(),
        }));
    }
    check_len(v.numel(), 1)?;
    let s = v.f64_at(0).ok_or(len_err(1, 0))? as f32;
    if !(s.is_finite() && s > 0.0) {
        return Err(Error::new(ErrorKind::Invalid(
            "quantization scale must be finite and > 0",
        )));
    }
    Ok(s)
}

/// A per-tensor zero point of dtype `dt` (0 when absent).
fn zero_point(get: Get<'_, '_>, i: usize, dt: DType) -> Result<i32> {
    let Some(v) = get(i)? else {
        return Ok(0);
    };
    if v.dtype() != dt {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: dt,
            got: v.dtype(),
        }));
    }
    check_len(v.numel(), 1)?;
    Ok(v.int_at(0).ok_or(len_err(1, 0))? as i32)
}

/// A kernel whose parameters `P` come from scale / zero-point inputs:
/// computed at prepare when those are constant, else at each run.
struct ParamKernel<P, F> {
    name: &'static str,
    pre: Option<P>,
    make: fn(Get<'_, '_>, DType) -> Result<P>,
    dt: DType,
    run: F,
}

impl<P, F> core::fmt::Debug for ParamKernel<P, F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.name)
    }
}

impl<P, F> Kernel for ParamKernel<P, F>
where
    P: Send + Sync,
    F: Fn(&mut KernelIo<'_>, &P) -> Result<()> + Send + Sync,
{
    fn run(&self, io: &mut KernelIo<'_>) -> Result<()> {
        match &self.pre {
            Some(p) => (self.run)(io, p),
            None => {
                let p = {
                    let get = |i: usize| io.opt_input(i);
                    (self.make)(&get, self.dt)?
                };
                (self.run)(io, &p)
            }
        }
    }
}

/// Builds a [`ParamKernel`], precomputing `P` when inputs `params` are
/// constant.
fn param_kernel<P, F>(
    ctx: &PrepareCtx<'_>,
    name: &'static str,
    params: &[usize],
    dt: DType,
    make: fn(Get<'_, '_>, DType) -> Result<P>,
    run: F,
) -> Result<ParamKernel<P, F>>
where
    F: Fn(&mut KernelIo<'_>, &P) -> Result<()>,
{
    let pre = if all_const(ctx, params) {
        let get = const_get(ctx);
        Some(make(&get, dt)?)
    } else {
        None
    };
    Ok(ParamKernel {
        name,
        pre,
        make,
        dt,
        run,
    })
}

// ---------------------------------------------------------------------------
// QLinearAdd, QLinearMul
// ---------------------------------------------------------------------------

// Inputs: A, A_scale, A_zero_point?, B, B_scale, B_zero_point?, C_scale,
// C_zero_point?.
fn bin_params(get: Get<'_, '_>, dt: DType, is_add: bool) -> Result<BinParams> {
    let (sa, sb, sc) = (scale(get, 1)?, scale(get, 4)?, scale(get, 6)?);
    let (sa, sb, sc) = (sa as f64, sb as f64, sc as f64);
    // Only the one the op uses is validated (the other is a placeholder).
    let (add, mul) = if is_add {
        (Requant2::new(sa / sc, sb / sc)?, Requant::new(1.0)?)
    } else {
        (Requant2::new(1.0, 1.0)?, Requant::new(sa * sb / sc)?)
    };
    Ok(BinParams {
        za: zero_point(get, 2, dt)?,
        zb: zero_point(get, 5, dt)?,
        zc: zero_point(get, 7, dt)?,
        add,
        mul,
    })
}

fn add_params(get: Get<'_, '_>, dt: DType) -> Result<BinParams> {
    bin_params(get, dt, true)
}

fn mul_params(get: Get<'_, '_>, dt: DType) -> Result<BinParams> {
    bin_params(get, dt, false)
}

fn prepare_add(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_binary(ctx, "QLinearAdd", add_params, true)
}

fn prepare_mul(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_binary(ctx, "QLinearMul", mul_params, false)
}

fn prepare_binary(
    ctx: &PrepareCtx<'_>,
    name: &'static str,
    make: fn(Get<'_, '_>, DType) -> Result<BinParams>,
    is_add: bool,
) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let dt = a.dtype;
    util::dtype_in(dt, &[DType::U8, DType::I8], "QLinearAdd / QLinearMul A")?;
    let b = ctx.input_of(3, dt)?;
    for i in [1, 4, 6] {
        check_scale(ctx, i)?;
    }
    for i in [2, 5, 7] {
        check_zp(ctx, i, dt)?;
    }
    let mut os = [0usize; MAX_RANK];
    let r = broadcast_shapes(a.shape, b.shape, &mut os)?;
    let shape: Vec<usize> = os
        .get(..r)
        .ok_or(Error::internal("broadcast rank"))?
        .to_vec();
    let strides = [
        broadcast_strides(a.shape, &shape),
        broadcast_strides(b.shape, &shape),
    ];
    let (na, nb) = (a.numel(), b.numel());
    let out = shape.clone();
    if all_const(ctx, &[1, 2, 4, 5, 6, 7]) {
        let get = const_get(ctx);
        // `os` is the shape zero-padded to MAX_RANK (broadcast_shapes
        // writes the first `r` entries only).
        let v = OpView::QBinary {
            dt,
            is_add,
            rank: r,
            shape: os,
            strides,
            p: make(&get, dt)?,
        };
        return Ok(Prepared::single(
            dt,
            &out,
            Export::new(name, [0, 3], Params::Plain(v)),
        ));
    }
    with_q8!(dt, name, T => {
        let k = param_kernel(ctx, name, &[1, 2, 4, 5, 6, 7], dt, make, move |io, p: &BinParams| {
            let a = io.input_slice::<T>(0)?;
            let b = io.input_slice::<T>(3)?;
            check_len(a.len(), na)?;
            check_len(b.len(), nb)?;
            qbinary(a, b, io.output_slice::<T>(0)?, &shape, strides, is_add, p)
        })?;
        Ok(Prepared::single(dt, &out, k))
    })
}

// ---------------------------------------------------------------------------
// Lookup-table ops: QLinearSigmoid, QLinearLeakyRelu
// ---------------------------------------------------------------------------

/// Maps byte patterns of the input type to byte patterns of the output.
type Table = [u8; 256];

/// `table[x] = quantize(f(sx · (x - zx)), sy, zy)` over all 256 values
/// (`zx` a zero point of type `T`, as [`zero_point`] reads it).
fn build_table<T: Q8>(sx: f32, zx: i32, sy: f32, zy: i32, f: impl Fn(f32) -> f32) -> Table {
    let mut t = [0u8; 256];
    for (i, e) in t.iter_mut().enumerate() {
        let x = T::from_bits(i as u8);
        // Both 8-bit values of T: |x - zx| <= 255, exact in i32.
        let v = sx * x.get().wrapping_sub(zx) as f32;
        *e = quantize::<T>(f(v), sy, zy).bits();
    }
    t
}

/// Inputs X, X_scale, X_zero_point?, Y_scale, Y_zero_point?; the f32
/// function is `f(v, alpha)`.
fn prepare_lookup(
    ctx: &PrepareCtx<'_>,
    name: &'static str,
    make: fn(Get<'_, '_>, DType) -> Result<Table>,
) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let dt = x.dtype;
    util::dtype_in(dt, &[DType::U8, DType::I8], name)?;
    check_scale(ctx, 1)?;
    check_scale(ctx, 3)?;
    check_zp(ctx, 2, dt)?;
    check_zp(ctx, 4, dt)?;
    let n = x.numel();
    with_q8!(dt, name, T => {
        let k = param_kernel(ctx, name, &[1, 2, 3, 4], dt, make, move |io, t: &Table| {
            if !io.is_inplace() {
                check_len(io.input(0)?.numel(), n)?;
            }
            map_table(io.unary::<T>()?, t)
        })?;
        Ok(Prepared::single(dt, x.shape, k).in_place())
    })
}

/// Maps every element through `t` (in place or not).
fn map_table<T: Q8>(u: Unary<'_, T>, t: &Table) -> Result<()> {
    match u {
        Unary::Separate(x, y) => {
            for (o, &v) in y.iter_mut().zip(x) {
                *o = T::from_bits(lut(t, v.bits())?);
            }
        }
        Unary::InPlace(y) => {
            for o in y.iter_mut() {
                *o = T::from_bits(lut(t, o.bits())?);
            }
        }
    }
    Ok(())
}

fn lookup_table(get: Get<'_, '_>, dt: DType, f: impl Fn(f32) -> f32) -> Result<Table> {
    let (sx, sy) = (scale(get, 1)?, scale(get, 3)?);
    let (zx, zy) = (zero_point(get, 2, dt)?, zero_point(get, 4, dt)?);
    with_q8!(dt, "quantized lookup", T => Ok(build_table::<T>(sx, zx, sy, zy, &f)))
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + libm::expf(-v))
}

fn sigmoid_table(get: Get<'_, '_>, dt: DType) -> Result<Table> {
    lookup_table(get, dt, sigmoid)
}

fn prepare_sigmoid(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_lookup(ctx, "QLinearSigmoid", sigmoid_table)
}

/// QLinearLeakyRelu: the table of `v >= 0 ? v : alpha · v` (attribute
/// `alpha`, default 0.01).
fn prepare_leaky_relu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 0.01)?;
    let name = "QLinearLeakyRelu";
    let x = ctx.input(0)?;
    let dt = x.dtype;
    util::dtype_in(dt, &[DType::U8, DType::I8], name)?;
    check_scale(ctx, 1)?;
    check_scale(ctx, 3)?;
    check_zp(ctx, 2, dt)?;
    check_zp(ctx, 4, dt)?;
    let n = x.numel();
    let f = move |v: f32| if v >= 0.0 { v } else { v * alpha };
    let pre = if all_const(ctx, &[1, 2, 3, 4]) {
        let get = const_get(ctx);
        Some(lookup_table(&get, dt, f)?)
    } else {
        None
    };
    with_q8!(dt, name, T => {
        let k = crate::ops::kernel(name, move |io| {
            let t = match pre {
                Some(t) => t,
                None => {
                    let get = |i: usize| io.opt_input(i);
                    lookup_table(&get, dt, f)?
                }
            };
            if !io.is_inplace() {
                check_len(io.input(0)?.numel(), n)?;
            }
            map_table(io.unary::<T>()?, &t)
        });
        Ok(Prepared::single(dt, x.shape, k).in_place())
    })
}

// ---------------------------------------------------------------------------
// Average pools
// ---------------------------------------------------------------------------

// Inputs X, x_scale, x_zero_point?, y_scale, y_zero_point?.
fn pool_params(get: Get<'_, '_>, dt: DType) -> Result<PoolParams> {
    let (sx, sy) = (scale(get, 1)?, scale(get, 3)?);
    Ok(PoolParams {
        zx: zero_point(get, 2, dt)?,
        zy: zero_point(get, 4, dt)?,
        r: Requant::new(sx as f64 / sy as f64)?,
    })
}

/// Validates X and the parameter inputs of a pool; returns X's dtype and
/// shape and `channels_last`.
fn pool_input<'a>(ctx: &PrepareCtx<'a>, name: &'static str) -> Result<(DType, &'a [usize], bool)> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, &[DType::U8, DType::I8], name)?;
    if x.shape.len() < 3 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 3,
            got: x.shape.len(),
        }));
    }
    check_scale(ctx, 1)?;
    check_scale(ctx, 3)?;
    check_zp(ctx, 2, x.dtype)?;
    check_zp(ctx, 4, x.dtype)?;
    let cl = ctx.attr_int("channels_last", 0)? != 0;
    Ok((x.dtype, x.shape, cl))
}

/// `(batch, channels, spatial dims)` of an NCHW or NHWC shape.
fn split_nc(xs: &[usize], channels_last: bool) -> Result<(usize, usize, &[usize])> {
    let rank = || {
        Error::new(ErrorKind::Rank {
            expected: 3,
            got: xs.len(),
        })
    };
    let (&n, rest) = xs.split_first().ok_or_else(rank)?;
    let (&c, sp) = if channels_last {
        rest.split_last()
    } else {
        rest.split_first()
    }
    .ok_or_else(rank)?;
    Ok((n, c, sp))
}

/// `[n, c, spatial...]` or `[n, spatial..., c]`.
fn join_nc(n: usize, c: usize, sp: &[usize], channels_last: bool) -> Vec<usize> {
    let mut v = alloc::vec![n];
    if !channels_last {
        v.push(c);
    }
    v.extend_from_slice(sp);
    if channels_last {
        v.push(c);
    }
    v
}

fn prepare_global_avg(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let name = "QLinearGlobalAveragePool";
    let (dt, xs, cl) = pool_input(ctx, name)?;
    let (n, c, sp) = split_nc(xs, cl)?;
    let img = checked_numel(sp)?;
    let ones = alloc::vec![1usize; sp.len()];
    let out = join_nc(n, c, &ones, cl);
    if all_const(ctx, &[1, 2, 3, 4]) {
        let get = const_get(ctx);
        let v = OpView::QGlobalAvg {
            dt,
            n,
            c,
            img,
            cl,
            p: pool_params(&get, dt)?,
        };
        return Ok(Prepared::single(
            dt,
            &out,
            Export::new(name, [0, 0], Params::Plain(v)),
        ));
    }
    with_q8!(dt, name, T => {
        let k = param_kernel(ctx, name, &[1, 2, 3, 4], dt, pool_params, move |io, p: &PoolParams| {
            let x = io.input_slice::<T>(0)?;
            global_avg(x, io.output_slice::<T>(0)?, n, c, img, cl, p)
        })?;
        Ok(Prepared::single(dt, &out, k))
    })
}

fn prepare_avg_pool(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let name = "QLinearAveragePool";
    let (dt, xs, cl) = pool_input(ctx, name)?;
    let (n, c, sp) = split_nc(xs, cl)?;
    let k: Vec<usize> = match ctx.attr_ints("kernel_shape")? {
        None => {
            return Err(Error::new(ErrorKind::Attribute {
                name: "kernel_shape",
                problem: "required",
            }))
        }
        Some(v) => v
            .iter()
            .map(|&x| {
                usize::try_from(x)
                    .ok()
                    .filter(|&x| x >= 1)
                    .ok_or(Error::new(ErrorKind::Attribute {
                        name: "kernel_shape",
                        problem: "must be positive",
                    }))
            })
            .collect::<Result<_>>()?,
    };
    if let Some(d) = ctx.attr_ints("dilations")? {
        if d.iter().any(|&d| d != 1) {
            return Err(Error::new(ErrorKind::Unsupported(
                "QLinearAveragePool with dilations",
            )));
        }
    }
    let ceil_mode = ctx.attr_int("ceil_mode", 0)? != 0;
    let include = ctx.attr_int("count_include_pad", 0)? != 0;
    let g = forward_geom(ctx, sp, &k, ceil_mode)?;
    let osp = g
        .out
        .len()
        .checked_sub(sp.len())
        .and_then(|from| g.out.get(from..))
        .ok_or(Error::internal("QLinearAveragePool output rank"))?;
    let out = join_nc(n, c, osp, cl);
    if all_const(ctx, &[1, 2, 3, 4]) {
        let get = const_get(ctx);
        let v = OpView::QAvgPool {
            dt,
            n,
            c,
            cl,
            include,
            g,
            p: pool_params(&get, dt)?,
        };
        return Ok(Prepared::single(
            dt,
            &out,
            Export::new(name, [0, 0], Params::Plain(v)),
        ));
    }
    with_q8!(dt, name, T => {
        let kern = param_kernel(ctx, name, &[1, 2, 3, 4], dt, pool_params, move |io, p: &PoolParams| {
            let x = io.input_slice::<T>(0)?;
            let y = io.output_slice::<T>(0)?;
            avg_pool(x, y, n, c, cl, &g, include, p)
        })?;
        Ok(Prepared::single(dt, &out, kern))
    })
}

// ---------------------------------------------------------------------------
// QLinearConcat
// ---------------------------------------------------------------------------

/// How one input's values become output values.
// Unboxed on purpose: with run-time scales the table is built on the stack
// (a kernel must not allocate).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
enum Map {
    /// Same scale and zero point: copy.
    Copy,
    /// Requantize through a table.
    Table(Table),
}

/// One input of QLinearConcat: its X, X_scale and X_zero_point inputs and
/// where its blocks go.
#[derive(Clone, Copy, Debug)]
struct Part {
    x: usize,
    scale: usize,
    zp: usize,
    /// Elements of one block (`len · inner`, `len` its size along the axis).
    block: usize,
    /// Elements of X (`outer · block`).
    numel: usize,
    /// Offset of its blocks in an output row of `total_axis · inner`.
    at: usize,
}

/// Inputs Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) triples.
fn concat_map(get: Get<'_, '_>, dt: DType, part: &Part) -> Result<Map> {
    let (sy, zy) = (scale(get, 0)?, zero_point(get, 1, dt)?);
    let (sx, zx) = (scale(get, part.scale)?, zero_point(get, part.zp, dt)?);
    if sx == sy && zx == zy {
        return Ok(Map::Copy);
    }
    with_q8!(dt, "QLinearConcat", T => Ok(Map::Table(build_table::<T>(sx, zx, sy, zy, |v| v))))
}

fn prepare_concat(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let name = "QLinearConcat";
    let ni = ctx.num_inputs();
    // At least one triple after Y_scale, Y_zero_point (ni >= 5).
    if !ni
        .checked_sub(2)
        .is_some_and(|r| r >= 3 && r.is_multiple_of(3))
    {
        return Err(Error::new(ErrorKind::Invalid(
            "QLinearConcat takes Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) triples",
        )));
    }
    check_scale(ctx, 0)?;
    let x0 = ctx.input(2)?;
    let dt = match ctx.opt_input(1) {
        Some(z) => z.dtype,
        None => x0.dtype,
    };
    util::dtype_in(dt, &[DType::U8, DType::I8], name)?;
    check_zp(ctx, 1, dt)?;
    let rank = x0.shape.len();
    if rank == 0 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 1,
            got: 0,
        }));
    }
    let axis = util::axis(
        ctx.attr_int("axis", i64::MIN).and_then(|a| {
            if a == i64::MIN {
                Err(Error::new(ErrorKind::Attribute {
                    name: "axis",
                    problem: "required",
                }))
            } else {
                Ok(a)
            }
        })?,
        rank,
        "axis",
    )?;
    let mut out: Vec<usize> = x0.shape.to_vec();
    let (outer, inner) = {
        let (head, tail) = out
            .split_at_checked(axis)
            .ok_or(Error::internal("QLinearConcat axis"))?;
        let rest = tail.get(1..).ok_or(Error::internal("QLinearConcat axis"))?;
        (checked_numel(head)?, checked_numel(rest)?)
    };
    let out_axis = out
        .get_mut(axis)
        .ok_or(Error::internal("QLinearConcat axis"))?;
    *out_axis = 0;
    let mut parts = Vec::new();
    let mut param_idx = alloc::vec![0usize, 1];
    // ni - 2 is a multiple of 3: base + 2 < ni for every triple.
    for base in (2..ni).step_by(3) {
        let (si, zi) = (base.wrapping_add(1), base.wrapping_add(2));
        let x = ctx.input_of(base, dt)?;
        check_scale(ctx, si)?;
        check_zp(ctx, zi, dt)?;
        param_idx.extend([si, zi]);
        if x.shape.len() != rank
            || x.shape
                .iter()
                .zip(x0.shape)
                .enumerate()
                .any(|(i, (&a, &b))| i != axis && a != b)
        {
            return Err(shape_err(
                "QLinearConcat inputs must match except along axis",
            ));
        }
        let &len = x
            .shape
            .get(axis)
            .ok_or(Error::internal("QLinearConcat axis"))?;
        // Sizes of this part and its offset in an output row, checked once:
        // the kernel only walks blocks of them.
        let block = len.checked_mul(inner).ok_or_else(overflow)?;
        parts.push(Part {
            x: base,
            scale: si,
            zp: zi,
            block,
            numel: outer.checked_mul(block).ok_or_else(overflow)?,
            at: out_axis.checked_mul(inner).ok_or_else(overflow)?,
        });
        *out_axis = out_axis.checked_add(len).ok_or_else(overflow)?;
    }
    let row = out_axis.checked_mul(inner).ok_or_else(overflow)?;
    let y_len = outer.checked_mul(row).ok_or_else(overflow)?;
    let pre: Option<Vec<Map>> = if all_const(ctx, &param_idx) {
        let get = const_get(ctx);
        Some(
            parts
                .iter()
                .map(|p| concat_map(&get, dt, p))
                .collect::<Result<_>>()?,
        )
    } else {
        None
    };
    with_q8!(dt, name, T => {
        let k = crate::ops::kernel(name, move |io| {
            for (j, part) in parts.iter().enumerate() {
                let map = match &pre {
                    Some(m) => *m.get(j).ok_or(Error::internal("QLinearConcat maps"))?,
                    None => {
                        let get = |i: usize| io.opt_input(i);
                        concat_map(&get, dt, part)?
                    }
                };
                let x = io.input_slice::<T>(part.x)?;
                check_len(x.len(), part.numel)?;
                let y = io.output_slice::<T>(0)?;
                check_len(y.len(), y_len)?;
                // `outer` blocks of X, one per output row (none when the
                // block or the row is empty: nothing to copy).
                for (src, yrow) in x.chunks_of(part.block).zip(y.chunks_of_mut(row)) {
                    let dst = win_mut(yrow, part.at, part.block)
                        .ok_or(Error::internal("QLinearConcat output block"))?;
                    match &map {
                        // A zip, not `copy_from_slice`: the lengths are
                        // equal, but its length-mismatch panic stays in
                        // the firmware when the optimizer cannot see it.
                        Map::Copy => {
                            for (d, &s) in dst.iter_mut().zip(src) {
                                *d = s;
                            }
                        }
                        Map::Table(t) => {
                            for (d, &s) in dst.iter_mut().zip(src) {
                                *d = T::from_bits(lut(t, s.bits())?);
                            }
                        }
                    }
                }
            }
            Ok(())
        });
        Ok(Prepared::single(dt, &out, k))
    })
}

// ---------------------------------------------------------------------------
// QGemm
// ---------------------------------------------------------------------------

/// Inputs A, a_scale, a_zero_point?, B, b_scale, b_zero_point?, C?,
/// y_scale?, y_zero_point?.
#[derive(Clone, Debug)]
struct GemmParams {
    za: i32,
    /// Per column of B (one entry when per tensor).
    zb: Vec<i32>,
    zy: i32,
    /// Per column: `alpha·sa·sb[j]` (f32 output) ...
    fscale: Vec<f32>,
    /// ... or the requantizer of `alpha·sa·sb[j]/sy`.
    req: Vec<Requant>,
}

/// Elements of a per-column parameter (`1` or `n`).
fn per_col(ctx: &PrepareCtx<'_>, i: usize, n: usize) -> Result<()> {
    if let Some(x) = ctx.opt_input(i) {
        let k = x.numel();
        if x.shape.len() > 1 || (k != 1 && k != n) {
            return Err(shape_err(
                "QGemm b_scale / b_zero_point must be a scalar or a 1-D vector of N",
            ));
        }
    }
    Ok(())
}

fn gemm_params(
    get: Get<'_, '_>,
    alpha: f32,
    dta: DType,
    dtb: DType,
    quant_out: bool,
) -> Result<GemmParams> {
    let sa = scale(get, 1)?;
    let za = zero_point(get, 2, dta)?;
    let bs = get(4)?.ok_or(Error::new(ErrorKind::MissingInput { index: 4 }))?;
    if bs.dtype() != DType::F32 {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: DType::F32,
            got: bs.dtype(),
        }));
    }
    let mut zb = Vec::new();
    if let Some(z) = get(5)? {
        if z.dtype() != dtb {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dtb,
                got: z.dtype(),
            }));
        }
        for i in 0..z.numel() {
            zb.push(z.int_at(i).ok_or(len_err(i.saturating_add(1), i))? as i32);
        }
    } else {
        zb.push(0);
    }
    let (sy, zy) = if quant_out {
        let sy = scale(get, 7)?;
        let zdt = get(8)?.map_or(dta, |z| z.dtype());
        (sy, zero_point(get, 8, zdt)?)
    } else {
        (1.0, 0)
    };
    let mut fscale = Vec::with_capacity(bs.numel());
    let mut req = Vec::new();
    for i in 0..bs.numel() {
        let sb = bs.f64_at(i).ok_or(len_err(i.saturating_add(1), i))? as f32;
        if !(sb.is_finite() && sb > 0.0) {
            return Err(Error::new(ErrorKind::Invalid(
                "quantization scale must be finite and > 0",
            )));
        }
        // onnxruntime's order: alpha · a_scale · b_scale[j] (/ y_scale).
        let m = alpha * sa * sb;
        fscale.push(m);
        if quant_out {
            // Applied in f32, as onnxruntime's MLAS requantization.
            req.push(Requant::f32_product(m / sy)?);
        }
    }
    Ok(GemmParams {
        za,
        zb,
        zy,
        fscale,
        req,
    })
}

/// The `k` elements `x[start + t * step]` (`t < k`) of one row or column of
/// a Gemm operand, checked once.
fn lane<T>(
    x: &[T],
    start: usize,
    step: usize,
    k: usize,
) -> Result<core::iter::Take<core::iter::StepBy<core::slice::Iter<'_, T>>>> {
    let Some(k1) = k.checked_sub(1) else {
        return Ok(x.iter().step_by(1).take(0));
    };
    let last = k1.checked_mul(step).and_then(|s| s.checked_add(start));
    if step == 0 || last.is_none_or(|l| l >= x.len()) {
        return Err(Error::internal("QGemm operand lane"));
    }
    Ok(x.get(start..)
        .ok_or(Error::internal("QGemm operand lane"))?
        .iter()
        .step_by(step)
        .take(k))
}

fn prepare_qgemm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let name = "QGemm";
    let a = ctx.input(0)?;
    let b = ctx.input(3)?;
    util::dtype_in(a.dtype, &[DType::U8, DType::I8], "QGemm A")?;
    util::dtype_in(b.dtype, &[DType::U8, DType::I8], "QGemm B")?;
    check_scale(ctx, 1)?;
    check_zp(ctx, 2, a.dtype)?;
    ctx.input_of(4, DType::F32)?;
    if let Some(z) = ctx.opt_input(5) {
        if z.dtype != b.dtype {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: b.dtype,
                got: z.dtype,
            }));
        }
    }
    let c = ctx.opt_input(6);
    if let Some(c) = c {
        util::dtype_in(c.dtype, &[DType::I32], "QGemm C")?;
    }
    let g = gemm_geom(ctx, a.shape, b.shape, c.map(|c| c.shape))?;
    per_col(ctx, 4, g.n)?;
    per_col(ctx, 5, g.n)?;
    let quant_out = ctx.opt_input(7).is_some();
    let ydt = if quant_out {
        check_scale(ctx, 7)?;
        let ydt = ctx.opt_input(8).map_or(a.dtype, |z| z.dtype);
        util::dtype_in(ydt, &[DType::U8, DType::I8], "QGemm y_zero_point")?;
        check_zp(ctx, 8, ydt)?;
        ydt
    } else {
        if ctx.opt_input(8).is_some() {
            return Err(Error::new(ErrorKind::Invalid(
                "QGemm y_zero_point without y_scale",
            )));
        }
        DType::F32
    };
    let alpha = ctx.attr_float("alpha", 1.0)?;
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(Error::new(ErrorKind::Attribute {
            name: "alpha",
            problem: "must be finite and > 0",
        }));
    }
    if quant_out {
        if let Some(fast) = super::qdq::qlinear_matmul(ctx, [6, 7, 8])? {
            return Ok(fast);
        }
    }
    let (dta, dtb) = (a.dtype, b.dtype);
    let make = move |get: Get<'_, '_>| gemm_params(get, alpha, dta, dtb, quant_out);
    let pre = if all_const(ctx, &[1, 2, 4, 5, 7, 8]) {
        let get = const_get(ctx);
        Some(make(&get)?)
    } else {
        None
    };
    // Sizes checked once: A is [m, lda] unless transposed and B [n, ldb]
    // when transposed, so a row start i·lda (i < m) stays under numel(A)
    // and a column start j·ldb (j < n) under numel(B); C's broadcast
    // strides (r, q) keep i·r + j·q under numel(C); the output index
    // i·n + j under m·n.
    let (na, nb) = (checked_numel(a.shape)?, checked_numel(b.shape)?);
    let cn = c.map_or(Ok(0), |c| checked_numel(c.shape))?;
    let mn = g.m.checked_mul(g.n).ok_or_else(overflow)?;
    with_q8!(dta, name, A => {
        with_q8!(dtb, name, B => {
            let k = crate::ops::kernel(name, move |io| {
                let owned;
                let p = match &pre {
                    Some(p) => p,
                    None => {
                        let get = |i: usize| io.opt_input(i);
                        owned = make(&get)?;
                        &owned
                    }
                };
                let a = io.input_slice::<A>(0)?;
                let b = io.input_slice::<B>(3)?;
                check_len(a.len(), na)?;
                check_len(b.len(), nb)?;
                let c = match g.c {
                    Some(s) => {
                        let cv = io.input_slice::<i32>(6)?;
                        check_len(cv.len(), cn)?;
                        Some((cv, s))
                    }
                    None => None,
                };
                let acc = |i: usize, j: usize| -> Result<i32> {
                    let &zb = p
                        .zb
                        .get(if p.zb.len() == 1 { 0 } else { j })
                        .ok_or(Error::internal("QGemm b_zero_point"))?;
                    // Row i of op(A) and column j of op(B), k elements each.
                    // Offsets exact under numel(A), numel(B), numel(C)
                    // (checked at prepare).
                    let al = if g.transa {
                        lane(a, i, g.lda, g.k)?
                    } else {
                        lane(a, i.wrapping_mul(g.lda), 1, g.k)?
                    };
                    let bl = if g.transb {
                        lane(b, j.wrapping_mul(g.ldb), 1, g.k)?
                    } else {
                        lane(b, j, g.ldb, g.k)?
                    };
                    // 8-bit values less 8-bit zero points (zero_point and
                    // gemm_params check their dtypes): each product is at
                    // most 255² in magnitude, exact in i32; the sum and C
                    // wrap in i32 (an int32 accumulator, wrapping by name).
                    let mut s = 0i32;
                    for (av, bv) in al.zip(bl) {
                        let d = av.get().wrapping_sub(p.za).wrapping_mul(bv.get().wrapping_sub(zb));
                        s = s.wrapping_add(d);
                    }
                    if let Some((cv, (r, q))) = c {
                        let at = i.wrapping_mul(r).wrapping_add(j.wrapping_mul(q));
                        s = s.wrapping_add(*cv.get(at).ok_or(Error::internal("QGemm C"))?);
                    }
                    Ok(s)
                };
                if quant_out {
                    with_q8!(ydt, name, Y => {
                        let y = io.output_slice::<Y>(0)?;
                        check_len(y.len(), mn)?;
                        for i in 0..g.m {
                            for j in 0..g.n {
                                let rq = p
                                    .req
                                    .get(if p.req.len() == 1 { 0 } else { j })
                                    .ok_or(Error::internal("QGemm requantizer"))?;
                                let v = rq.apply(acc(i, j)?);
                                let at = i.wrapping_mul(g.n).wrapping_add(j);
                                *y.get_mut(at).ok_or(Error::internal("QGemm output"))? =
                                    Y::from_sat(clamp(v, p.zy, Y::LO, Y::HI));
                            }
                        }
                        Ok(())
                    })
                } else {
                    let y = io.output_slice::<f32>(0)?;
                    check_len(y.len(), mn)?;
                    for i in 0..g.m {
                        for j in 0..g.n {
                            let &fs = p
                                .fscale
                                .get(if p.fscale.len() == 1 { 0 } else { j })
                                .ok_or(Error::internal("QGemm scale"))?;
                            let at = i.wrapping_mul(g.n).wrapping_add(j);
                            *y.get_mut(at).ok_or(Error::internal("QGemm output"))? =
                                acc(i, j)? as f32 * fs;
                        }
                    }
                    Ok(())
                }
            });
            Ok(Prepared::single(ydt, &[g.m, g.n], k))
        })
    })
}

#[cfg(test)]
mod tests;
