#!/usr/bin/env bash
# GPU check of mote's CUDA provider (issue 7), in one go, in under 5 minutes:
#   1. the GPU tests (cuda-ext/tests/gpu.rs: every GPU kernel and the model
#      set against the CPU provider, f32 within 1e-4 relative);
#   2. `mote bench --provider cuda` on the model set, ResNet-18 and
#      MobileNetV2 at batch 1 and 32, against onnxruntime on the same
#      machine (its CUDA execution provider where it loads, else its CPU
#      one) and against cuBLAS SGEMM throughput (cuda-ext/device-bench.py).
#
# Usage:
#   bash cuda-ext/device-check.sh [OUTDIR]          on a machine with cargo and a GPU
#   bash cuda-ext/device-check.sh --prepare DIR     build here (no GPU needed) into DIR,
#   MOTE_PREBUILT=DIR bash cuda-ext/device-check.sh [OUTDIR]
#                                                   then run there (a GPU machine without Rust)
# Needs python3 with numpy, onnx and onnxruntime for the model set and the peers.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

build() { # DIR: the mote CLI with the cuda feature and the GPU test binary
    local dir="$1"
    mkdir -p "$dir"
    cargo build --release -p mote-std --features cuda
    cp target/release/mote "$dir/mote"
    local t
    t="$(cargo test --release -p mote-cuda --test gpu --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="gpu": print(m["executable"])' | tail -1)"
    cp "$t" "$dir/gpu-tests"
}

if [[ "${1:-}" == "--prepare" ]]; then
    build "${2:?--prepare DIR}"
    ls -l "$2"
    exit 0
fi

OUT="${1:-$REPO/target/device-check}"
mkdir -p "$OUT"
BIN="${MOTE_PREBUILT:-}"
if [[ -z "$BIN" ]]; then
    BIN="$REPO/target/device-check-bin"
    build "$BIN"
fi

# cudarc opens libnvrtc.so / libcublas.so (or .so.12): where a CUDA 13
# install has only .so.13 (pip wheels), link the names it looks for.
LIBS="$OUT/cuda-libs"
mkdir -p "$LIBS"
DIRS=(/usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu)
for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    DIRS+=("$sp"/nvidia/*/lib "$sp"/nvidia/cu13/lib)
done
for lib in nvrtc cublas cublasLt cudnn; do
    for d in "${DIRS[@]}"; do
        f="$(ls "$d"/lib$lib.so* 2>/dev/null | head -1 || true)"
        if [[ -n "$f" ]]; then
            [[ -e "$LIBS/lib$lib.so" ]] || ln -sf "$f" "$LIBS/lib$lib.so"
            export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
            break
        fi
    done
done
export LD_LIBRARY_PATH="$LIBS:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== model set"
MODELS="$OUT/models"
if [[ ! -f "$MODELS/manifest.json" ]]; then
    python3 bench/make_models.py "$MODELS" --only mlp,kws,resnet8,mbv1,mbv2,resnet18 >/dev/null
    # Batch as a symbolic dim N (bound with --dim N=1 / N=32).
    python3 - "$MODELS" <<'PY'
import sys, onnx
for name in ["mbv2", "resnet18"]:
    p = f"{sys.argv[1]}/{name}.onnx"
    m = onnx.load(p)
    for v in list(m.graph.input) + list(m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(m, p)
PY
fi

echo "== GPU tests (cuDNN convolutions where it loads, then mote's own: MOTE_CUDA_CUDNN=0)"
tests_ok=1
for cudnn in 1 0; do
    MOTE_CUDA_CUDNN=$cudnn MOTE_GPU_MODELS="$MODELS" "$BIN/gpu-tests" --test-threads 1 --nocapture 2>&1 \
        | tee "$OUT/gpu-tests-cudnn$cudnn.log" | grep -E "max rel|skipped|claimed|test result|panicked|FAILED" || true
    grep -q "test result: ok" "$OUT/gpu-tests-cudnn$cudnn.log" || tests_ok=0
done

echo "== CLI: the shipped model on the CPU, the GPU, and the GPU with 4 CPU threads"
for a in "" "--provider cuda" "--provider cuda --threads 4"; do
    # shellcheck disable=SC2086
    "$BIN/mote" run models/digits_mlp.onnx --input input=models/digits_sample.npy $a | tail -n 2
done
"$BIN/mote" inspect --provider cuda "$MODELS/mbv2.onnx" | tail -n 3

echo "== bench"
python3 cuda-ext/device-bench.py --mote "$BIN/mote" --models "$MODELS" --out "$OUT/bench.json"
if [[ $tests_ok != 1 ]]; then
    echo "device-check: GPU tests FAILED (see $OUT/gpu-tests-cudnn*.log)"
    exit 1
fi
echo "device-check: GPU tests passed"
