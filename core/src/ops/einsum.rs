//! Einsum (opset 12): Einstein summation over any number of operands.
//!
//! Prepare parses the equation (explicit or implicit output, `...`,
//! repeated labels for diagonals and traces) into one list of labels with
//! sizes, and for each operand a stride per label; a label repeated in one
//! term gets the sum of its strides, which walks the diagonal, and a
//! broadcast `...` dimension of size 1 gets stride 0. The kernel is a
//! single odometer over all labels, output labels outermost, so each run of
//! the contracted labels sums into one output element. Correctness over
//! speed: no contraction reordering or GEMM.

use crate::error::{Error, ErrorKind, Result};
use crate::ops::{kernel, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::tensor::MAX_RANK;
use crate::{DType, Element};
use alloc::vec::Vec;

/// Operators of this family.
pub const OPS: &[OpDef] = &[OpDef::onnx("Einsum", 12, prepare_einsum)];

/// Letters a-z, A-Z, then one label per `...` dimension.
const LETTERS: usize = 52;
const MAX_LABELS: usize = LETTERS + MAX_RANK;
/// Operands the kernel holds at once (a fixed array: no allocation).
const MAX_INPUTS: usize = 8;

fn eq_err(problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute {
        name: "equation",
        problem,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sym {
    Letter(usize),
    Ellipsis,
}

fn parse_term(s: &[u8]) -> Result<Vec<Sym>> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        match c {
            // Inside the matched ranges: no wrap.
            b'a'..=b'z' => out.push(Sym::Letter(usize::from(c.wrapping_sub(b'a')))),
            b'A'..=b'Z' => out.push(Sym::Letter(26 | usize::from(c.wrapping_sub(b'A')))),
            b'.' => {
                if s.get(i..i.saturating_add(3)) != Some(b"...") {
                    return Err(eq_err("'.' outside an ellipsis"));
                }
                if out.contains(&Sym::Ellipsis) {
                    return Err(eq_err("two ellipses in one term"));
                }
                out.push(Sym::Ellipsis);
                i = i.saturating_add(2);
            }
            _ => return Err(eq_err("labels must be letters")),
        }
        i = i.saturating_add(1);
    }
    Ok(out)
}

/// The parsed equation, bound to the operand shapes.
#[derive(Clone, Debug)]
struct Plan {
    /// Output labels' sizes (the output shape).
    out_shape: Vec<usize>,
    /// Size of every label, output labels first.
    sizes: Vec<usize>,
    /// `strides[l][k]`: step in operand `k` for label `l` (0 past `n_in`).
    strides: Vec<[usize; MAX_INPUTS]>,
    n_in: usize,
    out_count: usize,
    red_count: usize,
}

fn build_plan(eq: &str, shapes: &[&[usize]]) -> Result<Plan> {
    let eq: Vec<u8> = eq.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let (lhs, rhs) = match eq.windows(2).position(|w| w == b"->") {
        Some(p) => {
            let lhs = eq
                .get(..p)
                .ok_or(Error::internal("einsum: arrow position"))?;
            let rhs = eq
                .get(p.saturating_add(2)..)
                .ok_or(Error::internal("einsum: arrow position"))?;
            (lhs, Some(rhs))
        }
        None => (eq.as_slice(), None),
    };
    let terms: Vec<Vec<Sym>> = lhs
        .split(|&c| c == b',')
        .map(parse_term)
        .collect::<Result<_>>()?;
    if terms.len() != shapes.len() {
        return Err(eq_err("one term per input is needed"));
    }
    if shapes.len() > MAX_INPUTS {
        return Err(Error::new(ErrorKind::Unsupported(
            "Einsum with over 8 inputs",
        )));
    }
    // Ellipsis rank of each operand, and the broadcast ellipsis rank.
    let mut ell = Vec::with_capacity(terms.len());
    for (term, shape) in terms.iter().zip(shapes) {
        let letters = term.iter().filter(|s| **s != Sym::Ellipsis).count();
        let has_ell = term.contains(&Sym::Ellipsis);
        if shape.len() < letters || (!has_ell && shape.len() != letters) {
            return Err(eq_err("term does not match its input's rank"));
        }
        ell.push(shape.len().saturating_sub(letters));
    }
    let e_rank = ell.iter().copied().max().unwrap_or(0);
    if e_rank > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported("Einsum rank")));
    }
    // Labels of each operand's dimensions, and the size of each label.
    let mut size: [Option<usize>; MAX_LABELS] = [None; MAX_LABELS];
    let mut count = [0usize; MAX_LABELS];
    let mut dims: Vec<Vec<usize>> = Vec::with_capacity(terms.len());
    for ((term, &ell_k), &shape) in terms.iter().zip(&ell).zip(shapes) {
        let mut d = Vec::new();
        for s in term {
            match *s {
                Sym::Letter(l) => d.push(l),
                // ell_k <= e_rank (its maximum) <= MAX_RANK.
                Sym::Ellipsis => d.extend(
                    (e_rank.saturating_sub(ell_k)..e_rank).map(|j| LETTERS.saturating_add(j)),
                ),
            }
        }
        for (&l, &n) in d.iter().zip(shape) {
            let (Some(count_l), Some(size_l)) = (count.get_mut(l), size.get_mut(l)) else {
                return Err(Error::internal("einsum: label index"));
            };
            *count_l = count_l.saturating_add(1);
            *size_l = match *size_l {
                None => Some(n),
                Some(m) if m == n => Some(m),
                // Only `...` dimensions broadcast, as in numpy.
                Some(1) if l >= LETTERS => Some(n),
                Some(m) if l >= LETTERS && n == 1 => Some(m),
                Some(_) => return Err(Error::new(ErrorKind::Shape("Einsum label sizes differ"))),
            };
        }
        dims.push(d);
    }
    // Output labels.
    let mut out: Vec<usize> = Vec::new();
    match rhs {
        Some(r) => {
            for s in parse_term(r)? {
                match s {
                    Sym::Letter(l) => {
                        if size
                            .get(l)
                            .ok_or(Error::internal("einsum: label index"))?
                            .is_none()
                        {
                            return Err(eq_err("output label not in any input"));
                        }
                        if out.contains(&l) {
                            return Err(eq_err("output label repeated"));
                        }
                        out.push(l);
                    }
                    Sym::Ellipsis => out.extend(LETTERS..LETTERS.saturating_add(e_rank)),
                }
            }
        }
        None => {
            // numpy's implicit form: `...` first, then the labels seen once,
            // in ASCII order (capitals first).
            out.extend(LETTERS..LETTERS.saturating_add(e_rank));
            let seen = |l: &usize| count.get(*l) == Some(&1);
            out.extend((26..LETTERS).chain(0..26).filter(seen));
        }
    }
    let mut labels = out.clone();
    labels.extend(
        size.iter()
            .enumerate()
            .filter(|(l, s)| s.is_some() && !out.contains(l))
            .map(|(l, _)| l),
    );
    let sizes: Vec<usize> = labels
        .iter()
        .map(|&l| {
            let s = size.get(l).ok_or(Error::internal("einsum: label index"))?;
            Ok(s.unwrap_or(1))
        })
        .collect::<Result<_>>()?;
    let mut strides = alloc::vec![[0usize; MAX_INPUTS]; labels.len()];
    for (k, (d, &shape)) in dims.iter().zip(shapes).enumerate() {
        if d.len() != shape.len() {
            return Err(Error::internal("einsum: labels per dimension"));
        }
        let mut st = 1usize;
        for (&dl, &n) in d.iter().zip(shape).rev() {
            let li = labels
                .iter()
                .position(|&l| l == dl)
                .ok_or(Error::internal("einsum label"))?;
            let size_l = *sizes.get(li).ok_or(Error::internal("einsum: label size"))?;
            if !(n == 1 && size_l != 1) {
                let s = strides
                    .get_mut(li)
                    .and_then(|s| s.get_mut(k))
                    .ok_or(Error::internal("einsum: stride index"))?;
                *s = s.saturating_add(st);
            }
            st = st.saturating_mul(n);
        }
    }
    let (out_sizes, red_sizes) = sizes
        .split_at_checked(out.len())
        .ok_or(Error::internal("einsum: output labels"))?;
    let out_shape: Vec<usize> = out_sizes.to_vec();
    let out_count = out_shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or(Error::new(ErrorKind::Overflow))?;
    let red_count = red_sizes
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or(Error::new(ErrorKind::Overflow))?;
    out_count
        .checked_mul(red_count)
        .ok_or(Error::new(ErrorKind::Overflow))?;
    Ok(Plan {
        out_shape,
        sizes,
        strides,
        n_in: shapes.len(),
        out_count,
        red_count,
    })
}

/// Accumulator arithmetic: floats in f64, integers wrapping.
trait Acc: Copy {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}

impl Acc for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
}

macro_rules! int_acc {
    ($($t:ty),*) => {$(
        impl Acc for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
        }
    )*};
}
int_acc!(i64, u64);

/// An element type Einsum computes on.
trait Num: Element {
    type A: Acc;
    fn get(self) -> Self::A;
    fn put(a: Self::A) -> Self;
}

macro_rules! num {
    ($($t:ty => $a:ty, $get:expr, $put:expr);* $(;)?) => {$(
        impl Num for $t {
            type A = $a;
            #[inline]
            fn get(self) -> $a {
                $get(self)
            }
            #[inline]
            fn put(a: $a) -> Self {
                $put(a)
            }
        }
    )*};
}
num! {
    f32 => f64, |x: f32| x as f64, |a: f64| a as f32;
    f64 => f64, |x: f64| x, |a: f64| a;
    half::f16 => f64, |x: half::f16| x.to_f64(), half::f16::from_f64;
    half::bf16 => f64, |x: half::bf16| x.to_f64(), half::bf16::from_f64;
    i32 => i64, |x: i32| x as i64, |a: i64| a as i32;
    i64 => i64, |x: i64| x, |a: i64| a;
    u32 => u64, |x: u32| x as u64, |a: u64| a as u32;
    u64 => u64, |x: u64| x, |a: u64| a;
}

impl Plan {
    fn run<T: Num>(&self, io: &mut KernelIo<'_>) -> Result<()> {
        let mut xs: [&[T]; MAX_INPUTS] = [&[]; MAX_INPUTS];
        for (k, x) in xs.iter_mut().enumerate().take(self.n_in) {
            *x = io.input_slice::<T>(k)?;
        }
        let y = io.output_slice::<T>(0)?;
        if y.len() != self.out_count {
            return Err(Error::new(ErrorKind::Internal("einsum output size")));
        }
        if self.red_count == 0 {
            y.fill(T::put(T::A::ZERO));
            return Ok(());
        }
        let mut idx = [0usize; MAX_LABELS];
        let idx = idx
            .get_mut(..self.sizes.len())
            .ok_or(Error::internal("einsum: label count"))?;
        let mut offs = [0usize; MAX_INPUTS];
        let mut acc = T::A::ZERO;
        let mut r = 0usize;
        let mut o = 0usize;
        for _ in 0..self.out_count.saturating_mul(self.red_count) {
            let mut prod = T::A::ONE;
            for (x, &off) in xs.iter().zip(&offs).take(self.n_in) {
                let v = x.get(off).ok_or(Error::internal("einsum offset"))?;
                prod = prod.mul(v.get());
            }
            acc = acc.add(prod);
            r = r.saturating_add(1);
            if r == self.red_count {
                *y.get_mut(o)
                    .ok_or(Error::internal("einsum: output index"))? = T::put(acc);
                acc = T::A::ZERO;
                r = 0;
                o = o.saturating_add(1);
            }
            // Advance the odometer, last label fastest. Each offset is an
            // index inside its operand after every step (checked by the
            // lookup above); wrapping arithmetic gives it exactly, the
            // step back over `size - 1` steps included.
            let labels = idx.iter_mut().zip(&self.sizes).zip(&self.strides);
            for ((i, &size), st) in labels.rev() {
                *i = i.saturating_add(1);
                if *i < size {
                    for (off, &s) in offs.iter_mut().zip(st).take(self.n_in) {
                        *off = off.wrapping_add(s);
                    }
                    break;
                }
                for (off, &s) in offs.iter_mut().zip(st).take(self.n_in) {
                    *off = off.wrapping_sub(s.wrapping_mul(size.wrapping_sub(1)));
                }
                *i = 0;
            }
        }
        Ok(())
    }
}

fn prepare_einsum(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let eq = ctx.attr_str("equation", "")?;
    if ctx.num_inputs() == 0 {
        return Err(Error::new(ErrorKind::MissingInput { index: 0 }));
    }
    let dt = ctx.input(0)?.dtype;
    let mut shapes = Vec::with_capacity(ctx.num_inputs());
    for i in 0..ctx.num_inputs() {
        let x = ctx.input_of(i, dt)?;
        shapes.push(x.shape);
    }
    let plan = build_plan(eq, &shapes)?;
    let shape = plan.out_shape.clone();
    macro_rules! typed {
        ($t:ty) => {
            Prepared::single(dt, &shape, kernel("Einsum", move |io| plan.run::<$t>(io)))
        };
    }
    Ok(match dt {
        DType::F32 => typed!(f32),
        DType::F64 => typed!(f64),
        DType::F16 => typed!(half::f16),
        DType::BF16 => typed!(half::bf16),
        DType::I32 => typed!(i32),
        DType::I64 => typed!(i64),
        DType::U32 => typed!(u32),
        DType::U64 => typed!(u64),
        _ => {
            return Err(Error::new(ErrorKind::UnsupportedDType {
                what: "Einsum",
                code: dt.onnx_code(),
            }))
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::model::{AttrValue, Const};
    use crate::ops::testing::{assert_close, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    fn es(eq: &str, ins: &[Option<Const>]) -> crate::Result<Const> {
        let attrs = vec![("equation", AttrValue::Str(eq.as_bytes().to_vec()))];
        Ok(run("Einsum", 12, attrs, ins, 1)?.remove(0))
    }

    #[test]
    fn matmul_implicit_and_explicit() {
        let a = t(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = t(&[3, 2], &[7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0]);
        // [[1 2 3] [4 5 6]] x [[7 8] [9 10] [11 12]]
        let want = [58.0, 64.0, 139.0, 154.0];
        let y = es("ij,jk", &[a.clone(), b.clone()]).unwrap();
        assert_eq!(y.shape, vec![2, 2]);
        assert_close(&vals::<f32>(&y), &want, 0.0);
        // Explicit transposed output.
        let y = es("ij,jk->ki", &[a, b]).unwrap();
        assert_close(&vals::<f32>(&y), &[58.0, 139.0, 64.0, 154.0], 0.0);
    }

    #[test]
    fn implicit_output_is_sorted() {
        // "ba" alone means "ba->ab": a transpose.
        let y = es("ba", &[t(&[2, 3], &[1i64, 2, 3, 4, 5, 6])]).unwrap();
        assert_eq!(y.shape, vec![3, 2]);
        assert_eq!(vals::<i64>(&y), vec![1, 4, 2, 5, 3, 6]);
    }

    #[test]
    fn trace_diagonal_and_outer() {
        let m = t(&[3, 3], &[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        let tr = es("ii", core::slice::from_ref(&m)).unwrap();
        assert!(tr.shape.is_empty());
        assert_eq!(vals::<f64>(&tr), vec![15.0]);
        assert_eq!(
            vals::<f64>(&es("ii->i", core::slice::from_ref(&m)).unwrap()),
            vec![1.0, 5.0, 9.0]
        );
        assert_eq!(
            vals::<f64>(&es("ij->", &[m]).unwrap()),
            vec![45.0],
            "full sum"
        );
        let y = es("i,j->ij", &[t(&[2], &[1i32, 2]), t(&[3], &[3i32, 4, 5])]).unwrap();
        assert_eq!(vals::<i32>(&y), vec![3, 4, 5, 6, 8, 10]);
    }

    #[test]
    fn ellipsis_broadcasts() {
        // Batch [2] against batch [1]: the single B matrix serves both.
        let a: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        let y = es(
            "...ij,...jk->...ik",
            &[t(&[2, 2, 2], &a), t(&[1, 2, 2], &[1.0f32, 0.0, 0.0, 2.0])],
        )
        .unwrap();
        assert_eq!(y.shape, vec![2, 2, 2]);
        assert_close(
            &vals::<f32>(&y),
            &[1.0, 4.0, 3.0, 8.0, 5.0, 12.0, 7.0, 16.0],
            0.0,
        );
        // Implicit with ellipsis: "...j" sums nothing, keeps `...` first.
        let y = es("j...", &[t(&[2, 3], &a[..6])]).unwrap();
        assert_eq!(y.shape, vec![3, 2]);
        assert_close(&vals::<f32>(&y), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0], 0.0);
    }

    #[test]
    fn rejects_bad_equations() {
        let m = || t(&[2, 2], &[1.0f32; 4]);
        assert!(es("ij,jk", &[m()]).is_err(), "term count");
        assert!(es("ijk", &[m()]).is_err(), "rank");
        assert!(es("ij->k", &[m()]).is_err(), "unknown output label");
        assert!(es("ij->ii", &[m()]).is_err(), "repeated output label");
        assert!(es("i.j", &[m()]).is_err(), "lone dot");
        assert!(
            es("ij,jk", &[m(), t(&[3, 2], &[1.0f32; 6])]).is_err(),
            "sizes"
        );
    }
}
