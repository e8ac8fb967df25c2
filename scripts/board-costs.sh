#!/usr/bin/env bash
# Flash / RAM / stack / instruction figures of the QEMU board firmware
# (boards/README.md): builds and runs every (board, model) pair twice under
# qemu-system-arm -icount shift=0 and prints a markdown table.
# Needs qemu-system-arm, arm-none-eabi-nm/size (binutils-arm-none-eabi or
# gcc-arm-none-eabi) and the thumbv7m/thumbv7em/thumbv8m.main targets.
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cargo test -p mote-tests --test boards -- --ignored --exact cost_report --nocapture >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
grep -E '^(\||<!--)' "$log"
