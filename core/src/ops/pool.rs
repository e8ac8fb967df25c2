//! Pooling operators: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool
//! (f32, NCHW layout; windowed pools over 1 to 3 spatial axes).

use alloc::vec::Vec;

use crate::error::{Error, ErrorKind, Result};
use crate::ops::conv::{forward_geom, valid_range, Geom};
use crate::ops::{kernel, util, OpDef, PrepareCtx, Prepared};
use crate::DType;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("MaxPool", 1, prepare_max_pool),
    OpDef::onnx("AveragePool", 1, prepare_avg_pool),
    OpDef::onnx("GlobalAveragePool", 1, prepare_global_avg),
    OpDef::onnx("GlobalMaxPool", 1, prepare_global_max),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Max,
    /// Average; the flag is `count_include_pad`.
    Avg(bool),
}

fn pool_input<'a>(ctx: &PrepareCtx<'a>) -> Result<&'a [usize]> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, &[DType::F32], "pool input")?;
    if x.shape.len() < 3 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 3,
            got: x.shape.len(),
        }));
    }
    Ok(x.shape)
}

fn prepare_window(ctx: &PrepareCtx<'_>, mode: Mode, name: &'static str) -> Result<Prepared> {
    let xs = pool_input(ctx)?;
    let n = xs.len() - 2;
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
                if x >= 1 {
                    Ok(x as usize)
                } else {
                    Err(Error::new(ErrorKind::Attribute {
                        name: "kernel_shape",
                        problem: "must be positive",
                    }))
                }
            })
            .collect::<Result<_>>()?,
    };
    let ceil_mode = ctx.attr_int("ceil_mode", 0)? != 0;
    let g = forward_geom(ctx, &xs[2..], &k, ceil_mode)?;
    let planes = xs[0] * xs[1];
    let mut shape = alloc::vec![xs[0], xs[1]];
    shape.extend_from_slice(&g.out[g.out.len() - n..]);
    Ok(Prepared::single(
        DType::F32,
        &shape,
        kernel(name, move |io| {
            let x = io.input_slice::<f32>(0)?;
            let y = io.output_slice::<f32>(0)?;
            pool(x, y, planes, &g, mode)
        }),
    ))
}

fn prepare_max_pool(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    if ctx.has_output(1) {
        return Err(Error::new(ErrorKind::Unsupported("MaxPool indices")));
    }
    prepare_window(ctx, Mode::Max, "MaxPool")
}

fn prepare_avg_pool(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let include = ctx.attr_int("count_include_pad", 0)? != 0;
    prepare_window(ctx, Mode::Avg(include), "AveragePool")
}

fn check_len(got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::new(ErrorKind::Len {
            expected: want as u64,
            got: got as u64,
        }));
    }
    Ok(())
}

/// Number of window taps `k` of output `o` with `o*s + k*d - pb < limit`
/// (positions never precede `-pb`).
#[inline]
fn taps_below(o: usize, s: usize, d: usize, k: usize, pb: usize, limit: usize) -> usize {
    // o*s + k*d < limit + pb
    let start = o * s;
    let lim = limit + pb;
    if start >= lim {
        0
    } else {
        ((lim - start - 1) / d + 1).min(k)
    }
}

fn pool(x: &[f32], y: &mut [f32], planes: usize, g: &Geom, mode: Mode) -> Result<()> {
    let (in_sz, out_sz) = (g.in_size(), g.out_size());
    check_len(x.len(), planes * in_sz)?;
    check_len(y.len(), planes * out_sz)?;
    if y.is_empty() {
        return Ok(());
    }
    let [o0, o1, o2] = g.out;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    let [s0, s1, s2] = g.s;
    let [d0, d1, d2] = g.d;
    let [p0, p1, p2] = g.pb;
    let [e0, e1, e2] = g.pe;
    for (pi, yp) in y.chunks_exact_mut(out_sz).enumerate() {
        let xp = &x[pi * in_sz..][..in_sz];
        for od in 0..o0 {
            // Taps of this window that fall inside the input, per axis.
            let (ad, bd) = valid_range(k0, d0, od * s0, p0, i0);
            let pd = taps_below(od, s0, d0, k0, p0, i0 + e0);
            for oh in 0..o1 {
                let (ah, bh) = valid_range(k1, d1, oh * s1, p1, i1);
                let ph = taps_below(oh, s1, d1, k1, p1, i1 + e1);
                let yrow = &mut yp[(od * o1 + oh) * o2..][..o2];
                for (ow, out) in yrow.iter_mut().enumerate() {
                    let (aw, bw) = valid_range(k2, d2, ow * s2, p2, i2);
                    let mut acc = match mode {
                        Mode::Max => f32::MIN,
                        Mode::Avg(_) => 0.0,
                    };
                    for kd in ad..bd {
                        let id = od * s0 + kd * d0 - p0;
                        for kh in ah..bh {
                            let ih = oh * s1 + kh * d1 - p1;
                            let row = &xp[(id * i1 + ih) * i2..][..i2];
                            for kw in aw..bw {
                                let v = row[ow * s2 + kw * d2 - p2];
                                match mode {
                                    Mode::Max => {
                                        if v > acc || v.is_nan() {
                                            acc = v;
                                        }
                                    }
                                    Mode::Avg(_) => acc += v,
                                }
                            }
                        }
                    }
                    *out = match mode {
                        Mode::Max => acc,
                        Mode::Avg(include) => {
                            let cnt = if include {
                                pd * ph * taps_below(ow, s2, d2, k2, p2, i2 + e2)
                            } else {
                                (bd - ad) * (bh - ah) * (bw - aw)
                            };
                            if cnt == 0 {
                                0.0
                            } else {
                                acc / cnt as f32
                            }
                        }
                    };
                }
            }
        }
    }
    Ok(())
}

fn prepare_global(ctx: &PrepareCtx<'_>, max: bool) -> Result<Prepared> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, &[DType::F32], "global pool input")?;
    let xs = x.shape;
    if xs.len() < 2 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 3,
            got: xs.len(),
        }));
    }
    let planes = xs[0] * xs[1];
    let plane: usize = xs[2..].iter().product();
    let mut shape = alloc::vec![1usize; xs.len()];
    shape[0] = xs[0];
    shape[1] = xs[1];
    let name = if max {
        "GlobalMaxPool"
    } else {
        "GlobalAveragePool"
    };
    Ok(Prepared::single(
        DType::F32,
        &shape,
        kernel(name, move |io| {
            let x = io.input_slice::<f32>(0)?;
            let y = io.output_slice::<f32>(0)?;
            check_len(x.len(), planes * plane)?;
            check_len(y.len(), planes)?;
            if plane == 0 {
                y.fill(if max { f32::MIN } else { 0.0 });
                return Ok(());
            }
            for (o, xp) in y.iter_mut().zip(x.chunks_exact(plane)) {
                *o = if max {
                    xp.iter()
                        .fold(f32::MIN, |a, &v| if v > a || v.is_nan() { v } else { a })
                } else {
                    xp.iter().sum::<f32>() / plane as f32
                };
            }
            Ok(())
        }),
    ))
}

fn prepare_global_avg(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_global(ctx, false)
}

fn prepare_global_max(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_global(ctx, true)
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};

    use crate::ops::testing::rnd;

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    fn out_len(i: usize, k: usize, s: usize, d: usize, pb: usize, pe: usize, ceil: bool) -> usize {
        let ek = (k - 1) * d + 1;
        let num = i + pb + pe - ek;
        if ceil {
            let mut o = num.div_ceil(s) + 1;
            if (o - 1) * s >= i + pb {
                o -= 1;
            }
            o
        } else {
            num / s + 1
        }
    }

    /// Naive 2-D pool over [planes, h, w]; `avg = Some(count_include_pad)`.
    #[allow(clippy::too_many_arguments)]
    fn naive_pool(
        x: &[f32],
        planes: usize,
        h: usize,
        w: usize,
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
        ceil: bool,
        avg: Option<bool>,
    ) -> (Vec<f32>, usize, usize) {
        let oh = out_len(h, k[0], s[0], d[0], p[0], p[2], ceil);
        let ow = out_len(w, k[1], s[1], d[1], p[1], p[3], ceil);
        let mut y = Vec::new();
        for pl in 0..planes {
            for yh in 0..oh {
                for yw in 0..ow {
                    let mut mx = f32::MIN;
                    let mut sum = 0.0;
                    let mut n_valid = 0usize;
                    let mut n_padded = 0usize;
                    for a in 0..k[0] {
                        for b in 0..k[1] {
                            let ih = (yh * s[0] + a * d[0]) as isize - p[0] as isize;
                            let iw = (yw * s[1] + b * d[1]) as isize - p[1] as isize;
                            if ih < (h + p[2]) as isize && iw < (w + p[3]) as isize {
                                n_padded += 1;
                            }
                            if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                continue;
                            }
                            let v = x[(pl * h + ih as usize) * w + iw as usize];
                            mx = mx.max(v);
                            sum += v;
                            n_valid += 1;
                        }
                    }
                    y.push(match avg {
                        None => mx,
                        Some(true) => sum / n_padded as f32,
                        Some(false) => sum / n_valid as f32,
                    });
                }
            }
        }
        (y, oh, ow)
    }

    #[allow(clippy::too_many_arguments)]
    fn check_pool(
        xs: [usize; 4],
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
        ceil: bool,
        avg: Option<bool>,
        auto_pad: Option<&str>,
    ) {
        let x = rnd(xs.iter().product(), 31);
        let (want, oh, ow) = naive_pool(&x, xs[0] * xs[1], xs[2], xs[3], k, s, d, p, ceil, avg);
        let mut attrs = vec![
            ("kernel_shape", ints(&[k[0] as i64, k[1] as i64])),
            ("strides", ints(&[s[0] as i64, s[1] as i64])),
            ("ceil_mode", AttrValue::Int(ceil as i64)),
        ];
        if d != [1, 1] {
            attrs.push(("dilations", ints(&[d[0] as i64, d[1] as i64])));
        }
        match auto_pad {
            Some(a) => attrs.push(("auto_pad", AttrValue::Str(a.as_bytes().to_vec()))),
            None => attrs.push(("pads", ints(&p.map(|v| v as i64)))),
        }
        let op = match avg {
            None => "MaxPool",
            Some(inc) => {
                attrs.push(("count_include_pad", AttrValue::Int(inc as i64)));
                "AveragePool"
            }
        };
        let out = run(op, 19, attrs, &[t(&xs, &x)], 1).unwrap();
        assert_eq!(out[0].shape, vec![xs[0], xs[1], oh, ow]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-6);
    }

    #[test]
    fn max_pool_2d() {
        check_pool(
            [2, 3, 8, 9],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            false,
            None,
            None,
        );
        check_pool(
            [1, 2, 8, 9],
            [3, 3],
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            true,
            None,
            None,
        );
        check_pool(
            [1, 2, 7, 7],
            [2, 2],
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            true,
            None,
            None,
        );
        check_pool(
            [1, 2, 10, 9],
            [3, 2],
            [1, 2],
            [2, 2],
            [1, 0, 2, 1],
            false,
            None,
            None,
        );
        check_pool(
            [1, 2, 9, 8],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 0, 1, 1],
            false,
            None,
            Some("SAME_UPPER"),
        );
        check_pool(
            [1, 2, 9, 8],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 0],
            false,
            None,
            Some("SAME_LOWER"),
        );
    }

    #[test]
    fn avg_pool_2d() {
        for inc in [false, true] {
            check_pool(
                [2, 3, 8, 9],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                false,
                Some(inc),
                None,
            );
            check_pool(
                [1, 2, 8, 9],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 0, 1, 2],
                true,
                Some(inc),
                None,
            );
            check_pool(
                [1, 2, 7, 6],
                [2, 3],
                [2, 2],
                [1, 1],
                [0, 0, 0, 0],
                true,
                Some(inc),
                None,
            );
            check_pool(
                [1, 2, 10, 9],
                [3, 2],
                [1, 2],
                [2, 2],
                [1, 0, 2, 1],
                false,
                Some(inc),
                None,
            );
            check_pool(
                [1, 2, 9, 8],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 0, 1, 1],
                false,
                Some(inc),
                Some("SAME_UPPER"),
            );
        }
    }

    #[test]
    fn pool_onnx_ceil_examples() {
        let x: Vec<f32> = (1..=16).map(|v| v as f32).collect();
        let attrs = || {
            vec![
                ("kernel_shape", ints(&[3, 3])),
                ("strides", ints(&[2, 2])),
                ("ceil_mode", AttrValue::Int(1)),
            ]
        };
        let out = run("MaxPool", 10, attrs(), &[t(&[1, 1, 4, 4], &x)], 1).unwrap();
        assert_eq!(vals::<f32>(&out[0]), vec![11.0, 12.0, 15.0, 16.0]);
        let out = run("AveragePool", 10, attrs(), &[t(&[1, 1, 4, 4], &x)], 1).unwrap();
        assert_close(&vals::<f32>(&out[0]), &[6.0, 7.5, 12.0, 13.5], 1e-6);
    }

    #[test]
    fn pool_1d() {
        let x = rnd(2 * 11, 41);
        let (want, _, ow) = naive_pool(
            &x,
            2,
            1,
            11,
            [1, 3],
            [1, 2],
            [1, 1],
            [0, 1, 0, 1],
            false,
            Some(false),
        );
        let out = run(
            "AveragePool",
            11,
            vec![
                ("kernel_shape", ints(&[3])),
                ("strides", ints(&[2])),
                ("pads", ints(&[1, 1])),
            ],
            &[t(&[1, 2, 11], &x)],
            1,
        )
        .unwrap();
        assert_eq!(out[0].shape, vec![1, 2, ow]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-6);
        let (want, _, ow) = naive_pool(
            &x,
            2,
            1,
            11,
            [1, 2],
            [1, 2],
            [1, 1],
            [0, 0, 0, 0],
            true,
            None,
        );
        let out = run(
            "MaxPool",
            11,
            vec![
                ("kernel_shape", ints(&[2])),
                ("strides", ints(&[2])),
                ("ceil_mode", AttrValue::Int(1)),
            ],
            &[t(&[1, 2, 11], &x)],
            1,
        )
        .unwrap();
        assert_eq!(out[0].shape, vec![1, 2, ow]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-6);
    }

    #[test]
    fn max_pool_indices_unsupported() {
        let x = rnd(16, 1);
        let r = run(
            "MaxPool",
            12,
            vec![("kernel_shape", ints(&[2, 2]))],
            &[t(&[1, 1, 4, 4], &x)],
            2,
        );
        assert!(r.is_err());
    }

    #[test]
    fn global_pools() {
        let x = rnd(2 * 3 * 4 * 5, 51);
        let avg = run("GlobalAveragePool", 1, vec![], &[t(&[2, 3, 4, 5], &x)], 1).unwrap();
        let mx = run("GlobalMaxPool", 1, vec![], &[t(&[2, 3, 4, 5], &x)], 1).unwrap();
        assert_eq!(avg[0].shape, vec![2, 3, 1, 1]);
        assert_eq!(mx[0].shape, vec![2, 3, 1, 1]);
        let want_avg: Vec<f32> = x.chunks(20).map(|c| c.iter().sum::<f32>() / 20.0).collect();
        let want_max: Vec<f32> = x
            .chunks(20)
            .map(|c| c.iter().cloned().fold(f32::MIN, f32::max))
            .collect();
        assert_close(&vals::<f32>(&avg[0]), &want_avg, 1e-6);
        assert_close(&vals::<f32>(&mx[0]), &want_max, 0.0);
    }
}
