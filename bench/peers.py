#!/usr/bin/env python3
"""mote against onnxruntime and tract on the models of make_models.py.

Usage: peers.py [--quick] [--models a,b] [--rounds R] [--iters N] [--warmup W]
                [--budget-s S] [--models-dir DIR] [--mote PATH]

Every measurement is a fresh child process (one engine, one model), and
its peak resident memory is the child's own VmHWM (/proc/self/status) at the
end of its runs; `mote bench` reports the same figure. (Not ru_maxrss from
os.wait4: on Linux exec records the high-water mark of the forking process
into it, so every child would start at the size of this Python parent.)
The child loads the
model, runs W warmups and N timed runs and reports its median; the parent
runs R interleaved rounds (each round every engine once per model, the
engine order rotated every round) and takes the median over rounds.

Engines:
  mote      target/release/mote bench --json (1 thread)
  mote-2t   mote bench --threads 2 (skipped with a note if this mote build has no
            multithreaded provider)
  ort-1t    onnxruntime, intra_op_num_threads 1, inter_op 1, sequential,
            ORT_ENABLE_ALL
  ort-2t    the same with intra_op_num_threads 2
  tract     tract (Python bindings): load, into_model, into_runnable (optimized)

Before the rounds each engine writes its output on the model's fixed input
(mote: `mote run --output-dir`); outputs are compared with ort-1t: f32 models
with rtol 1e-3 / atol 1e-4, int8 models within 4 steps of the output's
quantization scale (the max abs diff rounded to steps). The single-run time of that step caps N and W for an engine whose
runs are slow (N * time <= budget, at least one run).

The memory of the Python engines includes the interpreter, numpy and the
engine's shared library; the header reports that baseline (a child that only
imports the engine).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ENGINES = ["mote", "ort-1t", "tract", "mote-2t", "ort-2t"]
QUICK = ["mlp", "kws"]
# The engine whose reference run stands for each engine.
FAMILY = {"mote": "mote", "mote-2t": "mote", "ort-1t": "ort-1t", "ort-2t": "ort-1t", "tract": "tract"}
NO_MT = "no multithreaded provider"
INT8_LSB = 4


# -- child side -------------------------------------------------------------
def vmhwm():
    """Peak resident bytes of this process (VmHWM), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def child(engine, model, input_name, input_file, out_file, iters, warmup):
    import numpy as np

    if engine.startswith("import-"):
        # The baseline: the interpreter, numpy and the engine's library.
        __import__({"import-ort": "onnxruntime", "import-tract": "tract"}[engine])
        print(json.dumps({"median_ms": None, "peak_rss_bytes": vmhwm()}))
        return
    x = np.load(input_file)
    if engine.startswith("ort"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = int(engine[4])
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        feed = {input_name: x}

        def once():
            return s.run(None, feed)[0]

    elif engine == "tract":
        import tract

        r = tract.onnx().load(model).into_model().into_runnable()

        def once():
            return r.run([x])[0].to_numpy()

    else:
        raise SystemExit(f"unknown engine {engine}")
    t = time.perf_counter()
    y = once()
    first = (time.perf_counter() - t) * 1e3
    if out_file:
        np.save(out_file, np.asarray(y))
    for _ in range(warmup):
        once()
    ms = []
    for _ in range(iters):
        t = time.perf_counter()
        once()
        ms.append((time.perf_counter() - t) * 1e3)
    print(json.dumps({"median_ms": statistics.median(ms) if ms else None, "first_ms": first, "peak_rss_bytes": vmhwm()}))


# -- parent side ------------------------------------------------------------
def spawn(cmd):
    """Runs cmd; returns (exit code, stdout, stderr)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def engine_cmd(args, engine, m, iters, warmup, out_file=None):
    model = os.path.join(args.models_dir, m["file"])
    inp = os.path.join(args.models_dir, m["input_file"])
    if engine.startswith("mote"):
        threads = "2" if engine == "mote-2t" else "1"
        return [args.mote, "bench", model, "--json", "--iters", str(iters), "--warmup", str(warmup),
                "--threads", threads, "--input", f"{m['input_name']}={inp}"]
    return [sys.executable, os.path.abspath(__file__), "--child", engine, model, m["input_name"], inp,
            out_file or "", str(iters), str(warmup)]


def measure(args, engine, m, iters, warmup):
    """(median ms, peak RSS bytes) of one child, or raises RuntimeError."""
    rc, out, err = spawn(engine_cmd(args, engine, m, iters, warmup))
    if rc != 0:
        raise RuntimeError((err.strip().splitlines() or [f"exit {rc}"])[-1])
    r = json.loads(out.strip().splitlines()[-1])
    return r["median_ms"], r["peak_rss_bytes"]


def reference_outputs(args, name, m, engines, tmp):
    """Each engine's output on the fixed input, and the time of that one run (ms)."""
    import numpy as np

    outs, first, errors = {}, {}, {}
    for e in engines:
        if e.endswith("2t"):
            continue
        d = os.path.join(tmp, f"{name}.{e}")
        os.makedirs(d, exist_ok=True)
        if e == "mote":
            model = os.path.join(args.models_dir, m["file"])
            inp = os.path.join(args.models_dir, m["input_file"])
            t = time.perf_counter()
            rc, out, err = spawn([args.mote, "run", model, "--input", f"{m['input_name']}={inp}", "--output-dir", d])
            first[e] = (time.perf_counter() - t) * 1e3
            files = sorted(f for f in os.listdir(d) if f.endswith(".npy"))
            if rc != 0 or not files:
                errors[e] = (err.strip().splitlines() or [f"exit {rc}"])[-1]
                continue
            outs[e] = np.load(os.path.join(d, files[0]))
        else:
            f = os.path.join(d, "out.npy")
            rc, out, err = spawn(engine_cmd(args, e, m, 0, 0, f))
            if rc != 0:
                errors[e] = (err.strip().splitlines() or [f"exit {rc}"])[-1]
                continue
            first[e] = json.loads(out.strip().splitlines()[-1])["first_ms"]
            outs[e] = np.load(f)
    first["mote-2t"] = first.get("mote")
    first["ort-2t"] = first.get("ort-1t")
    return outs, first, errors


def agreement(m, outs, errors):
    """{engine: text} for each engine against ort-1t."""
    import numpy as np

    res = {}
    ref = outs.get("ort-1t")
    for e in ["mote", "tract"]:
        if e in errors:
            res[e] = f"**ERROR**: {errors[e]}"
            continue
        if ref is None or e not in outs:
            res[e] = "n/a"
            continue
        y = outs[e]
        if y.shape != ref.shape:
            res[e] = f"**DISAGREE** shape {list(y.shape)} vs {list(ref.shape)}"
            continue
        d = np.abs(y.astype(np.float64) - ref.astype(np.float64))
        mx = float(d.max()) if d.size else 0.0
        if m["kind"] == "int8":
            # In steps of the output's quantization scale: requantization
            # rounding differs between engines and adds up over the layers.
            scale = m.get("output_scale") or 0.025
            lsb = int(np.rint(mx / scale))
            top1 = bool(np.all(np.argmax(y, axis=-1) == np.argmax(ref, axis=-1)))
            ok = lsb <= INT8_LSB
            crit = f"= {lsb} LSB of {scale:.3g}, tol {INT8_LSB} LSB; top-1 {'same' if top1 else 'DIFFERS'}"
        else:
            ok = bool(np.all(d <= 1e-4 + 1e-3 * np.abs(ref)))
            crit = "rtol 1e-3 atol 1e-4"
        res[e] = f"{'ok' if ok else '**DISAGREE**'} (max abs diff {mx:.3g}, {crit})"
    return res


def cpu_line():
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical cores (os.cpu_count), {platform.system()} {platform.release()}"


def versions(args):
    import numpy as np
    import onnxruntime as ort
    import tract

    rc, out, _ = spawn([args.mote, "--version"])
    mote_v = out.strip() if rc == 0 else "mote ?"
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    return f"{mote_v} (git {commit}), onnxruntime {ort.__version__}, tract {tract.version()}, numpy {np.__version__}, Python {platform.python_version()}"


def fmt_ms(v):
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def fmt_mib(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="MLP and KWS only, few iterations (smoke test)")
    ap.add_argument("--models", help="comma-separated model names (default: all in the manifest)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--iters", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--budget-s", type=float, default=10.0, help="caps iters*run time per child (default 10)")
    ap.add_argument("--models-dir", default=os.path.join(HERE, "models"))
    ap.add_argument("--mote", default=os.path.join(REPO, "target", "release", "mote"))
    ap.add_argument("--child", nargs=7, metavar="X", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        e, model, name, inp, out, n, w = args.child
        child(e, model, name, inp, out, int(n), int(w))
        return
    rounds = args.rounds or (2 if args.quick else 3)
    iters = args.iters or (10 if args.quick else 30)
    warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    with open(os.path.join(args.models_dir, "manifest.json")) as f:
        manifest = json.load(f)
    names = args.models.split(",") if args.models else (QUICK if args.quick else list(manifest))
    for n in names:
        if n not in manifest:
            raise SystemExit(f"unknown model '{n}' (have: {', '.join(manifest)})")

    engines = list(ENGINES)
    notes = []
    rc, _, err = spawn([args.mote, "bench", os.path.join(args.models_dir, manifest[names[0]]["file"]),
                           "--threads", "2", "--iters", "1", "--warmup", "0", "--json"])
    if rc != 0 and NO_MT in err:
        engines.remove("mote-2t")
        notes.append(f"mote-2t skipped: `mote bench --threads 2` says: {err.strip()}")
    base = {}
    for e in ["ort", "tract"]:
        _, out, _ = spawn([sys.executable, os.path.abspath(__file__), "--child", f"import-{e}", "-", "-", "-", "", "0", "0"])
        base[e] = json.loads(out.strip().splitlines()[-1])["peak_rss_bytes"]
    print(f"machine: {cpu_line()}")
    print(f"versions: {versions(args)}")
    print(f"method: {rounds} interleaved rounds x {iters} timed runs after {warmup} warmups per child "
          f"(capped to {args.budget_s:g} s of runs per child); median of per-child medians; "
          f"peak RSS = the child's VmHWM (max over rounds)")
    print(f"Python engines' RSS includes the interpreter: python+numpy+onnxruntime import alone = "
          f"{fmt_mib(base['ort'])} MiB, python+numpy+tract import alone = {fmt_mib(base['tract'])} MiB")
    for n in notes:
        print(f"note: {n}")
    print(flush=True)

    tmp = tempfile.mkdtemp(prefix="mote-peers-")
    for name in names:
        m = manifest[name]
        outs, first, errors = reference_outputs(args, name, m, engines, tmp)
        agree = agreement(m, outs, errors)
        plan = {}
        for e in engines:
            if FAMILY[e] in errors:
                continue
            t = first.get(e) or 0.0
            n_it = max(1, min(iters, int(args.budget_s * 1e3 / t))) if t > 0 else iters
            n_w = min(warmup, max(0, n_it // 5)) if n_it < iters else warmup
            plan[e] = (n_it, n_w)
        times = {e: [] for e in plan}
        rss = {e: 0 for e in plan}
        fails = {}
        for r in range(rounds):
            order = list(plan)
            k = r % len(order) if order else 0
            for e in order[k:] + order[:k]:
                if e in fails:
                    continue
                try:
                    ms, b = measure(args, e, m, *plan[e])
                    times[e].append(ms)
                    rss[e] = max(rss[e], b or 0)
                except RuntimeError as ex:
                    fails[e] = str(ex)
        med = {e: statistics.median(v) if v else None for e, v in times.items()}
        mem = {e: (rss[e] or None) for e in plan}
        print(f"### {name} ({m['kind']})\n")
        print("| engine | median ms | peak RSS MiB | runs per child | agreement with ort-1t |")
        print("|---|---:|---:|---|---|")
        for e in ENGINES:
            if e not in plan:
                if e == "mote-2t" and e not in engines:
                    continue
                why = f"**ERROR**: {errors[FAMILY[e]]}" if FAMILY[e] in errors else ""
                print(f"| {e} | - | - | - | {why} |")
                continue
            a = agree.get(e, "reference" if e == "ort-1t" else "")
            if e in fails:
                a = f"**FAILED**: {fails[e]}"
            print(f"| {e} | {fmt_ms(med[e])} | {fmt_mib(mem[e])} | {plan[e][0]} (+{plan[e][1]} warmup) | {a} |")
        print()
        print(f"mote/ort-1t {ratio(med.get('mote'), med.get('ort-1t'))}, "
              f"mote/tract {ratio(med.get('mote'), med.get('tract'))}, "
              f"mote-2t/ort-2t {ratio(med.get('mote-2t'), med.get('ort-2t'))}, "
              f"RSS mote/ort-1t {ratio(mem.get('mote'), mem.get('ort-1t'))}\n", flush=True)


if __name__ == "__main__":
    main()
