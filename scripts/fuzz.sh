#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ for a bounded time each.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]     (default: 60 s, every target)
#
# Targets: onnx_load (ONNX bytes -> import -> plan -> run), mote_load
# (compiled .mote -> validate -> invoke), npy (the CLI's .npy reader),
# graph_run (structured generator: random nodes of every registered op).
# Seeds are made from the generated test models, the compiled int8 models
# and the ONNX node suite (`.cache/`, made by scripts/test.sh); the corpus
# grows in .cache/fuzz/corpus/TARGET and is kept between runs. A crash,
# timeout, leak or over-limit allocation stops the script with status 1 and
# leaves the input in fuzz/artifacts/TARGET/ (replay it with
# `cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/FILE`).
# Per-run statistics are appended to .cache/fuzz/stats.tsv (target,
# seconds of fuzzing, executions, corpus size, status).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
SECS="${1:-60}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(onnx_load mote_load npy graph_run)

# Tools: a nightly toolchain (libFuzzer needs -Zsanitizer) and cargo-fuzz.
if ! cargo +nightly --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked
fi

FZ="$REPO/.cache/fuzz"
mkdir -p "$FZ"

# Seeds, once: small models and inputs the tests generate.
seed() { # TARGET FILE...
  local d="$FZ/seeds/$1"
  shift
  mkdir -p "$d"
  for f in "$@"; do
    [ -f "$f" ] || continue
    [ "$(stat -c %s "$f")" -le 65536 ] || continue
    cp "$f" "$d/$(echo "$f" | sed 's#[^A-Za-z0-9._-]#_#g')"
  done
}
if [ ! -f "$FZ/seeds/.complete" ]; then
  rm -rf "$FZ/seeds"
  seed onnx_load models/*.onnx .cache/test-models/*.onnx .cache/quant-models/*.onnx \
    .cache/onnx-node-tests/*/model.onnx
  seed npy models/*.npy .cache/test-models/*.npy .cache/quant-models/*.npy
  mkdir -p "$FZ/seeds/mote_load" "$FZ/seeds/graph_run"
  if ls .cache/quant-models/*.qdq.onnx >/dev/null 2>&1; then
    cargo build -q --release -p mote-std --bin mote
    for m in .cache/quant-models/*.qdq*.onnx; do
      b="$(basename "$m" .onnx)"
      ./target/release/mote compile "$m" -o "$FZ/seeds/mote_load/$b.mote" >/dev/null 2>&1 || true
    done
  fi
  touch "$FZ/seeds/.complete"
fi

status=0
for t in "${TARGETS[@]}"; do
  case "$t" in
    onnx_load | mote_load) max_len=65536 ;;
    *) max_len=4096 ;;
  esac
  mkdir -p "$FZ/corpus/$t"
  log="$FZ/$t.log"
  echo "== fuzz $t for ${SECS}s"
  # Built first, so that the time measured below is fuzzing alone.
  (cd fuzz && cargo +nightly fuzz build "$t") >"$log" 2>&1 || {
    echo "   FAILED to build: see $log" >&2
    status=1
    continue
  }
  start=$(date +%s)
  # -timeout: one input may take 10 s; -malloc_limit_mb: no single
  # allocation over 512 MiB (the targets plan under a 256 MiB budget).
  if (cd fuzz && cargo +nightly fuzz run "$t" "$FZ/corpus/$t" "$FZ/seeds/$t" -- \
      -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
      -max_len="$max_len" -print_final_stats=1) >>"$log" 2>&1; then
    result=ok
  else
    result=failed
    status=1
    echo "   FAILED: see $log and fuzz/artifacts/$t/" >&2
    grep -E "ERROR|panicked|SUMMARY|Test unit written" "$log" | head -n 20 >&2 || true
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  secs=$(($(date +%s) - start))
  corpus=$(find "$FZ/corpus/$t" -type f | wc -l)
  echo "   ${execs:-?} executions in ${secs:-?} s, corpus $corpus"
  printf '%s\t%s\t%s\t%s\t%s\n' "$t" "${secs:-0}" "${execs:-0}" "$corpus" "$result" >>"$FZ/stats.tsv"
done
exit $status
