#!/usr/bin/env bash
# aarch64 Linux (Raspberry Pi, Jetson CPU): cross-builds the `mote` CLI for
# aarch64-unknown-linux-gnu, runs it under qemu-aarch64 on the shipped model
# (same output as on the host), and runs the kernel tests there, so that the
# NEON micro-kernel and the portable int8 paths are checked against the
# reference loops on every change. Called by .ci/run; idempotent.
#
# The runner (.cargo/config.toml) pins a Cortex-A72 (Raspberry Pi 4).
set -euo pipefail
cd "$(dirname "$0")/.."
T=aarch64-unknown-linux-gnu

rustup target add "$T" >/dev/null 2>&1 || rustup target add "$T"
need=""
for c in qemu-aarch64:qemu-user aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu \
         /usr/aarch64-linux-gnu/lib/libc.so.6:libc6-dev-arm64-cross; do
  p="${c%%:*}"
  if [ "${p#/}" != "$p" ]; then [ -e "$p" ] || need="$need ${c#*:}"
  else command -v "$p" >/dev/null || need="$need ${c#*:}"; fi
done
if [ -n "$need" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update && $SUDO apt-get install -y $need
fi

# Models of the kernel tests (made on the host; scripts/test.sh does the same).
PY="$(bash scripts/venv.sh | tail -n 1)"
export MOTE_PYTHON="$PY"
export MOTE_QUANT_MODELS="${MOTE_QUANT_MODELS:-$PWD/.cache/quant-models}"
if [ ! -f "$MOTE_QUANT_MODELS/manifest.json" ]; then
  "$PY" scripts/make_quant_models.py "$MOTE_QUANT_MODELS"
fi

echo "== aarch64: cross-build the mote CLI"
cargo build -q --release --target "$T" -p mote-std --bin mote
file "target/$T/release/mote" 2>/dev/null || true

echo "== aarch64: mote run under qemu-aarch64 = host output"
run=(run models/digits_mlp.onnx --input input=models/digits_sample.npy)
want="$(cargo run -q --release -p mote-std --bin mote -- "${run[@]}")"
got="$(qemu-aarch64 -cpu cortex-a72 -L /usr/aarch64-linux-gnu "target/$T/release/mote" "${run[@]}")"
if [ "$got" != "$want" ]; then
  echo "aarch64 output differs from the host's:"; echo "host: $want"; echo "aarch64: $got"
  exit 1
fi
echo "$got" | tail -n 3

echo "== aarch64: kernel tests under qemu-aarch64"
# mote-core's unit tests (sgemm NEON vs reference, int8 GEMM and depthwise vs
# the reference loops, splits), then whole models with every kernel choice
# and with 2 and 4 threads.
cargo test -q --target "$T" -p mote-core --lib
cargo test -q --target "$T" -p mote-tests --test kernels --test threads

echo "== aarch64: the CUDA provider cross-builds (Jetson), and errs cleanly with no GPU"
# cudarc loads the CUDA libraries at run time: no toolkit is needed to build,
# and under qemu (no driver) `--provider cuda` must give its one-line error.
cargo build -q --release --target "$T" -p mote-std --features cuda --bin mote
set +e
msg="$(qemu-aarch64 -cpu cortex-a72 -L /usr/aarch64-linux-gnu "target/$T/release/mote" run models/digits_mlp.onnx --provider cuda 2>&1)"
rc=$?
set -e
echo "$msg"
if [ "$rc" -eq 0 ] || [ "$(echo "$msg" | wc -l)" -ne 1 ] || echo "$msg" | grep -qi panic; then
  echo "expected a one-line CUDA error and a non-zero exit, got rc=$rc"; exit 1
fi
