#!/usr/bin/env python3
"""mote's CUDA provider against onnxruntime and cuBLAS on the same machine
(called by cuda-ext/device-check.sh; needs a GPU).

For each model of the set (and ResNet-18 / MobileNetV2 at batch 1 and 32):
  - mote:   `mote bench --provider cuda --json` median latency (input upload
            and output download included, as onnxruntime's run includes
            them from numpy);
  - ORT:    onnxruntime's CUDA execution provider where it loads, else its
            CPU provider (all cores), median of the same number of runs;
  - check:  `mote run --provider cuda` outputs against ORT's (max |diff|
            relative to max |ORT output|);
  - cuBLAS: SGEMM throughput (f32, no TF32) of an 8192^3 product through
            PyTorch, and the model's FLOP rate under mote (2 x MACs /
            latency) as a fraction of it.
Writes every figure to --out (JSON) and prints a table."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def cublas_peak():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    n = 8192
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return 2 * n**3 / statistics.median(ts) / 1e12


def macs(path, batch):
    m = onnx.load(path)
    for v in list(m.graph.input) + list(m.graph.output):
        d = v.type.tensor_type.shape.dim[0]
        if d.dim_param:
            d.dim_value = 1
    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        onnx.save(m, f.name)
        out = subprocess.run([sys.executable, os.path.join(REPO, "scripts/model_macs.py"), f.name],
                             capture_output=True, text=True, check=True).stdout
    return int(out.split()[-1]) * batch


def ort_session(path):
    avail = ort.get_available_providers()
    if "CUDAExecutionProvider" in avail:
        try:
            s = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
            if "CUDAExecutionProvider" in s.get_providers():
                return s, "ort-cuda"
        except Exception as e:  # noqa: BLE001 - report and fall back
            print(f"  onnxruntime CUDA EP failed to load: {e}", file=sys.stderr)
    o = ort.SessionOptions()
    o.intra_op_num_threads = os.cpu_count()
    return ort.InferenceSession(path, o, providers=["CPUExecutionProvider"]), f"ort-cpu-{os.cpu_count()}t"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mote", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    peak = cublas_peak()
    print(f"onnxruntime {ort.__version__}, providers {ort.get_available_providers()}")
    print(f"cuBLAS SGEMM 8192^3 (no TF32): {peak:.1f} TFLOP/s" if peak else "cuBLAS peak: torch/CUDA unavailable")
    cases = [(m, 1) for m in ["mlp", "kws", "resnet8", "mbv1", "mbv2", "resnet18"]] + [("mbv2", 32), ("resnet18", 32)]
    rows = []
    shown = False
    for name, batch in cases:
        path = os.path.join(args.models, f"{name}.onnx")
        if not os.path.exists(path):
            continue
        x1 = np.load(os.path.join(args.models, f"{name}.input.npy"))
        x = np.concatenate([x1] * batch) if batch > 1 else x1
        tmp = tempfile.mkdtemp()
        xin = os.path.join(tmp, "x.npy")
        np.save(xin, x)
        dyn = any(d.dim_param for d in onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim)
        dim = ["--dim", f"N={batch}"] if dyn else []
        iters = args.iters if batch == 1 else max(10, args.iters // 3)
        bench = [args.mote, "bench", path, "--provider", "cuda", "--json", "--iters", str(iters),
                 "--warmup", "5", "--input", f"input={xin}"] + dim
        r = subprocess.run(bench + ["--profile"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name} b{batch}: mote bench failed: {r.stderr.strip()}")
            rows.append({"model": name, "batch": batch, "error": r.stderr.strip()})
            continue
        mb = json.loads(r.stdout)
        if not shown:
            print(f"mote: {mb.get('device')}: {mb.get('cuda')}", flush=True)
            shown = True
        # The same with mote's own convolutions (no cuDNN).
        r = subprocess.run(bench, capture_output=True, text=True, env=dict(os.environ, MOTE_CUDA_CUDNN="0"))
        own_conv_ms = json.loads(r.stdout)["median_ms"] if r.returncode == 0 else None
        # The same without CUDA graphs (one launch per kernel).
        r = subprocess.run(bench, capture_output=True, text=True, env=dict(os.environ, MOTE_CUDA_GRAPHS="0"))
        nograph_ms = json.loads(r.stdout)["median_ms"] if r.returncode == 0 else None
        # Batch > 1: the same with every Conv per image (no wide-N GEMM).
        per_image_ms = wide_ms = None
        if batch > 1:
            r = subprocess.run(bench, capture_output=True, text=True, env=dict(os.environ, MOTE_CUDA_WIDE_P="0"))
            per_image_ms = json.loads(r.stdout)["median_ms"] if r.returncode == 0 else None
            r = subprocess.run(bench, capture_output=True, text=True, env=dict(os.environ, MOTE_CUDA_WIDE_P="100000000"))
            wide_ms = json.loads(r.stdout)["median_ms"] if r.returncode == 0 else None
        prof = mb.get("profile") or {}
        g_ms = sum(prof[k]["ms"] for k in ("conv", "gemm") if k in prof)
        g_flops = sum(prof[k]["flops"] for k in ("conv", "gemm") if k in prof)
        gemm_tflops = g_flops / (g_ms / 1e3) / 1e12 if g_ms > 0 else None
        gpu_ms = sum(v["ms"] for v in prof.values())
        sess, peer = ort_session(path)
        feed = {sess.get_inputs()[0].name: x}
        y_ort = sess.run(None, feed)[0]
        for _ in range(3):
            sess.run(None, feed)
        ts = []
        n_ort = iters if peer == "ort-cuda" or batch == 1 else 5
        for _ in range(n_ort):
            t0 = time.perf_counter()
            sess.run(None, feed)
            ts.append((time.perf_counter() - t0) * 1e3)
        ort_ms = statistics.median(ts)
        od = os.path.join(tmp, "out")
        r = subprocess.run([args.mote, "run", path, "--provider", "cuda", "--input", f"input={xin}", "--output-dir", od]
                           + dim, capture_output=True, text=True)
        err = None
        if r.returncode == 0:
            outs = sorted(f for f in os.listdir(od) if f.endswith(".npy"))
            y = np.load(os.path.join(od, outs[0]))
            err = float(np.max(np.abs(y - y_ort)) / max(float(np.max(np.abs(y_ort))), 1e-12))
        flops = 2 * macs(path, batch)
        tflops = flops / (mb["median_ms"] / 1e3) / 1e12
        row = {"model": name, "batch": batch, "mote_ms": mb["median_ms"], "peer": peer, "peer_ms": ort_ms,
               "ratio": mb["median_ms"] / ort_ms, "gflop": flops / 1e9, "mote_tflops": tflops,
               "cublas_tflops": peak, "of_cublas": tflops / peak if peak else None, "rel_err_vs_ort": err,
               "device": mb.get("device"), "cuda": mb.get("cuda"), "no_graphs_ms": nograph_ms, "no_cudnn_ms": own_conv_ms, "conv_per_image_ms": per_image_ms, "conv_all_wide_ms": wide_ms,
               "profile_steps": mb.get("profile_steps"),
               "profile": prof, "gpu_steps_ms": gpu_ms, "gemm_layers_tflops": gemm_tflops,
               "gemm_layers_of_cublas": gemm_tflops / peak if (peak and gemm_tflops) else None}
        rows.append(row)
        print(f"{name:9s} b{batch:<3d} mote {mb['median_ms']:8.3f} ms (no graphs {nograph_ms or float('nan'):8.3f}, "
              f"no cuDNN {own_conv_ms or float('nan'):8.3f})  "
              f"{peer} {ort_ms:8.3f} ms  ratio {row['ratio']:6.2f}  "
              f"{flops/1e9:7.2f} GFLOP  {tflops:6.2f} TFLOP/s"
              + (f" ({100*tflops/peak:4.1f}% of cuBLAS)" if peak else "")
              + (f"  conv+gemm steps {gemm_tflops:6.2f} TFLOP/s" if gemm_tflops else "")
              + (f" ({100*gemm_tflops/peak:4.1f}%)" if (peak and gemm_tflops) else "")
              + (f"  max rel err vs ORT {err:.1e}" if err is not None else "  (mote run failed)"), flush=True)
        print("           profile: " + ", ".join(f"{k} {v['ms']:.3f} ms/{v['steps']}" for k, v in prof.items())
              + (f"; convs per image instead: {per_image_ms:.3f} ms" if per_image_ms else "")
              + (f"; all convs wide-N: {wide_ms:.3f} ms" if wide_ms else ""), flush=True)
        print(f"           {mb.get('cuda')}", flush=True)
        if batch > 1:
            top = sorted(mb.get("profile_steps") or [], key=lambda t: -t["ms"])[:8]
            for t in top:
                rate = t["flops"] / (t["ms"] / 1e3) / 1e12 if t["ms"] > 0 and t["flops"] else 0
                print(f"             step {t['step']:3d} {t['op'] or '?':10s} {t['kind']:14s} {t['ms']:7.3f} ms  {rate:6.2f} TFLOP/s", flush=True)
    with open(args.out, "w") as f:
        json.dump({"cublas_sgemm_tflops": peak, "onnxruntime": ort.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
