//! Execution providers: running part of a plan somewhere else (a GPU, an
//! accelerator), the rest on the CPU kernels of this crate.
//!
//! The shape of it follows onnxruntime's `GetCapability`: a provider is
//! asked, step by step, whether it [`claims`](ExecutionProvider::claims)
//! the step; [`partition`] cuts the plan into runs of consecutive steps
//! that stay on one side, and lists the tensors to copy at each boundary.
//!
//! ```text
//!  steps:   0   1   2   3   4   5        arena (host)   device arena
//!  side:    P   P   C   C   P   P        ┌──────────┐   ┌──────────┐
//!  segment: [ 0  ] [ 1  ] [ 2  ]         │ offsets  │ = │ offsets  │
//!  copies:  ↑in    ↓a     ↑b   ↓out      └──────────┘   └──────────┘
//! ```
//!
//! The device arena mirrors the host arena: the same [`Plan`] offsets, so
//! the planner places device memory too, aliases (Reshape, Flatten, ...)
//! cost nothing on either side, and a boundary copy is one contiguous span.
//! Constants (weights, folded values) are not in the arena; a provider
//! uploads the ones its steps read once, when it is built.
//!
//! Nothing here knows what the provider is: `mote-cuda` implements the
//! trait for NVIDIA GPUs, and the tests below use a fake one.

use alloc::vec::Vec;
use core::ops::Range;

use crate::error::{Error, ErrorKind, NodeId, Result, TensorId};
use crate::model::{Model, Node};
use crate::ops::Loc;
use crate::plan::Plan;
use crate::tensor::TensorView;
use crate::DType;

/// One step of a plan, as a provider sees it.
#[derive(Clone, Copy, Debug)]
pub struct StepInfo<'p> {
    /// Position of the step in the plan.
    pub index: usize,
    /// The node the step runs.
    pub node_id: NodeId,
    /// The node (op type, attributes, inputs and outputs).
    pub node: &'p Node,
    /// The step's inputs (as the kernel sees them; `None` when omitted).
    pub inputs: &'p [Option<TensorId>],
    /// The step's outputs.
    pub outputs: &'p [Option<TensorId>],
    /// Output shapes depend on input values (NonZero, ...): the CPU kernel
    /// writes run-time shape records in the host arena, so [`partition`]
    /// keeps such steps on the CPU whatever the provider says.
    pub dynamic: bool,
}

/// Where a tensor of a plan lives.
#[derive(Clone, Copy, Debug)]
pub enum Place<'p> {
    /// `len` bytes at `offset` of the arena (see [`crate::Session::arena`]).
    Arena {
        /// Byte offset from the start of the (aligned) arena.
        offset: usize,
        /// Byte length.
        len: usize,
    },
    /// A constant known at build time (an initializer, a folded value).
    Const(TensorView<'p>),
}

impl Plan {
    /// Step `i` of the plan with its node from `model` (the model the plan
    /// was built from).
    pub fn step<'p>(&'p self, model: &'p Model, i: usize) -> Result<StepInfo<'p>> {
        let st = self
            .steps
            .get(i)
            .ok_or(Error::new(ErrorKind::Internal("step index")))?;
        Ok(StepInfo {
            index: i,
            node_id: st.node,
            node: model.graph.node(st.node)?,
            inputs: &st.inputs,
            outputs: &st.outputs,
            dynamic: st.shapes.is_some(),
        })
    }

    /// Where tensor `id` lives, with its dtype and shape; `None` for a
    /// tensor the plan never placed (dead, or not in this graph).
    pub fn place<'p>(
        &'p self,
        model: &'p Model,
        id: TensorId,
    ) -> Option<(DType, &'p [usize], Place<'p>)> {
        let slot = self.slots.get(id as usize)?;
        let place = match slot.loc {
            Loc::None => return None,
            Loc::Arena { offset, len } => Place::Arena { offset, len },
            Loc::Model(t) => {
                let c = model.graph.tensors.get(t as usize)?.value.as_ref()?;
                Place::Const(TensorView::from_bytes(slot.dtype, &slot.shape, c.data.bytes()).ok()?)
            }
            Loc::Folded(f) => {
                let c = self.folded.get(f as usize)?;
                Place::Const(TensorView::from_bytes(slot.dtype, &slot.shape, c.data.bytes()).ok()?)
            }
        };
        Some((slot.dtype, &slot.shape, place))
    }
}

/// Something that runs some steps of a plan instead of the CPU kernels.
pub trait ExecutionProvider {
    /// Short name for messages and `mote inspect` (`"cuda"`).
    fn name(&self) -> &str;
    /// Whether the provider runs this step (op type, attributes, dtypes
    /// and shapes it supports). Called once per step by [`partition`].
    fn claims(&self, model: &Model, plan: &Plan, step: &StepInfo<'_>) -> bool;
}

/// A run of consecutive steps on one side, with the copies before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// `true`: the provider runs these steps; `false`: the CPU.
    pub on_provider: bool,
    /// The steps, as a range of plan step indices.
    pub steps: Range<usize>,
    /// Arena spans `(offset, len)` to copy to the side of this segment
    /// before it runs (host → device for a provider segment, device →
    /// host for a CPU one), with the tensor each belongs to.
    pub copies: Vec<(TensorId, usize, usize)>,
}

/// A plan cut between a provider and the CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Segments in execution order.
    pub segments: Vec<Segment>,
    /// Device → host copies after the last segment: the graph outputs the
    /// host does not hold yet.
    pub final_copies: Vec<(TensorId, usize, usize)>,
}

impl Partition {
    /// Steps the provider runs.
    pub fn provider_steps(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| s.on_provider)
            .map(|s| s.steps.len())
            .fold(0, usize::saturating_add)
    }
    /// Boundary copies and the bytes they move: (host → device, device →
    /// host), each as (count, bytes).
    pub fn copy_totals(&self) -> ((usize, usize), (usize, usize)) {
        let mut up = (0usize, 0usize);
        let mut down = (0usize, 0usize);
        for s in &self.segments {
            let t = if s.on_provider { &mut up } else { &mut down };
            for &(_, _, len) in &s.copies {
                t.0 = t.0.saturating_add(1);
                t.1 = t.1.saturating_add(len);
            }
        }
        for &(_, _, len) in &self.final_copies {
            down.0 = down.0.saturating_add(1);
            down.1 = down.1.saturating_add(len);
        }
        (up, down)
    }
}

/// Which side holds a valid copy of an arena span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Valid {
    host: bool,
    device: bool,
}

/// Validity of arena spans, keyed by `(offset, len)`; writing a span
/// forgets every other span it overlaps (a buffer reused by the planner).
struct Spans(Vec<(usize, usize, Valid)>);

impl Spans {
    fn get(&self, off: usize, len: usize) -> Option<Valid> {
        self.0
            .iter()
            .find(|&&(o, l, _)| o == off && l == len)
            .map(|&(_, _, v)| v)
    }
    fn set(&mut self, off: usize, len: usize, v: Valid) {
        let end = off.saturating_add(len);
        self.0
            .retain(|&(o, l, _)| (o == off && l == len) || o.saturating_add(l) <= off || o >= end);
        match self.0.iter_mut().find(|(o, l, _)| *o == off && *l == len) {
            Some(e) => e.2 = v,
            None => self.0.push((off, len, v)),
        }
    }
}

/// Cuts `plan` between `provider` and the CPU.
///
/// Graph inputs start on the host. Before each segment, every arena input
/// of its steps that its side does not hold is copied there; after the last
/// segment, the graph outputs the host does not hold are copied back. A
/// span written on one side is stale on the other until copied, so the
/// copies are exactly the boundary crossings.
pub fn partition(
    model: &Model,
    plan: &Plan,
    provider: &dyn ExecutionProvider,
) -> Result<Partition> {
    let mut segments: Vec<Segment> = Vec::new();
    let mut spans = Spans(Vec::new());
    for info in plan.inputs() {
        if let Some((_, _, Place::Arena { offset, len })) = plan.place(model, info.id) {
            spans.set(
                offset,
                len,
                Valid {
                    host: true,
                    device: false,
                },
            );
        }
    }
    for i in 0..plan.num_steps() {
        let st = plan.step(model, i)?;
        let on = !st.dynamic && provider.claims(model, plan, &st);
        let new_segment = segments.last().is_none_or(|s| s.on_provider != on);
        if new_segment {
            segments.push(Segment {
                on_provider: on,
                steps: i..i,
                copies: Vec::new(),
            });
        }
        let seg = segments
            .last_mut()
            .ok_or(Error::new(ErrorKind::Internal("partition segment")))?;
        seg.steps.end = i.saturating_add(1);
        for &t in st.inputs.iter().flatten() {
            let Some((_, _, Place::Arena { offset, len })) = plan.place(model, t) else {
                continue;
            };
            let v = spans.get(offset, len).unwrap_or(Valid {
                host: true,
                device: false,
            });
            let held = if on { v.device } else { v.host };
            if !held {
                seg.copies.push((t, offset, len));
                spans.set(
                    offset,
                    len,
                    Valid {
                        host: true,
                        device: true,
                    },
                );
            }
        }
        for &t in st.outputs.iter().flatten() {
            if let Some((_, _, Place::Arena { offset, len })) = plan.place(model, t) {
                spans.set(
                    offset,
                    len,
                    Valid {
                        host: !on,
                        device: on,
                    },
                );
            }
        }
    }
    let mut final_copies = Vec::new();
    for info in plan.outputs() {
        if let Some((_, _, Place::Arena { offset, len })) = plan.place(model, info.id) {
            if spans.get(offset, len).is_some_and(|v| !v.host)
                && !final_copies
                    .iter()
                    .any(|&(_, o, l)| o == offset && l == len)
            {
                final_copies.push((info.id, offset, len));
            }
        }
    }
    Ok(Partition {
        segments,
        final_copies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::chain_model;
    use crate::SessionBuilder;

    /// Claims the op types it is given.
    struct Fake(&'static [&'static str]);
    impl ExecutionProvider for Fake {
        fn name(&self) -> &str {
            "fake"
        }
        fn claims(&self, _: &Model, _: &Plan, s: &StepInfo<'_>) -> bool {
            self.0.contains(&s.node.op_type.as_str())
        }
    }

    #[test]
    fn all_cpu_means_no_copies() {
        let (m, _) = chain_model();
        let plan = SessionBuilder::new(&m).plan().unwrap();
        let p = partition(&m, &plan, &Fake(&[])).unwrap();
        assert_eq!(p.segments.len(), 1);
        assert!(!p.segments[0].on_provider);
        assert!(p.segments[0].copies.is_empty());
        assert!(p.final_copies.is_empty());
        assert_eq!(p.provider_steps(), 0);
    }

    #[test]
    fn all_provider_copies_input_in_and_output_out() {
        let (m, [x, .., y]) = chain_model();
        let plan = SessionBuilder::new(&m).plan().unwrap();
        let p = partition(&m, &plan, &Fake(&["Relu", "Neg", "Sigmoid"])).unwrap();
        assert_eq!(p.segments.len(), 1);
        assert_eq!(p.provider_steps(), 3);
        assert_eq!(p.segments[0].copies.len(), 1);
        assert_eq!(p.segments[0].copies[0].0, x);
        assert_eq!(p.segments[0].copies[0].2, 24);
        assert_eq!(p.final_copies.len(), 1);
        assert_eq!(p.final_copies[0].0, y);
    }

    #[test]
    fn boundary_through_an_alias_copies_the_span() {
        // Neg on the CPU between two provider steps; Sigmoid reads the
        // Reshape alias of Neg's output, which must go up again.
        let (m, [_, a, _, _, c, _]) = chain_model();
        let plan = SessionBuilder::new(&m).plan().unwrap();
        let p = partition(&m, &plan, &Fake(&["Relu", "Sigmoid"])).unwrap();
        let sides: Vec<bool> = p.segments.iter().map(|s| s.on_provider).collect();
        assert_eq!(sides, [true, false, true]);
        assert_eq!(p.segments[1].copies.len(), 1);
        assert_eq!(p.segments[1].copies[0].0, a);
        assert_eq!(p.segments[2].copies.len(), 1);
        assert_eq!(p.segments[2].copies[0].0, c);
        assert_eq!(p.final_copies.len(), 1);
        let ((nu, bu), (nd, bd)) = p.copy_totals();
        // x up, a down, c up, y down: 24 bytes each.
        assert_eq!((nu, bu, nd, bd), (2, 48, 2, 48));
    }

    #[test]
    fn step_and_place_expose_the_plan() {
        let (m, [_, _, b, shape, c, _]) = chain_model();
        let plan = SessionBuilder::new(&m).plan().unwrap();
        assert_eq!(plan.num_steps(), 3);
        let s = plan.step(&m, 1).unwrap();
        assert_eq!(s.node.op_type, "Neg");
        assert!(plan.step(&m, 3).is_err());
        match plan.place(&m, shape) {
            Some((DType::I64, _, Place::Const(v))) => assert_eq!(v.bytes().len(), 8),
            other => panic!("{other:?}"),
        }
        // The alias shares its source's span.
        let (Some((_, _, pc)), Some((_, _, pb))) = (plan.place(&m, c), plan.place(&m, b)) else {
            panic!("not placed")
        };
        let (
            Place::Arena {
                offset: oc,
                len: lc,
            },
            Place::Arena {
                offset: ob,
                len: lb,
            },
        ) = (pc, pb)
        else {
            panic!("not in the arena")
        };
        assert_eq!((oc, lc), (ob, lb));
    }
}
