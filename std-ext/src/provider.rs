//! Execution providers of a [`Session`](crate::Session): the CPU kernels of
//! mote-core, or CUDA (feature `cuda`, crate `mote-cuda`) with the steps
//! the GPU does not take on the CPU.
//!
//! [`partition_report`] shows what would run where (`mote inspect
//! --provider cuda`) without a GPU: it uses the provider's claim rule only.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use mote_core::{Model, Plan};
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// Where a session runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Provider {
    /// mote-core's CPU kernels (the default).
    #[default]
    Cpu,
    /// An NVIDIA GPU through `mote-cuda` (feature `cuda`); steps it does
    /// not support run on the CPU.
    Cuda {
        /// CUDA device ordinal (`cuda:N`).
        device: usize,
    },
}

const EXPECTED: &str = "expected cpu, cuda or cuda:N";

impl FromStr for Provider {
    type Err = Error;
    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("cpu") {
            return Ok(Provider::Cpu);
        }
        if t.eq_ignore_ascii_case("cuda") {
            return Ok(Provider::Cuda { device: 0 });
        }
        if let Some((kind, n)) = t.split_once(':') {
            if kind.eq_ignore_ascii_case("cuda") {
                return match n.trim().parse::<usize>() {
                    Ok(device) => Ok(Provider::Cuda { device }),
                    Err(_) => Err(Error::Provider(format!(
                        "provider '{s}': device '{n}' is not a non-negative integer ({EXPECTED})"
                    ))),
                };
            }
        }
        Err(Error::Provider(format!(
            "unknown provider '{s}' ({EXPECTED})"
        )))
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provider::Cpu => f.write_str("cpu"),
            Provider::Cuda { device } => write!(f, "cuda:{device}"),
        }
    }
}

impl Provider {
    /// `cpu` or `cuda` (without the device).
    pub fn kind(&self) -> &'static str {
        match self {
            Provider::Cpu => "cpu",
            Provider::Cuda { .. } => "cuda",
        }
    }

    /// Whether this build of mote can use the provider (CUDA needs the
    /// `cuda` feature); says nothing of the machine (driver, devices).
    pub fn compiled_in(&self) -> bool {
        match self {
            Provider::Cpu => true,
            Provider::Cuda { .. } => cfg!(feature = "cuda"),
        }
    }

    /// [`Provider::compiled_in`], as the error a session build or `mote
    /// inspect` gives.
    pub fn check_compiled_in(&self) -> Result<()> {
        if self.compiled_in() {
            Ok(())
        } else {
            Err(Error::Provider(format!(
                "provider {self}: this build of mote has no CUDA support \
                 (rebuild it with `cargo build --release --features cuda`)"
            )))
        }
    }
}

/// A run of consecutive steps on one side, with the names of its ops and
/// of the tensors copied to its side before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentReport {
    /// `true`: the provider (GPU) runs these steps; `false`: the CPU.
    pub on_provider: bool,
    /// Plan step indices.
    pub steps: Range<usize>,
    /// Op type of each step, in order.
    pub ops: Vec<String>,
    /// Tensors copied in before the segment (host → device for a GPU
    /// segment, device → host for a CPU one): (name, bytes).
    pub copies: Vec<(String, usize)>,
}

/// How a plan splits between a provider and the CPU, with names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionReport {
    /// The provider (`cuda:0`).
    pub provider: Provider,
    /// Steps of the plan.
    pub steps: usize,
    /// Steps the provider runs.
    pub provider_steps: usize,
    /// Segments in execution order.
    pub segments: Vec<SegmentReport>,
    /// Graph outputs copied device → host after the last segment.
    pub final_copies: Vec<(String, usize)>,
    /// Host → device copies: (count, bytes).
    pub to_device: (usize, usize),
    /// Device → host copies, final ones included: (count, bytes).
    pub to_host: (usize, usize),
}

/// Op names listed per segment line before `... (N more)`.
const OPS_SHOWN: usize = 12;

fn fmt_copies(c: &[(String, usize)]) -> String {
    c.iter()
        .map(|(n, b)| format!("'{n}' {b} B"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl PartitionReport {
    /// The text of `mote inspect --provider cuda`: a summary line, then one
    /// line per segment.
    ///
    /// ```text
    /// provider cuda: 12 of 14 steps on the GPU, 3 segments; copies host->device 1 (12288 B), device->host 2 (80 B)
    ///   [gpu] steps 0..5: Conv, Relu, MaxPool, Conv, Relu  (copies in: 'input' 12288 B)
    ///   [cpu] steps 5..6: TopK  (copies in: 'x' 40 B)
    /// ```
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!(
            "provider {}: {} of {} steps on the GPU, {} segment{}; copies host->device {} ({} B), device->host {} ({} B)",
            self.provider.kind(),
            self.provider_steps,
            self.steps,
            self.segments.len(),
            if self.segments.len() == 1 { "" } else { "s" },
            self.to_device.0,
            self.to_device.1,
            self.to_host.0,
            self.to_host.1
        )];
        for s in &self.segments {
            let mut ops = s
                .ops
                .iter()
                .take(OPS_SHOWN)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ");
            if s.ops.len() > OPS_SHOWN {
                ops.push_str(&format!(", ... ({} more)", s.ops.len() - OPS_SHOWN));
            }
            let mut line = format!(
                "  [{}] steps {}..{}: {ops}",
                if s.on_provider { "gpu" } else { "cpu" },
                s.steps.start,
                s.steps.end
            );
            if !s.copies.is_empty() {
                line.push_str(&format!("  (copies in: {})", fmt_copies(&s.copies)));
            }
            v.push(line);
        }
        if !self.final_copies.is_empty() {
            v.push(format!(
                "  copies out (device->host): {}",
                fmt_copies(&self.final_copies)
            ));
        }
        v
    }

    /// The same as a JSON object (`mote inspect --provider cuda --json`).
    pub fn to_json(&self) -> Value {
        let copies = |c: &[(String, usize)]| -> Vec<Value> {
            c.iter()
                .map(|(n, b)| json!({"tensor": n, "bytes": b}))
                .collect()
        };
        json!({
            "provider": self.provider.kind(),
            "steps": self.steps,
            "provider_steps": self.provider_steps,
            "copies_to_device": {"count": self.to_device.0, "bytes": self.to_device.1},
            "copies_to_host": {"count": self.to_host.0, "bytes": self.to_host.1},
            "segments": self.segments.iter().map(|s| json!({
                "on": if s.on_provider { "gpu" } else { "cpu" },
                "steps": [s.steps.start, s.steps.end],
                "ops": s.ops,
                "copies_in": copies(&s.copies),
            })).collect::<Vec<_>>(),
            "final_copies": copies(&self.final_copies),
        })
    }
}

/// What of `plan` (built from `model`) `provider` would run and what the
/// CPU would, by the provider's claim rule alone: no device is opened, so
/// this works on any machine (with the `cuda` feature for CUDA). `None`
/// for [`Provider::Cpu`].
pub fn partition_report(
    model: &Model,
    plan: &Plan,
    provider: Provider,
) -> Result<Option<PartitionReport>> {
    provider.check_compiled_in()?;
    match provider {
        Provider::Cpu => Ok(None),
        #[cfg(feature = "cuda")]
        Provider::Cuda { .. } => {
            let p = mote_core::provider::partition(model, plan, &mote_cuda::CudaCapability)
                .map_err(|e| crate::explain(model, &e))?;
            report(model, plan, provider, &p).map(Some)
        }
        #[cfg(not(feature = "cuda"))]
        Provider::Cuda { .. } => {
            let _ = (model, plan);
            Err(Error::Provider("unreachable: CUDA not compiled in".into()))
        }
    }
}

/// Names the tensors and ops of a core [`Partition`](mote_core::provider::Partition).
pub fn report(
    model: &Model,
    plan: &Plan,
    provider: Provider,
    p: &mote_core::provider::Partition,
) -> Result<PartitionReport> {
    let name = |id: mote_core::TensorId| -> String {
        match model.graph.tensor(id) {
            Ok(t) if !t.name.is_empty() => t.name.clone(),
            _ => format!("#{id}"),
        }
    };
    let named = |c: &[(mote_core::TensorId, usize, usize)]| -> Vec<(String, usize)> {
        c.iter().map(|&(t, _, len)| (name(t), len)).collect()
    };
    let mut segments = Vec::with_capacity(p.segments.len());
    for s in &p.segments {
        let ops = s
            .steps
            .clone()
            .map(|i| {
                plan.step(model, i)
                    .map(|st| st.node.op_type.clone())
                    .map_err(|e| crate::explain(model, &e))
            })
            .collect::<Result<Vec<_>>>()?;
        segments.push(SegmentReport {
            on_provider: s.on_provider,
            steps: s.steps.clone(),
            ops,
            copies: named(&s.copies),
        });
    }
    let (to_device, to_host) = p.copy_totals();
    Ok(PartitionReport {
        provider,
        steps: plan.num_steps(),
        provider_steps: p.provider_steps(),
        segments,
        final_copies: named(&p.final_copies),
        to_device,
        to_host,
    })
}
