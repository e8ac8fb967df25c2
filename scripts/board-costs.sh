#!/usr/bin/env bash
# Flash / RAM / stack / instruction figures of the QEMU board firmware
# (boards/README.md): builds and runs every (board, model) pair twice under
# qemu-system-arm -icount shift=0 and prints a markdown table, then the
# MACs of each model (scripts/model_macs.py) and MACs per instruction.
# Needs qemu-system-arm, arm-none-eabi-nm/size/objdump (binutils-arm-none-eabi)
# and the thumbv7m/thumbv7em/thumbv8m.main targets.
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cargo test -p mote-tests --test boards -- --ignored --exact cost_report --nocapture >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
grep -E '^(\||<!--)' "$log"

PY="${MOTE_PYTHON:-$(bash scripts/venv.sh | tail -n 1)}"
QM="${MOTE_QUANT_MODELS:-$PWD/.cache/quant-models}"
echo
echo "| board | model | MACs | instructions | MACs/instruction |"
echo "|---|---|---|---|---|"
"$PY" scripts/model_macs.py "$QM"/{kws,resnet8,mbv1}.f32.onnx >"$log.macs"
grep -E '^\| (lm3s|mps)' "$log" | awk -F'|' -v macs="$log.macs" '
  BEGIN { while ((getline l < macs) > 0) { split(l, a, " "); m[a[1]] = a[2] } }
  { b = $2; gsub(/ /, "", b); n = $3; gsub(/ /, "", n); i = $14; gsub(/ /, "", i);
    printf "| %s | %s | %d | %d | %.4f |\n", b, n, m[n], i, m[n] / i }'
rm -f "$log.macs"
