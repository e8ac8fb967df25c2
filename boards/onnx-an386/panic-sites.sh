#!/usr/bin/env bash
# Panic call sites left in the on-device ONNX path (import, optimizer,
# planner and every registered operator): builds this firmware as a size-
# optimized, fat-LTO release (what a product would ship) and lists, by kind,
# the calls into core's panic functions that the optimizer could not
# remove (scripts/panic_sites.py). Extra arguments go to that script
# (`--list`, `--max-core N`, `--max-div N`).
#   bash boards/onnx-an386/panic-sites.sh [--list]
# Needs MOTE_FW_MODEL_DIR (tests/tests/onnx_on_device.rs writes one under
# target/fw-models/kws.qdq), the thumbv7em-none-eabihf target, and
# llvm-objdump / llvm-symbolizer (Debian package llvm).
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$(cd ../.. && pwd)"
export MOTE_FW_MODEL_DIR="${MOTE_FW_MODEL_DIR:-$ROOT/target/fw-models/kws.qdq}"
[ -f "$MOTE_FW_MODEL_DIR/model.onnx" ] || {
  echo "no $MOTE_FW_MODEL_DIR/model.onnx: run tests/tests/onnx_on_device.rs first" >&2; exit 2; }
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS
export CARGO_TARGET_DIR="$ROOT/target/boards/onnx-sites"
CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
  CARGO_PROFILE_RELEASE_OPT_LEVEL=s CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
  cargo build -q --release --target thumbv7em-none-eabihf
python3 "$ROOT/scripts/panic_sites.py" \
  "$CARGO_TARGET_DIR/thumbv7em-none-eabihf/release/mote-fw-onnx-an386" "$@"
