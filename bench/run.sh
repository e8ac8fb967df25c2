#!/usr/bin/env bash
# Peer benchmark: mote against onnxruntime and tract (see bench/peers.py).
# Usage: bash bench/run.sh [peers.py args, e.g. --quick or --models mbv2,resnet18]
# Creates bench/.venv (bench/requirements.txt) and bench/models/ when missing,
# builds the release mote, then runs peers.py. Not part of CI.
set -euo pipefail
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH/.." && pwd)"
VENV="$BENCH/.venv"
PY="$VENV/bin/python"
STAMP="$VENV/.requirements.sha256"
HASH="$(sha256sum "$BENCH/requirements.txt" | cut -d' ' -f1)"

if [[ ! -x "$PY" ]]; then
    echo "run.sh: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$HASH" ]]; then
    echo "run.sh: installing bench/requirements.txt" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check -r "$BENCH/requirements.txt"
    echo "$HASH" > "$STAMP"
fi

(cd "$REPO" && cargo build --release -p mote-std)

if [[ ! -f "$BENCH/models/manifest.json" ]]; then
    echo "run.sh: generating bench/models" >&2
    "$PY" "$BENCH/make_models.py" "$BENCH/models"
fi

exec "$PY" "$BENCH/peers.py" --models-dir "$BENCH/models" --mote "$REPO/target/release/mote" "$@"
