//! Running a plan over a caller-owned arena.
//!
//! A [`Session`] borrows the model (weights), the plan (kernels, offsets)
//! and the arena (`&mut [u8]`: a `static` on firmware, a `Vec` on std).
//! Creating one is O(1) and checks the arena size; [`Session::run`] never
//! allocates.

use crate::error::{Error, ErrorKind, Result};
use crate::model::Model;
use crate::ops::{write_shape_record, KernelIo, Loc, SHAPE_RECORD};
use crate::plan::{IoInfo, Plan};
use crate::planner::ALIGN;
use crate::tensor::{TensorMut, TensorView};

/// One model, one plan, one arena: runs inferences.
///
/// ```
/// # fn main() -> Result<(), mote_core::Error> {
/// use mote_core::{Model, SessionBuilder, Session, TensorView};
/// let model = Model::from_onnx(include_bytes!("../../models/digits_mlp.onnx"))?;
/// let plan = SessionBuilder::new(&model).dim("batch", 1).plan()?;
/// let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
/// let mut session = Session::new(&model, &plan, &mut arena)?;
/// let pixels = [0.0f32; 64];
/// session.run(&[("input", TensorView::new(&[1, 64], &pixels)?)])?;
/// let scores = session.output(0)?.f32()?;
/// assert_eq!(scores.len(), 10);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Session<'a> {
    model: &'a Model,
    plan: &'a Plan,
    base: *mut u8,
    len: usize,
    _arena: core::marker::PhantomData<&'a mut [u8]>,
}

// SAFETY: the raw pointer is the exclusively borrowed arena; the session is
// the only user of it for its lifetime, so moving it to another thread is
// like moving the `&mut [u8]`.
unsafe impl Send for Session<'_> {}

impl<'a> Session<'a> {
    /// Pairs a plan with its model and an arena of at least
    /// [`Plan::arena_bytes`] bytes (plus alignment slack if the buffer is
    /// not 16-byte aligned: [`Plan::arena_bytes_unaligned`] always fits).
    pub fn new(model: &'a Model, plan: &'a Plan, arena: &'a mut [u8]) -> Result<Self> {
        if plan.fingerprint != (model.graph.tensors.len(), model.graph.nodes.len()) {
            return Err(Error::new(ErrorKind::Binding(
                "plan was built from another model",
            )));
        }
        let pad = arena.as_ptr().align_offset(ALIGN);
        let needed = plan
            .arena_bytes
            .checked_add(pad)
            .ok_or(Error::new(ErrorKind::Overflow))?;
        if pad >= ALIGN || arena.len() < needed {
            return Err(Error::new(ErrorKind::ArenaTooSmall {
                needed,
                got: arena.len(),
            }));
        }
        let usable = arena
            .get_mut(pad..)
            .ok_or(Error::new(ErrorKind::Internal("pad")))?;
        Ok(Session {
            model,
            plan,
            base: usable.as_mut_ptr(),
            len: usable.len(),
            _arena: core::marker::PhantomData,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &'a Plan {
        self.plan
    }

    /// Graph inputs (name, dtype, bound shape).
    pub fn inputs(&self) -> &'a [IoInfo] {
        &self.plan.inputs
    }

    /// Graph outputs (name, dtype, shape).
    pub fn outputs(&self) -> &'a [IoInfo] {
        &self.plan.outputs
    }

    /// Index of the graph input of this name.
    pub fn input_index(&self, name: &str) -> Result<usize> {
        self.plan
            .inputs
            .iter()
            .position(|i| i.name == name)
            .ok_or(Error::new(ErrorKind::UnknownName))
    }

    /// Index of the graph output of this name.
    pub fn output_index(&self, name: &str) -> Result<usize> {
        self.plan
            .outputs
            .iter()
            .position(|i| i.name == name)
            .ok_or(Error::new(ErrorKind::UnknownName))
    }

    fn arena_slice(&self, loc: Loc) -> Result<(*mut u8, usize)> {
        match loc {
            Loc::Arena { offset, len } => match offset.checked_add(len) {
                Some(end) if end <= self.len => Ok((self.base.wrapping_add(offset), len)),
                _ => Err(Error::new(ErrorKind::Internal("arena range"))),
            },
            _ => Err(Error::new(ErrorKind::Internal("not in arena"))),
        }
    }

    /// The arena buffer of input `i`, to fill in place (no copy) before
    /// [`Session::invoke`].
    pub fn input_mut(&mut self, i: usize) -> Result<TensorMut<'_>> {
        let info = self
            .plan
            .inputs
            .get(i)
            .ok_or(Error::new(ErrorKind::UnknownName))?;
        if info.bound {
            return Err(Error::new(ErrorKind::Binding(
                "input was bound to a value at build time: it has no arena buffer",
            ))
            .at_tensor(info.id));
        }
        let slot = self
            .plan
            .slots
            .get(info.id as usize)
            .ok_or(Error::new(ErrorKind::Internal("slot")))?;
        let (p, len) = self.arena_slice(slot.loc)?;
        // SAFETY: an in-bounds range of the exclusively borrowed arena;
        // `&mut self` keeps it the only view.
        let data = unsafe { core::slice::from_raw_parts_mut(p, len) };
        TensorMut::from_bytes(slot.dtype, &slot.shape, data)
    }

    /// Copies `inputs` (by name) into the arena and runs. Every graph input
    /// must be given, with its bound dtype and shape. Does not allocate.
    pub fn run(&mut self, inputs: &[(&str, TensorView<'_>)]) -> Result<()> {
        self.feed(inputs)?;
        self.invoke()
    }

    /// Copies `inputs` (by name) into the arena, checked as [`Session::run`]
    /// checks them, without running.
    pub fn feed(&mut self, inputs: &[(&str, TensorView<'_>)]) -> Result<()> {
        for (k, info) in self.plan.inputs.iter().enumerate() {
            let (_, v) = inputs.iter().find(|(n, _)| *n == info.name).ok_or(
                Error::new(ErrorKind::Binding("a graph input was not given")).at_tensor(info.id),
            )?;
            if v.dtype() != info.dtype {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: info.dtype,
                    got: v.dtype(),
                })
                .at_tensor(info.id));
            }
            if v.shape() != &info.shape[..] {
                if v.shape().len() != info.shape.len() {
                    return Err(Error::new(ErrorKind::Rank {
                        expected: info.shape.len(),
                        got: v.shape().len(),
                    })
                    .at_tensor(info.id));
                }
                let axis = v
                    .shape()
                    .iter()
                    .zip(&info.shape)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Err(Error::new(ErrorKind::Dim {
                    axis,
                    expected: info.shape.get(axis).copied().unwrap_or(0) as u64,
                    got: v.shape().get(axis).copied().unwrap_or(0) as u64,
                })
                .at_tensor(info.id));
            }
            if info.bound {
                if self.plan.bound_value(info.id) != Some(v.bytes()) {
                    return Err(Error::new(ErrorKind::Binding(
                        "input differs from the value bound at build time",
                    ))
                    .at_tensor(info.id));
                }
                continue;
            }
            let mut dst = self.input_mut(k)?;
            dst.bytes_mut().copy_from_slice(v.bytes());
        }
        for (n, _) in inputs {
            if !self.plan.inputs.iter().any(|i| i.name == *n) {
                return Err(Error::new(ErrorKind::UnknownName));
            }
        }
        Ok(())
    }

    /// Runs on the inputs already in the arena (see [`Session::input_mut`]).
    pub fn invoke(&mut self) -> Result<()> {
        self.invoke_steps(0..self.plan.steps.len())
    }

    /// Runs plan steps `steps` only (an execution provider runs the others:
    /// see [`crate::provider`]). Their inputs must already be in the arena.
    pub fn invoke_steps(&mut self, steps: core::ops::Range<usize>) -> Result<()> {
        let steps = self
            .plan
            .steps
            .get(steps)
            .ok_or(Error::new(ErrorKind::Internal("step range")))?;
        for st in steps {
            if let Some(at) = st.shapes {
                self.prefill_records(at, &st.outputs)?;
            }
            let mut io = KernelIo {
                slots: &self.plan.slots,
                graph: &self.model.graph,
                folded: &self.plan.folded,
                base: self.base,
                base_len: self.len,
                inputs: &st.inputs,
                outputs: &st.outputs,
                scratch: st.scratch,
                inplace: st.inplace,
                shapes: st.shapes,
                _arena: core::marker::PhantomData,
            };
            st.kernel.run(&mut io).map_err(|e| e.at_node(st.node))?;
        }
        Ok(())
    }

    /// The planned arena ([`Plan::arena_bytes`] bytes from its aligned
    /// start): the offsets of [`crate::provider::Place::Arena`] index it.
    pub fn arena(&self) -> &[u8] {
        // SAFETY: `base..base + len` is the exclusively borrowed arena;
        // `&self` excludes mutation through this session while it lives.
        unsafe { core::slice::from_raw_parts(self.base, self.len) }
    }

    /// The planned arena, writable (for copies an execution provider makes
    /// at segment boundaries).
    pub fn arena_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `arena`; `&mut self` makes it the only view.
        unsafe { core::slice::from_raw_parts_mut(self.base, self.len) }
    }

    /// The shape record at arena byte `at`, as a slice of words.
    fn record(&self, at: usize) -> Result<&[usize]> {
        let words = crate::ops::SHAPE_RECORD_BYTES;
        let (p, _) = self.arena_slice(Loc::Arena {
            offset: at,
            len: words,
        })?;
        if (p as usize).checked_rem(core::mem::align_of::<usize>()) != Some(0) {
            return Err(Error::new(ErrorKind::Internal("shape record alignment")));
        }
        // SAFETY: in bounds (checked by arena_slice), aligned (checked), and
        // any bit pattern is a valid usize.
        Ok(unsafe { core::slice::from_raw_parts(p as *const usize, SHAPE_RECORD) })
    }

    /// Writes the planned (upper bound) shapes into a dynamic step's
    /// records, so they are valid even if the kernel fails midway.
    fn prefill_records(&mut self, at: usize, outputs: &[Option<crate::TensorId>]) -> Result<()> {
        let words = crate::ops::SHAPE_RECORD_BYTES;
        for (k, o) in outputs.iter().enumerate() {
            let Some(o) = o else { continue };
            let shape = &self
                .plan
                .slots
                .get(*o as usize)
                .ok_or(Error::new(ErrorKind::Internal("slot")))?
                .shape;
            let (p, _) = self.arena_slice(Loc::Arena {
                offset: k
                    .checked_mul(words)
                    .and_then(|o| o.checked_add(at))
                    .ok_or(Error::new(ErrorKind::Overflow))?,
                len: words,
            })?;
            if (p as usize).checked_rem(core::mem::align_of::<usize>()) != Some(0) {
                return Err(Error::new(ErrorKind::Internal("shape record alignment")));
            }
            // SAFETY: in bounds and aligned (checked); `&mut self` makes it
            // the only view of these bytes.
            let rec = unsafe { core::slice::from_raw_parts_mut(p as *mut usize, SHAPE_RECORD) };
            write_shape_record(rec, shape);
        }
        Ok(())
    }

    /// Output `i` after a run: a view into the arena (or into the model,
    /// for outputs that are constants). For an output whose shape depends
    /// on values ([`IoInfo::dynamic`]), the view has the shape of the last
    /// run.
    pub fn output(&self, i: usize) -> Result<TensorView<'_>> {
        let info = self
            .plan
            .outputs
            .get(i)
            .ok_or(Error::new(ErrorKind::UnknownName))?;
        let slot = self
            .plan
            .slots
            .get(info.id as usize)
            .ok_or(Error::new(ErrorKind::Internal("slot")))?;
        let data: &[u8] = match slot.loc {
            Loc::Arena { .. } => {
                let (p, len) = self.arena_slice(slot.loc)?;
                // SAFETY: in-bounds range of the arena; `&self` excludes
                // concurrent mutation through this session.
                unsafe { core::slice::from_raw_parts(p, len) }
            }
            Loc::Model(t) => self
                .model
                .graph
                .tensors
                .get(t as usize)
                .and_then(|t| t.value.as_ref())
                .map(|c| c.data.bytes())
                .ok_or(Error::new(ErrorKind::Internal("const output")))?,
            Loc::Folded(f) => self
                .plan
                .folded
                .get(f as usize)
                .map(|c| c.data.bytes())
                .ok_or(Error::new(ErrorKind::Internal("folded")))?,
            Loc::None => return Err(Error::new(ErrorKind::Internal("output not placed"))),
        };
        if let Some(Some(at)) = self.plan.records.get(i) {
            let rec = self.record(*at)?;
            let rank = *rec
                .first()
                .ok_or(Error::new(ErrorKind::Internal("shape record rank")))?;
            let shape = rec
                .get(1..rank.saturating_add(1))
                .ok_or(Error::new(ErrorKind::Internal("shape record rank")))?;
            let len = crate::error::checked_numel(shape)?
                .checked_mul(slot.dtype.size())
                .ok_or(Error::new(ErrorKind::Overflow))?;
            let data = data
                .get(..len)
                .ok_or(Error::new(ErrorKind::Internal("run-time shape")))?;
            return TensorView::from_bytes(slot.dtype, shape, data);
        }
        TensorView::from_bytes(slot.dtype, &slot.shape, data)
    }

    /// Output of this name.
    pub fn output_by_name(&self, name: &str) -> Result<TensorView<'_>> {
        self.output(self.output_index(name)?)
    }
}

#[cfg(test)]
mod tests {
    //! Small whole-session runs, sized for Miri (`scripts/reliability.sh
    //! miri`): they reach the `unsafe` arena views of this module (inputs,
    //! outputs, shape records) and of `ops::KernelIo`.
    use super::*;
    use crate::ops::testing::TestGraph;
    use crate::SessionBuilder;
    use alloc::string::String;
    use alloc::vec;
    use alloc::vec::Vec;

    fn model(t: TestGraph) -> Model {
        Model {
            graph: t.g,
            opsets: vec![(String::new(), 13)],
            ..Model::default()
        }
    }

    #[test]
    fn chain_with_alias_and_in_place_steps() {
        // x[2,3] → Relu → Neg → Reshape[6] → Sigmoid → y.
        let (m, _) = crate::ops::testing::chain_model();
        let plan = SessionBuilder::new(&m).plan().unwrap();
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = Session::new(&m, &plan, &mut arena).unwrap();
        let xv = [-1.0f32, 0.5, 2.0, -3.0, 0.0, 1.0];
        for _ in 0..2 {
            s.run(&[("x", TensorView::new(&[2, 3], &xv).unwrap())])
                .unwrap();
            let out = s.output(0).unwrap();
            assert_eq!(out.shape(), [6]);
            let want: Vec<f32> = xv
                .iter()
                .map(|&v| 1.0 / (1.0 + libm::expf(v.max(0.0))))
                .collect();
            crate::ops::testing::assert_close(out.f32().unwrap(), &want, 1e-6);
        }
    }

    #[test]
    fn dynamic_output_shape_comes_from_the_record() {
        // NonZero's output shape depends on the values: [1, count].
        let mut t = TestGraph::new(2);
        let x = t.input("x", &[6]);
        let y = t.node("NonZero", &[x], vec![]);
        t.g.outputs = vec![y];
        let m = model(t);
        let plan = SessionBuilder::new(&m).plan().unwrap();
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = Session::new(&m, &plan, &mut arena).unwrap();
        for (xv, want) in [
            ([0.0f32, 1.0, 0.0, 2.0, 3.0, 0.0], vec![1i64, 3, 4]),
            ([0.0f32; 6], vec![]),
            ([1.0f32; 6], vec![0, 1, 2, 3, 4, 5]),
        ] {
            s.run(&[("x", TensorView::new(&[6], &xv).unwrap())])
                .unwrap();
            let out = s.output(0).unwrap();
            assert_eq!(out.shape(), [1, want.len()]);
            assert_eq!(out.as_slice::<i64>().unwrap(), want.as_slice());
        }
    }
}
