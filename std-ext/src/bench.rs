//! `mote bench`: latency percentiles, throughput and memory of one model.
//!
//! The model is planned and its inputs filled once (the same code as `mote
//! run`), then it runs `warmup` times untimed and `iters` times timed, each
//! run timed alone. Throughput is derived from the median, not the mean, so
//! one descheduled run does not move it. Peak memory is the process's
//! high-water resident set (VmHWM), which includes the model's weights, the
//! arena and the CLI itself.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;

use crate::{
    is_mote, load_model, mote_inputs, num, plan_with_inputs, Out, Planned, Provider, RunOptions,
    Tensor,
};

/// What `mote bench` was asked for.
pub(crate) struct Options {
    pub threads: usize,
    pub provider: Provider,
    pub iters: usize,
    pub warmup: usize,
    pub seed: u64,
    /// `--profile`: one more run with the GPU steps timed (CUDA only).
    pub profile: bool,
}

/// A profiled run: per kind of step, and each step as JSON.
type Profile = (Vec<(&'static str, KindTime)>, Vec<serde_json::Value>);

/// Per kind of GPU step: count, device ms, FLOPs (one profiled run).
#[derive(Debug, Default, Clone)]
struct KindTime {
    count: usize,
    ms: f64,
    flops: f64,
}

/// Latency summary of the timed runs, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Latency {
    pub min: f64,
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
}

/// Which thread counts this build can run (mote-std's `threads::check`).
pub(crate) fn check_threads(n: usize) -> Result<()> {
    if n == 0 {
        bail!("--threads must be at least 1");
    }
    mote_std::threads::check(n).map_err(|e| anyhow::anyhow!("--threads {n}: {e}"))
}

/// min, median (mean of the middle two for an even count) and the
/// nearest-rank p90 and p99 of `ms`, which must not be empty.
pub(crate) fn latency(ms: &mut [f64]) -> Latency {
    ms.sort_by(f64::total_cmp);
    let n = ms.len();
    let median = if n % 2 == 1 {
        ms[n / 2]
    } else {
        (ms[n / 2 - 1] + ms[n / 2]) / 2.0
    };
    let rank = |p: f64| ms[((p / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1];
    Latency {
        min: ms[0],
        median,
        p90: rank(90.0),
        p99: rank(99.0),
    }
}

/// Peak resident set size of this process in bytes (VmHWM), where the OS
/// reports it.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn progress(n: usize, hidden: bool) -> indicatif::ProgressBar {
    if hidden {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(n as u64);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("bench [{bar:40}] {pos}/{len} runs ({elapsed})")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// `opt.warmup` untimed runs of `once`, then the milliseconds of each of
/// `opt.iters` timed runs.
fn time_runs(opt: &Options, quiet: bool, mut once: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    for _ in 0..opt.warmup {
        once()?;
    }
    let pb = progress(opt.iters, quiet);
    let mut ms = Vec::with_capacity(opt.iters);
    for _ in 0..opt.iters {
        let t = Instant::now();
        once()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(ms)
}

/// `mote bench MODEL`: see the module header.
pub(crate) fn bench(
    path: &Path,
    given: &[(String, PathBuf)],
    dims: &[(String, usize)],
    opt: &Options,
    out: &mut Out,
) -> Result<()> {
    check_threads(opt.threads)?;
    if opt.iters == 0 {
        bail!("--iters must be at least 1");
    }
    let mut device: Option<String> = None;
    let mut graphs: Option<String> = None;
    let mut profile: Option<Vec<(&'static str, KindTime)>> = None;
    let mut profile_steps: Vec<serde_json::Value> = Vec::new();
    if opt.profile && opt.provider == Provider::Cpu {
        bail!("--profile times the GPU steps: it needs --provider cuda");
    }
    let (arena_bytes, mut ms) = if is_mote(path) {
        if !dims.is_empty() {
            bail!("--dim does not apply to a compiled model");
        }
        if opt.threads > 1 {
            bail!(
                "--threads {}: a compiled model runs on one thread",
                opt.threads
            );
        }
        if opt.provider != Provider::Cpu {
            bail!(
                "--provider {}: a compiled model runs on the CPU",
                opt.provider
            );
        }
        let f = mote_std::compiled::MoteFile::open(path)?;
        let inputs = mote_inputs(&f, given, opt.seed, out)?;
        let arena = f.model()?.arena_bytes();
        let ms = time_runs(opt, out.json, || {
            f.run(&inputs)?;
            Ok(())
        })?;
        (arena, ms)
    } else {
        let model = load_model(path)?;
        let Planned {
            mut session, feeds, ..
        } = plan_with_inputs(
            path,
            model,
            given,
            dims,
            &RunOptions {
                seed: opt.seed,
                threads: opt.threads,
                provider: opt.provider,
                max_memory: None,
                public_key: None,
            },
            out,
        )?;
        let (names, tensors): (Vec<String>, Vec<Tensor>) = feeds.into_iter().unzip();
        let args: Vec<(&str, Tensor)> = names.iter().map(String::as_str).zip(tensors).collect();
        let arena = session.plan().arena_bytes();
        device = session.device_name().map(String::from);
        graphs = session.cuda_summary();
        let ms = time_runs(opt, out.json, || {
            session.run(&args)?;
            Ok(())
        })?;
        if opt.profile {
            let (kinds, steps) = gpu_profile(&mut session, &args)?;
            profile = Some(kinds);
            profile_steps = steps;
        }
        (arena, ms)
    };
    let l = latency(&mut ms);
    let ips = if l.median > 0.0 {
        1e3 / l.median
    } else {
        f64::INFINITY
    };
    let rss = peak_rss_bytes();
    if out.json {
        out.line(
            json!({
                "model": path.display().to_string(),
                "provider": opt.provider.to_string(),
                "device": device,
                "cuda": graphs,
                "threads": opt.threads,
                "iters": opt.iters,
                "warmup": opt.warmup,
                "min_ms": num(l.min),
                "median_ms": num(l.median),
                "p90_ms": num(l.p90),
                "p99_ms": num(l.p99),
                "ips": num(ips),
                "arena_bytes": arena_bytes,
                "peak_rss_bytes": rss,
                "profile": profile.as_ref().map(|p| profile_json(p)),
                "profile_steps": profile_steps,
            })
            .to_string(),
        );
    } else {
        out.line(format!("model: {}", path.display()));
        out.line(match &device {
            Some(d) => format!(
                "provider: {} ({d}): {}",
                opt.provider,
                graphs.as_deref().unwrap_or("")
            ),
            None => format!("provider: {}", opt.provider),
        });
        out.line(format!(
            "threads {}, warmup {} runs, timed {} runs",
            opt.threads, opt.warmup, opt.iters
        ));
        out.line(format!(
            "latency: min {:.3} ms, median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
            l.min, l.median, l.p90, l.p99
        ));
        out.line(format!(
            "throughput: {ips:.1} inferences/s (from the median)"
        ));
        out.line(format!("arena: {arena_bytes} bytes"));
        out.line(match rss {
            Some(b) => format!(
                "peak resident memory: {b} bytes ({:.1} MiB)",
                b as f64 / (1 << 20) as f64
            ),
            None => "peak resident memory: n/a".to_string(),
        });
        if let Some(p) = &profile {
            out.line("GPU profile (one run, device time per kind of step):");
            for (kind, t) in p {
                let rate = if t.flops > 0.0 && t.ms > 0.0 {
                    format!("  {:.2} TFLOP/s", t.flops / (t.ms * 1e-3) / 1e12)
                } else {
                    String::new()
                };
                out.line(format!(
                    "  {kind:15} {:4} steps {:9.3} ms{rate}",
                    t.count, t.ms
                ));
            }
        }
    }
    Ok(())
}

/// One profiled GPU run, summed per kind of step (in first-seen order).
#[cfg(feature = "cuda")]
fn gpu_profile(session: &mut mote_std::Session, args: &[(&str, Tensor)]) -> Result<Profile> {
    let steps = session
        .profile_gpu(args)?
        .ok_or_else(|| anyhow::anyhow!("--profile: the session has no GPU steps"))?;
    let model = session.model().clone();
    let per_step = steps
        .iter()
        .map(|s| {
            let node = session.plan().step(&model, s.step).ok().map(|st| st.node);
            json!({
                "step": s.step,
                "node": node.map(|n| n.name.as_str()),
                "op": node.map(|n| n.op_type.as_str()),
                "kind": s.kind,
                "ms": s.ms,
                "flops": s.flops,
            })
        })
        .collect();
    let mut kinds: Vec<(&'static str, KindTime)> = Vec::new();
    for s in steps {
        let i = match kinds.iter().position(|(k, _)| *k == s.kind) {
            Some(i) => i,
            None => {
                kinds.push((s.kind, KindTime::default()));
                kinds.len() - 1
            }
        };
        let t = &mut kinds[i].1;
        t.count += 1;
        t.ms += f64::from(s.ms);
        t.flops += s.flops;
    }
    Ok((kinds, per_step))
}

#[cfg(not(feature = "cuda"))]
fn gpu_profile(_session: &mut mote_std::Session, _args: &[(&str, Tensor)]) -> Result<Profile> {
    bail!("--profile: this build of mote has no CUDA support")
}

fn profile_json(p: &[(&'static str, KindTime)]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (kind, t) in p {
        m.insert(
            (*kind).to_string(),
            json!({"steps": t.count, "ms": num(t.ms), "flops": num(t.flops)}),
        );
    }
    serde_json::Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_percentiles() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        let l = latency(&mut v);
        assert_eq!((l.min, l.median, l.p90, l.p99), (1.0, 3.0, 5.0, 5.0));
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let l = latency(&mut v);
        assert_eq!((l.min, l.median, l.p90, l.p99), (1.0, 50.5, 90.0, 99.0));
        let l = latency(&mut [7.0]);
        assert_eq!((l.min, l.median, l.p90, l.p99), (7.0, 7.0, 7.0, 7.0));
    }

    #[test]
    fn thread_counts_follow_the_build() {
        assert!(check_threads(1).is_ok());
        assert_eq!(check_threads(2).is_ok(), cfg!(feature = "rayon"));
        assert_eq!(
            check_threads(0).unwrap_err().to_string(),
            "--threads must be at least 1"
        );
    }
}
