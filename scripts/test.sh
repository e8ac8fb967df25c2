#!/usr/bin/env bash
# The test command of README.md: everything the tests need, then the tests.
# Idempotent; fast on a machine where it already ran.
set -euo pipefail
cd "$(dirname "$0")/.."

# Bare-metal targets for the no_std build tests (RUSTUP_AUTO_INSTALL=0 here).
# thumbv7m / thumbv7em / thumbv8m.main: the QEMU board firmware of
# tests/tests/boards.rs (which also needs qemu-system-arm and binutils-arm-none-eabi).
BOARD_TARGETS="thumbv6m-none-eabi thumbv7m-none-eabi thumbv7em-none-eabihf thumbv8m.main-none-eabihf"
rustup target add $BOARD_TARGETS >/dev/null 2>&1 || rustup target add $BOARD_TARGETS

# QEMU and the Arm bare-metal toolchain (Debian packages) for the firmware
# tests: tests/tests/boards.rs, c_example.rs (arm-none-eabi-gcc, make),
# onnx_on_device.rs.
need=""
for c in qemu-system-arm:qemu-system-arm arm-none-eabi-gcc:gcc-arm-none-eabi \
         arm-none-eabi-size:binutils-arm-none-eabi make:make; do
  command -v "${c%%:*}" >/dev/null || need="$need ${c#*:}"
done
if [ -n "$need" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update && $SUDO apt-get install -y $need
fi

# Pinned onnx/onnxruntime venv; reference models and outputs from it.
PY="$(bash scripts/venv.sh | tail -n 1)"
export MOTE_PYTHON="$PY"
export MOTE_TEST_MODELS="${MOTE_TEST_MODELS:-$PWD/.cache/test-models}"
if [ ! -f "$MOTE_TEST_MODELS/dynamic.expected.npy" ]; then
  "$PY" scripts/make_test_models.py "$MOTE_TEST_MODELS"
fi
# int8 / f16 models of quantized inference (tests/tests/quant_models.rs).
export MOTE_QUANT_MODELS="${MOTE_QUANT_MODELS:-$PWD/.cache/quant-models}"
if [ ! -f "$MOTE_QUANT_MODELS/manifest.json" ]; then
  "$PY" scripts/make_quant_models.py "$MOTE_QUANT_MODELS"
fi

cargo test --workspace "$@"
# mote-std with its `cuda` feature: --provider parsing and the errors with no
# GPU (mote-cuda's own tests ran above; their GPU checks skip without one).
cargo test -p mote-std --features cuda "$@"
# mote-core with `fast-math` (as `cargo test --workspace --all-features`
# builds it): its unit tests and the conformance ratchet, held to the
# tolerance the approximations meet (`mote_core::math::APPROX_RTOL`).
cargo test -p mote-core --lib --features fast-math "$@"
cargo test -p mote-tests --test conformance --features mote-core/fast-math "$@"
