//! `.mote` writer (feature `alloc`): turns a [`Plan`] whose every step has a
//! compiled kernel into the format of [`super`].

use alloc::string::String;
use alloc::vec::Vec;

use super::export::{encode, Encoder, Export};
use super::{
    crc32, CompiledModel, FORMAT_VERSION, HEADER, IO_REC, KIND_ARENA, KIND_CONST, NONE, STEP_REC,
    TENSOR_REC,
};
use crate::error::{Error, ErrorKind, Result};
use crate::ops::Loc;
use crate::plan::{IoInfo, Step};
use crate::{Model, Plan, TensorId};

/// One step of a plan, as `mote compile --ops-report` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepReport {
    /// Node index in the (optimized) model graph.
    pub node: crate::NodeId,
    /// Node name.
    pub name: String,
    /// `domain.op_type` (domain omitted for ai.onnx).
    pub op: String,
    /// The compiled kernel (`None`: the step has none, so the model cannot
    /// be compiled).
    pub kernel: Option<&'static str>,
}

/// What a plan compiles to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileReport {
    /// Every step, in run order.
    pub steps: Vec<StepReport>,
    /// Arena bytes.
    pub arena_bytes: usize,
    /// Arena lower bound.
    pub lower_bound: usize,
}

impl CompileReport {
    /// Steps without a compiled kernel.
    pub fn unsupported(&self) -> impl Iterator<Item = &StepReport> {
        self.steps.iter().filter(|s| s.kernel.is_none())
    }
}

fn export_of(step: &Step) -> Option<&Export> {
    step.kernel.as_any()?.downcast_ref::<Export>()
}

/// Lists each step of `plan` with its compiled kernel, if any.
pub fn report(model: &Model, plan: &Plan) -> CompileReport {
    let steps = plan
        .steps
        .iter()
        .map(|s| {
            let n = model.graph.nodes.get(s.node as usize);
            StepReport {
                node: s.node,
                name: n.map(|n| n.name.clone()).unwrap_or_default(),
                op: n
                    .map(|n| {
                        if n.domain.is_empty() {
                            n.op_type.clone()
                        } else {
                            alloc::format!("{}.{}", n.domain, n.op_type)
                        }
                    })
                    .unwrap_or_default(),
                kernel: export_of(s).map(|e| e.name),
            }
        })
        .collect();
    CompileReport {
        steps,
        arena_bytes: plan.arena_bytes,
        lower_bound: plan.lower_bound,
    }
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::new(ErrorKind::Overflow))
}

fn pad16(b: &mut Vec<u8>) {
    while !b.len().is_multiple_of(16) {
        b.push(0);
    }
}

struct Tables<'p> {
    model: &'p Model,
    plan: &'p Plan,
    /// Plan slot → file tensor index.
    index: Vec<Option<u32>>,
    tensors: Vec<u8>,
    data: Vec<u8>,
}

impl Tables<'_> {
    fn tensor(&mut self, id: TensorId) -> Result<u32> {
        let at = |e: Error| e.at_tensor(id);
        if let Some(Some(i)) = self.index.get(id as usize) {
            return Ok(*i);
        }
        let slot = self
            .plan
            .slots
            .get(id as usize)
            .ok_or(at(Error::new(ErrorKind::Internal("slot id"))))?;
        if slot.shape.len() > crate::tensor::MAX_RANK {
            return Err(at(Error::new(ErrorKind::Unsupported("rank above 8"))));
        }
        let (kind, offset, len) = match slot.loc {
            Loc::Arena { offset, len } => (KIND_ARENA, offset, len),
            Loc::Model(_) | Loc::Folded(_) => {
                let c = match slot.loc {
                    Loc::Model(t) => self
                        .model
                        .graph
                        .tensors
                        .get(t as usize)
                        .and_then(|t| t.value.as_ref()),
                    Loc::Folded(i) => self.plan.folded.get(i as usize),
                    _ => None,
                }
                .ok_or(at(Error::new(ErrorKind::Internal("constant"))))?;
                pad16(&mut self.data);
                let off = self.data.len();
                self.data.extend_from_slice(c.data.bytes());
                (KIND_CONST, off, c.data.bytes().len())
            }
            Loc::None => {
                return Err(at(Error::new(ErrorKind::Internal("tensor not placed"))));
            }
        };
        let i = u32_of(self.tensors.len() / TENSOR_REC)?;
        let r = &mut self.tensors;
        r.extend_from_slice(&[
            slot.dtype.onnx_code() as u8,
            slot.shape.len() as u8,
            kind,
            0,
        ]);
        for v in [offset, len, 0] {
            r.extend_from_slice(&u32_of(v)?.to_le_bytes());
        }
        for k in 0..crate::tensor::MAX_RANK {
            let d = slot.shape.get(k).copied().unwrap_or(0);
            r.extend_from_slice(&u32_of(d)?.to_le_bytes());
        }
        if let Some(s) = self.index.get_mut(id as usize) {
            *s = Some(i);
        }
        Ok(i)
    }
}

/// Writes `plan` (built from `model`) as a `.mote` file. Fails, naming the
/// node, on a step with no compiled kernel (see [`report`]), a dynamic
/// output or an input fixed at build time.
pub fn compile(model: &Model, plan: &Plan) -> Result<Vec<u8>> {
    let mut t = Tables {
        model,
        plan,
        index: alloc::vec![None; plan.slots.len()],
        tensors: Vec::new(),
        data: Vec::new(),
    };
    let mut steps = Vec::new();
    let mut params: Vec<u8> = Vec::new();
    for s in &plan.steps {
        let at = |e: Error| e.at_node(s.node);
        let ex = export_of(s).ok_or(at(Error::new(ErrorKind::Unsupported(
            "no compiled kernel for this op (mote compile takes int8/uint8 QDQ models; see --ops-report)",
        ))))?;
        if s.shapes.is_some() || s.scratch.1 != 0 {
            return Err(at(Error::new(ErrorKind::Internal(
                "compiled kernel with scratch or dynamic shapes",
            ))));
        }
        let v = ex.view();
        let input = |k: usize| -> Result<TensorId> {
            let index = *ex
                .ins
                .get(k)
                .ok_or(at(Error::new(ErrorKind::Internal("kernel input slot"))))?;
            s.inputs
                .get(index)
                .copied()
                .flatten()
                .ok_or(at(Error::new(ErrorKind::MissingInput { index })))
        };
        let in0 = t.tensor(input(0)?).map_err(at)?;
        let in1 = if v.arity() > 1 {
            t.tensor(input(1)?).map_err(at)?
        } else {
            NONE
        };
        let out_id = s
            .outputs
            .first()
            .copied()
            .flatten()
            .ok_or(at(Error::new(ErrorKind::Internal("step without output"))))?;
        let out = t.tensor(out_id).map_err(at)?;
        let mut e = Encoder {
            words: Vec::new(),
            data: &mut t.data,
        };
        encode(&v, &mut e).map_err(at)?;
        let off = params.len();
        for w in &e.words {
            params.extend_from_slice(&w.to_le_bytes());
        }
        for w in [
            v.id(),
            in0,
            in1,
            out,
            u32_of(off)?,
            u32_of(e.words.len().saturating_mul(4))?,
        ] {
            steps.extend_from_slice(&w.to_le_bytes());
        }
    }
    // IO records and names.
    let mut io = Vec::new();
    let mut strings = Vec::new();
    let ios = |v: &[IoInfo], input: bool| -> Vec<(IoInfo, bool)> {
        v.iter().map(|i| (i.clone(), input)).collect()
    };
    for (info, input) in ios(&plan.inputs, true)
        .into_iter()
        .chain(ios(&plan.outputs, false))
    {
        let at = |e: Error| e.at_tensor(info.id);
        if info.bound {
            return Err(at(Error::new(ErrorKind::Unsupported(
                "an input fixed at build time cannot be compiled",
            ))));
        }
        if info.dynamic {
            return Err(at(Error::new(ErrorKind::Unsupported(
                "an output with a data-dependent shape cannot be compiled",
            ))));
        }
        let ti = t.tensor(info.id)?;
        let q = model
            .io_quant
            .iter()
            .find(|q| q.input == input && q.name == info.name);
        let (flags, scale, zp) = match q {
            Some(q) => (1u32, q.scale.to_bits(), q.zero_point as u32),
            None => (0, 0, 0),
        };
        for w in [
            ti,
            u32_of(strings.len())?,
            u32_of(info.name.len())?,
            flags,
            scale,
            zp,
        ] {
            io.extend_from_slice(&w.to_le_bytes());
        }
        strings.extend_from_slice(info.name.as_bytes());
    }
    let io_count = plan.inputs.len().saturating_add(plan.outputs.len());
    if Some(steps.len()) != plan.steps.len().checked_mul(STEP_REC)
        || Some(io.len()) != io_count.checked_mul(IO_REC)
    {
        return Err(Error::new(ErrorKind::Internal(
            "compiled writer: record sizes",
        )));
    }

    // Layout: header, tensors, steps, io, params, strings, data.
    let mut f = alloc::vec![0u8; HEADER];
    let place = |f: &mut Vec<u8>, b: &[u8]| -> Result<(u32, u32)> {
        pad16(f);
        let off = f.len();
        f.extend_from_slice(b);
        Ok((u32_of(off)?, u32_of(b.len())?))
    };
    let tensors = place(&mut f, &t.tensors)?;
    let steps_at = place(&mut f, &steps)?;
    let io_at = place(&mut f, &io)?;
    let params_at = place(&mut f, &params)?;
    let strings_at = place(&mut f, &strings)?;
    let data_at = place(&mut f, &t.data)?;
    pad16(&mut f);
    let total = u32_of(f.len())?;
    let words = [
        total,
        0, // CRC, below
        u32_of(plan.arena_bytes)?,
        u32_of(plan.lower_bound)?,
        u32_of(t.tensors.len() / TENSOR_REC)?,
        u32_of(plan.steps.len())?,
        u32_of(plan.inputs.len())?,
        u32_of(plan.outputs.len())?,
        tensors.0,
        steps_at.0,
        io_at.0,
        params_at.0,
        params_at.1,
        strings_at.0,
        strings_at.1,
        data_at.0,
        data_at.1,
        0,
    ];
    put(&mut f, 0, b"MOTE")?;
    put(&mut f, 4, &FORMAT_VERSION.to_le_bytes())?;
    for (k, w) in words.iter().enumerate() {
        put(
            &mut f,
            k.saturating_mul(4).saturating_add(8),
            &w.to_le_bytes(),
        )?;
    }
    let crc = crc32(f.get(16..).ok_or(header_err())?);
    put(&mut f, 12, &crc.to_le_bytes())?;

    // Self-check: the reader accepts what was written.
    let mut aligned = alloc::vec![0u128; f.len().div_ceil(16)];
    let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut aligned);
    let buf = buf.get_mut(..f.len()).ok_or(header_err())?;
    buf.copy_from_slice(&f);
    CompiledModel::from_bytes(buf)?;
    Ok(f)
}

fn header_err() -> Error {
    Error::new(ErrorKind::Internal(
        "compiled writer: header out of the file",
    ))
}

/// Writes `bytes` at `at` of the file being built.
fn put(f: &mut [u8], at: usize, bytes: &[u8]) -> Result<()> {
    f.get_mut(at..at.saturating_add(bytes.len()))
        .ok_or(header_err())?
        .copy_from_slice(bytes);
    Ok(())
}
